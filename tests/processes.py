"""Process checks shared by the tests: ask psutil, never sleep-and-hope."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil

from pytest_qwenperf.serving import proctree

_SIGINT_AT_DEFAULT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"


def interruptible(argv: Sequence[str]) -> list[str]:
    """``argv`` as a terminal starts it: with SIGINT at its default disposition. Every child a test
    sends SIGINT is started through this.

    A shell script run in the background (no job control) starts its children with SIGINT
    ignored, and Python then installs no Ctrl-C handler, so a test that interrupts a child would
    depend on how its own runner was started. A small Python resets the disposition and execs
    ``argv`` (not ``preexec_fn``, which is unsafe in a process that runs threads)."""
    return [sys.executable, "-c", _SIGINT_AT_DEFAULT, *argv]


def alive(proc: int | psutil.Process) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        proc = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_tree(session: subprocess.Popen[bytes], ready: Path, timeout: float) -> list[psutil.Process]:
    """Wait until an inner pytest ``session`` touched ``ready``; return the server processes it tagged."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        assert session.poll() is None, "inner session ended before its server was up"
        assert time.monotonic() < deadline, "inner session's server never came up"
        time.sleep(0.2)
    tree = proctree.tagged_processes(f"{session.pid}-")
    assert tree, "the inner session's server processes should carry its tag"
    return tree


def end_inner_session(session: subprocess.Popen[bytes]) -> None:
    """Cleanup for a test that failed half-way: interrupt the inner session, then kill what it left."""
    if session.poll() is None:
        session.terminate()
        try:
            session.wait(timeout=60)
        except subprocess.TimeoutExpired:
            session.kill()
            session.wait()
    for proc in proctree.tagged_processes(f"{session.pid}-"):
        proc.kill()


@contextmanager
def busy_loops(cpus: frozenset[int], per_cpu: int = 1, own_sessions: bool = False) -> Iterator[None]:
    """``per_cpu`` spinning processes pinned to each of ``cpus``; all killed on the way out, however it ends.

    Where the kernel schedules by session (autogroup, on by default on Linux), each session
    takes an equal turn on a CPU, shared by its processes. In this process's session (the
    default) the loops compete with it as its equals, and when it wakes it gets the CPU
    back at once. ``own_sessions``: each loop in a session of its own, so that each takes a
    full turn against every other session (a server in its own session gets 1/(n+1) of a
    CPU with n loops, not half of it).
    """
    spin = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
    hogs = [
        subprocess.Popen([sys.executable, "-c", spin, str(cpu)], start_new_session=own_sessions)
        for cpu in sorted(cpus)
        for _ in range(per_cpu)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

"""Start a process tree that can always be found again, and take it down completely.

vLLM's API server forks engine-core and worker processes; stopping only the parent
leaks them. Every tree we start gets its own session (so a terminal's Ctrl-C does not
reach it behind our back and the whole group can be signalled at once) and an
environment tag that its descendants inherit, so that a process which left the group
or was re-parented to init is still found by the final sweep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from pytest_qwenperf.core.apikey import shown_command
from pytest_qwenperf.core.options import format_cpu_list

TAG_ENV = "QWENPERF_PROCESS_TAG"
"""Environment variable that marks every process of a tree started by this package.

Its value is ``<owner pid>-<owner start time>-<random>``: the process that started the
tree, identified so that a recycled pid is not mistaken for it (:func:`leftovers`)."""


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22): exact,
    unlike psutil's ``create_time``, which is derived from a boot time rounded to the second."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def owner_prefix(pid: int | None = None) -> str:
    """Tag prefix shared by every tree started from process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_ticks(pid)}-"


def new_tag() -> str:
    return f"{owner_prefix()}{uuid.uuid4().hex[:12]}"




_LIFELINES: dict[int, int] = {}
"""Owner pid → read end of the pipe every guard watches; the write end never leaves the owner."""
_LIFELINE_LOCK = threading.Lock()


def _lifeline() -> int:
    """The read end of this process's lifeline pipe, made on first use.

    Only this process holds the write end (``os.pipe`` fds are close-on-exec, and
    :func:`spawn_tree` passes the read end alone), so the guards see end-of-file exactly
    when this process is gone. A forked child makes a lifeline of its own.
    """
    pid = os.getpid()
    with _LIFELINE_LOCK:
        if pid not in _LIFELINES:
            read_end, _ = os.pipe()  # the write end stays open, unused, until this process ends
            _LIFELINES[pid] = read_end
        return _LIFELINES[pid]


def spawn_tree(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str],
    tag: str,
    cpus: frozenset[int] = frozenset(),
    scratch: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` under a :mod:`~pytest_qwenperf.serving.guard`, in a new session, with stdout+stderr
    appended to ``log_path``, the whole tree on ``cpus`` (empty: no pinning) and ``scratch``, a
    folder of the tree's own, removed by the guard once the tree is down (None: none).

    The tree dies with this process, even when this process is SIGKILLed. Output goes to a
    file, never to a pipe: nobody would read a pipe and the server would block once it filled.
    """
    watch = _lifeline()
    pin = ["--cpus", format_cpu_list(cpus)] if cpus else []
    remove = ["--remove", str(scratch)] if scratch is not None else []
    guarded = [sys.executable, "-m", "pytest_qwenperf.serving.guard", "--watch-fd", str(watch), *pin, *remove, "--", *argv]
    child_env = {**os.environ, **env, TAG_ENV: tag}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            guarded,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
            pass_fds=(watch,),
        )


def tagged_processes(tag_prefix: str) -> list[psutil.Process]:
    """Live processes of every tree whose tag starts with ``tag_prefix``.

    A process is found by its inherited tag, or by sharing a process group with, or
    descending from, a tagged process: processes that rename themselves with
    ``setproctitle`` (vLLM's engine core does) overwrite the memory that
    ``/proc/PID/environ`` shows, so their tag can no longer be read.
    """
    tagged: list[psutil.Process] = []
    by_group: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter():
        try:
            if not _alive(proc):
                continue
            by_group.setdefault(os.getpgid(proc.pid), []).append(proc)
            tag = proc.environ().get(TAG_ENV)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
            continue
        if tag is not None and tag.startswith(tag_prefix):
            tagged.append(proc)
    found = {p.pid: p for p in tagged}
    for proc in tagged:
        try:
            for member in by_group.get(os.getpgid(proc.pid), []) + proc.children(recursive=True):
                found.setdefault(member.pid, member)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return [p for p in found.values() if _alive(p)]


@dataclass(frozen=True)
class Leftover:
    """A process of a tree whose starter is gone (it died without stopping the tree)."""

    pid: int
    argv: tuple[str, ...]  # as :func:`command_of` shows it
    owner_pid: int  # the process that started the tree
    process: psutil.Process = field(compare=False, repr=False)  # knows its start time: a recycled pid is not it


def _owner(tag: str) -> tuple[int | None, int | None]:
    """(pid, start ticks) of the process named at the head of ``tag`` (see :data:`TAG_ENV`); None where absent."""
    pid, _, rest = tag.partition("-")
    ticks = rest.partition("-")[0]
    return (int(pid) if pid.isdigit() else None), (int(ticks) if ticks.isdigit() else None)


def _owner_alive(tag: str) -> bool:
    """Whether the process named at the head of ``tag`` still runs (the same process, not a recycled pid)."""
    pid, ticks = _owner(tag)
    if pid is None:
        return False
    if ticks is None:  # no start time in the tag: the pid alone decides
        return psutil.pid_exists(pid)
    return _start_ticks(pid) == ticks


def _ours(proc: psutil.Process) -> bool:
    """Started by this user: processes of other users are never touched."""
    try:
        return proc.uids().real == os.getuid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def leftovers() -> list[Leftover]:
    """Processes of this user's trees (by :data:`TAG_ENV`) whose starter has died, with their
    process groups and descendants. Trees of live sessions and untagged processes are left alone."""
    orphaned: set[str] = set()
    for proc in psutil.process_iter():
        try:
            tag = proc.environ().get(TAG_ENV) if _ours(proc) else None
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if tag and not _owner_alive(tag):
            orphaned.add(tag)
    found: dict[int, Leftover] = {}
    for tag in orphaned:
        owner = _owner(tag)[0] or 0
        for proc in tagged_processes(tag):
            if _ours(proc) and proc.pid != os.getpid():
                found.setdefault(proc.pid, Leftover(proc.pid, tuple(command_of(proc)), owner, proc))
    return sorted(found.values(), key=lambda leftover: leftover.pid)


def command_of(proc: psutil.Process) -> list[str]:
    """A process's argv as people know it: a guard shows as ``guard: COMMAND``, without its own options."""
    try:
        argv = proc.cmdline() or [proc.name()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ["?"]
    if "pytest_qwenperf.serving.guard" in argv[:3] and "--" in argv:
        return ["guard:", *argv[argv.index("--") + 1 :]]
    return argv


def stop_leftovers(found: Iterable[Leftover], grace: float = 5.0) -> list[int]:
    """SIGTERM the processes, SIGKILL what is left after ``grace`` s; the pids that survived SIGKILL."""
    procs = {leftover.process for leftover in found}
    signal_each(procs, signal.SIGTERM)
    alive = _wait_gone(procs, grace)
    signal_each(alive, signal.SIGKILL)
    return sorted(p.pid for p in _wait_gone(alive, 10.0))


@dataclass(frozen=True)
class Sweep:
    """What a sweep stopped, one line per process (its key masked), and the pids that survived SIGKILL."""

    stopped: tuple[str, ...]
    survivors: tuple[int, ...] = ()


def stop_orphaned_trees() -> Sweep:
    """Stop the :func:`leftovers` of sessions that died (they would hold the ports, cores or GPUs
    a new session is about to measure with)."""
    found = leftovers()
    if not found:
        return Sweep(())
    survivors = stop_leftovers(found)
    lines = tuple(f"pid {p.pid} (started by pid {p.owner_pid}, gone): {shown_command(p.argv)}" for p in found)
    return Sweep(lines, tuple(survivors))


def kill_own_trees() -> tuple[str, ...]:
    """SIGKILL what still runs of every tree this process started; each as ``pid command`` (key masked).

    Called after everything was stopped in order, so whatever it finds is a process that escaped."""
    found = tagged_processes(owner_prefix())
    described = tuple(f"{p.pid} {shown_command(command_of(p))}" for p in found)
    signal_each(found, signal.SIGKILL)
    return described


def stop_tree(popen: subprocess.Popen[bytes], tag: str, grace: float = 15.0) -> None:
    """SIGTERM the group, wait ``grace`` seconds, SIGKILL everything left; return when all are gone.

    Targets are the session's process group, the current descendants and every
    process carrying ``tag``, looked up again at each step (a dying server may still fork). Raises :class:`RuntimeError` if something survives SIGKILL.
    """
    targets = tree_of(popen.pid, tag)
    _signal_group(popen.pid, signal.SIGTERM)
    signal_each(targets, signal.SIGTERM)
    targets = _wait_gone(targets | tree_of(popen.pid, tag), grace)
    if targets:
        _signal_group(popen.pid, signal.SIGKILL)
        signal_each(targets | tree_of(popen.pid, tag), signal.SIGKILL)
        targets = _wait_gone(targets | tree_of(popen.pid, tag), 10.0)
    popen.wait(timeout=10)
    survivors = _wait_gone(targets | tree_of(popen.pid, tag), 5.0)
    if survivors:
        raise RuntimeError(f"processes survived SIGKILL: {sorted(p.pid for p in survivors)}")


def tree_of(root_pid: int, tag: str, *, group: bool = True) -> set[psutil.Process]:
    """Live processes of the tree: tagged, below the root, or (``group``) in the process
    group the root leads."""
    procs: set[psutil.Process] = set(tagged_processes(tag)) if tag else set()
    if group:
        procs |= _group_members(root_pid)
    try:
        root = psutil.Process(root_pid)
        procs.add(root)
        procs.update(root.children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    return {p for p in procs if _alive(p)}


def _group_members(pgid: int) -> set[psutil.Process]:
    members = set()
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.add(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_each(procs: Iterable[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            proc.send_signal(sig)


def _wait_gone(procs: set[psutil.Process], timeout: float) -> set[psutil.Process]:
    """Wait until every process in ``procs`` has exited (zombies count as exited)."""
    deadline = time.monotonic() + timeout
    alive = {p for p in procs if _alive(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {p for p in alive if _alive(p)}
    return alive

"""``python -m pytest_qwenperf.serving.guard --watch-fd FD [--cpus LIST] [--grace S] [--remove DIR] -- COMMAND...``

The first process of every tree this package starts (a vLLM server, nginx). It runs
COMMAND as its child, in its own session, and does four things a plain ``exec`` cannot:

* **dies with its starter.** FD is the read end of a pipe whose write end only the
  starting process holds (:func:`pytest_qwenperf.serving.proctree.spawn_tree`). When that
  process ends, however it ends (SIGKILL included), the kernel closes the write end, the
  read end reports end-of-file, and the guard takes its whole tree down: SIGTERM to its
  process group, ``--grace`` seconds, then SIGKILL to the group and to every descendant
  and tagged process that left it. ``PR_SET_PDEATHSIG`` cannot do this: it is not
  inherited by the server's own children (vLLM's engine core), and it fires when the
  *thread* that started the child ends (replicas are booted from worker threads);
* **keeps the tag readable.** vLLM's engine core and nginx write their process titles
  over their environment, tag included; the guard's environment stays intact, so the
  tree is always found through it (its members are its descendants and group);
* **pins before the first instruction.** With ``--cpus`` the affinity is set before
  COMMAND starts, so every process it forks inherits it;
* **leaves no files behind.** With ``--remove`` the folder the tree keeps its own files in
  (vLLM's IPC sockets: :attr:`~pytest_qwenperf.serving.process.Launch.scratch_env`) is removed once
  COMMAND has exited or the tree was taken down, so a tree whose starter was SIGKILLed leaves
  nothing in the temporary folder either.

The guard ignores SIGTERM and SIGINT itself: a stop signals the whole group, COMMAND
shuts down, and the guard exits with COMMAND's status (a signal death is re-raised, so
the starter sees the same exit code as if it had started COMMAND directly).
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from pytest_qwenperf.core.options import cpu_list, positive_seconds

if TYPE_CHECKING:
    import psutil

DEFAULT_GRACE_S = 5.0
"""After the starter died: how long the tree may take to shut down before SIGKILL. Short,
because nobody waits for the result any more; GitHub Actions gives a cancelled job 10 s."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pytest_qwenperf.serving.guard", description=__doc__.split("\n\n")[1])
    parser.add_argument("--watch-fd", type=int, required=True, help="read end of the starter's pipe")
    parser.add_argument("--cpus", type=cpu_list, help="run the tree on these CPUs, e.g. 0-3")
    parser.add_argument("--grace", type=positive_seconds, default=DEFAULT_GRACE_S, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--remove", metavar="DIR", help="a folder of the tree's own, removed once the tree is down")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run is required after --")
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"qwenperf guard: cannot start {command[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stay)  # the group's stop signal is for COMMAND; the guard waits for it
    if _wait(child, args.watch_fd):
        _remove(args.remove)
        return _exit_like(child.returncode)
    _take_down(child, args.grace, args.remove)
    return 128 + signal.SIGKILL


def _stay(signum: int, frame: object) -> None:
    """Signals to the group are for COMMAND; the guard outlives them to report its status."""


def _wait(child: subprocess.Popen[bytes], watch_fd: int) -> bool:
    """Wait until ``child`` exits (True) or the starter is gone (False)."""
    try:
        child_fd: int | None = os.pidfd_open(child.pid)
    except (AttributeError, OSError):  # before Linux 5.3: poll the child instead
        child_fd = None
    watched = [watch_fd] + ([child_fd] if child_fd is not None else [])
    while True:
        ready, _, _ = select.select(watched, [], [], 1.0 if child_fd is None else None)
        if child.poll() is not None:
            return True
        if watch_fd in ready and not _read_or_eof(watch_fd):
            return child.poll() is not None


def _read_or_eof(fd: int) -> bool:
    """Drain what the starter wrote (nothing, by design); False at end-of-file."""
    try:
        return os.read(fd, 4096) != b""
    except OSError:
        return False


def _remove(folder: str | None) -> None:
    """The tree's own folder, once nothing of it needs the folder any more."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _take_down(child: subprocess.Popen[bytes], grace: float, folder: str | None) -> None:
    """The starter is gone: stop the tree as :func:`proctree.stop_tree` would, from inside it."""
    from pytest_qwenperf.serving import (
        proctree,  # psutil: only when there is a tree to take down
    )

    tag = os.environ.get(proctree.TAG_ENV, "")
    me = os.getpid()
    leads_group = os.getpgid(0) == me  # started in a session of its own, as spawn_tree does

    def others() -> list[psutil.Process]:
        return [p for p in proctree.tree_of(me, tag, group=leads_group) if p.pid != me]

    members = others()
    proctree.signal_each(members, signal.SIGTERM)
    if leads_group:
        os.killpg(me, signal.SIGTERM)  # the guard's own handler lets it through
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proctree.signal_each(members + others(), signal.SIGKILL)
    _remove(folder)
    if leads_group:
        os.killpg(me, signal.SIGKILL)  # the guard itself last, with the rest of its group


def _exit_like(returncode: int) -> int:
    """COMMAND's exit status as the guard's own; a signal death is re-raised on the guard."""
    if returncode >= 0:
        return returncode
    sig = -returncode
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig  # only if the signal did not end the guard (it is blocked or ignored)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

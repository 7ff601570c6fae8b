"""Start a process tree that can always be found again, and take it down completely.

vLLM's API server forks engine-core and worker processes; stopping only the parent
leaks them. Every tree we start gets its own session (so a terminal's Ctrl-C does not
reach it behind our back and the whole group can be signalled at once) and an
environment tag that its descendants inherit, so that a process which left the group
or was re-parented to init is still found by the final sweep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

TAG_ENV = "QWENPERF_PROCESS_TAG"
"""Environment variable that marks every process of a tree started by this package."""


def owner_prefix() -> str:
    """Tag prefix shared by every tree started from this (Python) process."""
    return f"{os.getpid()}-"


def new_tag() -> str:
    return f"{owner_prefix()}{uuid.uuid4().hex[:12]}"


def spawn_tree(
    argv: Sequence[str], *, log_path: Path, env: Mapping[str, str], tag: str
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout+stderr appended to ``log_path``.

    Output goes to a file, never to a pipe: nobody would read a pipe and the server
    would block once it filled.
    """
    child_env = {**os.environ, **env, TAG_ENV: tag}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
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


def stop_tree(popen: subprocess.Popen[bytes], tag: str, grace: float = 15.0) -> None:
    """SIGTERM the group, wait ``grace`` seconds, SIGKILL everything left; return when all are gone.

    Targets are the session's process group, the current descendants and every
    process carrying ``tag``, looked up again at each step (a dying server may still fork). Raises :class:`RuntimeError` if something survives SIGKILL.
    """
    targets = _tree(popen.pid, tag)
    _signal_group(popen.pid, signal.SIGTERM)
    _signal_each(targets, signal.SIGTERM)
    targets = _wait_gone(targets | _tree(popen.pid, tag), grace)
    if targets:
        _signal_group(popen.pid, signal.SIGKILL)
        _signal_each(targets | _tree(popen.pid, tag), signal.SIGKILL)
        targets = _wait_gone(targets | _tree(popen.pid, tag), 10.0)
    popen.wait(timeout=10)
    survivors = _wait_gone(targets | _tree(popen.pid, tag), 5.0)
    if survivors:
        raise RuntimeError(f"processes survived SIGKILL: {sorted(p.pid for p in survivors)}")


def _tree(root_pid: int, tag: str) -> set[psutil.Process]:
    """Live processes of the tree: tagged, in the root's process group, or below the root."""
    procs: set[psutil.Process] = set(tagged_processes(tag)) | _group_members(root_pid)
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
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_each(procs: Iterable[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass


def _wait_gone(procs: set[psutil.Process], timeout: float) -> set[psutil.Process]:
    """Wait until every process in ``procs`` has exited (zombies count as exited)."""
    deadline = time.monotonic() + timeout
    alive = {p for p in procs if _alive(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {p for p in alive if _alive(p)}
    return alive

"""A server's boot as it goes: what the readiness loop tells an observer, with no terminal here.

:class:`~pytest_qwenperf.serving.server.ManagedServer` takes one optional :class:`BootWatch` (an
observer and the config it boots) and tells it, from the loop that polls the readiness probe (no
thread of its own), how long the boot has taken, what it waits for and the server log's last line;
then once that the server is ready. The pool hands every server it boots the observer of its
settings (:class:`~pytest_qwenperf.serving.pool.PoolSettings`); the pytest plugin's observer words
it as status lines (``plugin/progress.py``), a script may pass its own or none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TAIL_BYTES = 4096
"""How much of a log's end :func:`last_line` reads: a vLLM line is well under this."""


class BootProgress(Protocol):
    """What sees servers boot. Calls come from the thread that waits for the server (a pool of
    replicas boots each on a thread of its own, so calls may come from several), between two
    readiness probes: an observer must be quick and, for replicas, thread-safe."""

    def waiting(self, config_key: str, elapsed_s: float, phase: str, last_log_line: str | None) -> None:
        """The server of ``config_key`` is not ready ``elapsed_s`` seconds after its start:
        ``phase`` says what it waits for (``waiting for /health``), ``last_log_line`` is the last
        line its log holds (None: nothing yet)."""

    def booted(self, config_key: str, elapsed_s: float) -> None:
        """The server of ``config_key`` became ready ``elapsed_s`` seconds after its start."""


@dataclass(frozen=True)
class BootWatch:
    """An observer and the name of the boot it is told about (a config's key; a replica's adds ``-r<i>``)."""

    progress: BootProgress
    config_key: str

    def waiting(self, elapsed_s: float, reason: str, log_path: Path | None) -> None:
        """The readiness probe said ``reason`` (it is not ready) ``elapsed_s`` seconds into the boot."""
        self.progress.waiting(self.config_key, elapsed_s, phase_of(reason), last_line(log_path))

    def booted(self, elapsed_s: float) -> None:
        self.progress.booted(self.config_key, elapsed_s)

    def replica(self, index: int) -> BootWatch:
        """The watch of replica ``index`` of the config (named as its server and log are)."""
        return BootWatch(self.progress, f"{self.config_key}-r{index}")


def phase_of(reason: str) -> str:
    """What a boot waits for, from the readiness probe's reason
    (:func:`~pytest_qwenperf.serving.server.probe_ready`): ``/health`` until it answers 200 (a
    refused connection included: the API server is not listening yet), then the model on ``/v1/models``."""
    if reason.startswith("/v1/models"):
        return "waiting for the model on /v1/models"
    return "waiting for /health"


def last_line(path: Path | None, tail_bytes: int = TAIL_BYTES) -> str | None:
    """The last non-empty line of the file at ``path`` (None: no file, or nothing in it yet),
    read from its last ``tail_bytes`` bytes alone, so a long log costs what a short one does. A
    line longer than that comes cut at its start."""
    if path is None:
        return None
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - tail_bytes))
            tail = log.read(tail_bytes)
    except OSError:
        return None
    # vLLM's progress bars redraw with \r; the latest state is what follows the last one
    lines = [next((part.strip() for part in reversed(line.split("\r")) if part.strip()), "") for line in tail.decode(errors="replace").split("\n")]
    return next((line for line in reversed(lines) if line), None)

"""A real Ray cluster on this machine for the tests: a head node and a second node that joins it,
each ``ray start --block`` under the package's own process lifecycle
(:class:`~pytest_qwenperf.serving.process.ManagedProcess`: its whole tree dies with the test
session, even a SIGKILLed one), each with a raylet of its own.

Both nodes listen on loopback ports chosen when they start (the head's GCS on a free port, every
other port random), write under one short temporary folder (Ray's socket paths must stay short),
keep no dashboard and send no usage statistics. A node is ready once its log says that its Ray
runtime started.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.serving.process import Launch, ManagedProcess, ProcessSpec

STARTED = "Ray runtime started"
"""What ``ray start`` prints once its node is up."""
OBJECT_STORE_BYTES = 100 * 1024 * 1024
"""Each node's object store: records and shares are small, and the default takes 30 % of the memory."""


class RayUnavailable(RuntimeError):
    """Ray is not installed here; the message says how to install it."""


@dataclass
class RayCluster:
    """A running head and a second node; ``address`` is what a driver joins (``host:port``)."""

    head: ManagedProcess
    node: ManagedProcess
    folder: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.head.port}"

    def stop(self) -> None:
        try:
            self.node.stop()
        finally:
            try:
                self.head.stop()
            finally:
                shutil.rmtree(self.folder, ignore_errors=True)


def ray_command() -> str:
    """The ``ray`` command of this interpreter's environment."""
    found = Path(sys.executable).with_name("ray")
    if not found.exists():
        raise RayUnavailable("the Ray tests need the ray package in this environment: pip install 'pytest-qwenperf[ray]'")
    return str(found)


def _node(name: str, folder: Path, argv: list[str]) -> ManagedProcess:
    """Start ``ray start --block`` with ``argv`` added (``{port}`` in it: the port the process is given)."""
    log = folder / f"{name}.log"

    def probe() -> str | None:
        text = log.read_text(errors="replace") if log.exists() else ""
        return None if STARTED in text else f"{log} does not say {STARTED!r} yet"

    def launch(port: int) -> Launch:
        common = ["--block", "--disable-usage-stats", f"--object-store-memory={OBJECT_STORE_BYTES}", "--num-cpus=2"]
        common += ["--min-worker-port=0", "--max-worker-port=0"]
        env = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        return Launch((ray_command(), "start", *common, *(a.format(port=port) for a in argv)), log, env)

    process = ManagedProcess(ProcessSpec(
        f"Ray {name}", probe, lambda code, after: f"ray start ({name}) exited with {code} after {after:.1f} s",
        host="127.0.0.1", port=None, ready_timeout_s=120, poll_interval_s=0.5,
    ))  # fmt: skip
    process.start(launch)
    return process


def start_ray_cluster() -> RayCluster:
    """A head node on a free port and a second node joined to it, both ready."""
    folder = Path(tempfile.mkdtemp(prefix="qwenperf-ray-", dir="/tmp"))
    try:
        head = _node("head", folder, ["--head", "--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                                      f"--temp-dir={folder / 'ray'}"])  # fmt: skip
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        node = _node("node", folder, [f"--address=127.0.0.1:{head.port}", "--node-ip-address=127.0.0.1"])
    except BaseException:
        head.stop()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return RayCluster(head, node, folder)


def ray_processes() -> list[int]:
    """The pids of every live Ray process of this machine's clusters (raylets, GCS servers, agents,
    workers); a zombie, dead and waiting for its parent to reap it, is none."""
    import psutil

    names = ("raylet", "gcs_server", "ray::", "default_worker.py", "ray_client_server")
    found = []
    for proc in psutil.process_iter(["cmdline", "name", "status"]):
        line = " ".join(proc.info["cmdline"] or []) or (proc.info["name"] or "")
        if any(name in line for name in names) and proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found

"""A launcher that runs another launcher's server slowed by a known amount: inside a cgroup whose
CFS quota allows ``--cores`` CPUs (:mod:`benchmarks.cpu_cgroup`).

It is a candidate for ``--qwenperf-candidate`` (or a "release" for a history) that is slower
than the reference by a controlled amount, without changing vLLM::

    pytest perf_tests -m cpu --qwenperf-candidate \
        "python -m benchmarks.quota_launcher --cores 0.9 -- python -m vllm.entrypoints.openai.api_server"

Everything after ``--`` is the launcher to run, followed by what the plugin appends (the model,
the port, the config's flags). This process moves itself into the group first, so the server
and every process it starts are born there; it passes SIGTERM and SIGINT on to the server,
waits for it, removes the group and exits with the server's status. The quota is a share of
whole CPUs, not of what the server would use: the slowdown it gives depends on how busy the
server is, so measure it (the reference's and the candidate's throughput side by side).
Needs root, or a delegated cgroup.

``--after-ready`` holds the quota back until the server answers ``GET /health`` on the
``--port`` it was given: the boot runs at full speed (under half a core a boot of the tiny model
took 46 s against 29 s) and what is measured, which starts after the boot, is slowed alike.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

import psutil

from benchmarks.cpu_cgroup import CGROUP_ROOT, CgroupError, CpuCgroup
from pytest_qwenperf.core.http import http_get

PERIOD_US = 10_000
"""A 10 ms period: throttled stretches shorter than an engine step, so the quota reads as a slower CPU."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=float, required=True, help="CPU time the server's tree may use, in CPUs (e.g. 0.9)")
    parser.add_argument("--period-us", type=int, default=PERIOD_US, help=f"CFS period (default {PERIOD_US})")
    parser.add_argument(
        "--after-ready", action="store_true", help="set the quota once the server answers /health on its --port, not before its boot"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launcher and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("expected the launcher to run after --")
    if not args.cores > 0:
        parser.error(f"--cores: expected a positive number of CPUs, got {args.cores}")
    port = _port(command) if args.after_ready else None
    if args.after_ready and port is None:
        parser.error("--after-ready: expected --port PORT in the launcher's command, to know when the server is ready")
    try:
        cgroup = CpuCgroup.create(args.period_us, root=CGROUP_ROOT)
    except CgroupError as exc:
        print(f"quota_launcher: {exc}", file=sys.stderr)
        return 2
    quota = round(args.cores * args.period_us)
    with cgroup:
        if port is None:
            cgroup.set_quota(quota)
        cgroup.adopt([psutil.Process()])
        server = subprocess.Popen(command)
        if port is not None:
            threading.Thread(target=_quota_when_ready, args=(cgroup, quota, port, server), daemon=True).start()

        def pass_on(signum: int, frame: FrameType | None) -> None:
            server.send_signal(signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, pass_on)
        status = server.wait()
    return status


def _port(command: list[str]) -> int | None:
    """The port the launcher's command serves on (``--port N`` or ``--port=N``), None without one."""
    for arg, following in zip(command, [*command[1:], ""], strict=True):
        value = following if arg == "--port" else arg.removeprefix("--port=") if arg.startswith("--port=") else ""
        if value.isdigit():
            return int(value)
    return None


def _quota_when_ready(cgroup: CpuCgroup, quota: int, port: int, server: subprocess.Popen[bytes]) -> None:
    """Set ``quota`` once the server on ``port`` answers ``/health`` (none if it exits first)."""
    while server.poll() is None:
        try:
            status, _ = http_get(f"http://127.0.0.1:{port}/health", timeout=1)
        except OSError:  # not listening yet (URLError is one)
            status = None
        if status == 200:
            cgroup.set_quota(quota)
            return
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())

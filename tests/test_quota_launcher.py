"""benchmarks/quota_launcher.py's command line (the cgroup itself is tested on fake trees in
tests/test_cpu_cgroup.py, and used for real in the benchmarks)."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from benchmarks import quota_launcher
from benchmarks.cpu_cgroup import CpuCgroup


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cores", "0.9"], "expected the launcher to run after --"),
        (["--cores", "0.9", "--"], "expected the launcher to run after --"),
        (["--cores", "0", "--", "true"], "--cores: expected a positive number of CPUs, got 0.0"),
    ],
)
def test_bad_command_lines_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        quota_launcher.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_machine_without_the_cpu_controller_is_a_clear_error_and_nothing_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(quota_launcher, "CGROUP_ROOT", tmp_path)  # a tree with no controller mounted
    marker = tmp_path / "ran"
    assert quota_launcher.main(["--cores", "0.5", "--", "touch", str(marker)]) == 2
    assert f"{tmp_path / 'cpu'}: no cgroup v1 cpu controller" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize(
    ("command", "port"),
    [
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--port", "8123"], 8123),
        (["vllm", "serve", "m", "--port=9000", "--dtype", "bfloat16"], 9000),
        (["vllm", "serve", "m", "--port"], None),
        (["vllm", "serve", "m"], None),
    ],
)
def test_the_port_is_read_from_the_launchers_command(command: list[str], port: int | None) -> None:
    assert quota_launcher._port(command) == port


def test_after_ready_without_a_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        quota_launcher.main(["--cores", "0.5", "--after-ready", "--", "vllm", "serve", "m"])
    assert exit_info.value.code == 2
    assert "--after-ready: expected --port PORT in the launcher's command" in capsys.readouterr().err


class _Health(http.server.BaseHTTPRequestHandler):
    ready = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200 if self.ready.is_set() and self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_after_ready_the_quota_is_set_once_the_server_answers_health(tmp_path: Path) -> None:
    """On a fake cgroup v1 tree, with a real HTTP server: no quota while /health says 503, the
    quota once it says 200."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    cgroup = CpuCgroup.create(10_000, root=tmp_path)
    quota = cgroup.path / "cpu.cfs_quota_us"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        waiter = threading.Thread(target=quota_launcher._quota_when_ready, args=(cgroup, 5_000, server.server_port, child))
        waiter.start()
        waiter.join(0.6)  # three polls answered 503
        assert waiter.is_alive() and quota.read_text() == "-1"
        _Health.ready.set()
        waiter.join(10)
        assert not waiter.is_alive() and quota.read_text() == "5000"
    finally:
        child.kill()
        child.wait()
        server.shutdown()
        _Health.ready.clear()


def test_after_ready_gives_up_when_the_server_exits_before_it_is_ready(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    cgroup = CpuCgroup.create(10_000, root=tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    quota_launcher._quota_when_ready(cgroup, 5_000, 9, child)  # port 9 (discard): nothing answers
    assert (cgroup.path / "cpu.cfs_quota_us").read_text() == "-1"

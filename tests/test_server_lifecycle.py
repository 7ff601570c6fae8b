"""Lifecycle of managed servers with real processes and sockets, using the stand-in launcher
where vLLM cannot be made to misbehave on purpose."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from pytest_qwenperf.serving import process, proctree
from pytest_qwenperf.serving.process import PortInUseError, ServerBootError, ServerError
from pytest_qwenperf.serving.server import ExternalServer, ManagedServer, ServerSpec
from tests.processes import alive

STANDIN = (sys.executable, str(Path(__file__).parent / "standins" / "openai_standin.py"))


def standin_spec(*flags: str, **overrides: object) -> ServerSpec:
    return ServerSpec(model="standin-model", launcher=STANDIN, args=flags, boot_timeout_s=30, stop_grace_s=2, **overrides)


def _pids(pid_file: Path) -> list[int]:
    return [int(line) for line in pid_file.read_text().split()]


def test_ready_server_records_version_and_cache_config(tmp_path: Path) -> None:
    with ManagedServer(standin_spec(served_model_name="alias"), tmp_path) as srv:
        (info,) = srv.info
        assert info.model == "alias"
        assert info.version == "0.0.0-standin"
        assert info.max_model_len == 2048
        assert dict(info.cache_config) == {"block_size": "16"}
        assert srv.log_path is not None and "--served-model-name" in srv.log_path.read_text()
    assert not srv.is_alive()


def test_not_ready_until_models_endpoint_answers(tmp_path: Path) -> None:
    started = time.monotonic()
    with ManagedServer(standin_spec("--ready-after", "1.5"), tmp_path):
        assert time.monotonic() - started >= 1.5


def test_stubborn_tree_is_fully_reaped(tmp_path: Path) -> None:
    """Children and grandchildren ignore SIGTERM and the grandchildren leave the process group."""
    pid_file = tmp_path / "pids"
    srv = ManagedServer(
        standin_spec("--children", "2", "--ignore-sigterm", "--escape-group", "--pid-file", str(pid_file)), tmp_path
    )
    srv.start()
    pids = _pids(pid_file)
    assert len(pids) == 5 and all(alive(pid) for pid in pids)
    escaped = [pid for pid in pids if os.getsid(pid) != os.getsid(pids[0])]
    assert len(escaped) == 2, "the grandchildren should have left the server's session"
    srv.stop()
    assert [pid for pid in pids if alive(pid)] == []


def test_exit_during_boot_fails_at_once_with_the_error_line(tmp_path: Path) -> None:
    spec = standin_spec("--exit-during-boot", "3")
    started = time.monotonic()
    with pytest.raises(ServerBootError) as excinfo:
        ManagedServer(spec, tmp_path).start()
    assert time.monotonic() - started < spec.boot_timeout_s / 2  # at the exit (about 1 s with 4 busy loops), not at the timeout
    message = str(excinfo.value)
    assert "exited with code 3" in message
    assert "ValueError: stand-in asked to fail during boot" in message.splitlines()[0]


def test_boot_timeout_names_the_last_probe_and_stops_the_tree(tmp_path: Path) -> None:
    """The stand-in must be answering (503) before the timeout: about 0.6 s after the start with
    four busy loops on a 2-core machine, so the timeout is 8 times that."""
    pid_file = tmp_path / "pids"
    spec = ServerSpec(
        model="m", launcher=STANDIN, args=("--ready-after", "60", "--pid-file", str(pid_file)), boot_timeout_s=5, stop_grace_s=2
    )
    with pytest.raises(ServerBootError, match=r"not ready after 5 s \(last probe: /health returned 503\)"):
        ManagedServer(spec, tmp_path).start()
    assert not any(alive(pid) for pid in _pids(pid_file))


def test_requested_port_in_use_is_reported_with_its_owner(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=rf"port {port} on 127.0.0.1 is already in use by pid \d+"):
            ManagedServer(standin_spec(port=port), tmp_path).start()


def test_auto_port_taken_meanwhile_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chosen port is grabbed by someone else before the server binds it: pick another."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], process.free_port()])
        monkeypatch.setattr(process, "free_port", lambda host: next(ports))
        with ManagedServer(standin_spec(), tmp_path) as srv:
            assert srv.port != taken.getsockname()[1]
            assert len(list(tmp_path.glob("vllm*.log"))) == 2, "one log per attempt, none overwritten"


def test_external_server_waits_and_manages_nothing(tmp_path: Path) -> None:
    with ManagedServer(standin_spec(), tmp_path) as srv:
        ext = ExternalServer((srv.base_url + "/",), boot_timeout_s=5).wait_ready()
        assert ext.base_urls == (srv.base_url,)
        assert ext.model == "standin-model"
        assert ext.info[0].version == "0.0.0-standin"
        assert srv.is_alive()


def test_external_server_not_ready_names_the_endpoint() -> None:
    port = process.free_port()
    with pytest.raises(ServerError, match=rf"http://127.0.0.1:{port}: ConnectionRefusedError"):
        ExternalServer((f"http://127.0.0.1:{port}",), boot_timeout_s=1).wait_ready()


def test_tagged_processes_finds_only_our_tree(tmp_path: Path) -> None:
    with ManagedServer(standin_spec("--children", "1"), tmp_path) as srv:
        found = {p.pid for p in proctree.tagged_processes(srv.tag)}
        assert srv.pid in found and len(found) == 4  # guard, server, child, grandchild
    assert proctree.tagged_processes(srv.tag) == []


def test_pinned_server_tree_runs_only_on_its_cpus(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    cpu = max(os.sched_getaffinity(0))
    with ManagedServer(standin_spec("--children", "1", "--pid-file", str(pid_file), cpus=frozenset({cpu})), tmp_path) as srv:
        pids = _pids(pid_file)
        assert psutil.Process(pids[0]).ppid() == srv.pid, "the server runs under its guard"
        tree = [srv.pid, *pids]
        assert {pid: psutil.Process(pid).cpu_affinity() for pid in tree} == {pid: [cpu] for pid in tree}

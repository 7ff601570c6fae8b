"""Boots that fail, with the real vLLM (CPU build): fail fast, with vLLM's own error line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pytest_qwenperf.serving.process import ServerBootError
from pytest_qwenperf.serving.server import ManagedServer, ServerSpec
from pytest_qwenperf.suite.embedded import resolve_model
from tests.e2e.tiny import TINY

pytestmark = pytest.mark.e2e


def _boot_failure(spec: ServerSpec, log_dir: Path) -> tuple[str, float]:
    """Start ``spec``, expect a boot error; return its message and seconds since the log last changed.

    Failing fast means at vLLM's exit (a few seconds after its last log line, while it shuts
    down), not at the 600 s boot timeout: the tests allow a quarter of the timeout, which no
    amount of load on the machine stretches a shutdown to, and which a failure seen only at
    the timeout would be far beyond.
    """
    server = ManagedServer(spec, log_dir)
    with pytest.raises(ServerBootError) as excinfo:
        server.start()
    assert server.log_path is not None
    since_last_log_line = time.time() - server.log_path.stat().st_mtime
    assert not server.is_alive()
    return str(excinfo.value), since_last_log_line


def test_bad_model_path_fails_with_vllms_error(tmp_path: Path) -> None:
    spec = ServerSpec(model=str(tmp_path / "no-such-model"), env=TINY.env, boot_timeout_s=600)
    message, lag = _boot_failure(spec, tmp_path)
    headline = message.splitlines()[0]
    assert "exited with code 1" in headline
    assert "no-such-model" in headline, "the headline should carry vLLM's error line"
    assert lag < spec.boot_timeout_s / 4


def test_unknown_flag_fails_with_argparse_error(tmp_path: Path) -> None:
    spec = ServerSpec(model=resolve_model(TINY.model), args=("--no-such-flag",), env=TINY.env, boot_timeout_s=600)
    message, lag = _boot_failure(spec, tmp_path)
    assert "exited with code 2" in message.splitlines()[0]
    assert "unrecognized arguments: --no-such-flag" in message.splitlines()[0]
    assert lag < spec.boot_timeout_s / 4

"""Ctrl-C in the middle of a session with a real vLLM server leaves no process behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_qwenperf.serving import proctree
from tests.processes import alive, end_inner_session, interruptible, wait_for_tree

pytestmark = pytest.mark.e2e


def test_sigint_while_a_server_runs_leaves_no_process(pytester: pytest.Pytester, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    pytester.makepyfile(
        test_hold=f"""
import time, pytest
from pytest_qwenperf.suite.config import tiny_cpu_config
TINY = tiny_cpu_config("interrupted", ("--enforce-eager",))
@pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])
def test_hold(vllm_server):
    open({str(ready)!r}, "w").write("up")
    time.sleep(600)
"""
    )
    with open(tmp_path / "inner.out", "w") as out:
        inner = pytester.popen(interruptible([sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]), stdout=out, stderr=out)
    try:
        tree = wait_for_tree(inner, ready, timeout=600)
        assert any("EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM") for p in tree), [
            p.cmdline() for p in tree
        ]
        inner.send_signal(signal.SIGINT)
        try:
            code = inner.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
        assert code == pytest.ExitCode.INTERRUPTED, f"exit {code}; the inner session said:\n{(tmp_path / 'inner.out').read_text()[-3000:]}"
    finally:
        end_inner_session(inner)
    output = (tmp_path / "inner.out").read_text()
    assert "KeyboardInterrupt" in output
    assert [p.pid for p in tree if alive(p)] == []
    assert proctree.tagged_processes(f"{inner.pid}-") == []

"""The gate is light: comparing two result files loads no server, load-generator or telemetry
code and none of the heavy libraries, checked in a fresh interpreter as a user's command would run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.test_baseline import make_run
from tests.test_compare import session_file

HEAVY_LIBRARIES = ("numpy", "psutil", "tokenizers", "safetensors", "aiohttp", "torch", "vllm")
HEAVY_LAYERS = ("serving", "loadgen", "telemetry", "measure", "suite")


def _loaded_by(code: str) -> list[str]:
    """Every module a fresh interpreter has loaded after ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout.splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return sorted(
        name
        for name in modules
        if name.split(".")[0] in HEAVY_LIBRARIES
        or any(name.startswith(f"pytest_qwenperf.{layer}") for layer in HEAVY_LAYERS)
    )


def test_importing_the_gate_loads_nothing_heavy() -> None:
    loaded = _loaded_by("import pytest_qwenperf.gate.baseline, pytest_qwenperf.gate.judge, pytest_qwenperf.gate.compare")
    assert "pytest_qwenperf.gate.compare" in loaded
    assert _heavy(loaded) == []


def test_qwenperf_compare_loads_nothing_heavy(tmp_path: Path) -> None:
    before = session_file(tmp_path / "before.json", [make_run()])
    after = session_file(tmp_path / "after.json", [make_run()])
    code = (
        "from pytest_qwenperf.cli.main import main\n"
        f"status = main(['compare', {str(before)!r}, {str(after)!r}, '--fail-on', 'regression'])\n"
        "assert status == 0, status"
    )
    loaded = _loaded_by(code)
    assert "pytest_qwenperf.gate.compare" in loaded
    assert _heavy(loaded) == []


def test_the_check_sees_a_heavy_import() -> None:
    """The probe itself works: the load generator's client is heavy and is seen as such."""
    assert "pytest_qwenperf.loadgen.client" in _heavy(_loaded_by("import pytest_qwenperf.loadgen.client"))

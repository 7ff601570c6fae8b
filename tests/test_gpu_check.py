"""``scripts/gpu-check`` on a machine without a GPU: it says so and exits 2, having written nothing.

What it proves on a GPU is recorded in benchmarks/README.md ("GPU path, measured"); here only its
refusal can be checked, through a ``pynvml`` that cannot reach a GPU in each way NVML reports it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"
NO_DRIVER = """
class NVMLError(Exception):
    pass

def nvmlInit():
    raise NVMLError("Driver Not Loaded")
"""
NO_DEVICE = """
class NVMLError(Exception):
    pass

def nvmlInit():
    pass

def nvmlDeviceGetCount():
    return 0
"""


@pytest.mark.parametrize(
    ("pynvml", "why"),
    [
        (None, "nvidia-ml-py is not installed for this Python"),
        (NO_DRIVER, "NVML did not start: Driver Not Loaded"),
        (NO_DEVICE, "NVML lists no GPU"),
    ],
)
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path: Path, pynvml: str | None, why: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    if pynvml is not None:
        (site / "pynvml.py").write_text(pynvml)
    else:
        (site / "pynvml.py").write_text("raise ImportError('no nvidia-ml-py here')\n")
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"gpu-check: no NVIDIA GPU found ({why}): nothing to prove here\n"
    assert not out.exists()


def test_it_needs_exactly_one_outdir(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 64 and "usage: bash scripts/gpu-check OUTDIR" in result.stderr

"""The installed ``qwenperf`` console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QWENPERF = str(Path(sys.executable).parent / "qwenperf")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QWENPERF, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_tiny_model_into_a_folder_is_byte_identical_twice(tmp_path: Path) -> None:
    for name in ("a", "b"):
        done = run_cli("tiny-model", str(tmp_path / name))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(tmp_path / name)
    files_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= set(files_a)
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_tiny_model_without_a_folder_uses_the_cache(tmp_path: Path) -> None:
    first = run_cli("tiny-model", env={"QWENPERF_CACHE": str(tmp_path)})
    assert first.returncode == 0, first.stderr
    folder = Path(first.stdout.strip())
    assert folder.parent == tmp_path and (folder / "config.json").is_file()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    again = run_cli("tiny-model", env={"QWENPERF_CACHE": str(tmp_path)})
    assert Path(again.stdout.strip()) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime, "the cached model must be reused"


def test_unknown_command_is_a_usage_error() -> None:
    done = run_cli("no-such-command")
    assert done.returncode == 2
    assert "invalid choice: 'no-such-command'" in done.stderr

"""vLLM's cache folder for booted servers (``--qwenperf-vllm-cache``), and the boot seconds a pool keeps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.suite.config import ServingConfig

STANDIN = Path(__file__).parent / "standins" / "openai_standin.py"


def _launcher(seen: Path) -> tuple[str, ...]:
    """The stand-in server, started by a shell that first writes down the VLLM_CACHE_ROOT it was given."""
    script = f'printf "%s" "${{VLLM_CACHE_ROOT-unset}}" > {seen}; exec {sys.executable} {STANDIN} "$@"'
    return ("sh", "-c", script, "sh")


CONFIG = ServingConfig(id="base", model="standin-model", vllm_args=("--ready-after", "0.5"), suite="standin")


def test_a_pool_gives_its_servers_the_cache_folder_and_keeps_their_boot_seconds(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    cache = tmp_path / "vllm-cache"
    pool = ServerPool(PoolSettings(log_dir=tmp_path / "logs", launcher=_launcher(seen), boot_timeout_s=30, vllm_cache=cache))
    try:
        pool.get(CONFIG)
    finally:
        pool.close()
    assert seen.read_text() == str(cache.resolve())
    assert pool.boot_seconds["standin/base"] >= 0.5  # the stand-in is ready half a second after its start


def test_without_the_option_the_server_keeps_vllms_own_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    seen = tmp_path / "seen"
    pool = ServerPool(PoolSettings(log_dir=tmp_path / "logs", launcher=_launcher(seen), boot_timeout_s=30))
    try:
        pool.get(CONFIG)
    finally:
        pool.close()
    assert seen.read_text() == "unset"


def test_the_cache_option_and_its_ini_key_reach_the_settings(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nqwenperf_vllm_cache = from-ini\n")
    pytester.makeconftest(
        """
from pytest_qwenperf.plugin.settings import SETTINGS_KEY

def pytest_report_header(config):
    return f"cache: {config.stash[SETTINGS_KEY].vllm_cache}"
"""
    )
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    pytester.runpytest_subprocess().stdout.fnmatch_lines(["cache: from-ini"])
    pytester.runpytest_subprocess("--qwenperf-vllm-cache=from-option").stdout.fnmatch_lines(["cache: from-option"])

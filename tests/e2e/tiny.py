"""The serving config and a streamed request shared by the end-to-end tests (real vLLM, CPU build)."""

from __future__ import annotations

import json

import aiohttp

from pytest_qwenperf.suite.config import tiny_cpu_config

TINY = tiny_cpu_config("e2e-tiny")


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

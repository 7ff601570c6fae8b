"""The correctness canary: a fixed set of prompts sent greedy, and what the server answered.

Every prompt goes at once (the server batches them, as it batches a load), greedy
(``temperature`` 0) with a fixed seed, at most :data:`MAX_TOKENS` tokens, and without
``ignore_eos``: a model that now stops earlier or later has changed its output. The requests are
plain ``/v1/completions`` calls of their own, sent before or after a measurement, never inside
one, so they count in no throughput figure.

The output token ids come from ``return_token_ids`` (vLLM's OpenAI server answers with
``choices[0].token_ids``); the chosen tokens' log-probabilities from ``logprobs: 0``
(``choices[0].logprobs.token_logprobs``), where the server returns them. A server that does not
return token ids fails the canary with what it answered: text alone cannot be compared exactly.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.canary import CANARY, EXACT, Canary, CanaryFloor, CanaryOutput, definition_digest, fingerprint
from pytest_qwenperf.core.http import http_post_json
from pytest_qwenperf.core.identity import Identity, argv_digest
from pytest_qwenperf.core.run import context_of
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import ServingConfig

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The three primary colours are",
    "Once upon a time, in a small village,",
    "To sort a list in Python, you can",
    "The speed of light in a vacuum is",
    "A haiku about autumn:",
)
"""Fixed prompts: short, varied, and for any tokenizer (the server tokenizes them)."""

MAX_TOKENS = 32
SEED = 0


class CanaryError(Exception):
    """A canary request the server refused, or answered without token ids."""


def _body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": SEED,
        "logprobs": 0,
        "return_token_ids": True,
    }


def _output(prompt: str, status: int, raw: bytes) -> CanaryOutput:
    try:
        answer = json.loads(raw)
    except json.JSONDecodeError:
        answer = None
    if status != 200 or not isinstance(answer, dict):
        raise CanaryError(f"canary prompt {prompt!r}: HTTP {status}: {raw[:300]!r}")
    (choice,) = answer.get("choices") or [{}]
    token_ids = choice.get("token_ids")
    if not isinstance(token_ids, list):
        raise CanaryError(f"canary prompt {prompt!r}: the answer has no token_ids (a vLLM that predates return_token_ids?)")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    return CanaryOutput(
        token_ids=tuple(int(t) for t in token_ids),
        logprobs=tuple(float(v) for v in logprobs if v is not None),
        text=str(choice.get("text") or ""),
    )


def ask(
    base_url: str,
    model: str,
    *,
    prompts: Sequence[str] = PROMPTS,
    max_tokens: int = MAX_TOKENS,
    api_key: ApiKey | None = None,
    timeout_s: float = 300.0,
) -> tuple[CanaryOutput, ...]:
    """Send every prompt at once and return the answers in prompt order."""

    def send(prompt: str) -> CanaryOutput:
        status, raw = http_post_json(f"{base_url}/v1/completions", _body(model, prompt, max_tokens), timeout=timeout_s, api_key=api_key)
        return _output(prompt, status, raw)

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return tuple(pool.map(send, prompts))


def canary_of(
    server: Server,
    config: ServingConfig,
    *,
    suite: str,
    floor: CanaryFloor = EXACT,
    api_key: ApiKey | None = None,
    max_tokens: int = MAX_TOKENS,
) -> Canary:
    """``config``'s answer to the canary from its running ``server`` (the first replica's), identified
    as a run of ``config`` from ``suite`` is, with the canary as its workload; ``floor``: the suite's
    for another session's answer, carried with it as runs carry their tolerances."""
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    outputs = ask(server.base_urls[0], server.model, max_tokens=max_tokens, api_key=api_key)
    hardware = detect()
    identity = Identity(
        hardware=hardware.id,
        model=config.model,
        suite=suite,
        config=config.id,
        argv_sha256=argv_digest(config.vllm_args),
        workload=CANARY,
        workload_fingerprint=definition_digest(PROMPTS, max_tokens),
    )
    version = server.info[0].version if server.info else None
    context = context_of(version, hardware.machine(), started)
    return Canary(
        identity=identity,
        context=context,
        prompts=PROMPTS,
        max_tokens=max_tokens,
        outputs=outputs,
        fingerprint=fingerprint(outputs),
        floor=floor,
    )

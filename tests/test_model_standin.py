"""The model stand-in (tests/standins/model_vllm.py) on this machine's CPU, with the tiny model.

It stands in for vLLM on the GPU check machine, where vLLM cannot be installed, so it must look
like vLLM to every part of the plugin that talks to a server: the managed-server lifecycle and
its readiness probe, ``describe`` (``/version``, ``/v1/models``, ``/metrics``, ``/server_info``
and the boot log), the load generator's streaming client, the ``/metrics`` cross-check and the
canary. One server per module (booting loads torch and the model), started and stopped by the
project's own :class:`ManagedServer`, which leaves no process behind however a test ends.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.http import http_get, http_post_json
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.client import run_load_sync
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.measure import canary
from pytest_qwenperf.serving.server import ManagedServer, ServerSpec
from pytest_qwenperf.serving.sleep import Turns
from pytest_qwenperf.suite.tiny_model import ensure_tiny_model
from pytest_qwenperf.suite.workloads import RandomWorkload
from pytest_qwenperf.telemetry.server_metrics import counter_deltas, metric_families, page_text, scrape

STANDIN = (sys.executable, str(Path(__file__).parent / "standins" / "model_vllm.py"), "--device", "cpu")
NAME = "tiny"
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 16
IGNORED = (
    "--enable-prefix-caching",
    "--kv-cache-dtype=fp8",
    "--speculative-config",
    '{"method": "ngram", "num_speculative_tokens": 2}',
)


def _spec(model: Path, **overrides: Any) -> ServerSpec:
    flags = ("--max-num-seqs", str(MAX_NUM_SEQS), "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0", *IGNORED)
    return ServerSpec(
        model=str(model), launcher=STANDIN, served_model_name=NAME, args=flags, boot_timeout_s=120, stop_grace_s=10, **overrides
    )


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def server(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    with ManagedServer(_spec(tiny), tmp_path_factory.mktemp("model-standin")) as srv:
        yield srv


def _complete(url: str, prompt: list[int] | str, api_key: ApiKey | None = None, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {"model": NAME, "prompt": prompt, "max_tokens": 8, "logprobs": 0, "return_token_ids": True, **fields}
    status, raw = http_post_json(f"{url}/v1/completions", body, timeout=60, api_key=api_key)
    return status, json.loads(raw)


def _choice(url: str, prompt: list[int] | str, **fields: Any) -> dict[str, Any]:
    status, answer = _complete(url, prompt, **fields)
    assert status == 200, answer
    choice: dict[str, Any] = answer["choices"][0]
    assert answer["usage"]["completion_tokens"] == len(choice["token_ids"])
    return choice


def _success(url: str, reason: str) -> float:
    _, body = http_get(f"{url}/metrics")
    for family in metric_families(page_text(body)):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total" and sample.labels.get("finished_reason") == reason:
                return sample.value
    raise AssertionError(f"no vllm:request_success_total{{finished_reason={reason!r}}}")


def test_describe_reads_it_as_a_vllm_server(server: ManagedServer, tiny: Path) -> None:
    (info,) = server.info
    assert (info.model, info.version, info.max_model_len, info.root) == (NAME, "0.0.0+standin", MAX_MODEL_LEN, str(tiny))
    assert info.unreadable == ()
    assert info.engine_config is not None and "max_seq_len=512" in info.engine_config
    assert info.kv_capacity is not None and info.kv_capacity.tokens == MAX_NUM_SEQS * MAX_MODEL_LEN
    assert dict(info.cache_config) == {"cache_dtype": "float32"}
    env = info.environment  # /server_info, through the project's own parser
    assert env is not None
    assert (env.vllm_version, env.torch) == ("0.0.0+standin", importlib.metadata.version("torch"))
    assert env.engine["scheduler_config.max_num_seqs"] == str(MAX_NUM_SEQS)
    assert env.engine["model_config.max_model_len"] == str(MAX_MODEL_LEN)
    assert env.engine["device_config.device"] == '"cpu"'
    assert env.engine["ignored_args.enable-prefix-caching"] == "true"
    assert env.engine["ignored_args.kv-cache-dtype"] == '"fp8"'
    assert json.loads(json.loads(env.engine["ignored_args.speculative-config"])) == {
        "method": "ngram",
        "num_speculative_tokens": 2,
    }
    assert http_get(f"{server.base_url}/health")[0] == 200


def test_closed_loop_run_every_token_counted_once(server: ManagedServer, tiny: Path) -> None:
    """32 requests at concurrency 8 through the project's load generator: each gets exactly its
    max_tokens, and the server's token counters grew by exactly the usage it returned."""
    workload = RandomWorkload(input_len=48, output_len=16, num_prompts=32, range_ratio=0.5, seed=3)
    requests = workload.build(PromptTokenizer.load(tiny))
    assert len({len(r.prompt) for r in requests}) > 1 and len({r.max_tokens for r in requests}) > 1  # padding, rows ending early
    before = scrape([server.base_url])
    load = run_load_sync([server.base_url], NAME, requests, ClosedLoop(8), LoadOptions(timeout_s=120))
    deltas = counter_deltas(before, scrape([server.base_url]))
    records = sorted(load.records, key=lambda r: r.index)
    assert [(r.status, r.error) for r in records] == [(200, None)] * len(requests)
    assert [r.prompt_tokens for r in records] == [len(r.prompt) for r in requests]
    assert [r.completion_tokens for r in records] == [r.max_tokens for r in requests]
    assert all(set(r.chunk_tokens) == {1} and len(r.chunk_tokens) == r.completion_tokens for r in records)
    assert deltas["prompt_tokens"] == sum(r.prompt_tokens for r in records)
    assert deltas["generation_tokens"] == sum(r.completion_tokens for r in records)
    assert deltas["request_success"] == len(records)


def test_greedy_output_is_the_same_alone_and_in_a_batch(server: ManagedServer, tiny: Path) -> None:
    """Each prompt alone, then the four in one wave (queued together behind a long request):
    left padding must change neither the tokens nor, beyond float error, their log-probs."""
    tokenizer = PromptTokenizer.load(tiny)
    prompts = [tokenizer.encode(text * repeat) for text, repeat in zip(canary.PROMPTS, (1, 3, 7, 12), strict=False)]
    assert len({len(p) for p in prompts}) == 4
    alone = [_choice(server.base_url, p, max_tokens=12, ignore_eos=True) for p in prompts]
    blocker = threading.Thread(target=_choice, args=(server.base_url, [5, 6, 7]), kwargs={"max_tokens": MAX_MODEL_LEN - 3})
    blocker.start()
    try:
        while scrape([server.base_url])["num_requests_running"] != 1:
            assert blocker.is_alive(), "the long request finished before it was seen running"
            time.sleep(0.005)
        with ThreadPoolExecutor(4) as pool:
            batched = [pool.submit(_choice, server.base_url, p, max_tokens=12, ignore_eos=True) for p in prompts]
            waited_together = False
            while blocker.is_alive() and not waited_together:
                waited_together = scrape([server.base_url])["num_requests_waiting"] == len(prompts)
                time.sleep(0.005)
            together = [future.result() for future in batched]
    finally:
        blocker.join()
    assert waited_together, "the four prompts were never queued together behind the long request"
    for one, other in zip(alone, together, strict=True):
        assert one["token_ids"] == other["token_ids"]
        assert one["logprobs"]["token_logprobs"] == pytest.approx(other["logprobs"]["token_logprobs"], abs=1e-4)


def test_eos_stops_unless_ignored_or_too_early(server: ManagedServer, tiny: Path) -> None:
    eos = json.loads((tiny / "config.json").read_text())["eos_token_id"]
    url = server.base_url
    with ThreadPoolExecutor(8) as pool:  # a one-token prompt whose greedy answer is EOS at once
        firsts = pool.map(lambda t: (t, _choice(url, [t], max_tokens=1)["token_ids"]), range(3, 512))
        prompt = next(([t] for t, ids in firsts if ids == [eos]), None)
    assert prompt is not None, "no one-token prompt makes the tiny model answer EOS first"
    stops = _success(url, "stop")
    stopped = _choice(url, prompt, max_tokens=8)
    assert (stopped["finish_reason"], stopped["token_ids"], stopped["text"]) == ("stop", [eos], "")
    assert _success(url, "stop") == stops + 1
    ignored = _choice(url, prompt, max_tokens=4, ignore_eos=True)
    assert (ignored["finish_reason"], len(ignored["token_ids"]), ignored["token_ids"][0]) == ("length", 4, eos)
    late = _choice(url, prompt, max_tokens=6, min_tokens=3)
    assert len(late["token_ids"]) >= 3 and eos not in late["token_ids"][:3]


def test_stream_has_vllms_layout_and_cumulative_usage(server: ManagedServer, tiny: Path) -> None:
    prompt = "The speed of light in a vacuum is"
    options = {"include_usage": True, "continuous_usage_stats": True}
    status, raw = http_post_json(
        f"{server.base_url}/v1/completions",
        {"model": NAME, "prompt": prompt, "max_tokens": 12, "ignore_eos": True, "stream": True, "stream_options": options},
    )
    assert status == 200
    events = [event.removeprefix("data: ") for event in raw.decode().split("\n\n") if event]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    *tokens, final = chunks
    n_prompt = len(PromptTokenizer.load(tiny).encode(prompt))
    assert all(list(chunk) == ["id", "object", "created", "model", "choices", "usage"] for chunk in chunks)
    assert [c["usage"]["completion_tokens"] for c in tokens] == list(range(1, 13))
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {n_prompt}
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 11 + ["length"]
    assert final["choices"] == [] and final["usage"] == {
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + 12,
        "completion_tokens": 12,
    }
    whole = _choice(server.base_url, prompt, max_tokens=12, ignore_eos=True)
    assert "".join(c["choices"][0]["text"] for c in tokens) == whole["text"]

    status, raw = http_post_json(
        f"{server.base_url}/v1/completions",
        {
            "model": NAME,
            "prompt": prompt,
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    usages = [json.loads(e[6:]).get("usage") for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    assert usages[:-1] == [None] * 3 and usages[-1]["completion_tokens"] == 3  # usage only at the end


def test_chat_streams_through_the_load_generator(server: ManagedServer) -> None:
    requests = [RequestSpec(index=i, max_tokens=6, api="chat", messages=(("user", f"hello world {i}"),)) for i in range(3)]
    load = run_load_sync([server.base_url], NAME, requests, ClosedLoop(3), LoadOptions(timeout_s=60))
    assert [(r.status, r.error, r.completion_tokens) for r in load.records] == [(200, None, 6)] * 3


def test_canary_reads_its_answers(server: ManagedServer) -> None:
    outputs = canary.ask(server.base_url, NAME, prompts=canary.PROMPTS[:4], max_tokens=8)
    assert all(len(o.token_ids) == len(o.logprobs) and 1 <= len(o.token_ids) <= 8 for o in outputs)
    assert all(value <= 0.0 for o in outputs for value in o.logprobs)
    again = canary.ask(server.base_url, NAME, prompts=canary.PROMPTS[:4], max_tokens=8)
    assert [o.token_ids for o in again] == [o.token_ids for o in outputs]
    assert [o.logprobs for o in again] == [pytest.approx(o.logprobs, abs=1e-4) for o in outputs]  # other batch companions


def test_refuses_like_vllm(server: ManagedServer) -> None:
    url = server.base_url
    status, answer = _complete(url, [5, 6, 7], model="not-served")
    assert (status, answer["error"]["type"], answer["error"]["code"]) == (404, "NotFoundError", 404)
    assert answer["error"]["message"] == "The model `not-served` does not exist."
    status, answer = _complete(url, [5] * (MAX_MODEL_LEN - 10), max_tokens=16)
    assert (status, answer["error"]["type"]) == (400, "BadRequestError")
    assert "maximum context length is 512 tokens" in answer["error"]["message"]
    status, answer = _complete(url, [5] * MAX_MODEL_LEN)
    assert status == 400 and "512 input tokens" in answer["error"]["message"]
    status, answer = _complete(url, [5, 100_000])
    assert status == 400 and "out of vocabulary" in answer["error"]["message"]
    wrong = run_load_sync([url], "not-served", [RequestSpec(index=0, max_tokens=4, prompt=(5, 6))], ClosedLoop(1))
    assert [(r.status, r.error) for r in wrong.records] == [(404, "The model `not-served` does not exist.")]


def test_api_key_guards_v1_and_sigterm_stops_it(tiny: Path, tmp_path: Path) -> None:
    key = ApiKey("stand-in-key", "test")
    with ManagedServer(_spec(tiny, api_key=key), tmp_path) as srv:  # the key reaches it as VLLM_API_KEY
        url = srv.base_url
        status, body = http_get(f"{url}/v1/models")
        assert (status, json.loads(body)) == (401, {"error": "Unauthorized"})
        assert http_get(f"{url}/v1/models", api_key=key)[0] == 200
        assert _complete(url, [5, 6, 7])[0] == 401
        assert _complete(url, [5, 6, 7], api_key=ApiKey("another", "test"))[0] == 401
        assert _complete(url, [5, 6, 7], api_key=key)[0] == 200
        assert [http_get(f"{url}{path}")[0] for path in ("/health", "/version", "/metrics")] == [200] * 3
        log = srv.log_path
    assert log is not None and log.read_text().rstrip().endswith("stopped")  # it left by its handler, not SIGKILL


def test_in_sleep_mode_it_sleeps_refuses_requests_and_wakes_to_the_same_answers(tiny: Path, tmp_path: Path) -> None:
    """Taking turns (serving.sleep.Turns) on the model stand-in: asleep, its weights are off the device
    and a request gets 503; awake again, it answers as before (greedy decoding, the same weights)."""
    spec = _spec(tiny)
    with ManagedServer(dataclasses.replace(spec, args=(*spec.args, "--enable-sleep-mode")), tmp_path) as srv:
        before = _choice(srv.base_url, [5, 6, 7])["token_ids"]
        turns = Turns()
        turns.join(srv)
        turns.rest()
        status, answer = _complete(srv.base_url, [5, 6, 7])
        assert status == 503 and "asleep" in answer["error"]["message"], answer
        turns.take(srv)
        assert _choice(srv.base_url, [5, 6, 7])["token_ids"] == before
        assert (turns.counts.sleeps, turns.counts.wakes) == (1, 1)
        log = srv.log_path.read_text() if srv.log_path else ""
        assert "seconds to fall asleep" in log and "seconds to wake up" in log

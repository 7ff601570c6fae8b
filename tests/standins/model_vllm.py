"""A stand-in launcher for vLLM that serves a real Qwen3-architecture model with transformers and torch.

Why: the GPU check machine has one NVIDIA GPU, torch with CUDA, transformers, aiohttp and
tokenizers, but no vLLM (it cannot be installed there) and no network. This launcher takes
vLLM's command line and serves its OpenAI endpoints from a real model on that GPU (or the CPU),
so the plugin's whole GPU path (boot, readiness, load, ``/metrics``, NVML, ``/server_info``,
canary) runs end to end. It is not vLLM: its speed says nothing about vLLM's.

``model_vllm.py [--device D] [--dtype T] --model FOLDER --host H --port P [vLLM flags ...]``

* Own options: ``--device`` (default ``cuda`` where torch sees a GPU, else ``cpu``) and
  ``--dtype`` (vLLM's flag and spelling; ``auto``: bfloat16 on CUDA, float32 on CPU).
  Needs transformers 4.51 or later (Qwen3).
* vLLM flags honoured: ``--model`` (a local Hugging Face folder with ``config.json``,
  ``tokenizer.json`` and safetensors weights), ``--served-model-name``, ``--host``, ``--port``,
  ``--max-num-seqs`` (most sequences decoded at once, default 256), ``--max-model-len`` (default:
  the config's ``max_position_embeddings``; longer requests get vLLM's 400), ``--seed`` (seeds
  torch; decoding is greedy) and ``--api-key`` (else a non-empty ``VLLM_API_KEY``: ``/v1/*``
  then needs ``Authorization: Bearer KEY``, else 401). Every other flag (``--flag value``,
  ``--flag=value``, bare booleans, JSON values) is accepted, ignored and listed in
  ``/server_info`` under ``vllm_config.ignored_args``.
* Decoding is greedy (argmax), whatever the sampling fields say, with one choice per request;
  ``max_tokens`` (default 16), ``min_tokens`` and ``ignore_eos`` are honoured, otherwise a request
  stops at the config's ``eos_token_id`` (counted, as vLLM counts it); ``stop`` strings are ignored.
  A background thread owns the model and decodes in static waves: it takes up to max-num-seqs
  waiting requests (those arriving within :data:`GATHER_S` of the first), left-pads them into one
  batch, prefills, then decodes with the KV cache, one host sync per step for the whole batch.
  Requests that arrive meanwhile wait for the next wave; rows that finished early keep computing
  padding until the wave ends. A failing forward pass ends the process, as a dead vLLM engine does.
  ``vllm:kv_cache_usage_perc`` is the share of max-num-seqs × max-model-len held by running requests,
  and the boot log states that product as the KV cache size, in vLLM's words.
* Endpoints: ``GET /health``, ``/version``, ``/v1/models``, ``/metrics`` (vLLM's token counters,
  request successes, scheduler gauges and ``vllm:cache_config_info``), ``/server_info`` (the
  shape of vLLM's dev-mode answer: torch's environment report and the resolved config),
  ``POST /reset_prefix_cache`` (there is no prefix cache: always done), ``/v1/completions``
  (prompt as token ids or text; streamed in vLLM's SSE layout with ``stream_options``, or whole
  with ``return_token_ids`` and ``logprobs``: the chosen token's only) and ``/v1/chat/completions`` (the messages'
  contents joined by newlines and tokenized: no chat template).
* Sleep mode (``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``, as vLLM wants both):
  ``POST /sleep?level=N`` waits for the running wave to end, moves the weights to CPU RAM and
  empties torch's CUDA cache, so NVML sees the memory freed (any level keeps the weights: there is
  no reload); ``POST /wake_up`` moves them back; ``GET /is_sleeping``. A request sent while asleep
  gets 503. The log says how long each took.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from aiohttp import web
from packaging.version import Version
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from tokenizers import Tokenizer

VERSION = "0.0.0+standin"
GATHER_S = 0.005
"""How long a wave waits for more requests after its first: a closed loop's replacements arrive
within a few milliseconds of each other, and without it waves would alternate between halves."""
DTYPES = {
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}
Step = tuple[int, float | None, str | None]  # a token id, its log-prob (if asked for), the finish reason of the last one


def log(message: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [model_vllm.py] {message}", flush=True)


@dataclass(eq=False)
class Request:
    """One sequence to decode; the engine thread puts its :data:`Step` s on ``steps`` (through the loop)."""

    prompt: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    logprobs: bool
    steps: asyncio.Queue[Step] = field(default_factory=asyncio.Queue)
    cancelled: bool = False  # the client has gone: the engine drops it


class Engine:
    """The model and the thread that decodes waves of waiting requests."""

    def __init__(self, model: Any, eos: Sequence[int], max_num_seqs: int) -> None:
        self.model, self.max_num_seqs = model, max_num_seqs
        self.device = next(model.parameters()).device
        self.eos = frozenset(eos)
        self.eos_ids = torch.tensor(sorted(eos), dtype=torch.long, device=self.device)
        self.waiting: queue.Queue[Request] = queue.Queue()
        self.running = 0
        self.kv_tokens = 0  # prompt and output tokens of the running requests
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.loop: asyncio.AbstractEventLoop  # the server's, set by start()
        self.awake = threading.Event()  # cleared while asleep: the thread takes no wave
        self.awake.set()
        self.idle = threading.Lock()  # held while a wave decodes

    def move(self, device: torch.device | str) -> float:
        """Move the weights to ``device`` between waves (the CPU to sleep, :attr:`device` to wake); the seconds it took."""
        started = time.monotonic()
        with self.idle:
            self.model.to(device)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
        return time.monotonic() - started

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                if not self.awake.wait(timeout=0.1):
                    continue  # asleep: what waits stays queued until the weights are back
                try:
                    wave = [self.waiting.get(timeout=0.1)]
                except queue.Empty:
                    continue
                until = time.monotonic() + GATHER_S
                while len(wave) < self.max_num_seqs:
                    try:
                        wave.append(self.waiting.get(timeout=max(0.0, until - time.monotonic())))
                    except queue.Empty:
                        break
                wave = [r for r in wave if not r.cancelled]
                if wave:
                    with self.idle:
                        self._decode(wave)
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    @torch.inference_mode()
    def _decode(self, wave: list[Request]) -> None:
        width = max(len(r.prompt) for r in wave)
        ids = torch.zeros((len(wave), width), dtype=torch.long)
        mask = torch.zeros((len(wave), width), dtype=torch.long)
        for row, r in enumerate(wave):
            ids[row, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[row, width - len(r.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generated = [0] * len(wave)
        live = [True] * len(wave)
        want_logprobs = any(r.logprobs for r in wave)
        past = None
        self.running = len(wave)
        while any(live) and not self.stopping.is_set():
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=past, use_cache=True, logits_to_keep=1
            )
            past, logits = out.past_key_values, out.logits[:, -1].float()
            scores = logits.log_softmax(-1) if want_logprobs else None  # as vLLM: of the model's logits, before min_tokens
            banned = [row for row, r in enumerate(wave) if live[row] and generated[row] < r.min_tokens]
            if banned:
                logits[torch.tensor(banned, device=self.device)[:, None], self.eos_ids] = -math.inf
            chosen = logits.argmax(-1)
            tokens = chosen.tolist()  # the step's one host sync
            logprobs = scores.gather(1, chosen[:, None])[:, 0].tolist() if scores is not None else None
            steps: list[tuple[Request, Step]] = []
            for row, r in enumerate(wave):
                if not live[row] or r.cancelled:
                    live[row] = False
                    continue
                generated[row] += 1
                token = tokens[row]
                stop = token in self.eos and not r.ignore_eos
                reason = "stop" if stop else "length" if generated[row] >= r.max_tokens else None
                live[row] = reason is None
                steps.append((r, (token, logprobs[row] if logprobs and r.logprobs else None, reason)))
            self.running = sum(live)
            self.kv_tokens = sum(len(r.prompt) + generated[row] for row, r in enumerate(wave) if live[row])
            self.loop.call_soon_threadsafe(_deliver, steps)
            ids = chosen[:, None]
            mask = torch.cat((mask, mask.new_ones((len(wave), 1))), dim=1)
            positions = positions[:, -1:] + 1
        self.running = self.kv_tokens = 0


def _deliver(steps: list[tuple[Request, Step]]) -> None:
    for request, step in steps:
        request.steps.put_nowait(step)


class Metrics:
    """vLLM's Prometheus families, labelled ``{model_name, engine="0"}``; tokens count when they are sent."""

    def __init__(self, model_name: str, engine: Engine, capacity: int, cache_dtype: str) -> None:
        self.registry = CollectorRegistry()
        labels, values = ("model_name", "engine"), (model_name, "0")

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, (*labels, *extra), registry=self.registry)

        def gauge(name: str, doc: str, read: Any) -> None:
            Gauge(name, doc, labels, registry=self.registry).labels(*values).set_function(read)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*values)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(*values)
        success = counter("vllm:request_success", "Count of successfully processed requests.", "finished_reason")
        self.success = {reason: success.labels(*values, reason) for reason in ("stop", "length")}
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lambda: engine.running)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", engine.waiting.qsize)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lambda: engine.kv_tokens / capacity)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("engine", "cache_dtype"),
            registry=self.registry,
        )
        info.labels("0", cache_dtype).set(1)


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}}, status=status)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


class StandIn:
    """The HTTP side: validates requests, hands them to the engine, streams or returns what it decodes."""

    def __init__(self, args: argparse.Namespace, ignored: dict[str, str | bool]) -> None:
        folder = Path(args.model)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        dtype = DTYPES.get(args.dtype) or (torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
        torch.manual_seed(args.seed)
        dtype_kwarg = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, **{dtype_kwarg: dtype}).to(args.device).eval()
        config = model.config
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = (
            args.max_model_len if (args.max_model_len or 0) > 0 else int(config.max_position_embeddings)
        )  # -1: auto
        self.names = args.served_model_name or [args.model]
        self.root = str(folder)
        self.engine = Engine(model, [t for t in eos if t is not None], args.max_num_seqs)
        capacity = args.max_num_seqs * self.max_model_len
        self.metrics = Metrics(self.names[0], self.engine, capacity, str(dtype).removeprefix("torch."))
        keys = args.api_key or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else [])
        self.bearers = {f"Bearer {key}" for key in keys}
        self.sleep_mode = args.enable_sleep_mode and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        self.config = {
            "model_config": {
                "model": self.root,
                "served_model_name": self.names[0],
                "max_model_len": self.max_model_len,
                "dtype": str(dtype),
                "seed": args.seed,
            },
            "scheduler_config": {"max_num_seqs": args.max_num_seqs},
            "device_config": {"device": args.device},
            "ignored_args": ignored,
        }
        self.system_env: dict[str, Any] | None = None
        # vLLM's boot lines that the plugin reads (engine config, KV capacity: here the most the batch may hold)
        settings = f"model={self.root!r}, dtype={dtype}, max_seq_len={self.max_model_len}, device={args.device}"
        log(f"Initializing a V1 LLM engine ({VERSION}) with config: {settings}")
        per_request = f"Maximum concurrency for {self.max_model_len:,} tokens per request: {args.max_num_seqs:.2f}x"
        log(f"{'GPU' if args.device.startswith('cuda') else 'CPU'} KV cache size: {capacity:,} tokens, {per_request}")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._ok)
        app.router.add_get("/version", self._version)
        app.router.add_post("/reset_prefix_cache", self._ok)  # there is no prefix cache: always reset
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        if self.sleep_mode:
            app.router.add_post("/sleep", self._sleep)
            app.router.add_post("/wake_up", self._wake_up)
            app.router.add_get("/is_sleeping", self._is_sleeping)
        return app

    async def _sleep(self, request: web.Request) -> web.Response:
        level = int(request.query.get("level", "1"))
        if self.engine.awake.is_set():
            self.engine.awake.clear()
            took = await asyncio.get_running_loop().run_in_executor(None, self.engine.move, "cpu")
            log(f"It took {took:.6f} seconds to fall asleep (level {level}; the weights are in CPU RAM)")
        return web.json_response({"status": "sleeping", "level": level})

    async def _wake_up(self, _: web.Request) -> web.Response:
        if not self.engine.awake.is_set():
            took = await asyncio.get_running_loop().run_in_executor(None, self.engine.move, self.engine.device)
            self.engine.awake.set()
            log(f"It took {took:.6f} seconds to wake up")
        return web.json_response({"status": "awake", "tags": None})

    async def _is_sleeping(self, _: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": not self.engine.awake.is_set()})

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """As vLLM: with a key, paths under ``/v1`` need it (``OPTIONS`` never does)."""
        guarded = self.bearers and request.path.startswith("/v1") and request.method != "OPTIONS"
        if guarded and request.headers.get("Authorization") not in self.bearers:
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _ok(self, _: web.Request) -> web.Response:
        return web.Response()

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _server_info(self, _: web.Request) -> web.Response:
        """vLLM's dev-mode answer: ``system_env`` is torch's environment report (what ``vllm collect-env`` extends)."""
        if self.system_env is None:
            from torch.utils import collect_env

            report = await asyncio.get_running_loop().run_in_executor(None, collect_env.get_env_info)
            build = f"stand-in: transformers {transformers.__version__}, torch {torch.__version__}"
            self.system_env = {**report._asdict(), "vllm_version": VERSION, "vllm_build_flags": build}
        return web.json_response({"vllm_config": self.config, "system_env": self.system_env})

    async def _models(self, _: web.Request) -> web.Response:
        card = {"object": "model", "created": int(time.time()), "owned_by": "vllm", "root": self.root, "parent": None}
        data = [{"id": name, **card, "max_model_len": self.max_model_len} for name in self.names]
        return web.json_response({"object": "list", "data": data})

    def _prompt(self, body: dict[str, Any], chat: bool) -> list[int] | str:
        """The prompt's token ids, or why it cannot be used."""
        prompt = body.get("prompt")
        if chat:
            prompt = "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False).ids
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
            return list(prompt) if bad is None else f"Token id {bad} is out of vocabulary"
        return "prompt must be a string or a non-empty list of token ids (the stand-in takes one prompt per request)"

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON", "BadRequestError")
        if body.get("model") not in self.names:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
        if not self.engine.awake.is_set():
            return _error(503, "the engine is asleep", "ServiceUnavailableError")
        chat = request.path.endswith("/chat/completions")
        prompt = self._prompt(body, chat)
        if isinstance(prompt, str):
            return _error(400, prompt, "BadRequestError")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is None:  # vLLM's defaults
            max_tokens = self.max_model_len - len(prompt) if chat else 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, f"max_tokens must be at least 1, got {max_tokens}", "BadRequestError", "max_tokens")
        if len(prompt) >= self.max_model_len:
            message = f"This model's maximum context length is {self.max_model_len} tokens. However, your request has {len(prompt)} input tokens. Please reduce the length of the input messages."
            return _error(400, message, "BadRequestError")
        if len(prompt) + max_tokens > self.max_model_len:
            message = (
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context length is "
                f"{self.max_model_len} tokens and your request has {len(prompt)} input tokens ({max_tokens} > {self.max_model_len} - {len(prompt)})."
            )
            return _error(400, message, "BadRequestError")
        logprobs = not chat and body.get("logprobs") is not None
        job = Request(prompt, max_tokens, int(body.get("min_tokens") or 0), bool(body.get("ignore_eos")), logprobs)
        self.engine.waiting.put(job)
        kind = "chatcmpl" if chat else "cmpl"
        head = {"id": f"{kind}-{uuid.uuid4().hex}", "object": "", "created": int(time.time()), "model": body["model"]}
        try:
            if body.get("stream"):
                return await self._stream(request, job, head, chat, body.get("stream_options") or {})
            return await self._whole(job, head, chat, bool(body.get("return_token_ids")))
        finally:
            job.cancelled = True  # a no-op once finished; frees the slot of a client that has gone

    async def _outputs(self, job: Request) -> AsyncIterator[tuple[int, float | None, str, str | None]]:
        """Each step with its new text, counted as it is handed out. Byte-level pieces of a character
        give empty text until the character is complete."""
        ids: list[int] = []
        shown = 0
        while True:
            token, logprob, reason = await job.steps.get()
            if not ids:
                self.metrics.prompt_tokens.inc(len(job.prompt))
            ids.append(token)
            self.metrics.generation_tokens.inc()
            text = self.tokenizer.decode(ids[shown:])
            if text.endswith("\ufffd") and reason is None:
                text = ""
            else:
                shown = len(ids)
            if reason is not None:
                self.metrics.success[reason].inc()
            yield token, logprob, text, reason
            if reason is not None:
                return

    async def _stream(
        self, request: web.Request, job: Request, head: dict[str, Any], chat: bool, options: dict[str, Any]
    ) -> web.StreamResponse:
        """vLLM's SSE layout: one chunk per token (cumulative usage in each with ``continuous_usage_stats``),
        a usage chunk without choices (``include_usage``), then ``[DONE]``."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head["object"] = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))

        def event(choices: list[dict[str, Any]], completion: int, usage: bool) -> bytes:
            chunk = {**head, "choices": choices, **({"usage": _usage(len(job.prompt), completion)} if usage else {})}
            return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

        async def events() -> AsyncIterator[bytes]:
            if chat:
                role = {"role": "assistant", "content": ""}
                yield event([{"index": 0, "delta": role, "logprobs": None, "finish_reason": None}], 0, continuous)
            completion = 0
            async for _, _, text, reason in self._outputs(job):
                completion += 1
                if chat:
                    choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": reason}
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
                yield event([choice], completion, continuous)
            if include_usage:
                yield event([], completion, True)
            yield b"data: [DONE]\n\n"

        try:
            async for data in events():
                await response.write(data)
            await response.write_eof()
        except ConnectionResetError:  # the client left mid-stream; the caller frees its slot
            pass
        return response

    async def _whole(self, job: Request, head: dict[str, Any], chat: bool, token_ids: bool) -> web.Response:
        """The non-streamed answer; ``logprobs`` in vLLM's completion layout (the chosen token's only)."""
        steps = [step async for step in self._outputs(job)]
        ids = [token for token, _, _, _ in steps]
        text, reason = "".join(text for _, _, text, _ in steps), steps[-1][3]
        usage = {**_usage(len(job.prompt), len(ids)), "prompt_tokens_details": None}
        end = {"finish_reason": reason, "stop_reason": None}
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, **end}
            return web.json_response({**head, "object": "chat.completion", "choices": [choice], "usage": usage})
        logprobs = None
        if job.logprobs:
            pieces = [self.tokenizer.decode([token], skip_special_tokens=False) for token in ids]
            offsets = list(itertools.accumulate((len(p) for p in pieces), initial=0))[:-1]
            values = [logprob for _, logprob, _, _ in steps]
            top = [{piece: value} for piece, value in zip(pieces, values, strict=True)]
            logprobs = {"text_offset": offsets, "token_logprobs": values, "tokens": pieces, "top_logprobs": top}
        choice = {"index": 0, "text": text, "logprobs": logprobs, **end, "prompt_logprobs": None}
        if token_ids:
            choice |= {"prompt_token_ids": job.prompt, "token_ids": ids}
        return web.json_response({**head, "object": "text_completion", "choices": [choice], "usage": usage})


def ignored_flags(rest: Sequence[str]) -> dict[str, str | bool]:
    """The flags not honoured, by name: ``--a=b`` and ``--a b`` give ``"b"``, a bare ``--a`` gives True."""
    flags: dict[str, str | bool] = {}
    k = 0
    while k < len(rest):
        name, eq, value = rest[k].partition("=")
        takes_next = not eq and k + 1 < len(rest) and not rest[k + 1].startswith("--")
        flags[name.lstrip("-")] = value if eq else rest[k + 1] if takes_next else True
        k += 2 if takes_next else 1
    return flags


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, dict[str, str | bool]]:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    parser.add_argument("--device", default="cuda" if cuda else "cpu", help="torch device (default: %(default)s)")
    parser.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="auto: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder")
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", nargs="+")
    parser.add_argument("--enable-sleep-mode", action="store_true")
    args, rest = parser.parse_known_args(argv)
    return args, ignored_flags(rest)


async def serve(standin: StandIn, args: argparse.Namespace) -> None:
    """Listen until SIGTERM or SIGINT, then stop the engine."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    standin.engine.start(loop)
    runner = web.AppRunner(standin.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port, backlog=1024).start()
    log(f"serving {standin.names[0]} on http://{args.host}:{args.port}; Application startup complete.")
    await stop.wait()
    log("shutting down")
    standin.engine.stopping.set()
    await runner.cleanup()
    await loop.run_in_executor(None, standin.engine.thread.join, 5.0)
    log("stopped")


def main() -> None:
    args, ignored = parse_args(sys.argv[1:])
    standin = StandIn(args, ignored)  # before listening: a ready port means a loaded model (signals kill it meanwhile)
    asyncio.run(serve(standin, args))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # tearing down torch and transformers takes the interpreter seconds; there is nothing left to do


if __name__ == "__main__":
    main()

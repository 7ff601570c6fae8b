"""What ``qwenperf bench``'s command line asks for, as a :class:`~pytest_qwenperf.measure.bench.BenchPlan`:
the servers (ready, one model), the workload and its requests (each within the servers' context),
the arrival, the load's options and the SLO, and the first request sent once, as ``vllm bench
serve`` does. Whatever cannot work is a :class:`BenchError` naming the flag, before the run."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence

from pytest_qwenperf.core.apikey import ApiKey, ApiKeyError, resolve_api_key
from pytest_qwenperf.core.summary import GoodputSLO
from pytest_qwenperf.loadgen.arrivals import Arrival, ClosedLoop, Distribution, OpenLoop, Replay
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.client import run_load_sync
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.measure.bench import BenchPlan
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.serving.server import ServerAuthError, ServerInfo, describe, probe_ready
from pytest_qwenperf.suite.workloads import Workload, workload_from_dict

DEFAULT_OUTPUT_LEN = 128  # vllm bench serve's --random-output-len default
DEFAULT_PROMPTS = 1000  # vllm bench serve's --num-prompts default


class BenchError(Exception):
    """A run that cannot start or cannot be trusted, with what to fix."""


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    """What the command line asks for, checked against the servers before anything is measured."""
    if args.ray is not None and args.client_cpus:
        raise BenchError("--client-cpus pins a client on this machine; with --ray the workers run on the cluster's nodes, one CPU each")
    try:
        api_key = resolve_api_key(args.api_key, os.environ)
    except ApiKeyError as exc:
        raise BenchError(str(exc)) from None
    servers = _servers(args.endpoint, args.model, api_key)
    chosen = workload(args, servers)
    tokenizer = _tokenizer(args.tokenizer, servers[0], needed=chosen.kind in ("random", "shared-prefix"))
    try:
        requests = chosen.build(tokenizer)
    except (ValueError, OSError) as exc:
        raise BenchError(f"cannot build the {chosen.kind} workload: {exc}") from None
    if args.warmup >= len(requests):
        raise BenchError(f"--warmup {args.warmup}: {args.dataset_name} dataset has only {len(requests)} requests")
    _check_lengths(requests, servers, tokenizer)
    plan = BenchPlan(
        servers=servers,
        workload=chosen,
        requests=requests,
        arrival=arrival(args, len(requests) - args.warmup),
        options=LoadOptions(
            warmup=args.warmup,
            duration_s=args.duration,
            window=args.window,
            timeout_s=args.timeout,
            continuous_usage=args.continuous_usage,
            api_key=api_key,
        ),
        slo=_slo(args.goodput),
        client=ClientSetup(cpus=args.client_cpus or frozenset(), workers=args.workers, ray=args.ray),
    )
    _check_first_request(plan)
    return plan


def _servers(endpoints: Sequence[str], model: str | None, api_key: ApiKey | None) -> tuple[ServerInfo, ...]:
    try:
        unreachable = [(url, reason) for url in endpoints if (reason := probe_ready(url, model, api_key)) is not None]
    except ServerAuthError as exc:
        raise BenchError(f"{exc}{'' if api_key else ', or pass --api-key'}") from None
    if unreachable:
        raise BenchError("; ".join(f"endpoint {url} is not ready: {reason}" for url, reason in unreachable))
    servers = tuple(describe(url, model, api_key=api_key) for url in endpoints)
    if len({s.model for s in servers}) > 1:
        raise BenchError("the endpoints serve different models: " + ", ".join(f"{s.base_url}: {s.model}" for s in servers) + "; pass --model")
    return servers


def workload(args: argparse.Namespace, servers: Sequence[ServerInfo]) -> Workload:
    kind = args.dataset_name
    if kind != "trace" and (given := [flag for flag, value in _TRACE_FLAGS if getattr(args, value) not in (None, 0.0)]):
        raise BenchError(f"{', '.join(given)}: only a trace has them (--dataset-name trace)")
    if kind == "trace":
        return _trace(args, servers)
    count = (args.num_prompts or DEFAULT_PROMPTS) + args.warmup  # as in vllm bench serve, --num-prompts counts measured requests
    output_len = DEFAULT_OUTPUT_LEN if args.output_len is None else args.output_len
    fields: dict[str, object] = {"kind": kind}
    if kind == "random":
        fields |= {"input_len": args.input_len, "output_len": output_len, "num_prompts": count}
        fields |= {"range_ratio": args.range_ratio, "seed": args.seed, "api": args.endpoint_type}
    elif kind == "shared-prefix":
        per_prefix = math.ceil(count / args.num_prefixes)
        fields |= {"num_prefixes": args.num_prefixes, "prompts_per_prefix": per_prefix, "prefix_len": args.prefix_len}
        fields |= {"suffix_len": args.suffix_len, "output_len": output_len, "seed": args.seed}
    elif kind == "conversation":
        fields |= {"conversations": math.ceil(count / args.turns), "turns": args.turns, "first_input_len": args.input_len}
        fields |= {"turn_input_len": args.turn_input_len, "output_len": output_len, "think_time_s": args.think_time, "seed": args.seed}
    elif kind == "fixed":
        if args.prompt is None:
            raise BenchError("--dataset-name fixed needs --prompt TEXT")
        fields |= {"prompt": args.prompt, "output_len": output_len, "num_prompts": count, "api": args.endpoint_type}
    else:
        if args.dataset_path is None:
            raise BenchError("--dataset-name jsonl needs --dataset-path FILE")
        fields |= {"path": args.dataset_path, "num_prompts": count, "api": args.endpoint_type}
        if args.output_len is not None:  # else each line's own
            fields["output_len"] = args.output_len
    try:
        return workload_from_dict(fields, source=f"--dataset-name {kind}")
    except ValueError as exc:
        raise BenchError(str(exc)) from None


_TRACE_FLAGS = (("--time-scale", "time_scale"), ("--max-lag", "max_lag"), ("--trace-start", "trace_start"), ("--trace-span", "trace_span"),
                ("--trace-fit", "trace_fit"), ("--trace-context", "trace_context"))  # fmt: skip


def _trace(args: argparse.Namespace, servers: Sequence[ServerInfo]) -> Workload:
    """A trace's window (``--trace-start``, ``--trace-span``, then ``--num-prompts`` and ``--warmup``
    of it), fitted with ``--trace-fit`` to ``--trace-context``, else to the servers' context."""
    if args.dataset_path is None:
        raise BenchError("--dataset-name trace needs --dataset-path FILE (a Mooncake or Bailian .jsonl, or a .csv trace)")
    if args.trace_context is not None and args.trace_fit is None:
        raise BenchError("--trace-context is the context --trace-fit fits to: give --trace-fit too")
    context = args.trace_context
    if args.trace_fit is not None and context is None:
        context = min((s.max_model_len for s in servers if s.max_model_len), default=None)
        if context is None:
            raise BenchError("--trace-fit: the server does not say its max_model_len; give --trace-context TOKENS")
    fields: dict[str, object] = {"kind": "trace", "path": args.dataset_path, "seed": args.seed, "start_s": args.trace_start}
    if args.num_prompts is not None:
        fields["num_prompts"] = args.num_prompts + args.warmup
    if args.trace_span is not None:
        fields["span_s"] = args.trace_span
    if args.trace_fit is not None:
        fields |= {"fit": args.trace_fit, "fit_context": context}
    try:
        return workload_from_dict(fields, source="--dataset-name trace")
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def _tokenizer(name: str | None, server: ServerInfo, *, needed: bool) -> PromptTokenizer | None:
    """The tokenizer the prompts are built with: as given, else from the folder the server loaded."""
    source = name or server.root or server.model
    try:
        return PromptTokenizer.load(source)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        if needed:
            raise BenchError(f"exact prompt lengths need the model's tokenizer: {exc}; pass --tokenizer") from None
        return None


def _check_lengths(requests: Sequence[RequestSpec], servers: Sequence[ServerInfo], tokenizer: PromptTokenizer | None) -> None:
    """Refuse before sending when a request cannot fit the server's context (vLLM would answer 400)."""
    limit = min((s.max_model_len for s in servers if s.max_model_len), default=None)
    if limit is None:
        return
    for spec in requests:
        prompt = spec.expected_prompt_tokens
        if prompt is None and tokenizer is not None and isinstance(spec.prompt, str) and spec.api == "completions":
            prompt = len(tokenizer.encode(spec.prompt))
        if prompt is not None and prompt + spec.max_tokens > limit:
            raise BenchError(
                f"request {spec.index}: {prompt} input + {spec.max_tokens} output tokens = {prompt + spec.max_tokens}, "
                f"more than the server's max_model_len {limit}; lower --input-len/--output-len or start vLLM with a longer --max-model-len"
            )


def arrival(args: argparse.Namespace, measured: int) -> Arrival:
    if args.dataset_name == "trace" and args.request_rate is None and args.max_concurrency is None:
        return Replay(args.time_scale or 1.0, args.max_lag)  # at the traced times, unless a loop is asked for
    if args.time_scale is not None or args.max_lag is not None:
        raise BenchError("--time-scale and --max-lag replay a trace at its times: without --request-rate and --max-concurrency")
    if args.request_rate is None:
        if args.constant_rate or args.burstiness != 1.0:
            raise BenchError("--constant-rate and --burstiness need --request-rate")
        return ClosedLoop(args.max_concurrency or measured)
    try:
        if args.constant_rate:
            return OpenLoop(args.request_rate, "constant", max_concurrency=args.max_concurrency, seed=args.seed)
        distribution: Distribution = "poisson" if args.burstiness == 1.0 else "gamma"
        return OpenLoop(args.request_rate, distribution, args.burstiness, args.seed, args.max_concurrency)
    except ValueError as exc:
        raise BenchError(f"--request-rate/--burstiness: {exc}") from None


def _slo(goodput: Sequence[str] | None) -> GoodputSLO | None:
    if not goodput:
        return None
    try:
        return GoodputSLO.parse(" ".join(goodput))
    except ValueError as exc:
        raise BenchError(f"--goodput: {exc}") from None


def _check_first_request(plan: BenchPlan) -> None:
    """Send the first request once, as ``vllm bench serve`` does, so a rejected request stops the run here."""
    first = plan.requests[0]
    options = LoadOptions(timeout_s=plan.options.timeout_s, api_key=plan.options.api_key)
    load = run_load_sync([plan.servers[0].base_url], plan.servers[0].model, [first], ClosedLoop(1), options)
    record = load.records[0]
    if not record.ok:
        status = f"HTTP {record.status}" if record.status is not None else "no response"
        detail = record.error or f"{record.completion_tokens} of {record.expected_output_tokens} output tokens"
        raise BenchError(f"the first request to {plan.servers[0].base_url} failed ({status}): {detail}")



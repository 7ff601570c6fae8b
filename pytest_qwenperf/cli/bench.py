"""``qwenperf bench``: the load generator against endpoints that are already running.

The same client, workloads and metrics as the perf suite, with ``vllm bench serve``'s
option names where one exists, so a figure from one can be checked with the other.
Everything that can be known to fail is checked before the run: endpoints that do not
answer, a model they do not serve, requests longer than the server's ``max_model_len``,
and a first request the server rejects (its own message is shown). With ``--profile``, the
requests are sent once more after the measured run, between ``/start_profile`` and
``/stop_profile`` (:func:`~pytest_qwenperf.measure.profile.capture`), and measured by nothing.

Exit status: 0 for a complete run; 1 when more measured requests failed than
``--max-failed-fraction`` allows (default none) or none completed (the result is still
written, with the failures grouped by reason); 2 when the run cannot start
(:class:`BenchError`), or when ``--profile``'s capture failed after the measured run (whose result
is still written and recorded, without a profile); 130 / 143 when SIGINT / SIGTERM interrupted it
(nothing written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

import msgspec

from pytest_qwenperf.cli.bench_output import ProgressBar, print_summary, show_progress
from pytest_qwenperf.cli.bench_plan import DEFAULT_OUTPUT_LEN, DEFAULT_PROMPTS, BenchError, plan_from_args
from pytest_qwenperf.core.files import unwritable, unwritable_folder, write_atomically
from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.options import (
    fraction,
    measured_window,
    positive_factor,
    positive_rate,
    positive_seconds,
    seconds,
    whole_number,
)
from pytest_qwenperf.core.profile import OperatorProfile
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore
from pytest_qwenperf.gate.llmd_report import llmd_bench_report, write_llmd_report
from pytest_qwenperf.gate.sources import bench_run
from pytest_qwenperf.loadgen.arrivals import OpenLoop
from pytest_qwenperf.loadgen.assignment import DEFAULT_TIMEOUT_S
from pytest_qwenperf.loadgen.ray_workers import RayUnavailable, WorkerLost, connect
from pytest_qwenperf.loadgen.sizing import need
from pytest_qwenperf.measure.bench import BenchPlan, bench_result
from pytest_qwenperf.measure.observe import Load, Observation, Target, Watching, observe
from pytest_qwenperf.measure.profile import ProfilingFailed, capture
from pytest_qwenperf.option_table import BY_NAME
from pytest_qwenperf.serving.environment import profiler_dir
from pytest_qwenperf.suite.traces import FITS
from pytest_qwenperf.suite.workloads import KINDS

_AT_LEAST_0, _AT_LEAST_1 = whole_number(0), whole_number(1)




HELP = "drive a workload against running servers and report vllm-bench-serve-style metrics"
DESCRIPTION = "Load-test already-running OpenAI-compatible vLLM servers with the suite's load generator."
ERRORS: tuple[type[Exception], ...] = (BenchError, HistoryError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    BY_NAME["endpoint"].add(target.add_argument, "bench", required=True)
    target.add_argument("--model", help="model name to request (default: the one the endpoints serve)")
    target.add_argument("--tokenizer", help="folder or hub name of the tokenizer (default: the folder the server loaded)")
    target.add_argument(
        "--api-key",
        metavar="KEY",
        help="bearer token for servers run with vLLM's --api-key (default: $VLLM_API_KEY, else $OPENAI_API_KEY). "
        "A key on the command line is visible to every user in ps and stays in shell histories: prefer VLLM_API_KEY",
    )

    work = parser.add_argument_group("workload")
    work.add_argument("--dataset-name", default="random", choices=sorted(KINDS), help="default: %(default)s")
    work.add_argument(
        "--dataset-path", help="JSON-lines file of prompts or conversations (jsonl), or a Mooncake or Bailian .jsonl or a .csv trace (trace)"
    )
    work.add_argument("--input-len", "--random-input-len", type=_AT_LEAST_1, default=1024, help="prompt tokens (default %(default)s)")
    work.add_argument(
        "--output-len",
        "--random-output-len",
        type=_AT_LEAST_1,
        help=f"output tokens (default {DEFAULT_OUTPUT_LEN}; jsonl: each line's output_len unless given)",
    )
    work.add_argument("--range-ratio", "--random-range-ratio", type=float, default=0.0, help="lengths vary within +-ratio")
    work.add_argument(
        "--num-prompts", type=_AT_LEAST_1, help=f"measured requests (default {DEFAULT_PROMPTS}; trace: every request of the window)"
    )
    work.add_argument("--num-prefixes", type=_AT_LEAST_1, default=4, help="shared-prefix: distinct prefixes")
    work.add_argument("--prefix-len", type=_AT_LEAST_1, default=512, help="shared-prefix: tokens per prefix")
    work.add_argument("--suffix-len", type=_AT_LEAST_1, default=64, help="shared-prefix: tokens after the prefix")
    work.add_argument("--prompt", help="fixed: the prompt text")
    work.add_argument("--turns", type=_AT_LEAST_1, default=4, help="conversation: turns per conversation (default %(default)s)")
    work.add_argument(
        "--turn-input-len", type=_AT_LEAST_1, default=64, help="conversation: tokens of each later user message (default %(default)s)"
    )
    work.add_argument("--think-time", type=seconds, default=0.0, help="conversation: seconds between a reply and the next turn")
    trace = parser.add_argument_group("trace (--dataset-name trace)")
    trace.add_argument("--time-scale", type=positive_factor, help="replay at the traced times times this (0.5: twice as fast; default 1)")
    trace.add_argument(
        "--max-lag", type=positive_factor, metavar="MS", help="the p99 send lag the replay may have before it is client-bound (default 50)"
    )
    trace.add_argument("--trace-start", type=seconds, default=0.0, metavar="S", help="replay from S seconds after the first request")
    trace.add_argument("--trace-span", type=positive_seconds, metavar="S", help="replay S seconds of the trace (default: to the end)")
    trace.add_argument(
        "--trace-fit",
        choices=FITS,
        help="fit every request into the context (--trace-context, else the server's max_model_len): scale all lengths and "
        "blocks by one power of two, or cap the ones too long; send times and shared blocks stay (see docs/capacity-and-traces.md)",
    )
    trace.add_argument("--trace-context", type=whole_number(2), metavar="TOKENS", help="the context --trace-fit fits to")
    work.add_argument("--endpoint-type", choices=("completions", "chat"), default="completions", help="default: %(default)s")
    work.add_argument("--seed", type=int, default=0)

    load = parser.add_argument_group("load")
    load.add_argument("--max-concurrency", type=_AT_LEAST_1, help="requests in flight at most (closed loop without --request-rate)")
    load.add_argument("--request-rate", type=positive_rate, help="open loop: requests per second (default: closed loop)")
    load.add_argument("--burstiness", type=float, default=1.0, help="open loop: gamma shape; 1 is Poisson (default)")
    load.add_argument("--constant-rate", action="store_true", help="open loop: exactly 1/rate between requests")
    load.add_argument("--warmup", type=_AT_LEAST_0, default=0, help="extra requests sent first and left out of the results")
    load.add_argument("--duration", type=positive_seconds, help="stop sending after this many seconds")
    load.add_argument(
        "--window",
        type=measured_window,
        help='measure for this long once the batch is full, "90s" or "4 lifetimes" (a lifetime: the warm-up\'s median '
        "request); the figures are the window's, the dataset a supply it must not exhaust",
    )
    load.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S, help="per request (default %(default)s s)")
    load.add_argument(
        "--no-continuous-usage",
        dest="continuous_usage",
        action="store_false",
        help="do not ask for usage in every chunk: less server CPU per chunk, but chunks with empty text "
        "(partial byte tokens) go untimed and speculative chunks count as one token",
    )
    load.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs for goodput, e.g. ttft:500 tpot:50")
    load.add_argument("--workers", type=_AT_LEAST_1, default=1, help="client processes (default %(default)s)")
    BY_NAME["ray"].add(load.add_argument, "bench")
    BY_NAME["client-cpus"].add(load.add_argument, "bench")

    out = parser.add_argument_group("output")
    BY_NAME["json"].add(out.add_argument, "bench")
    out.add_argument("--detailed", action="store_true", help="with --json: per-request records too")
    BY_NAME["history"].add(out.add_argument, "bench")
    BY_NAME["profile"].add(out.add_argument, "bench")
    BY_NAME["llmd-report"].add(out.add_argument, "bench")
    out.add_argument("--progress", choices=("auto", "on", "off"), default="auto", help="progress bar (auto: when stderr is a terminal and not in CI)")
    out.add_argument(
        "--max-failed-fraction",
        type=fraction,
        default=0.0,
        metavar="F",
        help="exit 1 when more than this fraction of the measured requests failed (default %(default)s: any failure)",
    )


def run(args: argparse.Namespace) -> int:
    if args.json is not None and args.json.is_file():
        raise BenchError(f"--json {args.json}: the file exists; choose another path (results are never overwritten)")
    if args.json is not None and (why := unwritable(args.json)):  # before the probes and the run, not after
        raise BenchError(f"--json {args.json}: cannot write the result there: {why}")
    if args.llmd_report is not None and (why := unwritable_folder(args.llmd_report)):
        raise BenchError(f"--llmd-report {args.llmd_report}: cannot write the report there: {why}")
    if args.history is not None:
        HistoryStore.open(args.history).close()  # a store that cannot be opened fails before the run, not after
    plan = plan_from_args(args)
    if args.profile:
        _check_profilers(plan)
    if plan.client.ray is not None:
        try:
            connect(plan.client.ray)
        except RayUnavailable as exc:
            raise BenchError(f"--ray: {exc}") from None
    _warn_if_client_bound(plan)
    progress = ProgressBar(len(plan.requests), sys.stderr if show_progress(args.progress) else None)
    try:
        seen = observe(
            Target(tuple(s.base_url for s in plan.servers), plan.servers[0].model),
            Load(plan.requests, plan.arrival, plan.options, plan.slo),
            plan.client,
            Watching(progress=progress),
        )
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the command turns it into one): the CLI names which
        raise KeyboardInterrupt(f"after {progress.done} of {progress.total} requests; no result written") from None
    except WorkerLost as exc:
        print(f"qwenperf: {exc}; no result written", file=sys.stderr)
        return 1
    finally:
        progress.close()
    for line in filter(None, (clock.reported() for clock in seen.load.clocks)):
        print(f"qwenperf: {line}", file=sys.stderr)
    result = bench_result(plan, seen, detailed=args.detailed, max_failed_fraction=args.max_failed_fraction)
    unprofiled = None
    if args.profile:
        try:
            result = msgspec.structs.replace(result, profile=_profile(plan, args.json))
        except BenchError as exc:  # the measured run is complete: it is kept, and the command still fails
            unprofiled = str(exc)
    print_summary(result, sys.stdout)
    text = json.dumps(json_safe(result.as_json()), indent=2)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(args.json, text)
        print(f"result written to {args.json}")
    if args.llmd_report is not None:
        written = write_llmd_report(args.llmd_report, llmd_bench_report(result), f"bench--{result.identity.workload}")
        print(f"llm-d Benchmark Report written to {written}")
    if args.history is not None:
        with HistoryStore.open(args.history) as store:
            store.append([bench_run(json.loads(text))], source="qwenperf bench")  # the result as its file holds it
        print(f"result recorded in the history store {store.where}")
    if unprofiled is not None:
        print(f"qwenperf: {unprofiled}; the measured result is kept without a profile", file=sys.stderr)
        return 2
    return _exit_status(seen, args.max_failed_fraction, sys.stderr)


def _warn_if_client_bound(plan: BenchPlan) -> None:
    """Before an open loop's run: a warning when its rate needs more client workers than it has
    (:func:`~pytest_qwenperf.loadgen.sizing.need`, one token a chunk); a closed loop's rate is the server's to set."""
    if not isinstance(plan.arrival, OpenLoop):
        return
    output = sum(spec.max_tokens for spec in plan.requests) / len(plan.requests)
    found = need(plan.arrival.rate, output)
    if found.workers > plan.client.workers:
        print(
            f"qwenperf: warning: {plan.arrival.rate:g} requests/s of {output:.0f} output tokens needs about {found.busy_cores:.2f} "
            f"busy client cores, {found.workers} workers at most half busy each (qwenperf plan), and --workers is "
            f"{plan.client.workers}: the run may be client-bound",
            file=sys.stderr,
        )


def _check_profilers(plan: BenchPlan) -> None:
    """Before the run: every endpoint says where its profiler writes (``/server_info``)."""
    api_key = plan.options.api_key
    silent = [s.base_url for s in plan.servers if profiler_dir(s.base_url, api_key) is None]
    if silent:
        raise BenchError(
            f"--profile: {', '.join(silent)} name no profiler folder in GET /server_info: start vLLM with VLLM_SERVER_DEV_MODE=1 and "
            "--profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": \"/abs/dir\"}' (VLLM_TORCH_PROFILER_DIR before vLLM 0.32)"
        )


def _profile(plan: BenchPlan, json_path: Path | None) -> OperatorProfile:
    """The operator profile of the plan's requests sent once more, unmeasured; its traces beside ``json_path``."""
    load = Load(plan.requests, plan.arrival, plan.options, plan.slo)
    target = Target(tuple(s.base_url for s in plan.servers), plan.servers[0].model)

    def drive() -> None:
        observe(target, load, plan.client)

    folder = json_path.with_name(f"{json_path.stem}.profiles") if json_path is not None else None
    try:
        return capture(target.base_urls, drive, folder, relative_to=json_path.parent if json_path else None, api_key=plan.options.api_key)
    except ProfilingFailed as exc:
        raise BenchError(f"--profile: {exc}") from None


def _exit_status(seen: Observation, max_failed_fraction: float, err: TextIO) -> int:
    """1, with the reason on ``err``, when no request completed or more failed than allowed; else 0."""
    values = seen.summary.values()
    completed, failed = int(values["completed"]), int(values["failed"])
    if completed == 0:
        print(f"qwenperf: no measured request completed ({failed} failed)", file=err)
        return 1
    if failed / (completed + failed) > max_failed_fraction:
        print(
            f"qwenperf: {failed} of {completed + failed} measured requests failed ({failed / (completed + failed):.1%}), "
            f"more than --max-failed-fraction {max_failed_fraction:g} allows",
            file=err,
        )
        return 1
    return 0

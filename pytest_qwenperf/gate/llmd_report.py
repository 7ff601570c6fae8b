"""The llm-d Benchmark Report (version 0.2) of one measured run, so that llm-d's tooling (and anyone
reading that format) can take this project's results beside those of the tools it converts.

:func:`llmd_report` turns a :class:`~pytest_qwenperf.core.run.Run` into the report's document, a
dict ready for JSON; :func:`llmd_bench_report` does the same for a ``qwenperf bench`` result. One
report describes one load point, as the format intends. The document holds what the run measured,
in the units the format names per field, and leaves out what the run does not know: the format
makes nearly every field optional, and a missing field says less than a guessed one.

What goes where (``R`` = ``results.request_performance.aggregate``; ``metrics`` are the run's, under
``vllm bench serve``'s names, of the repeat its figures come from):

* ``run.uid``: a UUID5 of the run's identity (its suite, config, rendered argv, model, workload and
  its fingerprint, hardware) and its start time, so writing one run twice gives one uid. A run
  that recorded no start time gets the uid of its identity alone, which every such run of that
  identity shares. ``run.time.start`` is when the run's observation began, just before its load
  (``context.started``, to the second); ``run.time.duration`` is the span its figures were
  measured over (``metrics.duration``, the whole run or a time-bounded run's window).
  ``run.time.end`` is left out: the run keeps when its observation started, not when that span
  began or ended. (``Run.elapsed_s`` is the wall time
  of every repeat of the point, not of this repeat, and is not used.) ``run.description`` is
  ``<model> [<suite/config>: <workload>]``.
* ``scenario.stack``: one ``inference_engine`` component, vLLM (``context.vllm_version``; ``""``
  where the run did not record it), role ``replica`` (every server serves whole requests),
  ``replicas`` = ``context.replicas`` (else the servers recorded), the model as the suite names it.
  ``accelerator.model`` is the GPU's product name as NVML reports it (``context.machine.gpu_name``,
  e.g. ``NVIDIA H200``; llm-d's own writers use Kubernetes node labels such as
  ``NVIDIA-H100-80GB-HBM3``); ``accelerator.count`` is the GPUs one replica uses, TP × PP × DP from
  the argv as the server pool reserves them, as llm-d counts one replica's (TP × local DP) beside
  ``replicas``. On the CPU build there is no accelerator: the count is 0 and the model names the
  CPU (``machine.cpu_model``, else the machine's id). ``parallelism`` holds TP, PP, DP, local DP
  (= DP: a server's GPUs are on one node here) and EP (TP × DP where the argv turns expert
  parallelism on, as vLLM spreads the experts; else 1). ``metadata.cfg_id`` is the argv's sha256 (a
  baseline's ``argv_sha256``); ``native.args`` holds the argv as it was rendered, under ``argv``.
  A run without a machine record has no stack: the accelerator is required.
* ``scenario.load``: ``tool`` is ``pytest-qwenperf``. The format's ``tool`` is free text in 0.2
  (its ``WorkloadGenerator`` list, ``aiperf``, ``guidellm``, ``inferencemax``, ``inference-perf``,
  ``vllm-benchmark``, ``nop``, names the converters its CLI has and the 0.1 format's load name);
  this project's load generator is its own client, not ``vllm bench serve``, so it is named as
  itself. ``tool_version`` is what the caller passes (a run does not record the version that
  measured it; ``""`` otherwise, as llm-d writes an unknown version). ``source`` is ``unknown``: a
  run names its workload (``metadata.description``; ``metadata.cfg_id`` is its fingerprint) but
  not whether its prompts were random tokens or sampled text. ``input_seq_len`` (required) is the
  prompt tokens per completed request the server counted, distribution ``other``, as llm-d's own
  converter falls back to when the configured length is unknown. ``output_seq_len`` is left out:
  it means an enforced length, which a run does not record. ``rate_qps`` is the requested rate of
  an open-loop load (``metrics.requested_request_rate``); a closed loop's concurrency is not in a
  run and is left out. ``parallelism`` is the number of client workers on a Ray cluster
  (``client.workers``); a run does not record local worker processes, so it is otherwise left out
  (the format's default, 1, may then be wrong). With no completed request there is no input
  length, and no ``scenario.load``.
* ``R.requests``: ``total`` = ``completed`` + ``failed``, ``failures`` = ``failed`` (a request that
  failed, got no usage or was cut short; ``incomplete`` is not told apart and is left out).
  ``input_length`` / ``output_length`` (``count``): the mean of ``total_input_tokens`` /
  ``total_output_tokens`` per completed request, exact for a whole run and close for a
  time-bounded run's window (whose tokens count at their arrival in it). Failures of the point's
  other repeats are not in this repeat's counts.
* ``R.latency`` (each a Statistics: ``mean`` = ``mean_<x>_ms``, ``stddev`` = ``std_<x>_ms``, ``p50``
  = ``median_<x>_ms``, every ``p<N>_<x>_ms`` the run has; the other percentiles, ``min`` and ``max``
  from ``Run.distributions``, percentiles 0..100 of the same requests to 4 significant digits):

  - ``time_to_first_token`` (``ms``) <- ``ttft``;
  - ``time_per_output_token`` (``ms/token``) <- ``tpot``: ``(e2e - ttft) / (tokens - 1)`` per
    request, the format's (and GKE's) TPOT, excluding the first token;
  - ``inter_token_latency`` (``ms/token``) <- ``itl``: the gaps between output tokens pooled over
    all requests, a chunk of k tokens after a gap g counting k gaps of g/k
    (:mod:`~pytest_qwenperf.core.summary`), the format's ITL;
  - ``request_latency`` (``ms``) <- ``e2el``.

  ``normalized_time_per_output_token`` (e2e / tokens) is not measured and is left out. With no
  completed request ``vllm bench serve``'s zero fill stands in for each latency: none is written.
* ``R.throughput``: ``input_token_rate`` = ``total_input_tokens`` / ``duration``, and
  ``output_token_rate`` <- ``output_throughput``, ``total_token_rate`` <- ``total_token_throughput``
  (``tokens/s``), ``request_rate`` <- ``request_throughput`` (``queries/s``): each a Statistics of
  the one rate over the span (``mean``).

Not mapped: the steady-state figures, telemetry, server counters (prefix cache, speculative
decoding), verdicts and conditions; the format has no field for most of them, and a figure from
another span than ``metrics`` would mislead beside it.

A ``qwenperf bench`` result maps the same way, except: its uid comes from its identity (model,
workload, arrival, warm-up, endpoints) and start; its description names the arrival; it has no
``scenario.stack`` (a bench result records neither the machine nor the server's argv); its load's
``tool_version`` is the version it recorded and ``parallelism`` its client processes; it keeps no
latency distributions, so only the ``p<N>`` it was asked for are written.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pytest_qwenperf.core.bench import BenchResult
from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.core.identity import argv_digest, slug
from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.core.parallel import expert_parallel, parallel_sizes
from pytest_qwenperf.core.run import Number, Run

Document = dict[str, Any]

VERSION = "0.2"
TOOL = "pytest-qwenperf"
ENGINE = "vllm"
COMPONENT_SCHEMA = "0.0.1"
NAMESPACE = uuid.UUID("8919bb23-581a-4491-ad84-4ce94f91f390")
"""This project's namespace for report uids: never change it, or every report written gets a new uid."""

_KEPT_PERCENTILES = 101
"""How many percentiles a run keeps of each latency (0..100, ``core.summary.QUANTILES``)."""

_LATENCIES = (
    ("time_to_first_token", "ttft", "ms"),
    ("time_per_output_token", "tpot", "ms/token"),
    ("inter_token_latency", "itl", "ms/token"),
    ("request_latency", "e2el", "ms"),
)
"""The format's latency, the ``vllm bench serve`` family it comes from, its units."""

_POINTS = (
    ("min", None, 0),
    ("p0p1", "p0.1", None),
    ("p1", "p1", 1),
    ("p5", "p5", 5),
    ("p10", "p10", 10),
    ("p25", "p25", 25),
    ("p50", "median", 50),
    ("p75", "p75", 75),
    ("p90", "p90", 90),
    ("p95", "p95", 95),
    ("p99", "p99", 99),
    ("p99p9", "p99.9", None),
    ("max", None, 100),
)
"""A Statistics key, the metric prefix that holds it (``p99`` -> ``p99_ttft_ms``), its percentile in a distribution."""

_RATES = (
    ("output_token_rate", "output_throughput", "tokens/s"),
    ("total_token_rate", "total_token_throughput", "tokens/s"),
    ("request_rate", "request_throughput", "queries/s"),
)


@dataclass(frozen=True)
class _Source:
    """What a report is written from, whichever record it came from."""

    uid: str
    description: str
    started: str | None
    metrics: Mapping[str, Number]
    distributions: Mapping[str, Sequence[float]]
    stack: tuple[Document, ...]
    workload: str
    workload_fingerprint: str
    tool_version: str
    client_workers: int | None


def llmd_report(run: Run, *, tool_version: str = "") -> Document:
    """The Benchmark Report v0.2 of ``run`` (see the module); ``tool_version``: this project's version
    that measured it, where the caller knows it. ValueError where the run's argv holds a parallel
    size that is not a whole number >= 1 (:func:`~pytest_qwenperf.core.parallel.parallel_sizes`)."""
    identity, context = run.identity, run.context
    engine = _engine(run)
    return _document(
        _Source(
            uid=_uid({"run": msgspec.to_builtins(identity), "started": context.started}),
            description=f"{identity.model} [{run.config_key}: {identity.workload}]",
            started=context.started,
            metrics=run.metrics,
            distributions=run.distributions,
            stack=(engine,) if engine else (),
            workload=identity.workload,
            workload_fingerprint=identity.workload_fingerprint,
            tool_version=tool_version,
            client_workers=len(run.client.workers) or None,
        )
    )


def llmd_bench_report(result: BenchResult) -> Document:
    """The Benchmark Report v0.2 of a ``qwenperf bench`` result (see the module)."""
    identity, context = result.identity, result.context
    return _document(
        _Source(
            uid=_uid({"bench": msgspec.to_builtins(identity), "started": context.started}),
            description=f"{identity.model} [qwenperf bench: {identity.workload}, {identity.arrival}]",
            started=context.started,
            metrics=result.metrics,
            distributions={},
            stack=(),
            workload=identity.workload,
            workload_fingerprint=identity.workload_fingerprint,
            tool_version=context.qwenperf_version or "",
            client_workers=context.workers,
        )
    )


def write_llmd_report(folder: Path, document: Document, name: str) -> Path:
    """``document`` as ``<folder>/<name>--<uid's first 8>.json`` (the folder made where missing): a
    report of another run never takes the place of one written before, and the same run written
    again gives the same file."""
    path = folder / f"{slug(name)}--{document['run']['uid'][:8]}.json"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(document, indent=1) + "\n")
    return path


def _uid(name: Mapping[str, object]) -> str:
    return str(uuid.uuid5(NAMESPACE, json.dumps(name, sort_keys=True, separators=(",", ":"))))


def _document(source: _Source) -> Document:
    scenario: Document = {}
    if source.stack:
        scenario["stack"] = list(source.stack)
    load = _load(source)
    if load:
        scenario["load"] = load
    document: Document = {"version": VERSION, "run": _run(source)}
    if scenario:
        document["scenario"] = scenario
    document["results"] = _results(source.metrics, source.distributions)
    return document


# ------------------------------------------------------------------ run


def _run(source: _Source) -> Document:
    block: Document = {"uid": source.uid}
    time = _time(source.started, _finite(source.metrics.get("duration")))
    if time:
        block["time"] = time
    block["description"] = source.description
    return block


def _time(started: str | None, duration: float | None) -> Document:
    time: Document = {}
    start = _instant(started)
    if start is not None:
        time["start"] = start
    if duration is not None and duration >= 0:
        time["duration"] = f"PT{duration:.3f}S"
    return time


def _instant(text: str | None) -> str | None:
    """``text`` as an ISO 8601 date-time; None where it is none."""
    if text is None:
        return None
    try:
        return datetime.datetime.fromisoformat(text).isoformat()
    except ValueError:
        return None


# ------------------------------------------------------------------ scenario


def _engine(run: Run) -> Document | None:
    """The vLLM servers of ``run`` as one ``inference_engine`` component; None without a machine record."""
    machine = run.context.machine
    hardware = _accelerator(machine) if machine is not None else None
    if hardware is None:
        return None
    argv = run.identity.argv
    sizes = parallel_sizes(argv)
    model, on_gpu = hardware
    return {
        "metadata": {"schema_version": COMPONENT_SCHEMA, "label": run.config_key, "cfg_id": argv_digest(argv)},
        "standardized": {
            "kind": "inference_engine",
            "tool": ENGINE,
            "tool_version": run.context.vllm_version or "",
            "role": "replica",
            "replicas": run.context.replicas or len(run.context.servers) or 1,
            "model": {"name": run.identity.model},
            "accelerator": {
                "model": model,
                "count": math.prod(sizes.values()) if on_gpu else 0,
                "parallelism": _parallelism(sizes, expert=expert_parallel(argv)),
            },
        },
        "native": {"args": {"argv": list(argv)}},
    }


def _accelerator(machine: Machine) -> tuple[str, bool] | None:
    """The hardware's name and whether it is a GPU; None where the machine record names neither."""
    if machine.gpu_name:
        return machine.gpu_name, True
    cpu = machine.cpu_model or machine.id
    return (cpu, False) if machine.kind == "cpu" and cpu else None


def _parallelism(sizes: Mapping[str, int], *, expert: bool) -> Document:
    tp, pp, dp = sizes["tp"], sizes["pp"], sizes["dp"]
    return {"tp": tp, "dp": dp, "dp_local": dp, "ep": tp * dp if expert else 1, "pp": pp}


def _load(source: _Source) -> Document | None:
    """The workload as the format's load; None without a completed request (no input length)."""
    completed = _finite(source.metrics.get("completed"))
    prompts = _finite(source.metrics.get("total_input_tokens"))
    if not completed or prompts is None:
        return None
    standardized: Document = {"tool": TOOL, "tool_version": source.tool_version}
    if source.client_workers:
        standardized["parallelism"] = source.client_workers
    standardized["source"] = "unknown"
    standardized["input_seq_len"] = {"distribution": "other", "value": prompts / completed}
    rate = _finite(source.metrics.get("requested_request_rate"))
    if rate is not None and rate > 0:
        standardized["rate_qps"] = rate
    return {
        "metadata": {
            "schema_version": COMPONENT_SCHEMA,
            "cfg_id": source.workload_fingerprint,
            "description": source.workload,
        },
        "standardized": standardized,
        "native": {},
    }


# ------------------------------------------------------------------ results


def _results(metrics: Mapping[str, Number], distributions: Mapping[str, Sequence[float]]) -> Document:
    parts = (
        ("requests", _requests(metrics)),
        ("latency", _latency(metrics, distributions)),
        ("throughput", _throughput(metrics)),
    )
    aggregate = {name: part for name, part in parts if part}
    return {"request_performance": {"aggregate": aggregate}} if aggregate else {}


def _requests(metrics: Mapping[str, Number]) -> Document:
    completed, failed = _count(metrics.get("completed")), _count(metrics.get("failed"))
    if completed is None or failed is None:
        return {}
    block: Document = {"total": completed + failed, "failures": failed}
    for name, total in (("input_length", "total_input_tokens"), ("output_length", "total_output_tokens")):
        tokens = _finite(metrics.get(total))
        if completed and tokens is not None:
            block[name] = {"units": "count", "mean": tokens / completed}
    return block


def _latency(metrics: Mapping[str, Number], distributions: Mapping[str, Sequence[float]]) -> Document:
    """Each latency the run measured; none without a completed request. A run that keeps
    distributions keeps one of each latency it measured: a family it lacks was not measured
    (TPOT, where no request had two output tokens), and its figures are the zero fill."""
    if not _count(metrics.get("completed")):
        return {}
    block: Document = {}
    for name, family, units in _LATENCIES:
        spread = distributions.get(f"{family}_ms")
        if distributions and spread is None:
            continue
        stats = _statistics(metrics, family, units, spread or ())
        if stats:
            block[name] = stats
    return block


def _statistics(metrics: Mapping[str, Number], family: str, units: str, spread: Sequence[float]) -> Document:
    """A Statistics of one latency family (``ttft``): the run's own figures first, its distribution for the rest."""
    mean = _finite(metrics.get(f"mean_{family}_ms"))
    if mean is None:
        return {}
    stats: Document = {"units": units, "mean": mean}
    stddev = _finite(metrics.get(f"std_{family}_ms"))
    if stddev is not None:
        stats["stddev"] = stddev
    kept = len(spread) == _KEPT_PERCENTILES
    for key, prefix, percentile in _POINTS:
        value = _finite(metrics.get(f"{prefix}_{family}_ms")) if prefix else None
        if value is None and kept and percentile is not None:
            value = _finite(spread[percentile])
        if value is not None:
            stats[key] = value
    return stats


def _throughput(metrics: Mapping[str, Number]) -> Document:
    block: Document = {}
    prompts, duration = _finite(metrics.get("total_input_tokens")), _finite(metrics.get("duration"))
    if prompts is not None and duration:
        block["input_token_rate"] = {"units": "tokens/s", "mean": prompts / duration}
    for name, metric, units in _RATES:
        rate = _finite(metrics.get(metric))
        if rate is not None:
            block[name] = {"units": units, "mean": rate}
    return block


def _finite(value: object) -> float | None:
    """A finite number as a float; None for anything else (null, NaN, an infinity, absent)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _count(value: object) -> int | None:
    """A whole, non-negative count; None for anything else."""
    number = _finite(value)
    return int(number) if number is not None and number >= 0 and number.is_integer() else None

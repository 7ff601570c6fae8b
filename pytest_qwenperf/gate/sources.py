"""The result files ``qwenperf compare`` reads, as runs: which format a file is, and the readers of
this project's own formats and ``vllm bench serve``'s (GuideLLM's and AIPerf's are
:mod:`~pytest_qwenperf.gate.tool_results`; what a bench result measured, its :class:`Setup`, is
:mod:`~pytest_qwenperf.gate.setups`).

A column is a file or a directory: every ``*.json`` file in it, but the ``*.pytorch.json``
files ``vllm bench serve`` writes beside its results when ``SAVE_TO_PYTORCH_BENCHMARK_FORMAT``
is set (the same result in another shape). The formats:

* session JSON (``--qwenperf-json``) and pytest-benchmark JSON whose benchmarks carry a
  qwenperf run (the others are other tests, skipped): runs of a suite, matched by their
  :class:`~pytest_qwenperf.core.run.RunIdentity` (config, vLLM argv, workload, hardware).
  A session JSON also holds each config's answer to the correctness canary (``canaries``), and
  may hold answers alone (a session that ran only the correctness tests).
* ``qwenperf bench --json`` (schema ``qwenperf-bench/1``) and ``vllm bench serve --save-result``
  (no schema key; told by its ``model_id`` or ``backend``): one result of one command line each. They name
  no suite config and no argv, so what they measured is their :class:`Setup`, compared field
  by field, and all of them share one key (:data:`BENCH_KEY`): a column holds one setup.
* a GuideLLM benchmark report and an AIPerf profile export: bench results as well, read by
  :mod:`~pytest_qwenperf.gate.tool_results`.

What ``vllm bench serve --save-result`` saves (vLLM 0.32, read off a real run): ``model_id``,
``num_prompts``, ``request_rate`` (``"inf"`` for none), ``burstiness``, ``max_concurrency``,
``completed``, ``failed``, the token totals, the three throughputs, and the mean, median,
std and ``p<N>`` of TTFT, TPOT and ITL (``--metric-percentiles`` defaults to 99, so p99 is
there unless ``--percentile-metrics`` leaves a metric out; a row it lacks is absent, not
invalid), plus every ``--metadata KEY=VALUE`` as a top-level string. It saves neither the
dataset, nor the lengths asked for, nor the sampling, so:

* input and output length are the means per completed request (``total_input_tokens /
  completed``): what was sent, not what was asked (the random dataset's prompts come out a
  few tokens longer than ``--random-input-len`` after re-tokenizing);
* the dataset is ``--metadata dataset_name=NAME`` (with ``num_prompts``), else unknown;
* the sampling is ``--metadata temperature=T`` (0: ``greedy``), else unknown. Without
  ``--temperature`` the benchmark sends none and the server samples with its own default,
  which measured about 10 % faster than greedy on the tiny model: not the work of our runs,
  which are greedy (the load generator sends temperature 0).

An unknown field differs from every known value (:meth:`Setup.differences`): a default-sampling
``vllm bench serve`` run is not the greedy work of ours. Two unknowns match, within a column and
across columns: two results of the same command line (the common case, two ad-hoc runs before
and after an upgrade) record the same nothing, and the table's title says which fields were
not recorded, so the assumption is in view.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from pytest_qwenperf.core.bench import BenchResult
from pytest_qwenperf.core.canary import Canary, CanaryJudgement
from pytest_qwenperf.core.formats import BENCH_SCHEMA, SESSION_SCHEMA, show
from pytest_qwenperf.core.identity import Text
from pytest_qwenperf.core.machine import upgraded
from pytest_qwenperf.core.run import ClientLoad, Run, RunContext, ServerCounters, TokenCheck
from pytest_qwenperf.core.run_json import MISSING, RunJsonError, decode_run
from pytest_qwenperf.core.schema import Count
from pytest_qwenperf.core.textfiles import read_text
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.diagnosis import Diagnosis
from pytest_qwenperf.gate.setups import (
    GREEDY,
    Result,
    RunKey,
    Setup,
    SourceError,
    bench_result,
    client_metrics,
    convert,
    fault,
    mean_of,
    sampling,
)
from pytest_qwenperf.gate.tool_results import is_aiperf, is_guidellm, read_aiperf, read_guidellm

EXPECTED = (
    f'a qwenperf session JSON ({{"schema": "{SESSION_SCHEMA}", "runs": [...]}}, from --qwenperf-json), '
    'a pytest-benchmark JSON ({"benchmarks": [{"extra_info": {"qwenperf": <run>}}, ...]}), '
    f'a qwenperf bench --json result ({{"schema": "{BENCH_SCHEMA}", ...}}), '
    'a vllm bench serve --save-result result ({"model_id": ..., "completed": ..., ...}), '
    'a GuideLLM benchmark report ({"metadata": {"guidellm_version": ...}, "benchmarks": [...]}) '
    'or an AIPerf profile export ({"aiperf_version": ..., "request_throughput": {...}, ...})'
)


# ------------------------------------------------------------------ results


class Verdicts(msgspec.Struct, frozen=True, kw_only=True):
    """The verdicts a session decided for one of its runs as it measured it (a session JSON's ``verdicts``)."""

    suite: str
    config: str
    workload: str
    judgements: tuple[Judgement, ...]
    diagnosis: Diagnosis | None = None  # why it regressed, as the session decided (an older session JSON has none)

    @property
    def key(self) -> RunKey:
        return (self.suite, self.config, self.workload)


@dataclass(frozen=True)
class Results:
    """What a results file, or a directory of them, holds: its runs, its sessions' canary answers
    and the verdicts its sessions decided."""

    runs: tuple[Result, ...]
    canaries: tuple[Canary, ...] = ()
    verdicts: tuple[Verdicts, ...] = ()
    canary_verdicts: tuple[CanaryJudgement, ...] = ()  # each config's canary answer as its session judged it


def read(path: Path, *, recursive: bool = False) -> Results:
    """Every run and canary answer of a results file, or of every results file in a directory (and in
    its subfolders when ``recursive``, as pytest-benchmark's storage is laid out); :class:`SourceError` otherwise."""
    found = [_read(file) for file in _files(Path(path), recursive)]
    return Results(
        tuple(r for f in found for r in f.runs),
        tuple(c for f in found for c in f.canaries),
        tuple(v for f in found for v in f.verdicts),
        tuple(j for f in found for j in f.canary_verdicts),
    )


def read_results(path: Path, *, recursive: bool = False) -> tuple[Result, ...]:
    """Every run of :func:`read`."""
    return read(path, recursive=recursive).runs


def bench_run(data: object, where: str = "qwenperf bench") -> Run:
    """The run of a ``qwenperf bench`` result held in memory (its ``--json`` content)."""
    return _qwenperf_bench(Path(where), data).run


def _files(path: Path, recursive: bool = False) -> list[Path]:
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.glob("**/*.json" if recursive else "*.json") if p.is_file() and not p.name.endswith(".pytorch.json"))
    if not files:
        raise SourceError(f"{path}: a directory without a *.json file; expected a results file or a directory of them")
    return files


def _read(path: Path) -> Results:
    text = read_text(path, "results file", EXPECTED, SourceError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: not valid JSON ({exc}); expected {EXPECTED}") from None
    if isinstance(data, dict) and data.get("schema") == BENCH_SCHEMA:
        return Results((_qwenperf_bench(path, data),))
    if isinstance(data, dict) and "schema" not in data and any(key in data for key in _SERVE_MARKS):
        return Results((_vllm_bench_serve(path, data),))
    if is_guidellm(data):
        return Results(read_guidellm(path, data))
    if is_aiperf(data):
        return Results(read_aiperf(path, data))
    canaries = _canaries(path, data)
    runs = []
    for where, data_of_run in _suite_runs(path, data, bool(canaries)):
        try:
            runs.append(Result(path, decode_run(data_of_run, where)))
        except RunJsonError as exc:
            raise SourceError(str(exc)) from None
    verdicts = convert(path, _session_part(data, "verdicts", "canary_verdicts"), _SessionVerdicts)
    return Results(tuple(runs), canaries, verdicts.verdicts, verdicts.canary_verdicts)


class _SessionCanaries(msgspec.Struct, frozen=True, kw_only=True):
    """The canary answers of a session JSON (it has more)."""

    canaries: tuple[Canary, ...] = ()


class _SessionVerdicts(msgspec.Struct, frozen=True, kw_only=True):
    """The verdicts of a session JSON, its runs' and its canary answers' (an older one has none)."""

    verdicts: tuple[Verdicts, ...] = ()
    canary_verdicts: tuple[CanaryJudgement, ...] = ()


def _canaries(path: Path, data: object) -> tuple[Canary, ...]:
    if not (isinstance(data, dict) and data.get("schema") == SESSION_SCHEMA):
        return ()
    answers = data.get("canaries", [])
    answers = [upgraded(answer) for answer in answers] if isinstance(answers, list) else answers
    return convert(path, {"canaries": answers}, _SessionCanaries).canaries


def _session_part(data: object, *keys: str) -> dict[str, object]:
    """The ``keys`` of a session JSON (none of another file)."""
    if not (isinstance(data, dict) and data.get("schema") == SESSION_SCHEMA):
        return {}
    return {key: data[key] for key in keys if key in data}


def _suite_runs(path: Path, data: object, answered: bool = False) -> list[tuple[str, object]]:
    """(where, run JSON) pairs of a session or pytest-benchmark JSON; a session with canary answers
    (``answered``) may have no runs."""
    if isinstance(data, dict) and data.get("schema") == SESSION_SCHEMA:
        runs = data.get("runs")
        if not isinstance(runs, list) or not (runs or answered):
            raise SourceError(f"{path}: runs: expected a non-empty list of runs (or canary answers), got {runs!r:.80}")
        return [(f"{path}: runs[{i}]", run) for i, run in enumerate(runs)]
    if isinstance(data, dict) and "schema" in data:
        raise SourceError(f"{path}: schema: expected {SESSION_SCHEMA!r} or {BENCH_SCHEMA!r}, got {data['schema']!r:.80}")
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        found = []
        for i, bench in enumerate(data["benchmarks"]):
            extra = bench.get("extra_info") if isinstance(bench, dict) else None
            if isinstance(extra, dict) and extra.get("qwenperf") is not None:
                found.append((f"{path}: benchmarks[{i}].extra_info.qwenperf", extra["qwenperf"]))
        if not found:
            raise SourceError(
                f"{path}: benchmarks[*].extra_info.qwenperf: expected at least one benchmark carrying a qwenperf run, "
                f"found none in {len(data['benchmarks'])} benchmark(s)"
            )
        return found
    raise SourceError(f"{path}: (top level): expected {EXPECTED}")


# ------------------------------------------------------------------ qwenperf bench --json


def _qwenperf_bench(path: Path, data: object) -> Result:
    """Greedy (the load generator sends temperature 0); the load is the arrival as the file names it."""
    bench = convert(path, data, BenchResult)
    failed = bench.metrics.get("failed")
    if failed is None or not math.isfinite(failed) or failed < 0:
        got = show(failed) if "failed" in bench.metrics else MISSING
        raise fault(path, "metrics.failed", "a finite, non-negative number", got)
    completed = bench.metrics.get("completed")
    setup = Setup(
        client="qwenperf bench",
        model=bench.identity.model,
        dataset=f"{bench.identity.workload} (fingerprint {bench.identity.workload_fingerprint})",
        input_len=mean_of(bench.metrics.get("total_input_tokens"), completed),
        output_len=mean_of(bench.metrics.get("total_output_tokens"), completed),
        load=bench.identity.arrival,
        sampling=GREEDY,
    )
    context = RunContext(
        vllm_version=bench.context.vllm_version,
        servers=bench.context.servers,
        started=bench.context.started,
        environment=bench.context.environment,
    )
    return bench_result(
        path,
        setup,
        dict(bench.metrics),
        context=context,
        steady_state=bench.steady_state,
        server=ServerCounters.of(bench.server.deltas),
        token_check=bench.token_check,
        client=bench.client,
        telemetry=bench.telemetry,
        conditions=bench.conditions,
        profile=bench.profile,
    )


# ------------------------------------------------------------------ vllm bench serve --save-result

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
_SERVE_MARKS = ("model_id", "backend", "endpoint_type", "tokenizer_id")
"""Keys every ``vllm bench serve`` result has and no other format: a file with one is read as one."""


class _VllmBenchServe(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a ``vllm bench serve --save-result`` file this reads; it has more."""

    model_id: Text
    num_prompts: Count
    request_rate: Annotated[NonNegative | Literal["inf"], msgspec.Meta(description="a number of requests/s >= 0, or 'inf'")]
    burstiness: NonNegative = 1.0
    max_concurrency: Annotated[int, msgspec.Meta(ge=1)] | None = None
    completed: Count
    failed: Count | None = None  # older vLLM saves none: num_prompts - completed
    total_input_tokens: Count
    total_output_tokens: Count
    request_throughput: NonNegative
    output_throughput: NonNegative
    total_token_throughput: NonNegative
    p99_ttft_ms: NonNegative | None = None
    p99_tpot_ms: NonNegative | None = None
    temperature: str | float | None = None  # --metadata temperature=T
    dataset_name: Text | None = None  # --metadata dataset_name=NAME


def _vllm_bench_serve(path: Path, data: Mapping[str, Any]) -> Result:
    """Its metrics under their own names (every number the registry knows as a client metric),
    ``failed`` counted when the file has none; the setup as the module docstring says."""
    bench = convert(path, data, _VllmBenchServe)
    failed = bench.failed if bench.failed is not None else max(bench.num_prompts - bench.completed, 0)
    metrics = client_metrics(data)
    setup = Setup(
        client="vllm bench serve",
        model=bench.model_id,
        dataset=f"{bench.dataset_name}, {bench.num_prompts} prompts" if bench.dataset_name else None,
        input_len=mean_of(bench.total_input_tokens, bench.completed),
        output_len=mean_of(bench.total_output_tokens, bench.completed),
        load=_load(bench),
        sampling=_sampling(path, bench.temperature),
    )
    checks = TokenCheck(matches=None, detail="vllm bench serve does not check its token totals against the server's")
    return bench_result(path, setup, metrics | {"failed": failed}, context=RunContext(), token_check=checks, client=ClientLoad())


def _load(bench: _VllmBenchServe) -> str:
    concurrency = f"max_concurrency={bench.max_concurrency}" if bench.max_concurrency else "max_concurrency=none"
    rate = bench.request_rate
    if rate == "inf" or rate == math.inf:
        return f"{concurrency}, request_rate=inf"
    return f"{concurrency}, request_rate={rate:g}, burstiness={bench.burstiness:g}"


def _sampling(path: Path, temperature: str | float | None) -> str | None:
    if temperature is None:
        return None
    expected = "a temperature >= 0 (the run's --temperature, saved with --metadata temperature=T)"
    try:
        value = float(temperature)
    except ValueError:
        raise fault(path, "temperature", expected, show(temperature)) from None
    if not (math.isfinite(value) and value >= 0):
        raise fault(path, "temperature", expected, show(temperature))
    return sampling(value)

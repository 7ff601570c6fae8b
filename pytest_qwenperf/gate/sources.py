"""The result files ``qwenperf compare`` reads, as runs: one reader per format, and what a bench
result measured (its :class:`Setup`).

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

Kept as one module though over 400 lines: the readers share the column rules (what a
directory holds, which files are skipped) and the :class:`Setup` two of them fill; each
reader is short.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.bench import BenchResult
from pytest_qwenperf.core.canary import Canary, CanaryJudgement
from pytest_qwenperf.core.formats import BENCH_SCHEMA, SESSION_SCHEMA, show
from pytest_qwenperf.core.identity import Count, Text
from pytest_qwenperf.core.metrics import find
from pytest_qwenperf.core.run import (
    MISSING,
    ClientLoad,
    Number,
    Run,
    RunContext,
    RunIdentity,
    RunJsonError,
    ServerCounters,
    TokenCheck,
    decode_run,
)
from pytest_qwenperf.core.textfiles import read_text
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.diagnosis import Diagnosis

T = TypeVar("T")
RunKey = tuple[str, str, str]  # suite, config id, workload id
BENCH_KEY: RunKey = ("bench", "", "")
"""The key of every bench result: the columns' bench results meet on it, whatever their setups."""
GREEDY = "greedy"
SUITE_RUN = "a qwenperf suite run"

EXPECTED = (
    f'a qwenperf session JSON ({{"schema": "{SESSION_SCHEMA}", "runs": [...]}}, from --qwenperf-json), '
    'a pytest-benchmark JSON ({"benchmarks": [{"extra_info": {"qwenperf": <run>}}, ...]}), '
    f'a qwenperf bench --json result ({{"schema": "{BENCH_SCHEMA}", ...}}) '
    'or a vllm bench serve --save-result result ({"model_id": ..., "completed": ..., ...})'
)


class SourceError(ValueError):
    """A file that is none of the formats, or holds a wrong field; the message names the file, the field and what was expected."""


# ------------------------------------------------------------------ setups

_UNKNOWN = {
    "dataset": "vllm bench serve saves no dataset name: record it with --metadata dataset_name=NAME",
    "input_len": "no request completed",
    "output_len": "no request completed",
    "sampling": "vllm bench serve saves no temperature, and without --temperature the server samples with its own "
    "default: record it with --metadata temperature=T",
}


@dataclass(frozen=True)
class Setup:
    """What a bench result measured, a text per field, the lengths as numbers; None where its file
    cannot tell (``_UNKNOWN`` says why)."""

    client: str  # the command that measured it
    model: str
    dataset: str | None
    input_len: float | None  # tokens per completed request, the mean that was realised
    output_len: float | None
    load: str
    sampling: str | None

    def differences(self, other: Setup) -> tuple[str, ...]:
        """``"field: 'mine' vs 'other'"`` for every field that differs; an unknown differs from any known
        value. The lengths differ only by more than :data:`LENGTH_TOLERANCE`, and say by how much."""
        found = []
        for name in (f.name for f in fields(self)):
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in LENGTHS and mine is not None and theirs is not None:
                apart = abs(mine - theirs) / max(mine, theirs) if max(mine, theirs) else 0.0
                if apart > LENGTH_TOLERANCE:
                    found.append(
                        f"{name}: {mine:.1f} vs {theirs:.1f} tokens per request, {apart:.1%} apart "
                        f"(repeats of one setup are within {LENGTH_TOLERANCE:.0%})"
                    )
            elif mine != theirs:
                found.append(f"{name}: {_shown(name, mine)} vs {_shown(name, theirs)}")
        return tuple(found)

    def describe(self) -> str:
        """One line for a table's title; fields not recorded are named, since matching them is an assumption."""
        lengths = f"{_length(self.input_len)} in / {_length(self.output_len)} out tokens per request"
        parts = [self.model, self.dataset or "dataset not recorded", lengths, self.load, self.sampling or "sampling not recorded"]
        return f"{' · '.join(parts)} ({self.client})"

    def as_json(self) -> dict[str, str | None]:
        """Every field as text (the lengths to one decimal), as ``qwenperf-compare/1`` holds a setup."""
        return {f.name: _length(getattr(self, f.name)) if f.name in LENGTHS else getattr(self, f.name) for f in fields(self)}

    def digest(self) -> str:
        """What tells setups apart in a run's identity: every field but the realised lengths, which
        repeats of one setup do not share exactly (:meth:`differences` holds them to a tolerance)."""
        named = {name: value for name, value in self.as_json().items() if name not in LENGTHS}
        return hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:16]


LENGTHS = ("input_len", "output_len")
LENGTH_TOLERANCE = 0.01
"""How far apart the realised mean lengths of repeats of one setup may be. A random workload's
repeats with different seeds (the usual way to make them independent) realise different means:
three ``vllm bench serve`` runs of one random 128-token workload differed by 0.08 %. One per cent
is ten times that, and far below any change of workload that matters (128 vs 256 tokens: 50 %)."""


def _length(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


def _shown(name: str, value: str | float | None) -> str:
    if value is None:
        return f"unknown ({_UNKNOWN[name]})"
    return repr(_length(value) if isinstance(value, float) else value)


def differences(reference: Setup | None, run: Setup | None) -> tuple[str, ...]:
    """Why a run is no verdict on the reference (``reference`` vs ``run``); None stands for a
    suite run, which its run identity matches instead. A suite run and a bench result never
    match: one is identified by its config's vLLM argv, the other by its command line."""
    if reference is not None and run is not None:
        return reference.differences(run)
    if reference is None and run is None:
        return ()
    kinds = [SUITE_RUN if s is None else s.client for s in (reference, run)]
    found = [f"source: {kinds[0]!r} vs {kinds[1]!r} (a suite run is identified by its config's vLLM argv, a bench result by its options)"]
    sampling = [GREEDY if s is None else s.sampling for s in (reference, run)]
    if sampling[0] != sampling[1] or None in sampling:
        found.append(f"sampling: {_shown('sampling', sampling[0])} vs {_shown('sampling', sampling[1])}")
    return tuple(found)


# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class Result:
    """One run read from a file: a suite run, or a bench result with its :class:`Setup`."""

    file: Path
    run: Run
    setup: Setup | None = None

    @property
    def key(self) -> RunKey:
        identity = self.run.identity
        return BENCH_KEY if self.setup is not None else (identity.suite, identity.config, identity.workload)


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
    canaries = _canaries(path, data)
    runs = []
    for where, data_of_run in _suite_runs(path, data, bool(canaries)):
        try:
            runs.append(Result(path, decode_run(data_of_run, where)))
        except RunJsonError as exc:
            raise SourceError(str(exc)) from None
    verdicts = _convert(path, _session_part(data, "verdicts", "canary_verdicts"), _SessionVerdicts)
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
    return _convert(path, {"canaries": data.get("canaries", [])}, _SessionCanaries).canaries


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


def _convert(path: Path, data: object, shape: type[T]) -> T:
    return schema.convert(data, shape, lambda m: SourceError(f"{path}: {m.text(show=show, absent=MISSING)}"), null=True)


def _fault(path: Path, field: str, expected: str, got: str) -> SourceError:
    """``file: field: expected ..., got ...`` as :mod:`~pytest_qwenperf.core.schema` words it; ``got`` as shown."""
    return SourceError(f"{path}: {field}: expected {expected}, got {got}")


def _mean(total: float | None, completed: float | None) -> float | None:
    return total / completed if total is not None and completed else None


def _bench_run(path: Path, setup: Setup, metrics: dict[str, Number], **blocks: Any) -> Result:
    """A bench result as a run whose identity is its setup's digest."""
    digest = setup.digest()
    identity = RunIdentity(
        suite=BENCH_KEY[0],
        config=setup.client,
        argv=(),
        model=setup.model,
        workload=setup.dataset or "unknown",
        workload_fingerprint=digest,
        hardware="not recorded",
    )
    return Result(path, Run(identity=identity, metrics=metrics, **blocks), setup)


# ------------------------------------------------------------------ qwenperf bench --json


def _qwenperf_bench(path: Path, data: object) -> Result:
    """Greedy (the load generator sends temperature 0); the load is the arrival as the file names it."""
    bench = _convert(path, data, BenchResult)
    failed = bench.metrics.get("failed")
    if failed is None or not math.isfinite(failed) or failed < 0:
        got = show(failed) if "failed" in bench.metrics else MISSING
        raise _fault(path, "metrics.failed", "a finite, non-negative number", got)
    completed = bench.metrics.get("completed")
    setup = Setup(
        client="qwenperf bench",
        model=bench.identity.model,
        dataset=f"{bench.identity.workload} (fingerprint {bench.identity.workload_fingerprint})",
        input_len=_mean(bench.metrics.get("total_input_tokens"), completed),
        output_len=_mean(bench.metrics.get("total_output_tokens"), completed),
        load=bench.identity.arrival,
        sampling=GREEDY,
    )
    context = RunContext(
        vllm_version=bench.context.vllm_version,
        servers=bench.context.servers,
        started=bench.context.started,
        environment=bench.context.environment,
    )
    return _bench_run(
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
    bench = _convert(path, data, _VllmBenchServe)
    failed = bench.failed if bench.failed is not None else max(bench.num_prompts - bench.completed, 0)
    metrics: dict[str, Number] = {name: value for name, value in data.items() if _client_metric(name) and _finite(value)}
    setup = Setup(
        client="vllm bench serve",
        model=bench.model_id,
        dataset=f"{bench.dataset_name}, {bench.num_prompts} prompts" if bench.dataset_name else None,
        input_len=_mean(bench.total_input_tokens, bench.completed),
        output_len=_mean(bench.total_output_tokens, bench.completed),
        load=_load(bench),
        sampling=_sampling(path, bench.temperature),
    )
    checks = TokenCheck(matches=None, detail="vllm bench serve does not check its token totals against the server's")
    return _bench_run(path, setup, metrics | {"failed": failed}, context=RunContext(), token_check=checks, client=ClientLoad())


def _client_metric(name: str) -> bool:
    info = find(name)
    return info is not None and info.path == ("metrics", name)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
        raise _fault(path, "temperature", expected, show(temperature)) from None
    if not (math.isfinite(value) and value >= 0):
        raise _fault(path, "temperature", expected, show(temperature))
    return GREEDY if value == 0 else f"temperature={value:g}"

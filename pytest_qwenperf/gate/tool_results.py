"""Other benchmark tools' results as runs ``qwenperf compare`` can judge: GuideLLM's benchmark
report and AIPerf's profile export.

Each is read as a bench result (:mod:`~pytest_qwenperf.gate.setups`): its metrics under the names
``vllm bench serve`` and this project use, its :class:`~pytest_qwenperf.gate.setups.Setup` from what
the file says of the model, the data, the load and the sampling, and the tool's name and version as
its client, so that results of two versions of one tool (which may define a metric differently)
are named apart. Each tool's figures are its own: nothing is recomputed, and what a tool means by
a name is mapped to the name that means the same here.

**GuideLLM** (``guidellm benchmark``/``run``, ``benchmarks.json``; report ``metadata.version`` 1
and 2, GuideLLM 0.5 to 0.8): one run per benchmark of the report (a sweep holds several, each at
its own load). Figures are its ``successful`` requests'. Its ``inter_token_latency_ms`` is what
vLLM calls TPOT, ``(e2e - ttft) / (tokens - 1)``, but weighted by tokens rather than averaged per
request; its ``time_per_output_token_ms`` includes the TTFT and is not mapped; its
``request_latency`` is in seconds. It reports no gap between chunks (vLLM's ITL).

**AIPerf** (``aiperf profile``, ``profile_export_aiperf.json``; ``schema_version`` 1.x): one run.
Each metric's ``unit`` is authoritative and converted. Its ``inter_token_latency`` is vLLM's TPOT,
per request; its ``inter_chunk_latency`` is not vLLM's ITL (a mean per request, not the pooled
gaps) and is not mapped. It counts no incomplete requests; errors are ``error_request_count``.

**One run a file.** Neither tool repeats a point by itself: a file is one sample of each metric,
so its verdicts have no spread of their own to weigh. A column of one file against another's
gets a verdict only where the change is clear of the tolerance, and its MDE says what it could
not see; a directory of several files a side (repeats of one command) is what gives the verdict
its noise (``docs/compare.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.run import ClientLoad, Number, RunContext, TokenCheck
from pytest_qwenperf.core.run_json import MISSING
from pytest_qwenperf.gate.setups import (
    Result,
    Setup,
    SourceError,
    bench_result,
    client_metrics,
    convert,
    fault,
    mean_of,
    sampling,
)

# ------------------------------------------------------------------ GuideLLM


def is_guidellm(data: object) -> bool:
    """A GuideLLM report: ``metadata.guidellm_version``, or benchmarks of its ``generative_benchmark`` kind."""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        return False
    metadata = data.get("metadata")
    if isinstance(metadata, dict) and "guidellm_version" in metadata:
        return True
    return any(isinstance(b, dict) and b.get("type_") == "generative_benchmark" for b in data["benchmarks"])


class _Distribution(msgspec.Struct, frozen=True, kw_only=True):
    """A GuideLLM distribution summary: the parts read."""

    mean: float
    median: float | None = None
    std_dev: float | None = None
    total_sum: float | None = None
    percentiles: dict[str, float] = msgspec.field(default_factory=dict)


class _ByStatus(msgspec.Struct, frozen=True, kw_only=True):
    successful: _Distribution


class _Totals(msgspec.Struct, frozen=True, kw_only=True):
    successful: int
    errored: int = 0
    incomplete: int = 0


class _GuideLLMMetrics(msgspec.Struct, frozen=True, kw_only=True):
    request_totals: _Totals
    requests_per_second: _ByStatus
    output_tokens_per_second: _ByStatus
    tokens_per_second: _ByStatus
    prompt_token_count: _ByStatus
    output_token_count: _ByStatus
    time_to_first_token_ms: _ByStatus
    inter_token_latency_ms: _ByStatus
    request_latency: _ByStatus  # seconds


class _GuideLLMBenchmark(msgspec.Struct, frozen=True, kw_only=True):
    config: dict[str, Any]
    metrics: _GuideLLMMetrics
    start_time: float  # epoch seconds: the measured window's start (after warm-up)
    duration: float


class _GuideLLMReport(msgspec.Struct, frozen=True, kw_only=True):
    benchmarks: tuple[_GuideLLMBenchmark, ...]
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    config: dict[str, Any] = msgspec.field(default_factory=dict)  # report version 2: the scenario
    args: dict[str, Any] = msgspec.field(default_factory=dict)  # report version 1: the arguments


GUIDELLM_PERCENTILES = {"p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99"}
"""Our percentile → GuideLLM's key (``p001`` is its 0.1th, ``p01`` its 1st: only these agree by name)."""


def read_guidellm(path: Path, data: object) -> tuple[Result, ...]:
    """One result per benchmark of a GuideLLM report (see the module docstring)."""
    report = convert(path, data, _GuideLLMReport)
    if not report.benchmarks:
        raise fault(path, "benchmarks", "a non-empty list of benchmarks", "[]")
    version = report.metadata.get("guidellm_version")
    client = f"guidellm {version}" if version else "guidellm (version not recorded)"
    return tuple(_guidellm_result(path, report, benchmark, client) for benchmark in report.benchmarks)


def _guidellm_result(path: Path, report: _GuideLLMReport, benchmark: _GuideLLMBenchmark, client: str) -> Result:
    m = benchmark.metrics
    completed = m.request_totals.successful
    prompt_tokens = m.prompt_token_count.successful.total_sum
    output_tokens = m.output_token_count.successful.total_sum
    metrics: dict[str, Number] = {
        "completed": completed,
        "failed": m.request_totals.errored,
        "duration": benchmark.duration,
        "request_throughput": m.requests_per_second.successful.mean,
        "output_throughput": m.output_tokens_per_second.successful.mean,
        "total_token_throughput": m.tokens_per_second.successful.mean,
    }
    if prompt_tokens is not None and output_tokens is not None:
        metrics |= {"total_input_tokens": prompt_tokens, "total_output_tokens": output_tokens}
    metrics |= _latency("ttft", m.time_to_first_token_ms.successful, 1.0)
    metrics |= _latency("tpot", m.inter_token_latency_ms.successful, 1.0)
    metrics |= _latency("e2el", m.request_latency.successful, 1000.0)
    setup = Setup(
        client=client,
        model=_guidellm_model(report, benchmark) or "model not recorded",
        dataset=_guidellm_data(report),
        input_len=mean_of(prompt_tokens, completed),
        output_len=mean_of(output_tokens, completed),
        load=_guidellm_load(benchmark.config.get("strategy")),
        sampling=_guidellm_sampling(report, benchmark),
    )
    checks = TokenCheck(matches=None, detail=f"{client} does not check its token totals against the server's")
    return bench_result(path, setup, _known(metrics), context=RunContext(), token_check=checks, client=ClientLoad())


def _latency(name: str, found: _Distribution, to_ms: float) -> dict[str, Number]:
    figures = {f"mean_{name}_ms": found.mean, f"median_{name}_ms": found.median, f"std_{name}_ms": found.std_dev}
    figures |= {f"{ours}_{name}_ms": found.percentiles.get(theirs) for ours, theirs in GUIDELLM_PERCENTILES.items()}
    return {key: value * to_ms for key, value in figures.items() if value is not None}


def _guidellm_model(report: _GuideLLMReport, benchmark: _GuideLLMBenchmark) -> str | None:
    backend = benchmark.config.get("backend")
    spec_backend = _dig(report.config, "spec", "backend")
    for found in (_dig(backend, "model"), _dig(spec_backend, "model"), report.args.get("model")):
        if isinstance(found, str) and found:
            return found
    return None


def _guidellm_data(report: _GuideLLMReport) -> str | None:
    """The report's data sources as given (version 2: ``config.spec.data``, tables of a ``kind`` and its
    settings; version 1: ``args.data``, texts)."""
    data = _dig(report.config, "spec", "data") or report.args.get("data")
    if not data:
        return None
    return ", ".join(_source(item) for item in (data if isinstance(data, list) else [data]))


def _source(item: object) -> str:
    """``json_file path=/data/prompts.jsonl``: a data source's kind and its non-empty settings."""
    if not isinstance(item, dict):
        return str(item)
    settings = " ".join(f"{key}={value}" for key, value in item.items() if key != "kind" and value not in (None, {}, []))
    return f"{item.get('kind', 'data')} {settings}".strip()


def _guidellm_sampling(report: _GuideLLMReport, benchmark: _GuideLLMBenchmark) -> str | None:
    """The temperature its backend's ``extras`` put in every request body; None where none was set
    (GuideLLM then sends none, and the server samples with its own default)."""
    for backend in (benchmark.config.get("backend"), _dig(report.config, "spec", "backend")):
        found = _sampling(_dig(backend, "extras", "body", "temperature"))
        if found is not None:
            return found
    return None


def _guidellm_load(strategy: object) -> str:
    if not isinstance(strategy, dict) or "type_" not in strategy:
        return "load not recorded"
    kind = strategy["type_"]
    shown = {key: strategy[key] for key in ("streams", "rate", "max_concurrency") if strategy.get(key) is not None}
    return f"{kind}" + (f" ({', '.join(f'{k}={v}' for k, v in shown.items())})" if shown else "")


# ------------------------------------------------------------------ AIPerf


def is_aiperf(data: object) -> bool:
    """An AIPerf profile export: ``aiperf_version``, or its resolved ``input_config`` beside its metrics."""
    return isinstance(data, dict) and ("aiperf_version" in data or ("input_config" in data and "request_throughput" in data))


class _Metric(msgspec.Struct, frozen=True, kw_only=True):
    """An AIPerf metric: its unit and the statistics it has (derived metrics have ``avg`` alone)."""

    unit: str
    avg: float
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    std: float | None = None


TO_MS = {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "us": 0.001, "ns": 1e-6}
"""An AIPerf time unit → milliseconds."""

AIPERF_LATENCIES = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "e2el": "request_latency"}
"""Our latency → AIPerf's metric of the same meaning."""


def read_aiperf(path: Path, data: Mapping[str, Any]) -> tuple[Result, ...]:
    """The run of an AIPerf profile export (see the module docstring)."""
    metric = {name: _aiperf_metric(path, data, name) for name in _AIPERF_READ if name in data}
    for needed in ("request_count", "request_throughput", "output_token_throughput"):
        if needed not in metric:
            raise fault(path, needed, "an AIPerf metric ({'unit': ..., 'avg': ...})", MISSING)
    completed = metric["request_count"].avg
    failed = metric["error_request_count"].avg if "error_request_count" in metric else 0.0
    metrics: dict[str, Number] = {
        "completed": completed,
        "failed": failed,
        "request_throughput": metric["request_throughput"].avg,
        "output_throughput": metric["output_token_throughput"].avg,
    }
    for ours, theirs in (("total_token_throughput", "total_token_throughput"), ("duration", "benchmark_duration")):
        if theirs in metric:
            metrics[ours] = metric[theirs].avg
    prompt_tokens = metric["total_isl"].avg if "total_isl" in metric else None
    output_tokens = metric["total_osl"].avg if "total_osl" in metric else None
    if prompt_tokens is not None and output_tokens is not None:
        metrics |= {"total_input_tokens": prompt_tokens, "total_output_tokens": output_tokens}
    for ours, theirs in AIPERF_LATENCIES.items():
        if theirs in metric:
            metrics |= _aiperf_latency(path, ours, theirs, metric[theirs])
    version = data.get("aiperf_version")
    client = f"aiperf {version}" if version else "aiperf (version not recorded)"
    found = data.get("input_config")
    config: Mapping[str, Any] = found if isinstance(found, dict) else {}
    setup = Setup(
        client=client,
        model=_aiperf_model(config) or "model not recorded",
        dataset=_aiperf_dataset(config),
        input_len=mean_of(prompt_tokens, completed),
        output_len=mean_of(output_tokens, completed),
        load=_aiperf_load(config),
        sampling=_aiperf_sampling(config),
    )
    checks = TokenCheck(matches=None, detail=f"{client} does not check its token totals against the server's")
    context = RunContext(started=data["start_time"] if isinstance(data.get("start_time"), str) else None)
    return (bench_result(path, setup, _known(metrics), context=context, token_check=checks, client=ClientLoad()),)


_AIPERF_READ = (
    "request_count",
    "error_request_count",
    "request_throughput",
    "output_token_throughput",
    "total_token_throughput",
    "benchmark_duration",
    "total_isl",
    "total_osl",
    *AIPERF_LATENCIES.values(),
)


def _aiperf_metric(path: Path, data: Mapping[str, Any], name: str) -> _Metric:
    """``data[name]`` as a metric; a mismatch names the file and ``name.<field>``."""

    def error(m: schema.Mismatch) -> SourceError:
        return SourceError(f"{path}: {m.text(field=f'{name}.{m.field}' if m.field else name, show=show, absent=MISSING)}")

    return schema.convert(data[name], _Metric, error, null=True)


def _aiperf_latency(path: Path, ours: str, theirs: str, found: _Metric) -> dict[str, Number]:
    scale = TO_MS.get(found.unit)
    if scale is None:
        raise fault(path, f"{theirs}.unit", f"a time unit ({', '.join(TO_MS)})", show(found.unit))
    figures = {f"mean_{ours}_ms": found.avg, f"median_{ours}_ms": found.p50, f"std_{ours}_ms": found.std}
    figures |= {f"{p}_{ours}_ms": getattr(found, p) for p in ("p50", "p90", "p95", "p99")}
    return {key: value * scale for key, value in figures.items() if value is not None}


def _aiperf_model(config: Mapping[str, Any]) -> str | None:
    """Configuration 2.0: ``models.items[0].name``; before: ``endpoint.model_names[0]``."""
    items = _dig(config, "models", "items")
    if isinstance(items, list) and items and isinstance(items[0], dict) and items[0].get("name"):
        return str(items[0]["name"])
    names = _dig(config, "endpoint", "model_names")
    return str(names[0]) if isinstance(names, list) and names else None


def _aiperf_dataset(config: Mapping[str, Any]) -> str | None:
    """Its datasets (``datasets``: a file's format and path, or a synthetic one's settings)."""
    found = config.get("datasets")
    if not found:
        return None
    tables = [item if not isinstance(item, dict) else {"kind": item.get("type"), **{k: v for k, v in item.items() if k not in ("name", "type")}} for item in found]
    return ", ".join(_source(table) for table in tables)


def _aiperf_load(config: Mapping[str, Any]) -> str:
    """The profiling phase's type, concurrency and rate (configuration 2.0, phases a table or a list), else ``loadgen``'s."""
    phases = config.get("phases")
    listed = list(phases.values()) if isinstance(phases, dict) else phases if isinstance(phases, list) else []
    profiling = next((p for p in listed if isinstance(p, dict) and "profiling" in (p.get("kind"), p.get("name"))), None)
    if profiling is None and isinstance(phases, dict) and isinstance(phases.get("profiling"), dict):
        profiling = phases["profiling"]
    source = profiling if profiling is not None else _dig(config, "loadgen")
    if not isinstance(source, dict):
        return "load not recorded"
    shown = {key: source[key] for key in ("type", "request_rate_mode", "concurrency", "rate", "request_rate") if source.get(key) is not None}
    return ", ".join(f"{key}={value}" for key, value in shown.items()) or "load not recorded"


def _aiperf_sampling(config: Mapping[str, Any]) -> str | None:
    """The temperature ``--extra-inputs temperature:T`` put in every request body (``endpoint.extra``);
    None where none was set (the server then samples with its own default)."""
    return _sampling(_dig(config, "endpoint", "extra", "temperature"))


# ------------------------------------------------------------------ shared


def _sampling(temperature: object) -> str | None:
    """The setup's sampling for a temperature a file recorded; None where it recorded no number."""
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        return sampling(temperature)
    return None


def _dig(node: object, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _known(metrics: Mapping[str, Number]) -> dict[str, Number]:
    """The figures the registry knows as client metrics, finite (:func:`~pytest_qwenperf.gate.setups.client_metrics`); ``failed`` always."""
    return client_metrics(metrics) | {"failed": metrics["failed"]}

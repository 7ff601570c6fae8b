"""The baseline store: schema, atomic writes with history, clear errors, refusals, the seeded b200 figures."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.identity import Context
from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.run_json import RunJsonError, decode_run
from pytest_qwenperf.core.summary import RunSummary, TokenCrossCheck
from pytest_qwenperf.gate.baseline import (
    SCHEMA,
    BaselineError,
    BaselineRefused,
    PublishedBaselineKept,
    decode_baseline,
    find_baseline,
    load_baseline,
    published_baseline,
    write_baseline,
)
from pytest_qwenperf.gate.judge import judge_run
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

SUITES = Path(__file__).parents[1] / "perf_tests" / "suites"
BASELINES = Path(__file__).parents[1] / "baselines"


@cache
def suite(name: str) -> Suite:
    return load_suite(SUITES / f"{name}.toml")


def make_run(
    config: str = "base",
    workload: str = "isl128-osl128",
    *,
    version: str = "0.32.0",
    total: float = 10_000.0,
    output: float = 5_000.0,
    ttft: float = 200.0,
    tpot: float = 20.0,
    failed: int = 0,
    bound: str | None = None,
    tokens_match: bool | None = True,
    hit_rate: float | None = None,
    samples: Mapping[str, Sequence[float]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's JSON as the report writes it: a run of the CPU suite, through JSON."""
    cpu = suite("cpu")
    summary = RunSummary.from_values(
        {
            "duration": 10.0,
            "completed": 256,
            "failed": failed,
            "total_input_tokens": 32768,
            "total_output_tokens": 32768,
            "request_throughput": total / 256,
            "output_throughput": output,
            "total_token_throughput": total,
            "p99_ttft_ms": ttft,
            "p99_tpot_ms": tpot,
            "achieved_request_rate": float("inf"),
        }
    )
    deltas = {"prefix_cache_hits": hit_rate * 1000, "prefix_cache_queries": 1000.0} if hit_rate is not None else {}
    seen = observation(summary, deltas=deltas, per_server={"http://127.0.0.1:8000": 288.0}, tokens_match=tokens_match, bound=bound)
    result = build_run(
        cpu.config(config),
        next(w for w in cpu.workloads if w.id == workload),
        seen,
        Method(suite=cpu.name),
        (ServerInfo("http://127.0.0.1:8000", "tiny", version, 2048),),
        Hardware(kind="cpu", cpu_model="Test CPU", cpu_ids=frozenset({0, 1})),
    )
    run = json.loads(json.dumps(json_safe(msgspec.to_builtins(result))))
    if samples is not None:
        run["samples"] = {name: list(values) for name, values in samples.items()}
    return run | dict(extra or {})


def observation(
    summary: RunSummary,
    *,
    deltas: Mapping[str, float | None] | None = None,
    per_server: Mapping[str, float | None] | None = None,
    tokens_match: bool | None = True,
    bound: str | None = None,
) -> Observation:
    """What a load run saw, made up: no records, these figures (as :func:`observe` returns them)."""
    return Observation(
        load=LoadResult((), 0.0, 10.0, ClosedLoop(1), LoadOptions(), ((1,),)),
        summary=summary,
        steady=None,
        server_deltas=deltas or {},
        requests_per_server=per_server or {},
        tokens=TokenCrossCheck(1, 1, 1.0, 1.0, 0, tokens_match),
        client_bound=bound,
        client_cpu_busy=0.4,
        started="2026-04-01T02:00:00+00:00",
        telemetry=TelemetrySummary(window=None, gpu=None, cpu=None, server=None),
    )


def run_of(data: Mapping[str, Any] | None = None, **changes: Any) -> Run:
    """The typed run of ``data`` (default :func:`make_run` of ``changes``), as a file's run is read."""
    return decode_run(make_run(**changes) if data is None else data)


def test_round_trip_keeps_identity_context_metrics_and_provenance(tmp_path: Path) -> None:
    run = make_run(hit_rate=0.5, samples={"total_token_throughput": [9_900.0, 10_000.0, 10_100.0]})
    path = write_baseline(tmp_path, run_of(run), source="nightly", git_commit="abc123")
    assert path == tmp_path / "cpu-test-cpu-2c" / "embedded-tiny" / "base" / "isl128-osl128.json"  # CPU model and cores
    stored = load_baseline(path)
    assert stored.identity == suite("cpu").identity("base", "isl128-osl128", hardware="cpu-test-cpu-2c")
    machine = Machine(kind="cpu", id="cpu-test-cpu-2c", gpu_count=0, cpu_model="Test CPU", cpu_count=2)
    assert stored.context == Context(vllm_version="0.32.0", machine=machine, date="2026-04-01T02:00:00+00:00", git_commit="abc123")
    assert stored.provenance.kind == "measured" and stored.provenance.source == "nightly"
    assert set(stored.metrics) == {
        "total_token_throughput",
        "output_throughput",
        "request_throughput",
        "p99_ttft_ms",
        "p99_tpot_ms",
        "prefix_cache_hit_rate",
    }
    total = stored.metrics["total_token_throughput"]
    assert total.samples == (9_900.0, 10_000.0, 10_100.0) and total.unit == "tok/s" and total.direction == "higher"
    assert total.value == pytest.approx(10_000.0, rel=1e-3)
    assert stored.metrics["p99_ttft_ms"].direction == "lower"
    assert stored.metrics["p99_ttft_ms"].tolerance == metric("p99_ttft_ms").tolerance
    assert stored.metrics["prefix_cache_hit_rate"].samples == (0.5,)
    assert decode_baseline(msgspec.json.encode(stored), "again") == stored
    assert json.loads(path.read_text())["schema"] == SCHEMA


def test_each_write_moves_the_previous_metrics_to_history_newest_last(tmp_path: Path) -> None:
    for total, version in ((10_000.0, "0.30.0"), (11_000.0, "0.31.0"), (12_000.0, "0.32.0")):
        path = write_baseline(tmp_path, run_of(total=total, version=version), git_commit="c")
    stored = load_baseline(path)
    assert stored.metrics["total_token_throughput"].value == 12_000.0
    assert [h.context.vllm_version for h in stored.history] == ["0.30.0", "0.31.0"]
    assert [h.metrics["total_token_throughput"].value for h in stored.history] == [10_000.0, 11_000.0]
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file may be left behind"


def test_find_baseline_is_none_until_one_is_written(tmp_path: Path) -> None:
    identity = suite("cpu").identity("base", "isl128-osl128", hardware="cpu-test-cpu-2c")
    assert find_baseline(tmp_path, identity) is None
    write_baseline(tmp_path, run_of(), git_commit="c")
    found = find_baseline(tmp_path, identity)
    assert found is not None and found.identity == identity


def _stored(tmp_path: Path) -> Path:
    return write_baseline(tmp_path, run_of(), git_commit="c")


def test_a_half_written_file_names_file_and_is_never_overwritten(tmp_path: Path) -> None:
    path = _stored(tmp_path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=r"truncated or half-written") as caught:
        load_baseline(path)
    assert str(path) in str(caught.value) and "expected a complete qwenperf-baseline/1 JSON document" in str(caught.value)
    with pytest.raises(BaselineError):
        write_baseline(tmp_path, run_of(total=20_000.0), git_commit="c")
    assert path.read_bytes() == before


def test_a_schema_mismatch_names_file_field_and_expectation_and_is_never_overwritten(tmp_path: Path) -> None:
    path = _stored(tmp_path)
    data = json.loads(path.read_text())
    data["schema"] = "qwenperf-baseline/2"
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(BaselineError) as caught:
        load_baseline(path)
    assert str(caught.value) == f"{path}: schema: expected 'qwenperf-baseline/1', got 'qwenperf-baseline/2'"
    with pytest.raises(BaselineError):
        write_baseline(tmp_path, run_of(total=20_000.0), git_commit="c")
    assert path.read_bytes() == before


def _drop(*keys: str) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        target = data
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return edit


def _set(value: object, *keys: str | int) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        target: Any = data
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop("identity", "config"), "identity.config: expected a string, got nothing (the field is missing)"),
        (_set(7, "identity", "argv_sha256"), "identity.argv_sha256: expected a string, got 7"),
        (_set("x", "metrics", "p99_ttft_ms", "samples"), "metrics.p99_ttft_ms.samples: expected `array`, got 'x'"),
        (_set([1.0, "2"], "metrics", "p99_ttft_ms", "samples"), "metrics.p99_ttft_ms.samples[1]: expected a number, got '2'"),
        (_set([], "metrics", "p99_ttft_ms", "samples"), "metrics.p99_ttft_ms.samples: expected `array` of length >= 1, got []"),
        (_set([1.0, -2.0], "metrics", "p99_ttft_ms", "samples"), "metrics.p99_ttft_ms.samples[1]: expected a number >= 0.0, got -2.0"),
        (_set("", "identity", "model"), "identity.model: expected a string of length >= 1, got ''"),
        (_set("up", "metrics", "p99_ttft_ms", "direction"), "metrics.p99_ttft_ms.direction: expected one of 'higher', 'lower', 'none', got 'up'"),
        (_set(1.5, "metrics", "p99_ttft_ms", "tolerance"), "metrics.p99_ttft_ms.tolerance: expected a fraction in [0, 1)"),
        (_set(1.0, "metrics", "p99_ttft_ms", "value"), "metrics.p99_ttft_ms.value: expected the centre of its samples"),
        (_set([0], "metrics", "p99_ttft_ms", "sessions"), "metrics.p99_ttft_ms.sessions[0]: expected an integer >= 1, got 0"),
        (_set([7], "metrics", "p99_ttft_ms", "sessions"), "metrics.p99_ttft_ms.sessions: expected counts of samples per session adding up to its"),
        (_set({}, "metrics"), "metrics: expected `object` of length >= 1, got {}"),
        (_set("eight", "context", "machine", "gpu_count"), "context.machine.gpu_count: expected an integer"),
        (_set("guessed", "provenance", "kind"), "provenance.kind: expected one of 'measured', 'published', got 'guessed'"),
        (_set({}, "history"), "history: expected `array`, got {}"),
        (_set([{"context": {}, "metrics": {}, "provenance": {}}], "history"), "history[0].metrics: expected `object` of length >= 1, got {}"),
        (_set([], "identity"), "identity: expected `object`, got []"),
    ],
)
def test_a_malformed_field_names_file_field_and_expectation(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    path = _stored(tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError) as caught:
        load_baseline(path)
    assert str(caught.value).startswith(f"{path}: {message}")


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        (make_run(failed=3), r"3 request\(s\) failed"),
        (make_run(tokens_match=False), "token counts disagree"),
        (make_run(bound="p99 scheduling lag 80.0 ms exceeds 50.0 ms"), "the client could not keep up"),
    ],
    ids=["failed", "token-mismatch", "client-bound"],
)
def test_unfit_runs_are_refused_and_leave_the_file_untouched(tmp_path: Path, run: dict[str, Any], reason: str) -> None:
    with pytest.raises(BaselineRefused, match=reason):
        write_baseline(tmp_path, run_of(run), git_commit="c")
    assert not any(tmp_path.rglob("*.json")), "a refused first run must not create a file"
    path = _stored(tmp_path)
    before = path.read_bytes()
    with pytest.raises(BaselineRefused, match=reason):
        write_baseline(tmp_path, run_of(run), git_commit="c")
    assert path.read_bytes() == before


def test_a_run_that_is_not_comparable_is_refused(tmp_path: Path) -> None:
    path = _stored(tmp_path)
    before = path.read_bytes()
    changed = make_run()
    changed["identity"]["argv"] = [*changed["identity"]["argv"], "--max-num-seqs", "64"]
    with pytest.raises(BaselineRefused, match=r"not comparable with the stored baseline \(stored vs run: argv_sha256: "):
        write_baseline(tmp_path, run_of(changed), git_commit="c")
    assert path.read_bytes() == before


def test_an_update_keeps_each_stored_tolerance_and_takes_the_runs_for_new_metrics(tmp_path: Path) -> None:
    path = _stored(tmp_path)
    data = json.loads(path.read_text())
    data["metrics"]["p99_ttft_ms"]["tolerance"] = 0.6  # set by hand: the file's tolerance is authoritative
    del data["metrics"]["p99_tpot_ms"]
    path.write_text(json.dumps(data))
    stored = load_baseline(write_baseline(tmp_path, run_of(ttft=210.0), git_commit="c"))
    assert stored.metrics["p99_ttft_ms"].tolerance == 0.6 and stored.metrics["p99_ttft_ms"].value == 210.0
    assert stored.metrics["p99_tpot_ms"].tolerance == metric("p99_tpot_ms").tolerance
    assert stored.history[0].metrics["p99_ttft_ms"].tolerance == 0.6


def test_a_published_baseline_is_replaced_only_when_asked(tmp_path: Path) -> None:
    path = _stored(tmp_path)
    data = json.loads(path.read_text())
    data["provenance"] = {"kind": "published", "source": "https://example.com/figures"}
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(PublishedBaselineKept, match=r"not updated: it holds published figures") as caught:
        write_baseline(tmp_path, run_of(total=20_000.0), git_commit="c")
    assert isinstance(caught.value, BaselineRefused) and str(caught.value).startswith(f"{path}: ")
    assert path.read_bytes() == before
    stored = load_baseline(write_baseline(tmp_path, run_of(total=20_000.0), git_commit="c", replace_published=True))
    assert stored.provenance.kind == "measured" and stored.metrics["total_token_throughput"].value == 20_000.0
    assert [h.provenance.source for h in stored.history] == ["https://example.com/figures"]


def test_runs_carry_gated_metrics_from_metrics_server_and_samples() -> None:
    run = make_run(hit_rate=0.25, samples={"p99_tpot_ms": [19.0, 21.0]})
    measured = run_of(run)
    samples = measured.gated_samples()
    assert samples["prefix_cache_hit_rate"] == (0.25,)
    assert samples["p99_tpot_ms"] == (19.0, 21.0)
    assert "achieved_request_rate" not in samples and "completed" not in samples
    assert measured.client_bound is None and measured.token_check.matches is True and measured.failed_requests == 0
    run["context"]["machine"]["cpu_model"] = ""  # what an unknown CPU reports
    assert run_of(run).baseline_context.machine.cpu_model is None


def test_a_runs_tolerances_become_the_baselines_and_bad_ones_name_the_field(tmp_path: Path) -> None:
    run = make_run(extra={"tolerances": {"total_token_throughput": 0.25}})
    stored = load_baseline(write_baseline(tmp_path, run_of(run), git_commit="c"))
    assert stored.metrics["total_token_throughput"].tolerance == 0.25
    assert stored.metrics["output_throughput"].tolerance == 0.05  # the default where the suite says nothing
    with pytest.raises(RunJsonError, match=r"run: tolerances.completed: expected a gated metric"):
        run_of(extra={"tolerances": {"completed": 0.1}})
    with pytest.raises(RunJsonError, match=r"run: tolerances.p99_ttft_ms: expected a fraction in \[0, 1\), got 2"):
        run_of(extra={"tolerances": {"p99_ttft_ms": 2}})


def test_tokens_per_joule_from_gpu_telemetry_is_gated_higher_is_better(tmp_path: Path) -> None:
    def run_at(tokens_per_joule: float, spread: float) -> dict[str, Any]:
        run = make_run(samples={"tokens_per_joule": [tokens_per_joule - spread, tokens_per_joule, tokens_per_joule + spread]})
        run["telemetry"]["gpu"] = {"tokens_per_joule": tokens_per_joule}
        return run

    assert run_of(make_run() | {"telemetry": {"gpu": {"tokens_per_joule": 3.5}}}).gated_samples()["tokens_per_joule"] == (3.5,)
    write_baseline(tmp_path, run_of(run_at(4.0, 0.02)), git_commit="c")
    stored = load_baseline(tmp_path / "cpu-test-cpu-2c" / "embedded-tiny" / "base" / "isl128-osl128.json")
    assert stored.metrics["tokens_per_joule"].unit == "tok/J" and stored.metrics["tokens_per_joule"].direction == "higher"
    verdicts = {j.metric: j.verdict for j in judge_run(stored, run_of(run_at(3.0, 0.02)))}
    assert verdicts["tokens_per_joule"] == "regression"
    verdicts = {j.metric: j.verdict for j in judge_run(stored, run_of(run_at(5.0, 0.02)))}
    assert verdicts["tokens_per_joule"] == "improvement"


# The write-up's published figures (REFERENCE.md §1): per-node total tok/s on the random
# 1024-in / 512-out workload, and scaling efficiency over 2..12 nodes for the final rung.
ARTICLE = "https://medium.com/google-cloud/1-million-tokens-per-second-qwen-3-5-27b-on-gke-with-b200-gpus-161da5c1b592"
PUBLISHED = {
    ("dp8-ctx4k-fp8kv-mtp1", "isl1024-osl512"): (
        {
            "total_token_throughput": 95_317.0,
            "scaling_efficiency_n2": 0.997,
            "scaling_efficiency_n4": 0.986,
            "scaling_efficiency_n8": 0.971,
            "scaling_efficiency_n12": 0.965,
        },
        f"{ARTICLE} (per-node figure and scaling table from the README of https://github.com/m4r1k/vllm-1mtps)",
    ),
    ("dp8", "isl1024-osl512"): (
        {"total_token_throughput": 74_848.0},
        (
            f"{ARTICLE} (the DP=8 step of its ladder, as quoted by "
            "https://insights.marvin-42.com/articles/localllamaqwen-35-27b110-toksb200vllm-tuning)"
        ),
    ),
}
PUBLISHED_CONTEXT = Context(vllm_version="0.18.0", machine=Machine(gpu_name="NVIDIA B200", gpu_count=8), date="2026-03-26")


@pytest.mark.parametrize(("config", "workload"), list(PUBLISHED))
def test_seeded_b200_baselines_are_the_published_figures_with_the_suites_identity(config: str, workload: str) -> None:
    """When the b200 suite changes a rung's argv or the workload, this fails; regenerate the file with
    ``save_baseline(Path("baselines"), published_baseline(suite.identity(config, workload), values, source=..., context=...))``."""
    values, source = PUBLISHED[(config, workload)]
    expected = published_baseline(suite("b200").identity(config, workload), values, source=source, context=PUBLISHED_CONTEXT)
    stored = load_baseline(expected.identity.path(BASELINES))
    assert stored.identity == suite("b200").identity(config, workload)
    assert stored == expected
    assert stored.provenance.kind == "published"


def test_only_the_published_b200_baselines_are_seeded() -> None:
    files = sorted(p.relative_to(BASELINES).as_posix() for p in (BASELINES / "b200").rglob("*.json"))
    assert files == [
        "b200/Qwen--Qwen3.5-27B-FP8/dp8-ctx4k-fp8kv-mtp1/isl1024-osl512.json",
        "b200/Qwen--Qwen3.5-27B-FP8/dp8/isl1024-osl512.json",
    ]

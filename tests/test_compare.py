"""``qwenperf compare`` on small session and pytest-benchmark JSON files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.core.canary import Canary, CanaryFloor
from pytest_qwenperf.core.verdict import Hearing, Side, format_mde, judge
from tests.test_baseline import make_run
from tests.test_canary import make_canary


def session_file(path: Path, runs: Sequence[dict[str, Any]], canaries: Sequence[Canary] = ()) -> Path:
    answers = [msgspec.to_builtins(answer) for answer in canaries]
    path.write_text(json.dumps({"schema": "qwenperf-session/1", "hardware": {}, "boots": {}, "runs": list(runs), "canaries": answers}))
    return path


def benchmark_file(path: Path, runs: Sequence[dict[str, Any]]) -> Path:
    benchmarks = [{"name": "test_other", "extra_info": {}, "stats": {}}] + [
        {"name": f"test_{i}", "extra_info": {"qwenperf": run, "unit": "s"}, "stats": {}} for i, run in enumerate(runs)
    ]
    path.write_text(json.dumps({"machine_info": {"gpu_name": None}, "commit_info": {}, "benchmarks": benchmarks}))
    return path


def compare(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = main(["compare", *(str(a) for a in args)])
    out, err = capsys.readouterr()
    return status, out, err


def _rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}


def test_same_numbers_on_a_new_version_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run("base"), make_run("ctx-short")])
    new = benchmark_file(tmp_path / "new.json", [make_run("base", version="0.33.0"), make_run("ctx-short", version="0.33.0")])
    status, out, _ = compare(capsys, old, new, "--fail-on", "regression")
    assert status == 0
    assert "cpu/base · isl128-osl128 (cpu-test-cpu-2c)" in out and "cpu/ctx-short · isl128-osl128 (cpu-test-cpu-2c)" in out
    header = out.splitlines()[1].split()
    assert header == ["metric", "0.32.0", "0.33.0", "Δ", "verdict"]
    rows = _rows(out)
    assert rows["total_token_throughput"] == ["total_token_throughput", "(tok/s)", "10,000", "10,000", "+0.0%", "pass"]
    assert rows["p99_tpot_ms"][-1] == "pass"
    alone, summary = out.rstrip().splitlines()[-2:]
    assert summary == "verdicts against 0.32.0: 8 pass"
    assert alone.startswith("8 verdict(s) rest on the repeats of fewer than 3 sessions: how far this runner's sessions differ is unknown")


def test_a_regression_fails_only_when_asked_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run()])
    new = session_file(tmp_path / "new.json", [make_run(version="0.33.0", total=8_000.0, output=4_000.0)])
    status, out, err = compare(capsys, old, new, "--fail-on", "regression")
    assert status == 1
    assert _rows(out)["total_token_throughput"][-2:] == ["-20.0%", "regression"]
    # Same verdict and detail (both -20.0 %, one sample each): one line naming both metrics.
    assert "0.33.0: total_token_throughput, output_throughput: regression: worse than the tolerance: -20.0%" in out
    assert "failing on 2 regression" in err
    assert compare(capsys, old, new)[0] == 0


def test_the_reference_runs_suite_tolerances_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU suite allows 25 % on throughput: 20 % less is within it, 30 % less is not."""
    wide = {"tolerances": {"total_token_throughput": 0.25, "output_throughput": 0.25}}
    old = session_file(tmp_path / "old.json", [make_run(extra=wide)])
    within = session_file(tmp_path / "within.json", [make_run(version="0.33.0", total=8_000.0, output=4_000.0, extra=wide)])
    status, out, _ = compare(capsys, old, within, "--fail-on", "regression")
    assert status == 0 and _rows(out)["total_token_throughput"][-2:] == ["-20.0%", "pass"]
    beyond = session_file(tmp_path / "beyond.json", [make_run(version="0.33.0", total=7_000.0, output=3_500.0, extra=wide)])
    status, out, _ = compare(capsys, old, beyond, "--fail-on", "regression")
    assert status == 1 and _rows(out)["total_token_throughput"][-2:] == ["-30.0%", "regression"]


def test_markdown_for_a_job_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run()])
    new = session_file(tmp_path / "new.json", [make_run(version="0.33.0", ttft=400.0)])
    status, out, _ = compare(capsys, old, new, "--markdown")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "### cpu/base · isl128-osl128 (cpu-test-cpu-2c)"
    assert lines[2] == "| metric | 0.32.0 | 0.33.0 | Δ | verdict |"
    assert lines[3] == "|:---|---:|---:|---:|:---|"
    assert "| p99_ttft_ms (ms) | 200.0 | 400.0 | +100.0% | **regression** |" in lines
    assert any(line.startswith("- 0.33.0: p99_ttft_ms: regression:") for line in lines)


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run("base"), make_run("ctx-short"), make_run("ctx-short", "shared-prefix-pl1536")])
    new = session_file(tmp_path / "new.json", [make_run("base", version="0.33.0", total=11_000.0)])
    status, _, _ = compare(capsys, old, new, "--plot", tmp_path / "throughput.png")
    assert status == 0
    assert (tmp_path / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_repeats_in_one_file_are_pooled_and_judged_with_their_spread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = benchmark_file(tmp_path / "old.json", [make_run(total=t) for t in (10_000.0, 10_100.0, 9_900.0)])
    new = benchmark_file(tmp_path / "new.json", [make_run(version="0.33.0", total=t) for t in (9_000.0, 9_050.0, 8_950.0)])
    status, out, _ = compare(capsys, old, new, "--metric", "total_token_throughput", "--fail-on", "regression")
    assert status == 1
    assert [line.split()[0] for line in out.splitlines()[3:4]] == ["total_token_throughput"]
    assert "Welch on log values, 3 vs 3 samples" in out


def test_every_judged_cell_with_a_spread_shows_its_mde(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, tight, wide = (10_000.0, 10_100.0, 9_900.0), (10_000.0, 10_050.0, 9_950.0), (10_000.0, 12_000.0, 8_000.0)
    old = benchmark_file(tmp_path / "old.json", [make_run(total=t) for t in before])
    new = benchmark_file(tmp_path / "new.json", [make_run(version="0.33.0", total=t) for t in tight])
    noisy = benchmark_file(tmp_path / "noisy.json", [make_run(version="0.34.0", total=t) for t in wide])
    passed, underpowered = (
        judge(Hearing("total_token_throughput", Side(before), Side(after), direction="higher", tolerance=0.05))
        for after in (tight, wide)
    )
    assert passed.verdict == "pass" and underpowered.verdict == "underpowered"
    assert passed.mde is not None and underpowered.mde is not None
    status, out, _ = compare(capsys, old, new, noisy, "--metric", "total_token_throughput")
    assert status == 0
    line = next(line for line in out.splitlines() if line.startswith("total_token_throughput"))
    assert f"pass (MDE {format_mde(passed.mde)})" in line and f"underpowered (MDE {format_mde(underpowered.mde)})" in line
    status, out, _ = compare(capsys, old, new, noisy, "--metric", "total_token_throughput", "--markdown")
    assert f"| **underpowered** (MDE {format_mde(underpowered.mde)}) |" in out
    status, out, _ = compare(capsys, old, new, noisy, "--metric", "total_token_throughput", "--json")
    cells = json.loads(out)["groups"][0]["rows"][0]["judgements"]
    assert [cell["mde"] for cell in cells] == [pytest.approx(passed.mde), pytest.approx(underpowered.mde)]
    single = session_file(tmp_path / "single.json", [make_run(version="0.33.0")])
    status, out, _ = compare(capsys, session_file(tmp_path / "one.json", [make_run()]), single, "--json")
    assert json.loads(out)["groups"][0]["rows"][0]["judgements"][0]["mde"] is None  # one sample a side: no spread


def test_different_argv_is_not_comparable_and_never_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    changed = make_run(version="0.33.0", total=1_000.0)
    changed["identity"]["argv"] = [*changed["identity"]["argv"], "--enforce-eager"]
    old = session_file(tmp_path / "old.json", [make_run()])
    new = session_file(tmp_path / "new.json", [changed])
    status, out, _ = compare(capsys, old, new, "--fail-on", "regression")
    assert status == 0
    assert _rows(out)["total_token_throughput"][-2:] == ["—", "not-comparable"]
    assert "argv_sha256" in out
    assert compare(capsys, old, new, "--fail-on", "not-comparable")[0] == 1


def test_client_bound_runs_and_rows_only_some_files_have(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    telemetry = {"telemetry": {"gpu": {"utilization_mean": 0.93}, "cpu": None}}
    old = session_file(tmp_path / "old.json", [make_run(extra=telemetry)])
    new = session_file(
        tmp_path / "new.json",
        [make_run(version="0.33.0", total=5_000.0, bound="client busy 99% of the run (limit 95%)", extra=telemetry),
         make_run("seqs-32", version="0.33.0")],
    )
    status, out, err = compare(capsys, old, new, "--fail-on", "regression")
    assert status == 1 and "failing on 4 invalid" in err  # a client that could not keep up is no pass
    base, seqs = out[: out.index("cpu/seqs-32")], out[out.index("cpu/seqs-32") :]
    assert _rows(base)["total_token_throughput"][-3:] == ["-50.0%", "invalid:", "client-bound"]
    assert _rows(base)["gpu_utilization"] == ["gpu_utilization", "(fraction)", "0.93", "0.93", "+0.0%"]
    assert "the run's client could not keep up, so its numbers measure the client, not vLLM (client busy 99%" in base
    assert _rows(seqs)["total_token_throughput"] == ["total_token_throughput", "(tok/s)", "—", "10,000", "—", "no-baseline"]
    assert compare(capsys, old, new)[0] == 0  # no --fail-on: a report, not a gate


def test_a_config_the_candidate_lacks_is_missing_and_fails_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = session_file(tmp_path / "old.json", [make_run("base"), make_run("ctx-short")])
    new = session_file(tmp_path / "new.json", [make_run("base", version="0.33.0")])
    status, out, err = compare(capsys, old, new, "--fail-on", "regression")
    assert status == 1 and "failing on 4 missing" in err
    lacking = out[out.index("cpu/ctx-short") :]
    assert _rows(lacking)["total_token_throughput"] == ["total_token_throughput", "(tok/s)", "10,000", "—", "—", "missing"]
    assert "0.33.0: total_token_throughput, output_throughput, p99_ttft_ms, p99_tpot_ms: missing: new.json has no run" in lacking
    assert out.rstrip().endswith("verdicts against 0.32.0: 4 missing, 4 pass")
    assert compare(capsys, old, new, "--fail-on", "regression", "--allow", "missing")[0] == 0
    status, _, err = compare(capsys, old, new, "--fail-on", "missing", "--allow", "missing")
    assert status == 2 and "--allow missing contradicts --fail-on missing" in err


def test_a_failure_in_one_pooled_repeat_makes_the_pool_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = benchmark_file(tmp_path / "old.json", [make_run(total=t) for t in (10_000.0, 10_100.0, 9_900.0)])
    repeats = [make_run(version="0.33.0", total=10_000.0), make_run(version="0.33.0", total=10_050.0, failed=2)]
    without = make_run(version="0.33.0", total=9_950.0)
    del without["metrics"]["p99_ttft_ms"]
    new = benchmark_file(tmp_path / "new.json", repeats)
    status, out, _ = compare(capsys, old, new, "--fail-on", "regression")
    assert status == 1 and _rows(out)["total_token_throughput"][-3:] == ["+0.3%", "invalid:", "failed-requests"]
    assert "2 request(s) of the run failed" in out
    gap = benchmark_file(tmp_path / "gap.json", [repeats[0], without])
    status, out, _ = compare(capsys, old, gap, "--fail-on", "regression")
    assert status == 1 and _rows(out)["p99_ttft_ms"][-3:] == ["—", "invalid:", "no-value"]
    assert "the run has no value for it (samples.p99_ttft_ms[1] is null)" in out


def test_json_holds_every_group_row_value_and_judgement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run("base"), make_run("ctx-short")])
    new = session_file(tmp_path / "new.json", [make_run("base", version="0.33.0", failed=1)])
    status, out, _ = compare(capsys, old, new, "--json", "--fail-on", "regression")
    assert status == 1
    document = json.loads(out)
    assert document["schema"] == "qwenperf-compare/1"
    assert document["files"] == [{"label": "0.32.0", "path": str(old)}, {"label": "0.33.0", "path": str(new)}]
    base, lacking = document["groups"]
    assert (base["suite"], base["config"], base["workload"]) == ("cpu", "base", "isl128-osl128")
    row = base["rows"][0]
    assert (row["metric"], row["unit"], row["values"]) == ("total_token_throughput", "tok/s", [10_000.0, 10_000.0])
    (judged,) = row["judgements"]
    assert judged["file"] == "0.33.0" and judged["verdict"] == "invalid" and judged["reason"] == "failed-requests"
    assert judged["detail"] == "1 request(s) of the run failed" and judged["ratio"] == 1.0 and judged["tolerance"] == 0.05
    assert lacking["rows"][0]["values"] == [10_000.0, None] and lacking["rows"][0]["judgements"][0]["verdict"] == "missing"
    assert document["verdicts"] == {"invalid": 4, "missing": 4}
    with pytest.raises(SystemExit):
        main(["compare", str(old), str(new), "--json", "--markdown"])


def test_unknown_metric_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run()])
    status, _, err = compare(capsys, old, old, "--metric", "p42_ttft_ms")
    assert status == 2
    assert "--metric p42_ttft_ms: no input has it; metrics present: " in err and "p99_ttft_ms" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema": "qwenperf-session/1", "runs": [', "not valid JSON"),
        ('{"schema": "qwenperf-session/9", "runs": []}', "schema: expected 'qwenperf-session/1' or 'qwenperf-bench/1', got 'qwenperf-session/9'"),
        ('{"benchmarks": [{"name": "t", "extra_info": {}}]}', "benchmarks[*].extra_info.qwenperf: expected at least one"),
        ('[1, 2]', "(top level): expected a qwenperf session JSON"),
        ('{"schema": "qwenperf-session/1", "runs": [{"identity": {}}]}', "runs[0]: identity.suite: expected a string, got nothing (the field is missing)"),
        (
            '{"schema": "qwenperf-session/1", "runs": [{"identity": {"suite": "cpu", "config": "base", "argv": "--x"}}]}',
            "runs[0]: identity.argv: expected `array`, got '--x'",
        ),
        (
            '{"benchmarks": [{"extra_info": {"qwenperf": {"identity": {"suite": "", "config": "base"}}}}]}',
            "benchmarks[0].extra_info.qwenperf: identity.suite: expected a string of length >= 1, got ''",
        ),
    ],
    ids=["truncated", "schema", "no-runs", "not-an-object", "bad-run", "bad-argv", "empty-suite"],
)
def test_an_unreadable_input_exits_2_naming_file_and_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    good = session_file(tmp_path / "good.json", [make_run()])
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    status, out, err = compare(capsys, good, bad)
    assert status == 2 and out == ""
    assert err.startswith(f"qwenperf: {bad}") and message in err


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = session_file(tmp_path / "good.json", [make_run()])
    status, _, err = compare(capsys, good, tmp_path / "absent.json")
    assert status == 2 and f"{tmp_path / 'absent.json'}: cannot read" in err


def test_compare_needs_two_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = compare(capsys, session_file(tmp_path / "one.json", [make_run()]))
    assert status == 2 and "compare needs a REFERENCE and at least one FILE" in err


# ---------------------------------------------------------------- canary answers


def test_canary_answers_are_judged_and_a_changed_output_fails_when_asked_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run()], [make_canary("base"), make_canary("fp8kv")])
    changed = make_canary("fp8kv", outputs=((1, 2, 3), (4, 9, 9)), version="0.33.0")
    new = session_file(tmp_path / "new.json", [make_run(version="0.33.0")], [make_canary("base", version="0.33.0"), changed])
    status, out, err = compare(capsys, old, new, "--fail-on", "changed-output")
    assert status == 1 and "failing on 1 changed-output" in err
    section = out[out.index("canary answers (greedy, 8 prompts) against 0.32.0") :].splitlines()
    assert section[1].split() == ["config", "match", "rate", "(0.33.0)", "drift", "(0.33.0)", "verdict", "(0.33.0)"]
    assert section[3].split() == ["cpu/base", "1.000", "0", "pass"]
    assert section[4].split() == ["cpu/fp8kv", "0.500", "0", "changed-output"]
    assert "0.33.0: cpu/fp8kv: changed-output: match rate 0.500 < 1: 1 of 2 prompts give the reference's tokens" in out
    assert "first differing prompt 1 'def fibonacci(n):': reference 't4 t5 t6', now 't4 t9 t9'" in out
    assert out.rstrip().endswith("verdicts against 0.32.0: 1 changed-output, 5 pass")
    assert compare(capsys, old, new, "--fail-on", "regression")[0] == 0  # a change of output is its own verdict
    assert compare(capsys, old, old, "--fail-on", "changed-output")[0] == 0


def test_the_reference_answers_floor_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    half = CanaryFloor(match_rate=0.5)
    old = session_file(tmp_path / "old.json", [], [make_canary(floor=half)])
    new = session_file(tmp_path / "new.json", [], [make_canary(outputs=((1, 2, 3), (7, 7, 7)), version="0.33.0")])
    status, out, _ = compare(capsys, old, new, "--fail-on", "changed-output")
    assert status == 0 and out.rstrip().endswith("verdicts against 0.32.0: 1 pass")


def test_answers_a_file_lacks_are_missing_unless_it_has_none_at_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run()], [make_canary("base"), make_canary("fp8kv")])
    some = session_file(tmp_path / "some.json", [make_run(version="0.33.0")], [make_canary("base", version="0.33.0")])
    status, out, _ = compare(capsys, old, some, "--fail-on", "regression")
    assert status == 1 and "some.json has no canary answer of cpu/fp8kv; the reference has one" in out
    none = session_file(tmp_path / "none.json", [make_run(version="0.33.0")])
    status, out, _ = compare(capsys, old, none, "--fail-on", "regression")
    assert status == 0 and "canary answers" not in out
    # A config only a third file answered: no reference answer for it, nothing in the second file.
    answers = [make_canary(config, version="0.34.0") for config in ("base", "fp8kv", "seqs-32")]
    third = session_file(tmp_path / "third.json", [make_run(version="0.34.0")], answers)
    status, out, _ = compare(capsys, old, some, third)
    assert status == 0 and "0.34.0: cpu/seqs-32: no-baseline: old.json has no canary answer of cpu/seqs-32" in out
    assert "some.json has no canary answer of cpu/seqs-32" not in out


def test_answers_of_another_identity_are_not_comparable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [], [make_canary(hardware="h100")])
    new = session_file(tmp_path / "new.json", [], [make_canary(outputs=((7, 7, 7), (7, 7, 7)))])
    status, out, _ = compare(capsys, old, new, "--fail-on", "changed-output")
    assert status == 0 and "cpu/base: not-comparable: not comparable (reference vs answer): hardware: 'h100' vs 'cpu-test-cpu-2c'" in out


def test_of_differing_answers_in_one_column_the_least_agreeing_is_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [], [make_canary()])
    column = tmp_path / "new"
    column.mkdir()
    session_file(column / "a.json", [], [make_canary()])
    session_file(column / "b.json", [], [make_canary(outputs=((7, 7, 7), (7, 7, 7)))])
    status, out, _ = compare(capsys, old, column, "--fail-on", "changed-output")
    assert status == 1 and "match rate 0.000 < 1" in out


def test_json_and_markdown_carry_the_canary_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [], [make_canary()])
    new = session_file(tmp_path / "new.json", [], [make_canary(outputs=((1, 2, 3), (4, 9, 9)), version="0.33.0")])
    _, out, _ = compare(capsys, old, new, "--json")
    document = json.loads(out)
    assert document["groups"] == [] and document["verdicts"] == {"changed-output": 1}
    ((row),) = document["canaries"]
    (judged,) = row["judgements"]
    assert row["config"] == "cpu/base"
    assert (judged["file"], judged["verdict"], judged["match_rate"], judged["first_mismatch"]) == ("0.33.0", "changed-output", 0.5, 1)
    assert judged["logprob_drift"] == 0.0 and judged["floor"] == {"match_rate": 1.0, "logprob_drift": None}
    _, out, _ = compare(capsys, old, new, "--markdown")
    assert "### canary answers (greedy, 8 prompts) against 0.32.0" in out and "| cpu/base | 0.500 | 0 | **changed-output** |" in out


def test_a_bad_canary_answer_names_the_file_and_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = session_file(tmp_path / "good.json", [make_run()])
    bad = session_file(tmp_path / "bad.json", [make_run()], [make_canary()])
    document = json.loads(bad.read_text())
    del document["canaries"][0]["identity"]["config"]
    bad.write_text(json.dumps(document))
    status, _, err = compare(capsys, good, bad)
    assert status == 2 and err.startswith(f"qwenperf: {bad}: canaries[0].identity.config: expected a string, got nothing")
    empty = session_file(tmp_path / "empty.json", [])
    status, _, err = compare(capsys, good, empty)
    assert status == 2 and "runs: expected a non-empty list of runs (or canary answers), got []" in err


CONTENDED = {"conditions": [{"reason": "cpu-contention", "detail": "server core 0 was shared with pid 7 (spin) for 80% of the steady state"}]}


@pytest.mark.parametrize(
    ("bad", "reason", "detail"),
    [
        (make_run(version="0.33.0", extra=CONTENDED), "cpu-contention", "shared with pid 7 (spin) for 80% of the steady state (in 1 of 2 runs pooled)"),
        (make_run(version="0.33.0", failed=3), "failed-requests", "3 request(s) of the run failed"),
        (make_run(version="0.33.0", tokens_match=False), "token-mismatch", "client and server token totals disagree"),
        (make_run(version="0.33.0", bound="client busy 99% of the run"), "client-bound", "client could not keep up"),
    ],
    ids=["condition", "failed-requests", "token-mismatch", "client-bound"],
)
def test_a_folder_with_one_invalid_session_is_invalid_as_a_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: dict[str, Any], reason: str, detail: str
) -> None:
    """Pooling the files of a folder keeps whatever makes any of them invalid: one invalid night among
    valid ones never passes (it did for a condition: the pooled run dropped the second file's)."""
    old = session_file(tmp_path / "old.json", [make_run()])
    folder = tmp_path / "new"
    folder.mkdir()
    session_file(folder / "a.json", [make_run(version="0.33.0")])
    session_file(folder / "b.json", [bad])
    alone_status, alone, _ = compare(capsys, old, folder / "b.json", "--fail-on", "regression")
    status, out, err = compare(capsys, old, folder, "--fail-on", "regression")
    assert alone_status == status == 1
    assert f"invalid: {reason}" in " ".join(_rows(alone)["total_token_throughput"])
    assert f"invalid: {reason}" in " ".join(_rows(out)["total_token_throughput"])
    assert detail in out and "failing on 4 invalid" in err


def test_a_directory_of_sessions_counts_how_far_they_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three reference sessions whose repeats agree within 1 % but whose levels differ by ~9 %: one
    more ordinary session 12 % below their centre is no regression against them, as it would be
    against any one of them; against three quiet sessions a 20 % slowdown fails."""

    def sessions(folder: str, levels: Sequence[float]) -> Path:
        (tmp_path / folder).mkdir()
        for i, level in enumerate(levels):
            samples = {"output_throughput": [level * f for f in (0.99, 1.0, 1.01)]}
            session_file(tmp_path / folder / f"s{i}.json", [make_run(output=level, samples=samples)])
        return tmp_path / folder

    def one(name: str, level: float) -> Path:
        samples = {"output_throughput": [level * f for f in (0.99, 1.0, 1.01)]}
        return session_file(tmp_path / name, [make_run(output=level, version="0.33.0", samples=samples)])

    wandering, quiet = sessions("wandering", [5_000.0, 5_900.0, 5_050.0]), sessions("quiet", [5_000.0, 5_050.0, 4_980.0])
    ordinary, slowed = one("ordinary.json", 4_550.0), one("slowed.json", 4_000.0)
    for args, status in (((wandering / "s0.json", ordinary), 1), ((wandering, ordinary), 0), ((quiet, slowed), 1)):
        assert compare(capsys, *args, "--metric", "output_throughput", "--fail-on", "regression")[0] == status, args
    _, out, _ = compare(capsys, wandering, ordinary, "--metric", "output_throughput", "--json")
    (cell,) = json.loads(out)["groups"][0]["rows"][0]["judgements"]
    assert cell["verdict"] in ("noisy", "underpowered") and cell["between"] > 0.05
    low, high = cell["interval"]  # the interval the verdict was decided on, which it names in its detail
    assert low < cell["ratio"] < high and f"interval {low:.3f}–{high:.3f}" in cell["detail"]
    assert "a new session predicted from the baseline's 3 sessions" in cell["detail"]

"""The cost of a session before it starts (``suite/cost.py``, ``qwenperf plan --suite``): times worked
out by hand for a small suite, the sources of a point's throughput in their order (history, the
suite's expected figure, a floor as a bound, none), ``--fail-over``, a plan that creates no file, and
the client sizing that ``qwenperf plan`` still does."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import legs_mde, repeats_mde
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.suite.config import SuiteError, load_suite
from pytest_qwenperf.suite.cost import (
    LOAD_RUN_OVERHEAD_S,
    PLAN_SCHEMA,
    PROMPT_BUILD_S_PER_TOKEN,
    TURN_S,
    Measured,
    Rate,
    history_of,
    phases,
    plan,
    points_of,
)
from pytest_qwenperf.suite.trace_files import write_jsonl
from pytest_qwenperf.suite.traces import Trace, TraceEntry
from tests.suite_files import refused, suite_at
from tests.test_baseline import make_run, run_of

ROOT = Path(__file__).resolve().parents[1]
SMALL = """
[suite]
name = "small"
hardware = "h100"
model = "embedded:tiny"
gpus = 2
repeats = 2
max_repeats = 4
boot_s = 30

[[config]]
id = "base"
expected = { total_token_throughput = 1000.0 }

[[config]]
id = "two"
inherits = "base"
replicas = 2
expected = { total_token_throughput = 2000.0 }

[[config]]
id = "bare"
inherits = "base"

[[workload]]
name = "w"
kind = "random"
input_len = 100
output_len = 50
num_prompts = 120
warmup = 20
load = { concurrency = 10 }
configs = ["base", "two", "bare"]
floors = { output_throughput = { bare = 25.0 } }

[[workload]]
name = "open"
kind = "random"
input_len = 10
output_len = 10
num_prompts = 50
warmup = 10
load = { rate = 2.0 }
configs = ["base"]

[[workload]]
name = "search"
kind = "random"
input_len = 10
output_len = 10
num_prompts = 520
warmup = 8
load = { concurrency = 32 }
slo = "tpot:6"
search = { by = "concurrency", lowest = 2, highest = 256, max_probes = 7 }
configs = ["base"]

[[workload]]
name = "x"
kind = "random"
input_len = 10
output_len = 10
num_prompts = 20
load = { concurrency = 4 }
configs = ["bare"]
"""


def overhead(prompt_tokens: float) -> float:
    return LOAD_RUN_OVERHEAD_S + prompt_tokens * PROMPT_BUILD_S_PER_TOKEN


def test_a_small_suite_costs_what_the_model_says_by_hand(tmp_path: Path) -> None:
    suite = suite_at(tmp_path, SMALL)
    found = plan(suite, points_of(suite), {})
    cost = {(p.config, p.workload): p for p in found.points}
    # base x w at 1,000 total tok/s: 20 warm-up and 100 measured requests of 150 tokens
    base_w = 20 * 150 / 1000 + 100 * 150 / 1000 + overhead(120 * 100)
    # two replicas: each repeat runs one replica's load on one, then twice it on both, at the config's 2,000 tok/s
    two_w = 2 * (3.0 + 15.0 + overhead(2 * 120 * 100))
    # an open loop at 2 req/s sends its 40 measured requests in 20 s, though the server needs 0.8 s
    base_open = 10 * 20 / 1000 + 40 / 2 + overhead(50 * 10)
    # a search of 7 probes, planned a quarter of the way from its start (32) to its highest load (256) on a log
    # scale: round(32^0.75 x 256^0.25) = round(53.8) = 54 (108 requests: 2 a stream, at least 64), at worst each
    # at 256 (512 requests, all the workload measures); its second repeat's search starts at the bracket the
    # first settled and confirms it: 4 probes
    probe = 8 * 20 / 1000 + 108 * 20 / 1000 + overhead(116 * 10)
    longest = 8 * 20 / 1000 + 512 * 20 / 1000 + overhead(520 * 10)
    assert cost["base", "w"].timing is not None and cost["base", "w"].timing.repeat_s == pytest.approx(base_w)
    assert cost["base", "w"].planned_s == pytest.approx(2 * base_w) and cost["base", "w"].worst_s == pytest.approx(4 * base_w)
    two = cost["two", "w"]
    assert two.planned_s == pytest.approx(2 * two_w) and two.timing is not None and two.timing.load_runs == 2
    assert cost["base", "open"].planned_s == pytest.approx(2 * base_open)
    search = cost["base", "search"]
    assert search.timing is not None and search.timing.probes is not None
    assert (search.timing.probes.count, search.timing.probes.later, search.timing.probes.load) == (7, 4, 54.0)
    assert search.timing.probes.planned_s == pytest.approx(probe) and search.timing.probes.worst_s == pytest.approx(longest)
    assert (search.timing.repeat_s, search.timing.later_repeat_s) == (pytest.approx(7 * probe), pytest.approx(4 * probe))
    assert search.planned_s == pytest.approx((7 + 4) * probe) and search.worst_s == pytest.approx(4 * 7 * longest)
    assert {p.source.label for p in found.points if p.config in ("base", "two")} == {"expected (suite)"}
    # bare states no expected figure (a rung's is not inherited): its floor of 25 output tok/s bounds it
    bare_w = 20 * 50 / 25 + 100 * 50 / 25 + overhead(120 * 100)
    assert cost["bare", "w"].source.label == "floor (bound)" and cost["bare", "w"].planned_s == pytest.approx(2 * bare_w)
    assert cost["bare", "x"].source.label == "none" and cost["bare", "x"].timing is None
    timed = 2 * (base_w + two_w + base_open + bare_w) + (7 + 4) * probe
    worst = 4 * (base_w + two_w + base_open + 7 * longest + bare_w)
    assert found.boots == ("base", "two", "bare") and found.boots_s == 90.0 and found.boot_from == "suite"
    assert found.planned_s == pytest.approx(90 + timed) and found.worst_s == pytest.approx(90 + worst)
    assert found.gpu_hours(found.planned_s) == pytest.approx(2 * found.planned_s / 3600)
    assert found.line() == (
        f"planned ≈ {found.planned_s / 60:.0f} min, {2 * found.planned_s / 3600:.1f} GPU-h; "
        f"at most {found.worst_s / 60:.0f} min, {2 * found.worst_s / 3600:.1f} GPU-h, with extra repeats; "
        "1 point(s) timed by floors (upper bounds); 1 point(s) not timed (no history, expected figure or floor): not counted"
    )


def test_points_are_chosen_by_config_and_workload(tmp_path: Path) -> None:
    suite = suite_at(tmp_path, SMALL)
    assert [(c.id, w.id) for c, w in points_of(suite, ["two", "base"], ["w", "open"])] == [("base", "w"), ("base", "open"), ("two", "w")]
    with pytest.raises(SuiteError, match=r"no workload 'nope'; workloads are \['w', 'open', 'search', 'x'\]"):
        points_of(suite, workloads=["nope"])
    with pytest.raises(SuiteError, match=r"no point: none of the workloads \['open'\] runs on \['bare'\]"):
        points_of(suite, ["bare"], ["open"])


def test_a_replay_lasts_its_span_and_conversations_wait_their_think_time(tmp_path: Path) -> None:
    write_jsonl(Trace((TraceEntry(0, 100, 10), TraceEntry(1000, 200, 20), TraceEntry(3000, 300, 30), TraceEntry(7000, 400, 40))), tmp_path / "t.jsonl")
    suite = suite_at(
        tmp_path,
        SMALL
        + """
[[workload]]
name = "replay"
kind = "trace"
path = "t.jsonl"
warmup = 1
load = { replay = true, time_scale = 0.5 }
configs = ["base"]

[[workload]]
name = "chat"
kind = "conversation"
conversations = 4
turns = 3
first_input_len = 10
turn_input_len = 5
output_len = 4
think_time_s = 1.5
warmup = 3
load = { concurrency = 2 }
configs = ["base"]
""",
    )
    replay, chat = suite.workloads[-2:]
    warm, measured = phases(replay)
    assert (warm.requests, warm.input_tokens, warm.output_tokens, warm.paced_s) == (1, 100, 10, 0.0)
    # the measured requests go from 1 s to 7 s of the trace, replayed at half its times
    assert (measured.requests, measured.input_tokens, measured.output_tokens, measured.paced_s) == (3, 900, 90, 3.0)
    warm, measured = phases(chat)
    # a turn's prompt grows by a reply and a user turn: 10, 19, 28 tokens; 3 conversations on 2 lanes wait 2 x 2 x 1.5 s
    assert (measured.requests, measured.input_tokens, measured.output_tokens, measured.paced_s) == (9, 171, 36, 6.0)
    assert (warm.requests, warm.input_tokens, warm.paced_s) == (3, 57, 3.0)
    found = plan(suite, points_of(suite, ["base"], ["replay"]), {})
    assert found.points[0].timing is not None and found.points[0].timing.load_run.measured_s == 3.0


def test_a_machine_whose_pace_the_suite_states_has_the_expected_figures_scaled(tmp_path: Path) -> None:
    """A throughput-bound point takes 1/pace as long; a paced one (an open loop's arrivals) no less than its pace."""
    suite = suite_at(tmp_path, SMALL.replace("boot_s = 30\n", 'boot_s = 30\npace = { "cpu-slow-2c" = 0.25 }\n'))
    points = points_of(suite, ["base"], ["w", "open"])
    (w, open_), (w_slow, open_slow) = plan(suite, points, {}).points, plan(suite, points, {}, machine="cpu-slow-2c").points
    assert w.timing is not None and w_slow.timing is not None and open_.timing is not None and open_slow.timing is not None
    assert w_slow.timing.load_run.measured_s == pytest.approx(4 * w.timing.load_run.measured_s)
    assert w_slow.timing.rate == Rate("total_token_throughput", 250.0)
    assert open_slow.timing.load_run.measured_s == open_.timing.load_run.measured_s == pytest.approx(40 / 2.0)  # 40 requests at 2/s
    assert (w.source.label, w_slow.source.label) == ("expected (suite)", "expected (suite) at 0.25 on cpu-slow-2c")
    assert w_slow.as_json()["pace"] == {"machine": "cpu-slow-2c", "factor": 0.25}
    assert plan(suite, points, {}, machine="cpu-other-2c").points == (w, open_)  # another machine: the figures as stated
    refused(tmp_path, SMALL.replace("boot_s = 30\n", 'boot_s = 30\npace = { "cpu-slow-2c" = 0 }\n'), r"suite\.pace\.cpu-slow-2c: expected a factor > 0")


def night(day: int, duration: float, total: float, failed: int = 0, **identity: str) -> Run:
    """A run of the cpu suite's base x isl128-osl128 that started on November ``day``, its
    ``identity`` changed where given."""
    data = make_run("base", total=total, output=total / 2, failed=failed)
    data["context"]["started"] = f"2026-11-{day:02d}T02:00:00+00:00"
    data["metrics"]["duration"] = duration
    data["identity"] |= identity
    return run_of(data)


def test_the_history_beats_the_suites_expected_figure_which_beats_a_floor(tmp_path: Path) -> None:
    lines = (ROOT / "perf_tests" / "suites" / "cpu.toml").read_text().splitlines(keepends=True)
    text = "".join(line for line in lines if not line.startswith("expected ="))  # the cpu suite without its figures
    (tmp_path / "floors").mkdir()
    bare = suite_at(tmp_path / "floors", text)
    floored = plan(bare, points_of(bare, ["base"], ["isl128-osl128"]), {}).points[0]
    suite = suite_at(tmp_path, text.replace('id = "base"\n', 'id = "base"\nexpected = { total_token_throughput = 2048.0 }\n', 1))
    points = points_of(suite, ["base"], ["isl128-osl128"])
    expected = plan(suite, points, {}).points[0]
    assert expected.source.label == "expected (suite)" and expected.timing is not None
    assert expected.timing.load_run.measured_s == pytest.approx(128 * 256 / 2048)
    assert floored.source.label == "floor (bound)" and floored.timing is not None and floored.timing.rate == Rate("output_throughput", 500.0)

    runs = [night(day, duration, 10_000.0 + day) for day, duration in zip(range(1, 10), (9, 9, 10, 11, 12, 12, 12, 13, 14), strict=True)]
    others = [
        night(20, 99.0, 1.0, hardware="cpu-other-cpu-8c"),  # another machine: counted, and the newest
        night(21, 99.0, 1.0, failed=3),  # invalid
        night(22, 99.0, 1.0, workload_fingerprint="0" * 16),  # another workload of the same name
    ]
    with HistoryStore.open(tmp_path / "history.sqlite") as store:
        store.append([*runs, *others], source="test")
        history = history_of(store, suite, points)
    # the newest 7 (the suite's history_window) valid runs of the point's identity, on any hardware
    # the drift between sessions is measured over the runs of the newest one's machine: the other
    # machine's, of which there is one run, so none is known
    assert history == {("base", "isl128-osl128"): Measured(7, (Rate("total_token_throughput", 10_006.0), Rate("output_throughput", 5_003.0)), 12.0)}
    timed = plan(suite, points, history).points[0]
    assert timed.source.label == "history: 7 runs" and timed.timing is not None
    assert timed.timing.load_run.measured_s == 12.0 and timed.timing.load_run.warmup_s == pytest.approx(32 * 256 / 10_006)


def test_a_plan_creates_no_file_and_fails_over_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "suite"
    folder.mkdir()
    suite_at(folder, SMALL)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    chosen = ["plan", "--suite", str(folder / "suite.toml"), "--config", "base", "--config", "two"]
    assert main([*chosen, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == PLAN_SCHEMA and out["history"] is None and out["totals"]["untimed"] == []
    assert [(p["config"], p["workload"], p["source"]) for p in out["points"]] == [
        ("base", "w", "expected"), ("base", "open", "expected"), ("base", "search", "expected"), ("two", "w", "expected")
    ]
    worst_min = out["totals"]["worst_s"] / 60
    assert main([*chosen, "--fail-over", f"{worst_min * 1.01}"]) == 0
    assert "is within --fail-over" in capsys.readouterr().err
    assert main([*chosen, "--fail-over", f"{worst_min * 0.99}"]) == 1
    assert f"the worst case, {worst_min:.1f} min, is over --fail-over {worst_min * 0.99:g} min" in capsys.readouterr().err
    assert main(["plan", "--suite", str(folder / "suite.toml"), "--fail-over", "100000"]) == 1  # bare x x cannot be timed
    assert "cannot hold the session to --fail-over 100000 min: no figure times bare/x" in capsys.readouterr().err
    assert main([*chosen, "--history", str(tmp_path / "none.sqlite")]) == 2
    assert "none.sqlite: no history store there (a command that reads a store never creates one)" in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_plan_leaves_out_the_configs_a_session_here_would_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU suite is planned as the session here would run it: a config needing a CPU flag this
    machine lacks is skipped by the session, so the plan neither times it nor boots it, and says so."""
    suite = suite_at(tmp_path, SMALL.replace('hardware = "h100"', 'hardware = "cpu"').replace("gpus = 2\n", "").replace(
        'id = "two"', 'id = "two"\ncpu_flags_any = ["qwenperf_no_such_flag"]'
    ))
    monkeypatch.chdir(tmp_path)
    chosen = ["plan", "--suite", str(suite.path), "--config", "base", "--config", "two"]
    assert main([*chosen, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(p["config"], p["workload"]) for p in out["points"]] == [("base", "w"), ("base", "open"), ("base", "search")]
    assert list(out["skipped"]) == ["two"] and "qwenperf_no_such_flag" in out["skipped"]["two"]
    assert main(chosen) == 0
    assert "skipped, as a session here skips it: needs a CPU with one of ['qwenperf_no_such_flag'] (config small/two)" in capsys.readouterr().out
    assert main([*chosen[:3], "--config", "two"]) == 2
    assert "a session on this machine would skip every point: needs a CPU with one of" in capsys.readouterr().err


def test_the_client_sizing_plan_still_works_and_the_two_plans_do_not_mix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--request-rate", "16.6", "--output-len", "128"]) == 0
    assert "busy client cores: 0.03" in capsys.readouterr().out
    assert main(["plan", "--output-len", "64"]) == 2
    assert "one of the arguments --output-throughput --request-rate is required (or --suite SUITE" in capsys.readouterr().err
    assert main(["plan", "--request-rate", "1"]) == 2
    assert "the argument --output-len is required" in capsys.readouterr().err
    assert main(["plan", "--suite", "s.toml", "--output-len", "64"]) == 2
    assert "--output-len: an option of the client sizing" in capsys.readouterr().err
    assert main(["plan", "--request-rate", "1", "--output-len", "64", "--fail-over", "5"]) == 2
    assert "--fail-over: an option of a suite's session (--suite)" in capsys.readouterr().err


def test_the_b200_suite_plans_with_its_expected_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no history store here: the suite's figures alone
    assert main(["plan", "--suite", str(ROOT / "perf_tests" / "suites" / "b200.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    totals = out["totals"]
    assert {p["source"] for p in out["points"]} == {"expected"} and totals["untimed"] == []
    assert out["boot"] == {"seconds": 240.0, "from": "suite", "configs": [c.id for c in load_suite(ROOT / "perf_tests" / "suites" / "b200.toml").configs], "total_s": 1200.0}
    assert 1200 < totals["planned_s"] <= totals["worst_s"] and math.isclose(totals["planned_gpu_hours"], 8 * totals["planned_s"] / 3600)
    assert totals["planned_s"] == pytest.approx(1200 + sum(p["planned_s"] for p in out["points"]))


WORKFLOW = ROOT / ".github" / "workflows" / "nightly-gpu.yml"


def job_limits(job: str) -> tuple[int, int, int, int]:
    """A workflow job's fail-over limits and timeouts: (weekly, nightly, weekly timeout, nightly timeout)."""
    text = WORKFLOW.read_text()
    section = text[text.index(f"\n  {job}:\n") :]
    section = section[: re.search(r"\n  [a-z]+:\n", section[1:]).start() + 1]  # type: ignore[union-attr]
    limits = re.search(r"FAIL_OVER: \$\{\{ needs.versions.outputs.tier == 'weekly' && (\d+) \|\| (\d+) \}\}", section)
    timeouts = re.search(r"timeout-minutes: \$\{\{ needs.versions.outputs.tier == 'weekly' && (\d+) \|\| (\d+) \}\}", section)
    assert limits and timeouts, job
    return int(limits[1]), int(limits[2]), int(timeouts[1]), int(timeouts[2])


def gpu_plan(hardware: str, tier: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["plan", "--suite", str(ROOT / "perf_tests" / "suites" / f"{hardware}.toml"), "--tier", tier, "--json", *extra]) == 0
    return cast(dict[str, Any], json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("hardware", ["b200", "h200"])
@pytest.mark.parametrize("tier", ["nightly", "weekly"])
def test_a_gpu_leg_fits_its_plan_and_its_job(
    hardware: str, tier: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A nightly leg is planned at 45 min at most at the suite's expected figures, every windowed point's
    supply lasts its window, every throughput point's MDE is at most 3 % for repeats that spread
    1.5 %, and the legs' job's fail-over limit (its timeout less 20 min) holds the leg's worst case."""
    monkeypatch.chdir(tmp_path)
    out = gpu_plan(hardware, tier, capsys)
    weekly, nightly, weekly_timeout, nightly_timeout = job_limits("perf")
    assert (weekly_timeout, nightly_timeout) == (weekly + 20, nightly + 20)
    if tier == "nightly":
        assert out["totals"]["planned_s"] <= 45 * 60
    assert out["totals"]["worst_s"] <= 60 * (weekly if tier == "weekly" else nightly)
    assert not any(p["runs_out"] for p in out["points"])
    mdes = [p["mde"]["throughput_mde"] for p in out["points"] if p["mde"] is not None]
    assert mdes and max(mdes) <= 0.03
    configs = {p["config"] for p in out["points"]}
    assert (configs == {"dp8-ctx4k-fp8kv", "dp8-ctx4k-fp8kv-mtp1"}) == (tier == "nightly")


@pytest.mark.parametrize("hardware", ["b200", "h200"])
@pytest.mark.parametrize("tier", ["nightly", "weekly"])
def test_a_gpu_pair_fits_the_pair_job_and_sees_at_most_half_what_two_legs_see(
    hardware: str, tier: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pinned and candidate in one session taking turns: the pair job's fail-over limit holds its worst
    case, and each throughput point's MDE is at most half the MDE of the same repeats in two legs, for
    the drift between sessions the suite assumes."""
    monkeypatch.chdir(tmp_path)
    legs = gpu_plan(hardware, tier, capsys)
    pair = gpu_plan(hardware, tier, capsys, "--candidate")
    weekly, nightly, weekly_timeout, nightly_timeout = job_limits("pair")
    assert (weekly_timeout, nightly_timeout) == (weekly + 20, nightly + 20)
    assert pair["totals"]["worst_s"] <= 60 * (weekly if tier == "weekly" else nightly)
    assert pair["pairing"] == {"kind": "taking turns", "turn_s": TURN_S}
    assert pair["boot"]["total_s"] == 2 * legs["boot"]["total_s"]
    mdes = [p["mde"] for p in pair["points"] if p["mde"] is not None]
    assert mdes and all(m["legs_mde"] >= 2 * m["throughput_mde"] for m in mdes), mdes


def test_a_candidate_boots_each_config_twice_and_takes_each_repeat_on_both_sides(tmp_path: Path) -> None:
    """On a GPU suite a turn comes at each change of side: A B B A A B B A changes side 4 times after
    the first wake-up, 5 turns for 4 repeats a side; on a CPU suite both stay awake: no turn."""
    suite = suite_at(tmp_path, WINDOWED)
    points = points_of(suite, workloads=["seconds"])
    alone, paired = plan(suite, points, {}), plan(suite, points, {}, candidate=True)
    one, two = alone.points[0], paired.points[0]
    assert one.planned_s is not None and two.planned_s is not None and one.worst_s is not None and two.worst_s is not None
    assert two.planned_s == pytest.approx(2 * one.planned_s + 5 * TURN_S)
    assert two.worst_s == pytest.approx(2 * one.worst_s + 5 * TURN_S)  # no max_repeats: the repeats in force
    assert paired.boots_s == 2 * alone.boots_s and paired.planned_s == pytest.approx(paired.boots_s + two.planned_s)
    on_cpu = plan(dataclasses.replace(suite, gpus=0), points, {}, candidate=True)
    assert on_cpu.pairing is not None and on_cpu.pairing.kind == "side by side"
    assert on_cpu.points[0].planned_s == pytest.approx(2 * one.planned_s)


def test_the_legs_mde_keeps_the_drift_between_sessions_that_repeats_cannot_average_away() -> None:
    """Without drift two legs see what the pair sees; the CPU suite's measured drift (three sessions
    minutes apart: a 16 % CV) at 3 repeats spreading 5 % gives about the 40-43 % MDE that qwenperf
    compare reported for those sessions, where side by side the same repeats give about 10 %."""
    assert legs_mde(4, 0.015, 0.0) == pytest.approx(repeats_mde(4, 0.015))
    assert legs_mde(3, 0.05, 0.16) == pytest.approx(0.45, abs=0.02)
    assert repeats_mde(3, 0.05) == pytest.approx(0.105, abs=0.005)
    assert legs_mde(40, 0.015, 0.02) > legs_mde(4, 0.015, 0.0)  # ten times the repeats do not take the drift away
    with pytest.raises(ValueError, match="spreads >= 0"):
        legs_mde(4, 0.015, -0.01)


def test_a_history_that_timed_its_repeats_times_the_point_by_them(tmp_path: Path) -> None:
    """Runs that recorded their wall time (``Run.elapsed_s``) time a repeat whole: its warm-up, its
    drain, its overheads, with no model of them; a run of 4 repeats that took 60 s is 15 s a repeat."""
    suite = load_suite(ROOT / "perf_tests" / "suites" / "cpu.toml")
    points = points_of(suite, ["base"], ["isl128-osl128"])
    samples = {"total_token_throughput": [10_000.0] * 4, "output_throughput": [5_000.0] * 4}
    runs = []
    for day, elapsed in ((1, 60.0), (2, 64.0), (3, 56.0)):
        data = make_run("base", total=10_000.0, output=5_000.0, samples=samples)
        data["context"]["started"] = f"2026-11-{day:02d}T02:00:00+00:00"
        data["elapsed_s"] = elapsed
        runs.append(run_of(data))
    with HistoryStore.open(tmp_path / "history.sqlite") as store:
        store.append(runs, source="test")
        history = history_of(store, suite, points)
    assert history["base", "isl128-osl128"].repeat_s == pytest.approx(15.0)
    assert history["base", "isl128-osl128"].session_spread == 0.0  # three sessions of one machine, all at 10,000
    timed = plan(suite, points, history).points[0]
    assert timed.timing is not None and timed.timing.repeat_s == pytest.approx(15.0)
    assert timed.planned_s == pytest.approx(suite.repeats * 15.0)
    assert (timed.spread, timed.spread_from, timed.mde) == (0.0, "history", 0.0)  # repeats of one figure: no spread


WINDOWED = """
[suite]
name = "windowed"
hardware = "h100"
model = "embedded:tiny"
gpus = 1
repeats = 4
boot_s = 30
repeat_spread = 0.015

[[config]]
id = "base"
expected = { total_token_throughput = 1000.0 }

[[workload]]
name = "seconds"
kind = "random"
input_len = 100
output_len = 50
num_prompts = 520
warmup = 20
load = { concurrency = 10 }
window = "20s"

[[workload]]
name = "lifetimes"
kind = "random"
input_len = 100
output_len = 50
num_prompts = 520
warmup = 20
load = { concurrency = 10 }
window = "4 lifetimes"

[[workload]]
name = "short"
kind = "random"
input_len = 100
output_len = 50
num_prompts = 120
warmup = 20
load = { concurrency = 10 }
window = "20s"
"""


def test_a_window_times_a_run_by_the_window_and_one_lifetime(tmp_path: Path) -> None:
    """At 1,000 tok/s a request of 150 tokens leaves at 6.67 a second, so 10 in flight live 1.5 s
    each (Little's law): with a lifetime for the batch to turn over before it and one after it, a
    20 s window takes 23 s, 4 lifetimes 9 s. 100 requests last 15 s, so a 20 s window runs out of
    them: its run takes their 15 s, and the plan says so."""
    suite = suite_at(tmp_path, WINDOWED)
    found = plan(suite, points_of(suite), {})
    cost = {p.workload: p for p in found.points}
    runs = {name: point.timing.load_run for name, point in cost.items() if point.timing is not None}
    assert runs["seconds"].lifetime_s == pytest.approx(1.5) and runs["seconds"].window_s == 20.0
    assert runs["seconds"].measured_s == pytest.approx(23.0) and not runs["seconds"].runs_out
    assert runs["lifetimes"].window_s == pytest.approx(6.0) and runs["lifetimes"].measured_s == pytest.approx(9.0)
    assert runs["short"].runs_out and runs["short"].measured_s == pytest.approx(15.0)
    assert "1 point(s) run out of requests before their window closes" in found.line()
    assert cost["seconds"].timing is not None
    assert cost["seconds"].timing.repeat_s == pytest.approx(20 * 150 / 1000 + 23.0 + overhead(520 * 100))


def test_the_plan_gives_each_points_throughput_mde_at_its_repeats(tmp_path: Path) -> None:
    """4 repeats a side spreading 1.5 %: Welch's half-width t(0.975, 6) x ln(1.015) x sqrt(2/4) = 0.02576
    on the log scale, an MDE of 1 - exp(-0.02576) = 2.54 %; the history's own spread wins over the suite's."""
    suite = suite_at(tmp_path, WINDOWED)
    points = points_of(suite, workloads=["seconds"])
    assumed = plan(suite, points, {}).points[0]
    assert (assumed.spread, assumed.spread_from) == (0.015, "suite") and assumed.mde == pytest.approx(0.02543, abs=2e-5)
    measured = Measured(runs=3, rates=(Rate("total_token_throughput", 1000.0),), duration_s=None, spread=0.03)
    seen = plan(suite, points, {("base", "seconds"): measured}).points[0]
    assert (seen.spread, seen.spread_from) == (0.03, "history") and seen.mde is not None and seen.mde > 2 * assumed.mde * 0.95
    assert seen.as_json()["mde"] == {
        "spread": 0.03,
        "from": "history",
        "throughput_mde": seen.mde,
        "session_spread": None,
        "session_spread_from": None,
        "legs_mde": None,
    }

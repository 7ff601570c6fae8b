"""The history reference on synthetic series in a real SQLite store: the window's edges, a change
point inside it, must-match differences and invalid runs left out, and a store that is not there."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.run import Loss, Run
from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.gate.baseline import Baseline, BaselineError
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.gate.judge import judge_against_run, judge_run, render_judgements
from pytest_qwenperf.history.declines import judged_by_history
from pytest_qwenperf.history.reference import history_baseline, history_reference
from tests.test_history_store import night


def store_of(tmp_path: Path, runs: list[Run]) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "history.sqlite"
    with HistoryStore.open(path) as store:
        store.append(runs, source="test")
    return path


def levels(path: Path, run: Run, window: int = 5) -> list[float]:
    with HistoryStore.open(path, create=False) as store:
        found = history_reference(store, run, window)
    assert found is not None
    return [r.metrics["output_throughput"] for r in found.runs]


def test_the_window_is_the_last_valid_runs_pooled_as_repeats(tmp_path: Path) -> None:
    path = store_of(tmp_path, [night(day, 5_000.0 + day) for day in range(1, 9)])
    now = night(20, 5_000.0)
    assert levels(path, now) == [5_004.0, 5_005.0, 5_006.0, 5_007.0, 5_008.0]  # the last five, oldest first
    assert levels(path, now, window=2) == [5_007.0, 5_008.0]
    baseline = history_baseline(str(path), now, 5)
    assert baseline is not None and len(baseline.metrics["output_throughput"].samples) == 15  # 5 runs x 3 repeats
    assert baseline.metrics["output_throughput"].sessions == (3, 3, 3, 3, 3)  # each run a session
    assert baseline.name == "history: 5 runs, 2026-11-04 → 08, vLLM 0.32.0"
    judged = judge_run(baseline, now)
    assert {j.reference for j in judged} == {"history: 5 runs, 2026-11-04 → 08, vLLM 0.32.0"}
    assert render_judgements(judged).splitlines()[0] == "vs history: 5 runs, 2026-11-04 → 08, vLLM 0.32.0"


def test_invalid_runs_never_serve(tmp_path: Path) -> None:
    contended = msgspec.structs.replace(night(7, 9_999.0), conditions=(Loss(reason="cpu-contention", detail="a busy neighbour"),))
    path = store_of(tmp_path, [night(5, 5_000.0), night(6, 5_010.0), contended])
    assert levels(path, night(20, 5_000.0)) == [5_000.0, 5_010.0]


def test_runs_whose_environment_differs_where_the_suite_must_match_are_left_out(tmp_path: Path) -> None:
    def on(torch: str, day: int, level: float) -> Run:
        run = night(day, level)
        environment = Environment(vllm_version="0.32.0", torch=torch)
        return msgspec.structs.replace(run, context=msgspec.structs.replace(run.context, environment=environment))

    path = store_of(tmp_path, [on("2.12", 1, 4_000.0), on("2.13", 2, 5_000.0), on("2.12", 3, 4_100.0)])
    now = on("2.13", 20, 5_000.0)
    assert levels(path, msgspec.structs.replace(now, must_match=("torch",))) == [5_000.0]
    assert levels(path, now) == [4_000.0, 5_000.0, 4_100.0]  # torch may differ where the suite does not say otherwise


def test_the_window_never_reaches_back_across_a_confirmed_change_point(tmp_path: Path) -> None:
    flat = [night(day, 5_000.0 * (1 + 0.004 * (day % 3))) for day in range(1, 13)]
    stepped = [night(day, 4_000.0 * (1 + 0.004 * (day % 3))) for day in range(13, 16)]  # -20 % from night 13, three nights
    path = store_of(tmp_path, flat + stepped)
    with HistoryStore.open(path, create=False) as store:
        found = history_reference(store, night(20, 4_000.0), 5)
    assert found is not None and found.after_change
    assert [r.context.started[:10] for r in found.runs] == ["2026-11-13", "2026-11-14", "2026-11-15"]
    assert found.name == "history: 3 runs since a change point, 2026-11-13 → 15, vLLM 0.32.0"


def test_an_unconfirmed_step_stays_in_the_window(tmp_path: Path) -> None:
    """One night after a step is a blip the history cannot confirm: the reference keeps its window."""
    flat = [night(day, 5_000.0 * (1 + 0.004 * (day % 3))) for day in range(1, 13)]
    path = store_of(tmp_path, [*flat, night(13, 4_000.0)])
    with HistoryStore.open(path, create=False) as store:
        found = history_reference(store, night(20, 4_000.0), 5)
    assert found is not None and not found.after_change and len(found.runs) == 5


def test_no_store_yet_is_no_reference_and_makes_no_file(tmp_path: Path) -> None:
    absent = tmp_path / ".qwenperf" / "history.sqlite"
    assert history_baseline(str(absent), night(20, 5_000.0), 5) is None
    assert not absent.parent.exists()
    other = store_of(tmp_path, [night(1, 5_000.0, config="ctx-short")])
    assert history_baseline(str(other), night(20, 5_000.0), 5) is None  # another config's runs do not serve


def test_a_file_that_is_not_a_store_is_an_unreadable_reference(tmp_path: Path) -> None:
    junk = tmp_path / "history.sqlite"
    junk.write_text("not a database, " * 100)
    with pytest.raises(BaselineError, match=r"^the history: .*history.sqlite: cannot open the history store"):
        history_baseline(str(junk), night(20, 5_000.0), 5)


def test_sessions_that_wander_make_the_history_reference_say_it_cannot_tell(tmp_path: Path) -> None:
    """Each run's repeats agree within 1 %, the runs differ by up to 18 %: an ordinary session 12 %
    below the centre is no regression against the history, where the same samples as one session's would be."""
    path = store_of(tmp_path, [night(day, level) for day, level in enumerate([5_000.0, 5_900.0, 4_750.0, 5_500.0, 5_100.0], start=1)])
    now = night(20, 4_500.0)
    baseline = history_baseline(str(path), now, 5)
    assert baseline is not None
    (judged,) = [j for j in judge_run(baseline, now) if j.metric == "output_throughput"]
    assert judged.verdict == "noisy" and "predicted from the baseline's 5 sessions" in judged.detail
    fields = {k: v for k, v in msgspec.structs.asdict(baseline).items() if k != "name"}
    metrics = {"output_throughput": msgspec.structs.replace(baseline.metrics["output_throughput"], sessions=None)}
    one_session = Baseline(**{**fields, "metrics": metrics})  # the same samples, as a stored baseline of one session
    (alone,) = [j for j in judge_run(one_session, now) if j.metric == "output_throughput"]
    assert alone.verdict == "regression"


@pytest.mark.parametrize(("runs", "verdict"), [(1, "noisy"), (2, "noisy"), (3, "regression"), (5, "regression")])
def test_a_regression_against_the_history_needs_three_runs_to_know_the_runner(tmp_path: Path, runs: int, verdict: str) -> None:
    """A server slowed 19 % against quiet runs: confirmed once the history holds three, said but not
    failed on before (how far sessions wander here is not known from one or two)."""
    path = store_of(tmp_path, [night(day, 5_000.0 + 10 * day) for day in range(1, runs + 1)])
    now = night(20, 4_050.0)
    baseline = history_baseline(str(path), now, 5)
    assert baseline is not None
    (judged,) = [j for j in judge_run(baseline, now) if j.metric == "output_throughput"]
    assert judged.verdict == verdict, judged.detail
    if verdict == "noisy":
        assert f"the history holds {runs} run(s) of 3 needed to know how far this runner's sessions differ" in judged.detail


def test_an_improvement_against_a_history_of_one_run_is_not_confirmed_either(tmp_path: Path) -> None:
    """Two back-to-back sessions of one vLLM differed by 25 % here, which the repeats called a
    significant improvement: against one run it is said, not claimed."""
    path = store_of(tmp_path, [night(1, 4_400.0)])
    now = night(20, 5_500.0)
    baseline = history_baseline(str(path), now, 7)
    assert baseline is not None
    (judged,) = [j for j in judge_run(baseline, now) if j.metric == "output_throughput"]
    assert judged.verdict == "underpowered"
    assert judged.detail.startswith("better than the tolerance, but the history holds 1 run(s) of 3 needed")


def test_a_session_keeps_its_runners_noise_so_two_single_sessions_compare_on_it(tmp_path: Path) -> None:
    """Seven past sessions whose repeats agree within 1 % and whose levels differ by ~8 %: the run
    keeps that spread in its JSON, and a later comparison of it with one other session cannot call
    a 12 % gap a regression, as their repeats alone would; on a quiet runner a 20 % slowdown still fails."""
    wandering = store_of(tmp_path, [night(day, level) for day, level in enumerate([5_000.0, 5_600.0, 4_700.0, 5_400.0, 5_100.0, 4_650.0, 5_300.0], 1)])
    now = judged_by_history(str(wandering), night(20, 4_400.0), valid=True, window=7)
    spread = now.runner_noise["output_throughput"]
    assert spread.sessions == 7 and 0.06 < spread.fraction < 0.10
    assert decode_run(msgspec.json.decode(msgspec.json.encode(now))).runner_noise == now.runner_noise  # kept in its JSON
    other = night(21, 5_000.0)
    (told,) = [j for j in judge_against_run(other, now) if j.metric == "output_throughput"]
    assert told.verdict in ("noisy", "underpowered") and "this runner's sessions differing by SD" in told.detail
    (alone,) = [j for j in judge_against_run(other, night(20, 4_400.0)) if j.metric == "output_throughput"]
    assert alone.verdict == "regression" and "how far sessions differ is unknown" in alone.detail
    (either,) = [j for j in judge_against_run(now, other) if j.metric == "output_throughput"]  # the reference's history counts too
    assert either.verdict in ("underpowered", "noisy") and either.between == pytest.approx(spread.fraction)
    quiet = store_of(tmp_path / "quiet", [night(day, 5_000.0 + 15 * (day % 3)) for day in range(1, 8)])
    slowed = judged_by_history(str(quiet), night(20, 4_000.0), valid=True, window=7)
    (caught,) = [j for j in judge_against_run(other, slowed) if j.metric == "output_throughput"]
    assert caught.verdict == "regression" and caught.between is not None and caught.between < 0.01
    absent = tmp_path / "absent.sqlite"
    assert judged_by_history(str(absent), other, valid=True, window=7) == other and not absent.exists()
    few = store_of(tmp_path / "few", [night(1, 5_000.0), night(2, 5_500.0)])
    assert judged_by_history(str(few), other, valid=True, window=7).runner_noise == {}  # two sessions tell nothing yet

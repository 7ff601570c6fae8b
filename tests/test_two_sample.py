"""Both sides' sessions count: the two-sample t interval on session means (issue 38, point 4).

Expected intervals are computed here by hand: session mean logs, their SD pooled about each side's
own mean, ``t(k_b + k_c - 2) × s × √(1/k_b + 1/k_c)``."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.core.combine import pooled
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.stats import t_quantile
from pytest_qwenperf.core.verdict import Hearing, Judgement, Side, judge
from pytest_qwenperf.gate.baseline import PooledBaseline, baseline_from_run
from pytest_qwenperf.gate.judge import judge_run
from tests.test_baseline import make_run, run_of
from tests.test_compare import compare as compare_cli
from tests.test_compare_sources import column, serve, write

T975 = 0.975  # the two-sided 95 % interval's quantile


def sessions_at(levels: Sequence[float]) -> list[float]:
    """Three repeats a session within ±1 % of each session's level."""
    return [level * f for level in levels for f in (0.99, 1.0, 1.01)]


def session_means(samples: Sequence[float], per_session: int = 3) -> list[float]:
    logs = [math.log(x) for x in samples]
    return [statistics.fmean(logs[i : i + per_session]) for i in range(0, len(logs), per_session)]


def pooled_sd(*sides: Sequence[float]) -> float:
    squares = sum((x - statistics.fmean(side)) ** 2 for side in sides for x in side)
    return math.sqrt(squares / (sum(len(side) for side in sides) - len(sides)))


def judged(baseline: Sequence[float], now: Sequence[float], sessions: Sequence[int], counts: Sequence[int] | None) -> Judgement:
    """Output tok/s, 5 % tolerance, the baseline's ``sessions`` and the run's ``counts``."""
    sides = Side(tuple(baseline), tuple(sessions)), Side(tuple(now), None if counts is None else tuple(counts))
    return judge(Hearing("output_throughput", *sides, direction="higher", tolerance=0.05))


def test_one_run_session_is_the_prediction_interval_for_a_new_session() -> None:
    """k_c = 1: the pooled SD is the baseline's, its df k_b - 1 and √(1/k_b + 1) = √(1 + 1/k_b): the rule of old."""
    baseline, now = sessions_at([100.0, 118.0, 95.0, 110.0, 102.0]), sessions_at([92.0])
    s = statistics.stdev(session_means(baseline))
    half = t_quantile(T975, 4) * s * math.sqrt(1 + 1 / 5)
    for counts in (None, [3]):  # one session, whether said or not
        j = judged(baseline, now, [3] * 5, counts)
        assert j.ratio is not None and j.mde == pytest.approx(1 - math.exp(-half), rel=1e-12)
        assert j.interval == pytest.approx((j.ratio * math.exp(-half), j.ratio * math.exp(half)), rel=1e-12)
        assert j.between == pytest.approx(math.expm1(s), rel=1e-12)
        assert "a new session predicted from the baseline's 5 sessions (SD 8.9%), 4 df" in j.detail


def test_three_sessions_against_three_halve_the_mde_of_one_against_three() -> None:
    """The same nine candidate repeats counted as one session (the rule of old), one session of them
    alone, and the three sessions they are: three give ``t(4) √(2/3)`` against ``t(2) √(4/3)``. Sides
    that spread unlike are pooled, each about its own mean."""
    baseline = sessions_at([100.0, 112.0, 92.0])
    now = sessions_at([90.0, 100.8, 82.8])  # 10 % lower, its sessions as far apart as the baseline's
    s = statistics.stdev(session_means(baseline))
    one_mde = 1 - math.exp(-t_quantile(T975, 2) * s * math.sqrt(1 + 1 / 3))
    three_mde = 1 - math.exp(-t_quantile(T975, 4) * s * math.sqrt(1 / 3 + 1 / 3))
    assert judged(baseline, now, [3, 3, 3], None).mde == judged(baseline, now[:3], [3, 3, 3], None).mde
    assert judged(baseline, now, [3, 3, 3], None).mde == pytest.approx(one_mde, rel=1e-12)
    three = judged(baseline, now, [3, 3, 3], [3, 3, 3])
    assert three.mde == pytest.approx(three_mde, rel=1e-12) and three.between == pytest.approx(math.expm1(s))
    assert f"sessions against sessions: the baseline's 3 vs the run's 3, pooled SD {math.expm1(s):.1%}, 4 df" in three.detail
    assert 0.4 < three_mde / one_mde < 0.6
    assert (round(one_mde, 4), round(three_mde, 4)) == (0.3877, 0.2005)
    unlike = sessions_at([90.0, 93.0, 88.0])
    s_p = pooled_sd(session_means(baseline), session_means(unlike))
    pooled_sides = judged(baseline, unlike, [3, 3, 3], [3, 3, 3])
    assert pooled_sides.mde == pytest.approx(1 - math.exp(-t_quantile(T975, 4) * s_p * math.sqrt(2 / 3)), rel=1e-12)
    assert pooled_sides.between == pytest.approx(math.expm1(s_p), rel=1e-12)


def test_a_regression_between_two_directories_of_three_files_is_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three ``vllm bench serve`` results against three, 18 % slower: one of them against the three
    cannot confirm it (MDE 20 %); all three can (MDE 10 %, sessions against sessions)."""
    levels = (2_200.0, 2_300.0, 2_100.0)
    before = column(tmp_path / "before", *(serve(level) for level in levels))
    after = column(tmp_path / "after", *(serve(level * 0.82) for level in levels))
    one = write(tmp_path / "one.json", serve(levels[0] * 0.82))
    s = statistics.stdev(math.log(level) for level in levels)  # each file one session, the candidate's spread alike
    expected = {
        one: 1 - math.exp(-t_quantile(T975, 2) * s * math.sqrt(1 + 1 / 3)),
        after: 1 - math.exp(-t_quantile(T975, 4) * s * math.sqrt(2 / 3)),
    }
    cells = {}
    for candidate, verdict, status in ((one, "noisy", 0), (after, "regression", 1)):
        metric = ("--metric", "total_token_throughput")
        assert compare_cli(capsys, before, candidate, *metric, "--fail-on", "regression")[0] == status
        _, out, _ = compare_cli(capsys, before, candidate, *metric, "--json")
        (cell,) = json.loads(out)["groups"][0]["rows"][0]["judgements"]
        assert cell["verdict"] == verdict and cell["mde"] == pytest.approx(expected[candidate], rel=1e-9), cell
        cells[candidate] = cell
    assert "sessions against sessions: the baseline's 3 vs the run's 3" in cells[after]["detail"]
    assert cells[after]["between"] == pytest.approx(math.expm1(s), rel=1e-9)
    assert (round(cells[one]["mde"], 4), round(cells[after]["mde"], 4)) == (0.2023, 0.098)


def test_an_aa_of_three_sessions_against_three_false_alarms_at_most_at_the_rate_the_interval_allows() -> None:
    """Both sides drawn alike: sessions 10 % apart, repeats 2 %. Significance alone decides (a
    tolerance of 0), so 'regression' may come up at most (1 - 0.95) / 2 of the time; the repeats
    alone, blind to the sessions, raise it many times as often."""
    rng = random.Random(38)

    def side() -> tuple[float, ...]:
        return tuple(math.exp(level + rng.gauss(0, 0.02)) for level in (rng.gauss(0, 0.10) for _ in range(3)) for _ in range(3))

    draws, alarms, blind = 2_000, 0, 0
    for i in range(draws):
        baseline, now = side(), side()
        j = judge(Hearing("m", Side(baseline, (3, 3, 3)), Side(now, (3, 3, 3)), direction="higher", tolerance=0.0))
        alarms += j.verdict == "regression"
        if i < 200:
            blind += judge(Hearing("m", Side(baseline), Side(now), direction="higher", tolerance=0.0)).verdict == "regression"
    margin = 3 * math.sqrt(0.025 * 0.975 / draws)  # three binomial SDs: 1.0 %
    assert 0.01 < alarms / draws <= 0.025 + margin, alarms  # 3.15 % here; 2.5 % over 40,000: exact, not merely wide
    assert blind / 200 > 0.1, blind


def _sessions(levels: Sequence[float]) -> list[Run]:
    """One run a session, three repeats each at ``levels``."""
    return [run_of(make_run(output=level, samples={"output_throughput": sessions_at([level])})) for level in levels]


def test_a_short_history_confirms_a_change_once_the_runs_sessions_make_up_the_count() -> None:
    """Against a history of one run, a run of two sessions shows no spread between sessions (one
    degree of freedom): 19 % slower is said, not failed on. Against two runs it is confirmed."""
    runs = _sessions([4_050.0, 4_060.0])
    now = pooled(runs, runs[-1], "runs pooled")
    for history, verdict, detail in (
        ([5_000.0], "noisy", "the history holds 1 run(s) of 2 needed alongside this run's 2 sessions"),
        ([5_000.0, 5_010.0], "regression", "sessions against sessions: the baseline's 2 vs the run's 2"),
    ):
        past = _sessions(history)
        base = baseline_from_run(pooled(past, past[-1], "runs of the history"), source="the history store")
        reference = PooledBaseline(**msgspec.structs.asdict(base), name=f"history: {len(past)} runs")
        (judged,) = [j for j in judge_run(reference, now) if j.metric == "output_throughput"]
        assert judged.verdict == verdict and detail in judged.detail, judged.detail

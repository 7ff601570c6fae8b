"""Verdicts: properties of the rule (hypothesis) and plain examples, for one metric and for whole runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.stats import centre, centre_interval
from pytest_qwenperf.core.summary import Direction
from pytest_qwenperf.core.verdict import Hearing, Judgement, Later, SessionSpread, Side, judge, session_spread, t_quantile
from pytest_qwenperf.gate.baseline import baseline_from_run
from pytest_qwenperf.gate.judge import judge_against_run, judge_run, render_judgements
from tests.test_baseline import make_run, run_of

directions = st.sampled_from(["higher", "lower"])
tolerances = st.floats(min_value=0.0, max_value=0.3)
values = st.floats(min_value=1e-3, max_value=1e6)
# Run-to-run noise: every sample within ±2 % of its side's true value.
noise = st.floats(min_value=0.98, max_value=1.02)
# One sample (a published figure) or enough repeats to estimate a spread; two repeats
# give a 95 % t factor of 12.7, which is honestly too few to call anything.
sizes = st.one_of(st.just(1), st.integers(min_value=3, max_value=8))


def _samples(value: float, factors: list[float]) -> list[float]:
    return [value * f for f in factors]


def judge_samples(
    metric: str, before: Sequence[float], after: Sequence[float], *, direction: Direction, tolerance: float, unit: str = ""
) -> Judgement:
    """:func:`judge` on one session a side."""
    return judge(Hearing(metric, Side(tuple(before)), Side(tuple(after)), direction=direction, tolerance=tolerance, unit=unit))


@given(samples=st.lists(st.floats(min_value=0.0, max_value=1e9), min_size=1, max_size=10), direction=directions, tolerance=tolerances)
def test_identical_samples_never_point_at_a_change(samples: list[float], direction: Direction, tolerance: float) -> None:
    """However wide their spread: a file compared with itself is never noisy (nothing points at a change), but a
    spread too wide to see a change of the tolerance's size is said to be so."""
    j = judge_samples("m", samples, list(samples), direction=direction, tolerance=tolerance)
    assert j.verdict in ("pass", "underpowered"), j.detail
    assert (j.verdict == "underpowered") == (j.mde is not None and j.mde > tolerance), j.detail


@given(
    before=st.lists(values, min_size=1, max_size=6),
    after=st.lists(values, min_size=1, max_size=6),
    direction=directions,
    tolerance=tolerances,
)
def test_the_point_estimate_decides_between_pass_and_a_change_significance_and_the_mde_the_rest(
    before: list[float], after: list[float], direction: Direction, tolerance: float
) -> None:
    j = judge_samples("m", before, after, direction=direction, tolerance=tolerance)
    assert j.ratio is not None
    worse = j.ratio < 1 - tolerance if direction == "higher" else j.ratio > 1 + tolerance
    # The better bound is the worse one mirrored on the log scale: the same pair of runs read the
    # other way round (baseline and current swapped) is a regression exactly when this is better.
    better = j.ratio > 1 / (1 - tolerance) if direction == "higher" else j.ratio < 1 / (1 + tolerance)
    assume(min(abs(j.ratio - b) for b in (1 - tolerance, 1 + tolerance, 1 / (1 - tolerance), 1 / (1 + tolerance))) > 1e-9)  # not on a bound
    # The MDE is the change the interval can tell from none, on the side the direction calls worse.
    change = (1 - j.ratio) if direction == "higher" else (j.ratio - 1)
    underpowered = j.mde is not None and j.mde > tolerance
    if worse:
        assert j.verdict in ("regression", "noisy"), j.detail
        assert (j.verdict == "noisy") == ("cannot confirm" in j.detail)
        if j.verdict == "regression":  # significant: beyond the MDE as well as the tolerance
            assert j.mde is None or change >= j.mde * (1 - 1e-9), j.detail
    elif better:
        assert j.verdict in ("improvement", "pass", "underpowered"), j.detail
    else:
        assert j.verdict == ("underpowered" if underpowered else "pass"), j.detail
        assert ("could not have seen" if underpowered else "within tolerance") in j.detail, j.detail


@given(
    value=values,
    data=st.data(),
    direction=directions,
    tolerance=tolerances,
    n_base=sizes,
    n_now=sizes,
    margin=st.floats(min_value=0.0, max_value=0.9),
)
def test_a_uniform_change_beyond_tolerance_and_noise_always_regresses(
    value: float, data: st.DataObject, direction: Direction, tolerance: float, n_base: int, n_now: int, margin: float
) -> None:
    """Throughput down (or latency up) by more than the tolerance, with a 20 % margin for ±2 % noise."""
    before = _samples(value, data.draw(st.lists(noise, min_size=n_base, max_size=n_base)))
    factor = (1 - tolerance) * 0.8 * (1 - margin) if direction == "higher" else (1 + tolerance) / 0.8 / (1 - margin)
    after = _samples(value * factor, data.draw(st.lists(noise, min_size=n_now, max_size=n_now)))
    judgement = judge_samples("m", before, after, direction=direction, tolerance=tolerance)
    assert judgement.verdict == "regression", judgement.detail
    better = judge_samples("m", after, before, direction=direction, tolerance=tolerance)
    assert better.verdict == "improvement", better.detail


@given(
    before=st.lists(values, min_size=1, max_size=8),
    after=st.lists(values, min_size=1, max_size=8),
    tolerance=tolerances,
)
def test_direction_is_respected(before: list[float], after: list[float], tolerance: float) -> None:
    """A latency decrease or a throughput increase is never a regression, whatever the spread."""
    assume(centre(after) < centre(before))
    assert judge_samples("p99_ttft_ms", before, after, direction="lower", tolerance=tolerance).verdict != "regression"
    assert judge_samples("total_token_throughput", after, before, direction="higher", tolerance=tolerance).verdict != "regression"


@given(before=st.lists(values, min_size=1, max_size=5), after=st.lists(values, min_size=1, max_size=5), tolerance=tolerances)
def test_metrics_without_a_better_direction_always_pass(before: list[float], after: list[float], tolerance: float) -> None:
    assert judge_samples("duration", before, after, direction="none", tolerance=tolerance).verdict == "pass"


def _changed(run: dict[str, Any], field: str) -> dict[str, Any]:
    identity = dict(run["identity"])
    if field == "argv":
        identity["argv"] = [*identity["argv"], "--enforce-eager"]
    else:
        identity[field] = identity[field] + "-other"
    return {**run, "identity": identity}


@given(
    field=st.sampled_from(["argv", "config", "model", "suite", "workload", "workload_fingerprint", "hardware"]),
    factor=st.floats(min_value=0.01, max_value=100.0),
    bound=st.sampled_from([None, "client busy 99% of the run (limit 95%)"]),
)
def test_a_run_that_is_not_comparable_never_regresses(field: str, factor: float, bound: str | None) -> None:
    """Not comparable, or invalid when it also lost data (a run that lost data never passes): never a regression."""
    baseline = baseline_from_run(run_of(), source="test")
    run = _changed(make_run(total=10_000 * factor, ttft=200 / factor, tpot=20 / factor, bound=bound), field)
    judgements = judge_run(baseline, run_of(run))
    if bound is None:
        assert judgements and {j.verdict for j in judgements} == {"not-comparable"}
        assert all(j.ratio is None and field.split("_")[0] in j.detail for j in judgements)
    else:
        assert judgements and {j.label for j in judgements} == {"invalid: client-bound"}


# ------------------------------------------------------------------ examples


def test_t_quantiles_match_the_tables() -> None:
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.95, 10) == pytest.approx(1.8125, abs=1e-4)
    assert t_quantile(0.975, 1e9) == pytest.approx(1.95996, abs=1e-4)


def test_the_interval_of_a_centre_is_students_t_on_log_values() -> None:
    """Three repeats 10 % apart: the log values step by log 1.1, so their SD is log 1.1 and the
    interval is the geometric mean 110 times e to the plus or minus t(0.975, 2) log 1.1 / sqrt 3."""
    half = 4.302653 * math.log(1.1) / math.sqrt(3)
    low, high = centre_interval([100.0, 110.0, 121.0])
    assert (low, high) == (pytest.approx(110 * math.exp(-half)), pytest.approx(110 * math.exp(half)))
    assert centre_interval([5_000.0]) == (5_000.0, 5_000.0) and centre_interval([7.0, 7.0]) == (7.0, 7.0)
    low, high = centre_interval([-1.0, 1.0])  # not all positive: on the values themselves, around the mean
    assert low == pytest.approx(-12.7062, abs=1e-3) and high == pytest.approx(12.7062, abs=1e-3)


def test_a_clear_slowdown_over_repeats_is_a_regression_with_its_interval() -> None:
    before, after = [100, 101, 99, 100.5], [90, 91, 89.5, 90.2]
    j = judge_samples("total_token_throughput", before, after, direction="higher", tolerance=0.05, unit="tok/s")
    assert j.verdict == "regression"
    assert j.ratio == pytest.approx(0.901, abs=1e-3)
    assert "95% interval 0.888–0.913" in j.detail and "Welch" in j.detail


def test_a_change_beyond_the_tolerance_that_the_spread_cannot_confirm_is_noisy() -> None:
    j = judge_samples("total_token_throughput", [100, 110, 90], [90, 99, 81], direction="higher", tolerance=0.05)
    assert j.verdict == "noisy" and j.ratio == pytest.approx(0.9)
    assert "worse than the tolerance, but the noise cannot confirm it: -10.0%" in j.detail
    assert j.mde is not None and j.mde > 0.1 and "MDE" in j.detail


def test_a_small_change_with_a_wide_spread_is_underpowered_and_states_its_interval() -> None:
    j = judge_samples("total_token_throughput", [100, 110, 90], [97, 106.7, 87.3], direction="higher", tolerance=0.05)
    assert j.verdict == "underpowered" and j.ratio == pytest.approx(0.97)
    assert "could not have seen a change of the tolerance's size" in j.detail and "-3.0%" in j.detail
    assert "95% interval 0.7" in j.detail  # reaches far below the 0.950 bound: said, not hidden
    better = judge_samples("total_token_throughput", [90, 99, 81], [100, 110, 90], direction="higher", tolerance=0.05)
    assert better.verdict == "underpowered" and "+11.1%" in better.detail
    tight = judge_samples("total_token_throughput", [100, 101, 99], [97, 98, 96], direction="higher", tolerance=0.05)
    assert tight.verdict == "pass" and "within tolerance: -3.0%" in tight.detail
    assert tight.mde is not None and 0.02 < tight.mde < 0.05


def test_the_mde_is_the_smallest_change_the_interval_tells_from_none() -> None:
    """Half-width h on the log scale: a higher-is-better metric detects drops beyond 1 - e^-h, a lower one rises beyond e^h - 1."""
    import math

    before = [100.0, 102.0, 98.0, 101.0]
    higher = judge_samples("m", before, before, direction="higher", tolerance=0.2)
    lower = judge_samples("m", before, before, direction="lower", tolerance=0.2)
    assert higher.mde is not None and lower.mde is not None
    h = -math.log(1 - higher.mde)
    assert lower.mde == pytest.approx(math.exp(h) - 1)
    # Moving a copy of the samples by just more than the MDE makes the change significant; by just less, not.
    scaled = [a * (1 - higher.mde) for a in before]
    assert judge_samples("m", before, [s * 0.999 for s in scaled], direction="higher", tolerance=0.0).verdict == "regression"
    assert judge_samples("m", before, [s * 1.001 for s in scaled], direction="higher", tolerance=0.0).verdict == "noisy"


def sessions_at(levels: list[float], spread: float = 0.01) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Three repeats a session around each session's level (±``spread``), and the counts per session."""
    samples = tuple(level * f for level in levels for f in (1 - spread, 1.0, 1 + spread))
    return samples, (3,) * len(levels)


def test_a_reference_whose_sessions_differ_widens_the_interval_to_predict_a_new_session() -> None:
    """Tight repeats, sessions 15 % apart: the repeats alone would call an ordinary session a
    regression; the spread between the reference's sessions says it cannot tell."""
    noisy = Side(*sessions_at([100.0, 118.0, 95.0, 110.0, 102.0]))
    now = Side(tuple(92.0 * f for f in (0.99, 1.0, 1.01)))  # -13 % from the centre: one more session of this runner
    alone = judge(Hearing("output_throughput", Side(noisy.samples), now, direction="higher", tolerance=0.10))
    judged = judge(Hearing("output_throughput", noisy, now, direction="higher", tolerance=0.10))
    assert alone.verdict == "regression"  # a false alarm: the repeats cannot see how far sessions wander
    assert judged.verdict == "noisy" and judged.mde is not None and judged.mde > 0.2
    assert "a new session predicted from the baseline's 5 sessions (SD 8.9%), 4 df" in judged.detail
    assert judged.mde > (alone.mde or 0)


def test_a_reference_whose_sessions_agree_still_sees_a_slowdown_beyond_the_tolerance() -> None:
    quiet = Side(*sessions_at([100.0, 101.0, 99.5, 100.5, 99.0]))
    slowed = Side(tuple(81.0 * f for f in (0.99, 1.0, 1.01)))  # -19 %: a server held to 85 % of a core
    judged = judge(Hearing("output_throughput", quiet, slowed, direction="higher", tolerance=0.10))
    assert judged.verdict == "regression" and judged.mde is not None and judged.mde < 0.10
    same = judge(Hearing("output_throughput", quiet, Side((100.2, 99.1, 101.0)), direction="higher", tolerance=0.10))
    assert same.verdict == "pass"


def test_fewer_than_three_sessions_leave_the_repeats_to_decide() -> None:
    two, counts = sessions_at([100.0, 120.0])
    now = Side((90.0, 91.0, 89.0))
    with_counts = judge(Hearing("output_throughput", Side(two, counts), now, direction="higher", tolerance=0.10))
    without = judge(Hearing("output_throughput", Side(two), now, direction="higher", tolerance=0.10))
    assert with_counts == without
    with pytest.raises(ValueError, match=r"sessions \[3, 3, 2\] do not divide the 9 samples"):
        judge(Hearing("output_throughput", Side((100.0,) * 9, (3, 3, 2)), Side((90.0,) * 3), direction="higher", tolerance=0.1))


def test_two_single_sessions_are_judged_on_the_runners_known_spread_between_sessions() -> None:
    """One session a side, tight repeats: the repeats alone call an 11 % gap a regression and
    say how far sessions differ is unknown. On a runner whose history shows sessions 10 % apart
    the same pair cannot tell (never a pass), and on one 2 % apart a 20 % slowdown still fails."""
    reference = Side((5700.0, 5697.0, 5690.0))
    aa = Side((5074.0, 5044.0, 5060.0))  # -11 %, as an A/A pair of sessions on the 2-vCPU runner
    slowed = Side((4560.0, 4570.0, 4550.0))  # -20 %
    alone = judge(Hearing("output_throughput", reference, aa, direction="higher", tolerance=0.10))
    assert alone.verdict == "regression" and "how far sessions differ is unknown" in alone.detail
    wandering = session_spread(*sessions_at([100.0, 112.0, 95.0, 108.0, 90.0, 104.0, 99.0]))
    quiet = session_spread(*sessions_at([100.0, 102.0, 99.0, 101.0, 98.0, 100.5, 99.5]))
    assert wandering is not None and quiet is not None and wandering.sessions == quiet.sessions == 7
    assert 0.07 < wandering.fraction < 0.09 and quiet.fraction < 0.015
    for now in (aa, slowed):
        judged = judge(Hearing("output_throughput", reference, now, direction="higher", tolerance=0.10, runner=wandering))
        assert judged.verdict in ("noisy", "underpowered"), judged
        assert judged.mde is not None and judged.mde > 0.10 and judged.between == pytest.approx(wandering.fraction)
        assert "this runner's sessions differing by SD" in judged.detail
    caught = judge(Hearing("output_throughput", reference, slowed, direction="higher", tolerance=0.10, runner=quiet))
    assert caught.verdict == "regression" and caught.mde is not None and caught.mde < 0.10
    # The baseline's own sessions, where there are enough, win over the runner's.
    own = Side(*sessions_at([100.0, 101.0, 99.0]))
    slower = Side((80.0, 80.5, 79.5))
    tight = judge(Hearing("output_throughput", own, slower, direction="higher", tolerance=0.10, runner=wandering))
    assert tight.verdict == "regression" and "predicted from the baseline's 3 sessions" in tight.detail
    assert session_spread([100.0, 101.0], [1, 1]) is None
    assert SessionSpread(log_sd=0.0, sessions=3).fraction == 0.0


def test_one_sample_each_side_is_decided_on_the_tolerance_alone_and_says_so() -> None:
    worse = judge_samples("p99_ttft_ms", [100.0], [126.0], direction="lower", tolerance=0.25)
    within = judge_samples("p99_ttft_ms", [100.0], [124.0], direction="lower", tolerance=0.25)
    assert (worse.verdict, within.verdict) == ("regression", "pass")
    assert "one sample on each side" in worse.detail and "tolerance alone" in worse.detail


def test_a_published_single_figure_borrows_the_runs_spread() -> None:
    j = judge_samples("total_token_throughput", [95_317.0], [80_000.0, 80_500.0, 79_700.0], direction="higher", tolerance=0.05)
    assert j.verdict == "regression"
    assert "the baseline has one sample; its spread is taken from the other side's" in j.detail and "2.0 df" in j.detail


def test_a_hit_rate_that_drops_to_zero_is_a_regression() -> None:
    j = judge_samples("prefix_cache_hit_rate", [0.88, 0.87, 0.88], [0.0, 0.0, 0.0], direction="higher", tolerance=0.05)
    assert j.verdict == "regression" and j.ratio == 0.0 and "ratio alone" in j.detail
    assert judge_samples("prefix_cache_hit_rate", [0.0], [0.0], direction="higher", tolerance=0.05).verdict == "pass"


def test_a_zero_baseline_gives_no_ratio() -> None:
    j = judge_samples("spec_decode_acceptance_rate", [0.0], [0.5], direction="higher", tolerance=0.1)
    assert (j.verdict, j.ratio) == ("not-comparable", None)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"tolerance": 1.0}, r"m: tolerance must be a fraction in \[0, 1\), got 1.0"),
        ({"tolerance": -0.1}, r"m: tolerance must be a fraction in \[0, 1\), got -0.1"),
        ({"confidence": 1.0}, r"m: confidence must be in \(0, 1\), got 1.0"),
        ({"baseline": Side(())}, "m: no baseline samples"),
        ({"current": Side((-1.0,))}, "m: current samples must be finite and non-negative"),
    ],
)
def test_invalid_parameters_are_rejected(bad: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"baseline": Side((1.0,)), "current": Side((1.0,)), "tolerance": 0.05, **bad}
    with pytest.raises(ValueError, match=message):
        Hearing("m", direction="higher", **fields)


def test_judge_run_against_a_baseline_uses_the_stored_tolerance() -> None:
    baseline = baseline_from_run(run_of(ttft=200.0), source="test")
    judgements = {j.metric: j for j in judge_run(baseline, run_of(total=9_000.0, ttft=240.0, tpot=15.0))}
    assert judgements["total_token_throughput"].verdict == "regression"
    assert judgements["p99_ttft_ms"].verdict == "pass"  # +20 %, within the 25 % for tail TTFT
    assert judgements["p99_tpot_ms"].verdict == "improvement"
    assert list(judgements)[:2] == ["total_token_throughput", "output_throughput"]


def test_judge_run_without_a_baseline_or_with_a_client_bound_run() -> None:
    assert {j.verdict for j in judge_run(None, run_of())} == {"no-baseline"}
    baseline = baseline_from_run(run_of(), source="test")
    bound = judge_run(baseline, run_of(total=1_000.0, bound="sent 3 req/s, below 95% of the requested 10 req/s"))
    assert {j.label for j in bound} == {"invalid: client-bound"}
    assert all("client could not keep up" in j.detail and "sent 3 req/s" in j.detail for j in bound)
    assert next(j for j in bound if j.metric == "total_token_throughput").ratio == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("lossy", "label", "detail"),
    [
        (make_run(failed=3), "invalid: failed-requests", "3 request(s) of the run failed"),
        (make_run(tokens_match=False), "invalid: token-mismatch", "the run's client and server token totals disagree"),
        (
            make_run(failed=1, bound="client busy 99% of the run (limit 95%)"),
            "invalid: failed-requests, client-bound",
            "1 request(s) of the run failed; the run's client could not keep up",
        ),
    ],
    ids=["failed", "tokens", "both"],
)
def test_a_run_that_lost_data_is_invalid_with_or_without_a_baseline(lossy: dict[str, Any], label: str, detail: str) -> None:
    for baseline in (baseline_from_run(run_of(), source="test"), None):
        judgements = judge_run(baseline, run_of(lossy))
        assert judgements and {j.label for j in judgements} == {label}
        assert all(j.detail.startswith(detail) for j in judgements), judgements[0].detail


@pytest.mark.parametrize("value", [None, float("nan")], ids=["null", "nan"])
def test_a_metric_without_a_value_where_the_baseline_has_one_is_invalid(value: float | None) -> None:
    baseline = baseline_from_run(run_of(samples={"total_token_throughput": [9_900.0, 10_000.0, 10_100.0]}), source="test")
    run = make_run(extra={"samples": {"total_token_throughput": [9_900.0, value, 10_100.0]}})  # a lost value, as JSON has it
    judgements = {j.metric: j for j in judge_run(baseline, run_of(run))}
    lost = judgements["total_token_throughput"]
    assert (lost.label, lost.now, lost.ratio) == ("invalid: no-value", None, None)
    assert f"samples.total_token_throughput[1] is {'null' if value is None else 'NaN'}" in lost.detail
    assert judgements["output_throughput"].verdict == "pass"
    absent = make_run()
    del absent["metrics"]["p99_ttft_ms"]
    assert {j.metric: j.label for j in judge_run(baseline, run_of(absent))}["p99_ttft_ms"] == "invalid: no-value"


def test_a_reference_run_that_lost_data_makes_the_comparison_invalid_naming_it() -> None:
    reference = make_run(bound="client busy 99% of the run (limit 95%)")
    judgements = judge_against_run(run_of(reference), run_of(failed=2))
    assert {j.label for j in judgements} == {"invalid: failed-requests, client-bound (reference)"}
    assert all("the reference's client could not keep up" in j.detail for j in judgements)
    lost = make_run(samples={"p99_ttft_ms": [float("nan")]})
    by_metric = {j.metric: j for j in judge_against_run(run_of(lost), run_of())}
    assert by_metric["p99_ttft_ms"].label == "invalid: no-value (reference)"
    assert "the reference has no value for it (samples.p99_ttft_ms[0] is NaN)" in by_metric["p99_ttft_ms"].detail
    assert by_metric["total_token_throughput"].verdict == "pass"
    assert {j.verdict for j in judge_against_run(run_of(), run_of())} == {"pass"}


def test_a_metric_the_baseline_lacks_has_no_baseline_and_one_only_the_baseline_has_is_skipped() -> None:
    baseline = baseline_from_run(run_of(samples={"scaling_efficiency_n2": [0.99]}), source="test")
    judgements = {j.metric: j.verdict for j in judge_run(baseline, run_of(hit_rate=0.5))}
    assert judgements["prefix_cache_hit_rate"] == "no-baseline"
    assert "scaling_efficiency_n2" not in judgements  # a published multi-node figure: the run did not measure it
    lost = judge_run(baseline, run_of(extra={"samples": {"scaling_efficiency_n2": [None]}}))
    assert {j.metric: j.label for j in lost}["scaling_efficiency_n2"] == "invalid: no-value"


def test_the_table_shows_each_judgement_and_the_detail_of_what_did_not_pass() -> None:
    judgements = [
        judge_samples("total_token_throughput", [95_317.0], [80_000.0], direction="higher", tolerance=0.05, unit="tok/s"),
        judge_samples("p99_tpot_ms", [46.0], [46.5], direction="lower", tolerance=0.1, unit="ms"),
    ]
    text = render_judgements(judgements)
    lines = text.splitlines()
    assert lines[0].split() == list(Judgement.HEADER)
    assert lines[2].split() == ["total_token_throughput", "(tok/s)", "95,317", "80,000", "0.839", "5%", "—", "regression"]
    assert lines[3].split() == ["p99_tpot_ms", "(ms)", "46.0", "46.5", "1.011", "10%", "—", "pass"]
    assert "total_token_throughput: regression: worse than the tolerance: -16.1%" in text
    assert "p99_tpot_ms: pass" not in text
    markdown = render_judgements(judgements, markdown=True).splitlines()
    assert markdown[1] == "|:---|---:|---:|---:|---:|---:|:---|"
    assert markdown[2] == "| total_token_throughput (tok/s) | 95,317 | 80,000 | 0.839 | 5% | — | regression |"


def test_whether_more_repeats_could_settle_depends_on_the_repeats_left_and_on_which_sides_grow() -> None:
    """Three repeats a side spread 5 %, a 10 % tolerance, the first look of a plan of up to six:
    underpowered (MDE 12.5 %). A reference measured earlier keeps its three samples, and with them
    t on 2 df: the run's repeats, three more or sixteen, cannot narrow the interval enough. Side by
    side, the reference gains a repeat a look too, and six a side can; with no repeat left, nothing can."""
    plan = SequentialPlan(0.95, 3, 6)
    samples = (5_000.0, 5_250.0, 4_750.0)

    def judged(later: Later | None) -> Judgement:
        hearing = Hearing(
            "output_throughput", Side(samples), Side(samples), direction="higher", tolerance=0.10,
            confidence=plan.confidence_at(3), later=later,
        )
        return judge(hearing)

    first = judged(plan.later(3))
    assert first.verdict == "underpowered" and first.mde == pytest.approx(0.125, abs=0.001)
    assert not first.settles_with_repeats
    assert not judged(None).settles_with_repeats  # sixteen more of the run alone
    assert judged(plan.later(3, both=True)).settles_with_repeats
    assert not judged(plan.later(6, both=True)).settles_with_repeats  # no repeat left

"""Verdicts: is a metric of a run worse than its baseline, honestly, and could the run have seen it?

The rule, per metric with a better direction and a tolerance τ (the fraction of the
baseline a run may be worse by, the smallest change the user cares about):

* An interval for the ratio now / baseline comes from the run-to-run spread: Welch's t
  interval on the log of the samples (confidence 95 % by default), so it is an interval
  for the ratio of geometric means. Logs, because performance noise is multiplicative
  and a ratio's interval must be the same whichever side is called the baseline.
* The **minimum detectable effect** (MDE) is the smallest change the interval can tell
  from none: with half-width h (log scale) it is ``1 - exp(-h)`` for a higher-is-better
  metric and ``exp(h) - 1`` for a lower-is-better one, a fraction of the baseline. A
  change must be beyond the MDE to be significant and beyond τ to matter, so the
  smallest change that would have been judged a regression is ``max(τ, MDE)``. A true
  change of exactly the MDE is caught about half of the time; one of twice the MDE
  nearly always.
* **regression**: the point estimate (the ratio of the centres) lies beyond the worse
  bound (``1 - τ`` for higher-is-better, ``1 + τ`` for lower) *and* the interval lies
  wholly on the worse side of 1 (the change is significant, one-sided at half the
  interval's error rate). **improvement**: the same on the better side, beyond the worse
  bound mirrored on the log scale (``1 / (1 - τ)`` for higher-is-better, ``1 / (1 + τ)`` for
  lower), so that a pair read the other way round is a regression exactly when it is an improvement.
* **noisy**: the point estimate is beyond the worse bound but the change is not
  significant: it looks like a regression the noise cannot confirm.
* **underpowered**: nothing points at a regression, but the MDE exceeds τ: the run
  could not have seen a change of the size the tolerance names, so "pass" would claim
  more than the data show.
* **pass**: otherwise, with the MDE at most τ.

Why significance and the tolerance together: a red build must mean "worse by more than
the user cares about, and not by chance". Significance alone would flag changes smaller
than anyone cares about; the tolerance alone would turn noise red. Both conditions at
once keep the false-alarm rate under the null at or below ``(1 - confidence) / 2`` per
look, and "noisy" and "underpowered" say out loud when the data cannot decide (more
repeats are the cure: the plugin runs them, see :mod:`pytest_qwenperf.core.sequential`).

Sessions: repeats of one session share whatever that session's machine was doing, so a baseline
measured in another session can sit away from the run by more than either side's repeats spread
(on a shared 2-vCPU runner, sessions differed by 16-22 % while each one's repeats agreed within
1.5 %). Sessions, not repeats, are then what varies independently, so where each side's sessions
are known (a history reference, a promoted baseline, a directory of files in ``qwenperf compare``,
on either side; a run is one session unless it pooled several), the interval is also the
two-sample t interval on the sessions' mean logs: each side's session means spread about their
own side's mean, pooled into one SD ``s`` with ``k_b + k_c - 2`` degrees of freedom (``k_b`` and
``k_c`` sessions), half-width ``t(k_b + k_c - 2) × s × √(1/k_b + 1/k_c)`` on the log scale; the
wider of that and Welch's is used. Against a run of one session (``k_c = 1``) it is the
prediction interval for a new session's mean from the baseline's session means
(``t(k-1) × s × √(1 + 1/k)``); sessions on the run's side narrow it as the baseline's do (three
against three give about half the MDE of one against three). It needs at least
:data:`MIN_SESSIONS` - 1 degrees of freedom (:func:`sessions_known`: :data:`MIN_SESSIONS`
sessions against one, two against two). With fewer, a run may know how far its runner's sessions
differ from its history (:class:`SessionSpread`, kept in the run's JSON): the interval then uses
that spread and its degrees of freedom with the same ``√(1/k_b + 1/k_c)``, so two single sessions
compared later are judged on the runner's noise. Where neither is known, Welch's interval on the
repeats alone decides, and the detail says how far sessions differ is unknown.

Sample sizes: with one sample on one side (a published figure) its spread is taken to
be the other side's per-sample spread, with that side's degrees of freedom. With one
sample on each side there is no spread to test, and the ratio alone is compared with
the bounds; the MDE is unknown and the detail says so. Samples that include zero (a
hit rate of 0) have no logarithm: the ratio of their means is compared with the bounds
alone.

Metrics whose direction is "none" are never gated. A run is judged whole before any
metric is (:func:`judge_run`):

* **invalid**: the run lost data, so no number of it is a verdict on vLLM: failed
  requests, client and server token totals that disagree, a client that could not keep
  up (``client-bound``: achieved rate below the requested one, or the client's CPU
  saturated), or, per metric, no value where the baseline has one (a null, a NaN, an
  absent field). The short reason is shown with the verdict (``invalid: client-bound``)
  and which side lost the data, when it is the reference run (``qwenperf compare``).
* **not-comparable** (different identity: model, hardware, argv, workload) and
  **no-baseline**: nothing to judge against; never a regression.
* **missing** (``qwenperf compare`` only): the reference has a config × workload the
  candidate file lacks.

One verdict is not on a metric but on what a config answered (:func:`~pytest_qwenperf.core.canary.judge_canary`):

* **changed-output**: the config's answer to the correctness canary (fixed prompts, greedy)
  agrees with the reference answer (the stored one, or the other side of ``qwenperf compare``)
  less than the suite's floor allows: fewer prompts give the same tokens, or their
  log-probabilities drift further. Its output changed, whatever its speed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import ClassVar, Literal

import msgspec

from pytest_qwenperf.core.metrics import Direction
from pytest_qwenperf.core.stats import centre, t_quantile

Verdict = Literal[
    "pass",
    "regression",
    "improvement",
    "noisy",
    "underpowered",
    "not-comparable",
    "no-baseline",
    "missing",
    "invalid",
    "changed-output",
]
UNDECIDED: tuple[Verdict, ...] = ("noisy", "underpowered")
"""Verdicts more repeats can settle: the data point at a regression, or could not have seen one."""
DECIDED: tuple[Verdict, ...] = ("pass", "regression", "improvement")
"""Verdicts that compared the numbers and settled (an early look may stop on them, ``core.sequential``)."""
COMPARED: tuple[Verdict, ...] = (*DECIDED, *UNDECIDED)
"""Verdicts that compared the numbers (not a run, a reference or an identity missing or unfit)."""

DEFAULT_CONFIDENCE = 0.95
MIN_SESSIONS = 3
"""Sessions a baseline needs against a run of one before the spread between session means counts
(two give one degree of freedom, whose t quantile, 12.7 at 95 %, decides nothing). Both sides'
sessions counted, the same ``MIN_SESSIONS - 1`` degrees of freedom are needed (:func:`sessions_known`)."""


@dataclass(frozen=True)
class Judgement:
    """One metric of one run against its baseline."""

    metric: str
    unit: str
    direction: Direction
    baseline: float | None  # centre of the baseline samples
    now: float | None  # centre of the current samples
    ratio: float | None  # now / baseline
    tolerance: float
    verdict: Verdict
    detail: str
    reason: str = ""  # an invalid verdict's short why ("failed-requests", "client-bound (reference)")
    mde: float | None = None  # minimum detectable effect, a fraction of the baseline; None: no spread to know it
    confidence: float = DEFAULT_CONFIDENCE  # of the interval the verdict was decided on
    environment: tuple[str, ...] = ()  # how the run's environment differs from the baseline's where the suite allows it: shown, not judged
    reference: str = ""  # what it was judged against: "stored baseline", "history: 5 runs, ..." ("": nothing)
    between: float | None = None  # how far sessions differ (SD of their means, both sides' pooled or the runner's); None: unknown
    interval: tuple[float, float] | None = None  # the ratio's interval at ``confidence``; None: no spread to build one
    settles_with_repeats: bool = True  # an undecided verdict more repeats of this run could settle (see :func:`judge`)

    HEADER: ClassVar[tuple[str, ...]] = ("metric", "baseline", "now", "ratio", "tolerance", "MDE", "verdict")

    @property
    def label(self) -> str:
        """The verdict as a table shows it: ``regression``, ``invalid: client-bound``."""
        return f"{self.verdict}: {self.reason}" if self.reason else self.verdict

    def row(self) -> tuple[str, ...]:
        """Cells for :data:`HEADER`."""
        return (
            f"{self.metric} ({self.unit})" if self.unit else self.metric,
            format_value(self.baseline),
            format_value(self.now),
            "—" if self.ratio is None else f"{self.ratio:.3f}",
            f"{self.tolerance:.0%}",
            format_mde(self.mde),
            self.label,
        )


def format_value(value: float | None) -> str:
    """A number as a table shows it: ``95,317``, ``46.2``, ``0.965``; ``—`` for none."""
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.4g}"


def format_interval(interval: tuple[float, float] | None) -> str:
    """A ratio's interval as a table shows it: ``0.912–0.971``; ``—`` for none."""
    if interval is None:
        return "—"
    low, high = interval
    return f"{_ratio_text(low)}–{_ratio_text(high)}"


def format_mde(mde: float | None) -> str:
    """An MDE as a table shows it: ``4.3%``, ``>999%`` when the spread decides nothing, ``—`` when unknown."""
    if mde is None:
        return "—"
    return ">999%" if mde > 9.99 else f"{mde:.1%}"


# ------------------------------------------------------------------ one metric


@dataclass(frozen=True)
class _Interval:
    half: float | None  # half-width on the log scale; None: no spread to build an interval from
    how: str  # how it was obtained, for the detail
    between: float | None = None  # how far sessions differ (SD of their means, a fraction); None: unknown
    # Whether more repeats could narrow the half-width below a width (how far sessions differ stays,
    # and the baseline's own spread where it gains no repeat), asked only of an undecided verdict: it
    # may walk t quantiles. Where nothing is known of what stays: yes.
    narrows_below: Callable[[float], bool] = lambda width: True


class SessionSpread(msgspec.Struct, frozen=True, kw_only=True):
    """How far one runner's sessions differ on a metric: the SD of the sessions' mean logs, and how
    many sessions show it (at least :data:`MIN_SESSIONS`). A run carries its history's
    (:attr:`~pytest_qwenperf.core.run.Run.runner_noise`), so that a later comparison of single
    sessions knows what their repeats cannot show."""

    log_sd: float  # natural-log scale
    sessions: int

    @property
    def fraction(self) -> float:
        """The SD as a fraction of the level (``0.10``: sessions differ by about 10 %)."""
        return math.expm1(self.log_sd)


def repeats_mde(repeats: int, spread: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The MDE of a higher-is-better metric measured ``repeats`` times on each side, its repeats
    spreading by ``spread`` (their coefficient of variation) on both: Welch's interval as
    :func:`judge` computes it for equal sides (``2 × repeats - 2`` df), before sessions enter it."""
    if repeats < 2 or not spread >= 0:
        raise ValueError(f"an MDE needs at least 2 repeats and a spread >= 0, got {repeats} and {spread}")
    half = t_quantile(1 - (1 - confidence) / 2, 2 * repeats - 2) * math.log1p(spread) * math.sqrt(2 / repeats)
    return -math.expm1(-half)


def legs_mde(repeats: int, spread: float, session_spread: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The MDE of :func:`repeats_mde`'s repeats measured in two sessions apart (one per side, as two
    legs of a nightly are), where each session's mean is also moved by a drift between sessions that
    spreads by ``session_spread`` (a coefficient of variation): each side's log mean then varies by
    ``ln(1 + spread)² / repeats + ln(1 + session_spread)²``, and no number of repeats takes the second
    term away. One session each cannot measure that drift (it needs :data:`MIN_SESSIONS`), so this is
    what the legs' verdict could honestly see, not what their repeats alone suggest."""
    if repeats < 2 or not spread >= 0 or not session_spread >= 0:
        raise ValueError(f"an MDE needs at least 2 repeats and spreads >= 0, got {repeats}, {spread} and {session_spread}")
    per_side = math.log1p(spread) ** 2 / repeats + math.log1p(session_spread) ** 2
    half = t_quantile(1 - (1 - confidence) / 2, 2 * repeats - 2) * math.sqrt(2 * per_side)
    return -math.expm1(-half)


def sessions_known(baseline: int, current: int) -> bool:
    """Whether ``baseline`` and ``current`` sessions show how far sessions differ: their session means,
    each about its own side's mean, give ``baseline + current - 2`` degrees of freedom, and
    :data:`MIN_SESSIONS` against one is the least that decides."""
    return baseline + current - 2 >= MIN_SESSIONS - 1


def _session_means(samples: Sequence[float], sessions: Sequence[int] | None) -> list[float]:
    """The mean log of each session's samples (``sessions`` as :attr:`Side.sessions`); all samples positive."""
    counts = sessions or (len(samples),)
    if sum(counts) != len(samples) or min(counts) < 1:
        raise ValueError(f"sessions {list(counts)} do not divide the {len(samples)} samples")
    logs = [math.log(s) for s in samples]
    starts = [0, *itertools.accumulate(counts)]
    return [statistics.fmean(logs[a:b]) for a, b in itertools.pairwise(starts)]


def session_spread(samples: Sequence[float], sessions: Sequence[int] | None) -> SessionSpread | None:
    """How far the sessions that measured ``samples`` (``sessions`` as :attr:`Side.sessions`) differ;
    None with fewer than :data:`MIN_SESSIONS` of them or a sample of zero."""
    if not sessions or len(sessions) < MIN_SESSIONS or min(samples) <= 0:
        return None
    means = _session_means(samples, sessions)
    return SessionSpread(log_sd=statistics.stdev(means), sessions=len(means))


def _pooled_sd(sides: Sequence[Sequence[float]]) -> float:
    """The SD of the values of ``sides`` pooled, each side's about its own mean: as many degrees of
    freedom as values less sides (at least one)."""
    squares = math.fsum((x - statistics.fmean(side)) ** 2 for side in sides for x in side)
    return math.sqrt(squares / (sum(map(len, sides)) - len(sides)))


def _log_interval(hearing: Hearing) -> _Interval:
    """The wider of Welch's interval on the repeats and, where it is known how far sessions differ
    (both sides' own sessions, else the runner's), the two-sample interval on session means (see
    the module docstring)."""
    baseline, current, confidence, runner = hearing.baseline, hearing.current, hearing.confidence, hearing.runner
    repeats = _repeats_interval(baseline.samples, current.samples, confidence, hearing.later)
    if min(*baseline.samples, *current.samples) <= 0:
        return repeats
    k_b, k_c = (len(side.sessions) if side.sessions else 1 for side in (baseline, current))
    log_sd: float
    if sessions_known(k_b, k_c):
        means = [_session_means(side.samples, side.sessions) for side in (baseline, current)]
        log_sd, df = _pooled_sd(means), k_b + k_c - 2
        sd = f"{math.expm1(log_sd):.1%}"
        if k_c == 1:
            between = f"a new session predicted from the baseline's {k_b} sessions (SD {sd}), {df} df"
        else:
            between = f"sessions against sessions: the baseline's {k_b} vs the run's {k_c}, pooled SD {sd}, {df} df"
    elif runner is not None:
        log_sd, df = runner.log_sd, runner.sessions - 1
        run = "a new session" if k_c == 1 else f"the run's {k_c} sessions"
        between = (
            f"{run} against the baseline's {k_b}, this runner's sessions differing by SD {runner.fraction:.1%} "
            f"in its history ({runner.sessions} sessions, {df} df)"
        )
    else:
        unknown = "how far sessions differ is unknown (too few sessions, no history of this runner's)"
        return dataclasses.replace(repeats, how=f"{repeats.how}; {unknown}")
    half = t_quantile(1 - (1 - confidence) / 2, df) * log_sd * math.sqrt(1 / k_b + 1 / k_c)
    def narrows_below(width: float) -> bool:
        return half < width and repeats.narrows_below(width)

    if repeats.half is not None and repeats.half >= half:
        return _Interval(repeats.half, f"{repeats.how}; wider than {between}", math.expm1(log_sd), narrows_below)
    return _Interval(half, f"{between}; wider than the repeats alone", math.expm1(log_sd), narrows_below)


def _repeats_interval(baseline: Sequence[float], current: Sequence[float], confidence: float, later: Later | None) -> _Interval:
    if min(*baseline, *current) <= 0:
        return _Interval(None, "samples include zero, so no log-scale interval: decided on the ratio alone")
    n_b, n_c = len(baseline), len(current)
    if n_b == 1 and n_c == 1:
        return _Interval(None, "one sample on each side, no spread to test: decided on the tolerance alone")
    log_b = [math.log(s) for s in baseline]
    log_c = [math.log(s) for s in current]
    df: float
    if n_b == 1 or n_c == 1:
        other = log_c if n_b == 1 else log_b
        se = math.sqrt(statistics.variance(other) * (1 / n_b + 1 / n_c))
        df = len(other) - 1
        lonely = "baseline" if n_b == 1 else "current run"
        how = f"the {lonely} has one sample; its spread is taken from the other side's"
    else:
        v_b, v_c = statistics.variance(log_b) / n_b, statistics.variance(log_c) / n_c
        se = math.sqrt(v_b + v_c)
        df = (v_b + v_c) ** 2 / (v_b**2 / (n_b - 1) + v_c**2 / (n_c - 1)) if se > 0 else 0
        how = f"Welch on log values, {n_b} vs {n_c} samples"
    if se == 0:
        return _Interval(0.0, f"{n_b} vs {n_c} samples without spread", narrows_below=lambda width: width > 0)
    half = t_quantile(1 - (1 - confidence) / 2, df) * se
    return _Interval(half, f"{how}, {df:.1f} df", narrows_below=lambda width: _narrows_below(log_b, log_c, width, confidence, later))


_MORE_REPEATS = 16
"""How many more repeats of the run :func:`_narrows_below` looks ahead where no plan says (a plan allows a few)."""


@dataclass(frozen=True)
class Later:
    """What a sequential plan still allows after this look: ``repeats`` more (one a look), and whether
    the reference gains one a look too (side by side, repeats alternating; else it is an earlier
    measurement and keeps its samples)."""

    repeats: int
    both: bool = False


def _narrows_below(log_b: Sequence[float], log_c: Sequence[float], width: float, confidence: float, later: Later | None) -> bool:
    """Whether the repeats still allowed (``later``; None: up to :data:`_MORE_REPEATS` of the run
    alone) could narrow the interval's half-width below ``width`` at this look's confidence, each
    side's spread staying as it is. Later looks are judged more strictly, so this is the lenient
    side: a point it turns away could not settle; one it lets through may still end undecided.

    A reference that keeps its samples keeps its spread: as the run's repeats grow, their share of
    Welch's standard error vanishes and the Welch-Satterthwaite degrees of freedom fall to the
    reference's ``n_b - 1``, so the half-width tends to t at ``n_b - 1`` df times the reference's
    standard error (4.3 times it at 95 % with 3 repeats, not the normal 1.96); on the way the df can
    be larger and the half-width a little narrower, so the repeats are walked until it widens again."""
    more, both = (later.repeats, later.both) if later is not None else (_MORE_REPEATS, False)
    before = math.inf
    for k in range(1, more + 1):
        half = _half_after(log_b, log_c, (k if both else 0, k), confidence)
        if half < width:
            return True
        if half > before and not both:
            break
        before = half
    return False


def _half_after(log_b: Sequence[float], log_c: Sequence[float], more: tuple[int, int], confidence: float) -> float:
    """The half-width of the repeats' interval once the reference has ``more[0]`` and the run ``more[1]``
    more samples, each side's spread as it is (a side of one sample takes the other's)."""
    n_b, n_c = len(log_b) + more[0], len(log_c) + more[1]
    s2_c = statistics.variance(log_c) if len(log_c) > 1 else statistics.variance(log_b)
    s2_b = statistics.variance(log_b) if len(log_b) > 1 else s2_c
    p = 1 - (1 - confidence) / 2
    if n_b == 1:  # the reference's one sample, its spread taken from the run's
        return t_quantile(p, n_c - 1) * math.sqrt(s2_c * (1 + 1 / n_c))
    v_b, v_c = s2_b / n_b, s2_c / n_c
    if v_b + v_c == 0:
        return 0.0
    df = (v_b + v_c) ** 2 / (v_b**2 / (n_b - 1) + v_c**2 / (n_c - 1))
    return t_quantile(p, round(df, 1)) * math.sqrt(v_b + v_c)  # a forecast: df to a tenth, so t_quantile's cache answers


def _exp(x: float) -> float:
    """exp without overflow: a spread of hundreds of e-folds decides nothing either way."""
    return math.exp(max(-700.0, min(700.0, x)))


def _ratio_text(x: float) -> str:
    return f"{x:.3f}" if 1e-3 <= x < 1e3 else f"{x:.3g}"


def _check(metric: str, samples: Sequence[float], side: str) -> None:
    if not samples:
        raise ValueError(f"{metric}: no {side} samples")
    if not all(math.isfinite(s) and s >= 0 for s in samples):
        raise ValueError(f"{metric}: {side} samples must be finite and non-negative, got {list(samples)}")


@dataclass(frozen=True)
class Side:
    """One side of a :class:`Hearing`, the baseline's or the run's: a metric's samples and the sessions
    that measured them."""

    samples: tuple[float, ...]  # one value per repeat, finite and non-negative
    sessions: tuple[int, ...] | None = None  # how many of ``samples`` each session measured, in order; None: one session


@dataclass(frozen=True)
class Hearing:
    """What :func:`judge` decides on: one metric, its two sides, and the rule's settings. The samples
    and the settings are checked here, so a hearing that exists can be judged."""

    metric: str
    baseline: Side
    current: Side
    _: KW_ONLY
    direction: Direction
    tolerance: float  # the fraction of the baseline a run may be worse by, in [0, 1)
    unit: str = ""
    confidence: float = DEFAULT_CONFIDENCE  # of the interval, in (0, 1)
    runner: SessionSpread | None = None  # how far this runner's sessions differ (its history), for sides of too few sessions
    later: Later | None = None  # a sequential plan's looks after this one, for whether more repeats could settle it; None: not known

    def __post_init__(self) -> None:
        _check(self.metric, self.baseline.samples, "baseline")
        _check(self.metric, self.current.samples, "current")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"{self.metric}: tolerance must be a fraction in [0, 1), got {self.tolerance}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"{self.metric}: confidence must be in (0, 1), got {self.confidence}")


def _settles(interval: _Interval, bound: float, change: float) -> bool:
    """Whether the repeats still to come could settle an undecided verdict: narrow its interval below
    the change it would have to confirm (or below the tolerance ``bound``, for a pass; both on the log
    scale). They never narrow how far sessions differ, nor the spread of a baseline measured earlier."""
    return interval.narrows_below(max(bound, abs(change)))


def judge(hearing: Hearing) -> Judgement:
    """The verdict on one metric (the rule is in the module docstring)."""
    metric, direction, tolerance = hearing.metric, hearing.direction, hearing.tolerance
    unit, confidence = hearing.unit, hearing.confidence
    base, now = centre(hearing.baseline.samples), centre(hearing.current.samples)

    between: float | None = None
    bounds: tuple[float, float] | None = None
    interval: _Interval | None = None
    bound = change = 0.0

    def verdict(result: Verdict, detail: str, ratio: float | None, mde: float | None = None) -> Judgement:
        settles = result not in UNDECIDED or interval is None or _settles(interval, bound, change)
        return Judgement(
            metric, unit, direction, base, now, ratio, tolerance, result, detail, mde=mde, confidence=confidence,
            between=between, interval=bounds, settles_with_repeats=settles,
        )

    if base == 0:
        if now == 0:
            return verdict("pass", "zero before and now", None)
        return verdict("not-comparable", "the baseline is zero: no ratio to judge", None)
    ratio = now / base
    if direction == "none":
        return verdict("pass", "not gated: neither direction is better", ratio)
    interval = _log_interval(hearing)
    between = interval.between
    sign = 1 if direction == "higher" else -1  # log ratio times sign: positive is better
    change = sign * (math.log(ratio) if ratio > 0 else -math.inf)
    bound = -math.log1p(-tolerance) if direction == "higher" else math.log1p(tolerance)  # tolerance, log scale
    if interval.half is None:
        mde = None
        significant = True  # no spread to test: the tolerance alone decides
        spread = interval.how
    else:
        bounds = (_exp(math.log(ratio) - interval.half), _exp(math.log(ratio) + interval.half))
        mde = (1 - _exp(-interval.half)) if direction == "higher" else (_exp(interval.half) - 1)
        significant = abs(change) > interval.half
        spread = f"{confidence:.0%} interval {format_interval(bounds)} ({interval.how}), MDE {format_mde(mde)}"
    known = "" if mde is None else ", and significant"
    text = f"{ratio - 1:+.1%} ({direction} is better, tolerance {tolerance:.0%}); {spread}"
    if change < -bound:
        if significant:
            return verdict("regression", f"worse than the tolerance{known}: {text}", ratio, mde)
        return verdict("noisy", f"worse than the tolerance, but the noise cannot confirm it: {text}", ratio, mde)
    if change > bound and significant:
        return verdict("improvement", f"better than the tolerance{known}: {text}", ratio, mde)
    if mde is not None and mde > tolerance:
        detail = f"the run could not have seen a change of the tolerance's size (MDE {format_mde(mde)} > {tolerance:.0%}): {text}"
        return verdict("underpowered", detail, ratio, mde)
    return verdict("pass", f"within tolerance: {text}", ratio, mde)

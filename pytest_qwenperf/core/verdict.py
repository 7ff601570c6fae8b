"""Verdicts: is a metric of a run worse than its baseline, honestly?

The rule, per metric with a better direction and a tolerance τ (the fraction of the
baseline a run may be worse by):

* The bounds are ``1 - τ`` and ``1 + τ`` on the ratio now / baseline; for a
  higher-is-better metric the lower bound is the *worse* one, for lower-is-better the
  upper bound.
* An interval for that ratio comes from the run-to-run spread: Welch's t interval on
  the log of the samples (confidence 95 % by default), so it is an interval for the
  ratio of geometric means. Logs, because performance noise is multiplicative and a
  ratio's interval must be the same whichever side is called the baseline.
* **regression**: the point estimate (the ratio of the centres) and the whole interval
  lie beyond the worse bound; **noisy**: the point estimate lies beyond the worse bound
  but the interval reaches back inside it, so it looks like a regression the noise cannot
  confirm; **improvement**: the whole interval lies beyond the better bound; **pass**
  otherwise: a point estimate within the tolerance passes however wide its interval
  (the detail states the interval), and so does one beyond the better bound that the
  noise cannot confirm.

Why the whole interval for a regression: a red build must mean "worse than the
tolerance, and not by chance". Requiring only the point estimate beyond the tolerance
would turn a true change right at the tolerance red half of the nights; requiring only
significance would flag changes smaller than anyone cares about. Asking the interval to
clear the bound asks for both at once, and "noisy" says out loud when the data point at
a regression but cannot decide (more rounds, or pinning the client and the server apart,
are the cure). Why the point estimate for "noisy": the same samples on both sides, or a
repeat of the same build, have a ratio near 1; however wide their spread, nothing points
at a regression, so they pass (a wide interval means the run could not have seen a small
change: that is what the interval in the detail says).

Sample sizes: with one sample on one side (a published figure) its spread is taken to
be the other side's per-sample spread, with that side's degrees of freedom. With one
sample on each side there is no spread to test, and the ratio alone is compared with
the bounds; the detail says so. Samples that include zero (a hit rate of 0) have no
logarithm: the ratio of their means is compared with the bounds alone.

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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from pytest_qwenperf.core.metrics import Direction
from pytest_qwenperf.core.stats import centre, t_quantile

Verdict = Literal["pass", "regression", "improvement", "noisy", "not-comparable", "no-baseline", "missing", "invalid"]

DEFAULT_CONFIDENCE = 0.95


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
    reason: str = ""  # an invalid verdict's short why ("failed requests", "client-bound (reference)")

    HEADER: ClassVar[tuple[str, ...]] = ("metric", "baseline", "now", "ratio", "tolerance", "verdict")

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


# ------------------------------------------------------------------ one metric


@dataclass(frozen=True)
class _Interval:
    low: float
    high: float
    how: str  # how it was obtained, for the detail


def _ratio_interval(baseline: Sequence[float], current: Sequence[float], ratio: float, confidence: float) -> _Interval:
    if min(*baseline, *current) <= 0:
        return _Interval(ratio, ratio, "samples include zero, so no log-scale interval: decided on the ratio alone")
    n_b, n_c = len(baseline), len(current)
    if n_b == 1 and n_c == 1:
        return _Interval(ratio, ratio, "one sample on each side, no spread to test: decided on the tolerance alone")
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
        return _Interval(ratio, ratio, f"{n_b} vs {n_c} samples without spread: decided on the ratio alone")
    half = t_quantile(1 - (1 - confidence) / 2, df) * se
    low, high = _exp(math.log(ratio) - half), _exp(math.log(ratio) + half)
    return _Interval(low, high, f"{confidence:.0%} interval {_ratio_text(low)}–{_ratio_text(high)} ({how}, {df:.1f} df)")


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


def judge(
    metric: str,
    baseline_samples: Sequence[float],
    current_samples: Sequence[float],
    *,
    direction: Direction,
    tolerance: float,
    unit: str = "",
    confidence: float = DEFAULT_CONFIDENCE,
) -> Judgement:
    """The verdict on one metric (the rule is in the module docstring)."""
    _check(metric, baseline_samples, "baseline")
    _check(metric, current_samples, "current")
    if not 0 <= tolerance < 1:
        raise ValueError(f"{metric}: tolerance must be a fraction in [0, 1), got {tolerance}")
    if not 0 < confidence < 1:
        raise ValueError(f"{metric}: confidence must be in (0, 1), got {confidence}")
    base, now = centre(baseline_samples), centre(current_samples)

    def verdict(result: Verdict, detail: str, ratio: float | None) -> Judgement:
        return Judgement(metric, unit, direction, base, now, ratio, tolerance, result, detail)

    if base == 0:
        if now == 0:
            return verdict("pass", "zero before and now", None)
        return verdict("not-comparable", "the baseline is zero: no ratio to judge", None)
    ratio = now / base
    if direction == "none":
        return verdict("pass", "not gated: neither direction is better", ratio)
    interval = _ratio_interval(baseline_samples, current_samples, ratio, confidence)
    worse_bound = 1 - tolerance if direction == "higher" else 1 + tolerance
    better_bound = 1 + tolerance if direction == "higher" else 1 - tolerance

    def worse(x: float) -> bool:
        return x < worse_bound if direction == "higher" else x > worse_bound

    def better(x: float) -> bool:
        return x > better_bound if direction == "higher" else x < better_bound

    change = f"{ratio - 1:+.1%} ({direction} is better, tolerance {tolerance:.0%}); {interval.how}"
    if worse(ratio):
        if worse(interval.low) and worse(interval.high):
            return verdict("regression", f"worse than the tolerance: {change}", ratio)
        detail = f"worse than the tolerance bound {worse_bound:.3f}, but the interval reaches back inside it: {change}"
        return verdict("noisy", detail, ratio)
    if better(interval.low) and better(interval.high):
        return verdict("improvement", f"better than the tolerance: {change}", ratio)
    if better(ratio):
        detail = f"better than the tolerance bound {better_bound:.3f}, but the interval reaches back inside it: {change}"
        return verdict("pass", detail, ratio)
    return verdict("pass", f"within tolerance: {change}", ratio)

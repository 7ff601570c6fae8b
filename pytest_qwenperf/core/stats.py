"""Statistics every layer shares: a metric's centre, Student's t quantiles, percentiles."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def centre(samples: Sequence[float]) -> float:
    """The centre of a metric's samples: geometric mean when all are positive, else the mean.

    Geometric, because verdicts judge ratios on a log scale: the ratio of two centres is
    then exactly the ratio the verdict's interval is centred on.
    """
    if not samples:
        raise ValueError("no samples")
    if min(samples) == max(samples):
        return float(samples[0])  # exactly, not through exp(log(x))
    if all(s > 0 for s in samples):
        return math.exp(math.fsum(math.log(s) for s in samples) / len(samples))
    return math.fsum(samples) / len(samples)


def centre_interval(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student's t interval of :func:`centre` at ``confidence``, on log values where the centre is
    geometric (as the verdicts build theirs); a lone sample, or samples all alike, is its own interval."""
    n = len(samples)
    if n < 2 or min(samples) == max(samples):
        value = centre(samples)
        return value, value
    positive = all(s > 0 for s in samples)
    values = [math.log(s) for s in samples] if positive else list(samples)
    mean = statistics.fmean(values)
    half = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    low, high = mean - half, mean + half
    return (math.exp(low), math.exp(high)) if positive else (low, high)




def _incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below the mean
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(1000):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-15:
            break
    return front * (f - 1.0)


def _t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    return 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (p >= 0.5) of Student's t with ``df`` (real, > 0) degrees of freedom."""
    if not 0.5 <= p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    tail = 1 - p
    lo, hi = 0.0, 1.0
    while _t_tail(hi, df) > tail:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_tail(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2



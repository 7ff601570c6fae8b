"""Statistics every layer shares: a metric's centre, Student's t quantiles, percentiles."""

from __future__ import annotations

import functools
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


def _t_density(t: float, df: float) -> float:
    """The density of Student's t with ``df`` degrees of freedom at ``t``."""
    log = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log - (df + 1) / 2 * math.log1p(t * t / df))


@functools.lru_cache(maxsize=4096)  # a session asks the same few (p, df) for every metric of every look
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (p >= 0.5) of Student's t with ``df`` (real, > 0) degrees of freedom: Newton's
    steps on the tail from below the quantile, where the tail's convexity (its density falls on
    t > 0) keeps every step below it; the start is the Cornish-Fisher expansion, halved until it lies below."""
    if not 0.5 <= p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    tail = 1 - p
    z = statistics.NormalDist().inv_cdf(p)
    t = z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    while _t_tail(t, df) < tail:
        t /= 2
    for _ in range(500):
        step = (_t_tail(t, df) - tail) / _t_density(t, df)  # the tail falls by the density
        t += step
        if abs(step) <= 1e-14 * t:
            break
    return t



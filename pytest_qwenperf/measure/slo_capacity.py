"""Capacity at a service level: the highest load a server carries while every latency term of an
SLO holds, found with as few probes as the resolution asks for.

The search, given a way to measure one load (a *probe*: a concurrency or a request rate):

1. **Bracket.** Probe the start load, then double it while the SLO holds (up to the plan's
   highest load), or halve it while it does not (down to the lowest): one load that meets the
   SLO below one that does not. Whenever the fit of the probes so far (step 3) has no such pair,
   the search brackets again from the highest or lowest load probed.
2. **Bisect** the bracket at its geometric middle (integer loads for concurrency) until the
   failing load is within the plan's resolution of the meeting one, then probe both ends of that
   bracket again (:data:`~pytest_qwenperf.core.capacity.CONFIRMATIONS`), resuming the bisection wherever the pooled probes move
   it (and the bracketing, where a failing load that meets the SLO when probed again moves it
   past every load probed), until it holds or the probe budget is spent. Each step bisects the bracket that the
   monotone fit of every probe so far gives, not the last two probes, so one noisy probe does not
   send the search the wrong way.
3. **Fit.** Every probe's worst SLO term, as the log of its ratio to its target, is fitted by
   a non-decreasing function of load (isotonic regression, pool-adjacent-violators:
   ``scipy.optimize.isotonic_regression``). The capacity is where the fit crosses the target,
   linear in log load between the two fitted points around it.

A search given a *seed*, the bracket a search of the same point settled before (a point's repeats
after its first: :func:`seed_of`), probes both its ends first instead of the start load, and goes on
from there by the same steps: where the bracket holds again, confirming its ends is all that is left
(:data:`~pytest_qwenperf.core.capacity.SEEDED_PROBES` in all, where a search from the start load took
6-7 on the CPU suite); where it does not, the search brackets again from it. The answer still rests on
this search's probes alone: the seed moves where it looks first, not what it finds, so repeats stay as
far apart as their probes' noise puts them.

Why a monotone fit and bisection rather than a smooth curve (AIPerf's PCHIP on pooled probes) or
an even scan (``vllm bench sweep serve_workload``): latency only grows with load, so a probe
that breaks that order is noise, and pooling adjacent violators is the least-squares answer that
respects it, without a shape that a few probes cannot support; bisection spends the probes near
the knee, where the answer is decided, instead of evenly across loads that are clearly fine or
clearly saturated.

The result says which SLO term binds at the capacity, whether the boundary is a *cliff* (the
worst term jumps from within half its target to beyond twice it between two adjacent probes:
the server falls over rather than slowing down), and an interval: the wider of the search's
bracket around the crossing and a parametric bootstrap of the fit, each probe given the noise
that the bracket's repeated probes show (a fixed seed, so one set of probes always gives one
answer). It is the search's own uncertainty; how far whole searches differ is what repeats of
the search show, and what a verdict on the capacity judges. A probe stopped early because the server was over-saturated
(:func:`oversaturated`) counts as failing its SLO, whatever its latencies so far.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pytest_qwenperf.core.capacity import CONFIRMATIONS, Search, SearchPlan, Slo
from pytest_qwenperf.core.stats import t_quantile

Bound = Literal["found", "below-lowest", "above-highest", "below-probed", "above-probed"]
"""Where the capacity lies: between two probed loads; beyond the plan's lowest or highest load,
probed; or beyond the lowest or highest load probed, where the probe budget ran out before the
search reached the plan's edge (how far beyond, the search cannot say)."""

CLIFF = 2.0
"""A boundary is a cliff where the worst term goes from within 1/CLIFF of its target to beyond CLIFF times it."""
BOOTSTRAP = 400
"""Resamples of the fit's residuals for the interval."""


@dataclass(frozen=True)
class Probe:
    """One load, measured: its latencies (the SLO's metrics), its output tok/s, and why it was
    stopped early, if it was (an over-saturated server: it fails the SLO whatever its latencies)."""

    load: float
    latencies: Mapping[str, float]
    output_throughput: float
    stopped: str | None = None

    def worst(self, slo: Slo) -> tuple[str, float]:
        """The SLO term furthest from its target and its ratio; a stopped probe's is infinite."""
        ratios = slo.ratios(self.latencies)
        name = max(ratios, key=lambda n: ratios[n])
        return name, math.inf if self.stopped else ratios[name]

    def meets(self, slo: Slo) -> bool:
        return self.worst(slo)[1] <= 1.0


@dataclass(frozen=True)
class Capacity:
    """The highest load meeting the SLO on the monotone fit of the probes, and what it rests on."""

    search: Search
    load: float | None  # None: no load probed met the SLO (bound: below-lowest or below-probed)
    interval: tuple[float, float] | None
    output_throughput: float | None  # at the capacity, interpolated between the probes around it
    binding: str | None  # the SLO term that fails first above the capacity
    cliff: bool
    bound: Bound
    probes: tuple[Probe, ...]  # in the order run


def find_capacity(
    probe: Callable[[float], Probe], slo: Slo, plan: SearchPlan, seed: tuple[float, float] | None = None
) -> Capacity:
    """Bracket, bisect and fit (see the module docstring); ``probe`` measures one load, ``seed`` is
    the bracket to probe first (None: the plan's start load)."""
    first = (plan.start,) if seed is None else seed
    probes = [probe(load) for load in dict.fromkeys(plan.load(load) for load in first)]  # max_probes >= 2
    while len(probes) < plan.max_probes:
        fit = _fit(probes, slo)
        bracket = _bracket(fit)
        if bracket is None:  # on the fit every load probed meets the SLO, or none does: double or halve from the edge
            step = plan.load(float(fit.loads[-1]) * 2 if fit.fitted[-1] <= 0 else float(fit.loads[0]) / 2)
            if _known(probes, step):  # the plan's highest or lowest load, probed already
                break
            probes.append(probe(step))
            continue
        middle = plan.load(math.sqrt(bracket[0] * bracket[1]))
        if not plan.settled(*bracket) and not _known(probes, middle):
            probes.append(probe(middle))
            continue
        unconfirmed = [load for load in bracket if sum(p.load == load for p in probes) < CONFIRMATIONS]
        if not unconfirmed:
            break
        probes.append(probe(unconfirmed[0]))
    return _capacity(probes, slo, plan)


def seed_of(probes: Sequence[Probe], slo: Slo) -> tuple[float, float] | None:
    """The bracket ``probes`` settled (the highest load meeting the SLO on their fit and the next one
    probed above it), where a later search of the same point starts; None without both."""
    return _bracket(_fit(probes, slo)) if probes else None


def _known(probes: Sequence[Probe], load: float) -> bool:
    return any(p.load == load for p in probes)


def _by_load(probes: Sequence[Probe], value: Callable[[Probe], float]) -> dict[float, list[float]]:
    """``value`` of each probe, grouped by its load (loads probed again have several)."""
    found: dict[float, list[float]] = {}
    for p in probes:
        found.setdefault(p.load, []).append(value(p))
    return found


@dataclass(frozen=True)
class _Fit:
    """Distinct loads (ascending), how many probes each had, and the non-decreasing fit of their mean log worst ratio."""

    loads: np.ndarray
    counts: np.ndarray
    fitted: np.ndarray


def _fit(probes: Sequence[Probe], slo: Slo) -> _Fit:
    """The monotone fit of every probe (isotonic regression, each load weighted by its probes)."""
    # Imported here: a process importing scipy.optimize took 0.31-0.33 s (numpy alone 0.07 s), and only a search needs it.
    from scipy.optimize import isotonic_regression

    by_load = _by_load(probes, lambda p: _log_ratio(p.worst(slo)[1]))
    loads = np.array(sorted(by_load))
    values = np.array([statistics.fmean(by_load[x]) for x in loads])
    counts = np.array([len(by_load[x]) for x in loads], dtype=float)
    return _Fit(loads, counts, np.asarray(isotonic_regression(values, weights=counts, increasing=True).x))


def _log_ratio(ratio: float) -> float:
    """log of a worst ratio, a stopped probe's infinity held at a large finite value for the fit."""
    return math.log(min(max(ratio, 1e-9), 1e6))


def _crossing(loads: np.ndarray, fitted: np.ndarray) -> tuple[float | None, Bound]:
    """Where a non-decreasing fit of log ratios crosses 0, linear in log load."""
    if fitted[0] > 0:
        return None, "below-lowest"
    if fitted[-1] <= 0:
        return float(loads[-1]), "above-highest"
    above = int(np.argmax(fitted > 0))
    low, high = above - 1, above
    y0, y1 = float(fitted[low]), float(fitted[high])
    x0, x1 = math.log(loads[low]), math.log(loads[high])
    share = (0 - y0) / (y1 - y0) if y1 > y0 else 0.0
    return math.exp(x0 + share * (x1 - x0)), "found"


def _reached(bound: Bound, probes: Sequence[Probe], plan: SearchPlan) -> Bound:
    """``bound`` at the plan's edge only where that edge was probed: a search whose probes ran out
    on the way down (or up) says so, not that even the plan's lowest load failed."""
    if bound == "below-lowest" and not _known(probes, plan.load(plan.lowest)):
        return "below-probed"
    if bound == "above-highest" and not _known(probes, plan.load(plan.highest)):
        return "above-probed"
    return bound


def _bracket(fit: _Fit) -> tuple[float, float] | None:
    """The highest load meeting the SLO on the fit and the next load above it; None without both."""
    meeting = [float(x) for x, y in zip(fit.loads, fit.fitted, strict=True) if y <= 0]
    failing = [float(x) for x, y in zip(fit.loads, fit.fitted, strict=True) if y > 0]
    if not meeting or not failing:
        return None
    return meeting[-1], min(x for x in failing if x > meeting[-1])


def _capacity(probes: Sequence[Probe], slo: Slo, plan: SearchPlan) -> Capacity:
    fit = _fit(probes, slo)
    load, crossing = _crossing(fit.loads, fit.fitted)
    bound = _reached(crossing, probes, plan)
    if load is None:
        return Capacity(plan.search, None, None, None, _binding(probes, slo, 0.0), False, bound, tuple(probes))
    bracket = _bracket(fit)
    low, high = bracket if bracket else (load, load)
    resampled = _bootstrap(fit, _noise(probes, slo))
    if resampled:
        low, high = min(low, resampled[0]), max(high, resampled[1])
    cliff = False
    if bracket:
        below = [p.worst(slo)[1] for p in probes if p.load == bracket[0]]
        above = [p.worst(slo)[1] for p in probes if p.load == bracket[1]]
        cliff = max(below) <= 1 / CLIFF and min(above) >= CLIFF
    return Capacity(
        plan.search, load, (low, high), _throughput_at(probes, load), _binding(probes, slo, load), cliff, bound, tuple(probes)
    )


def _noise(probes: Sequence[Probe], slo: Slo) -> float | None:
    """The SD of a probe's log worst ratio, pooled over loads probed more than once (the bracket's
    confirmations); None where no load was, or a repeated load was stopped (no finite ratio)."""
    repeated = [ratios for ratios in _by_load(probes, lambda p: p.worst(slo)[1]).values() if len(ratios) > 1]
    if not repeated or any(not math.isfinite(r) for ratios in repeated for r in ratios):
        return None
    logs = [[math.log(r) for r in ratios] for ratios in repeated]
    df = sum(len(group) - 1 for group in logs)
    return math.sqrt(sum(statistics.variance(group) * (len(group) - 1) for group in logs) / df)


def _bootstrap(fit: _Fit, noise: float | None) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of the crossing over refits of the fit plus, at every
    probe, a normal error of SD ``noise`` (what the repeated loads show: :func:`_noise`); None without one."""
    from scipy.optimize import isotonic_regression

    if noise is None or noise == 0:
        return None
    spreads = noise / np.sqrt(fit.counts)
    rng = np.random.default_rng(0)
    found = []
    for _ in range(BOOTSTRAP):
        means = fit.fitted + rng.normal(0.0, spreads)
        crossing, _ = _crossing(fit.loads, np.asarray(isotonic_regression(means, weights=fit.counts, increasing=True).x))
        found.append(float(fit.loads[0]) if crossing is None else crossing)
    cuts = statistics.quantiles(found, n=40)
    return cuts[0], cuts[-1]


def _binding(probes: Sequence[Probe], slo: Slo, load: float) -> str | None:
    """The SLO term furthest from its target at the first probe above ``load`` that misses it."""
    above = sorted((p for p in probes if p.load > load and not p.meets(slo)), key=lambda p: p.load)
    if not above:
        return None
    ratios = slo.ratios(above[0].latencies)
    return max(ratios, key=lambda n: ratios[n])


def _throughput_at(probes: Sequence[Probe], load: float) -> float | None:
    """Output tok/s at ``load``, linear in log load between the probes around it (their mean where repeated)."""
    by_load = _by_load([p for p in probes if not p.stopped], lambda p: p.output_throughput)
    if not by_load:
        return None
    xs = sorted(by_load)
    ys = [statistics.fmean(by_load[x]) for x in xs]
    return float(np.interp(math.log(load), [math.log(x) for x in xs], ys))


# ------------------------------------------------------------------ over-saturation


@dataclass(frozen=True)
class ProbeWindow:
    """What a running probe has seen so far: per finished request its send time and TTFT (seconds
    from the probe's start), the requests in flight sampled over time, and, for a rate search, the
    rate asked for and the rate sent."""

    sent: Sequence[float]
    ttft: Sequence[float]
    in_flight: Sequence[tuple[float, float]]  # (time, requests in flight)
    requested_rate: float | None = None
    achieved_rate: float | None = None


MIN_POINTS = 20
"""Finished requests (and in-flight samples) a slope needs before it can stop a probe."""
RATE_SHORTFALL = 0.10
"""A rate probe whose achieved rate is more than this fraction below the requested one is over-saturated."""
MATERIAL_RISE = 2.0
"""The rising TTFT that stops a probe must have grown this many times over it, on its fitted line:
a slope can be significant and tiny (0.2 ms/s on 15 ms in a real probe far inside its capacity)."""


def oversaturated(window: ProbeWindow, ttft_limit_s: float | None = None, confidence: float = 0.95) -> str | None:
    """Why a probe should stop now, or None: the rate sent fell behind the rate asked for, or both
    the requests in flight and the TTFT of requests as they are sent keep rising (each slope
    positive beyond its one-sided ``confidence`` bound: GuideLLM's rule) and the rise is material:
    the TTFT at the latest send, on its fitted line, is :data:`MATERIAL_RISE` times that at the
    first and, where the SLO limits TTFT (``ttft_limit_s``), beyond that limit, so the probe would
    fail anyway. A server that keeps up holds both flat; one past its capacity queues, so both grow
    for as long as the probe lasts. (GuideLLM likewise counts only TTFTs above 2.5 s.)"""
    if window.requested_rate and window.achieved_rate is not None:
        short = 1 - window.achieved_rate / window.requested_rate
        if short > RATE_SHORTFALL:
            return f"over-saturated: sent {window.achieved_rate:.3g} requests/s of {window.requested_rate:.3g} asked ({short:.0%} behind)"
    if len(window.sent) < MIN_POINTS or len(window.in_flight) < MIN_POINTS:
        return None
    ttft = _rising(list(window.sent), list(window.ttft), confidence)
    queue = _rising([t for t, _ in window.in_flight], [n for _, n in window.in_flight], confidence)
    if ttft is None or queue is None:
        return None
    first, last = (ttft.intercept + ttft.slope * t for t in (window.sent[0], window.sent[-1]))
    if last < MATERIAL_RISE * max(first, 0.0) or (ttft_limit_s is not None and last <= ttft_limit_s):
        return None
    return (
        f"over-saturated: TTFT rising {ttft.slope * 1000:.3g} ms/s (to {last * 1000:.4g} ms from {max(first, 0.0) * 1000:.4g} ms) "
        f"and requests in flight rising {queue.slope:.3g}/s"
    )


def _rising(xs: list[float], ys: list[float], confidence: float) -> statistics.LinearRegression | None:
    """The least-squares fit of ``ys`` on ``xs`` when its slope is positive beyond its one-sided bound; else None."""
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return None
    fit = statistics.linear_regression(xs, ys)
    residual = [y - (fit.slope * x + fit.intercept) for x, y in zip(xs, ys, strict=True)]
    spread = sum(r * r for r in residual) / (n - 2)
    mean = statistics.fmean(xs)
    sxx = sum((x - mean) ** 2 for x in xs)
    se = math.sqrt(spread / sxx) if sxx > 0 else math.inf
    return fit if fit.slope - t_quantile(confidence, n - 2) * se > 0 else None

"""What a capacity search is asked for, as data a suite file states: the latency targets a load
must meet (:class:`Slo`) and how to search for the highest load that meets them
(:class:`SearchPlan`). The search itself is :mod:`pytest_qwenperf.measure.slo_capacity`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Search = Literal["concurrency", "rate"]

CONFIRMATIONS = 2
"""Probes of each load of a search's settled bracket (``measure.slo_capacity``): a noisy probe that put
the knee on the wrong side is measured again, the fit pools the two, and the bisection resumes where
the pooled level says."""
SEEDED_PROBES = 2 * CONFIRMATIONS
"""Probes of a search started at the bracket its point's search before settled (a repeat after the
first) where it holds there: each end of it :data:`CONFIRMATIONS` times, no bracketing, no bisection."""


@dataclass(frozen=True)
class Slo:
    """Latency targets a load must meet: a metric (``p99_ttft_ms``, ``p99_tpot_ms``,
    ``p99_e2el_ms``) and the most it may be, in its unit."""

    targets: Mapping[str, float]

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("an SLO needs at least one target")
        bad = {name: value for name, value in self.targets.items() if not (math.isfinite(value) and value > 0)}
        if bad:
            raise ValueError(f"SLO targets must be positive numbers, got {bad}")

    def ratios(self, latencies: Mapping[str, float]) -> dict[str, float]:
        """Each term's measured value over its target (above 1: missed); a term not measured is missed by infinity."""
        return {name: latencies.get(name, math.inf) / target for name, target in self.targets.items()}


@dataclass(frozen=True)
class SearchPlan:
    """How to search: over concurrency (integer loads) or request rate, from ``start`` within
    [``lowest``, ``highest``], until the bracket is within ``resolution`` (a fraction of the
    load) or ``max_probes`` are spent."""

    search: Search
    start: float
    lowest: float
    highest: float
    resolution: float = 0.10
    max_probes: int = 12

    def __post_init__(self) -> None:
        if not 0 < self.lowest <= self.start <= self.highest:
            raise ValueError(f"expected 0 < lowest <= start <= highest, got {self.lowest}, {self.start}, {self.highest}")
        if not 0 < self.resolution < 1:
            raise ValueError(f"resolution must be a fraction in (0, 1), got {self.resolution}")
        if self.max_probes < 2:
            raise ValueError(f"max_probes must be at least 2, got {self.max_probes}")

    def load(self, value: float) -> float:
        """``value`` as a load this search can probe: within bounds, a whole number for concurrency.

        Always a built-in float, never a numpy scalar: a load becomes an arrival's rate or concurrency,
        which accept only Python numbers."""
        value = min(max(float(value), self.lowest), self.highest)
        return float(max(1, round(value))) if self.search == "concurrency" else value

    def settled(self, meeting: float, failing: float) -> bool:
        """Whether a bracket is as tight as asked: within the resolution, or adjacent concurrencies."""
        return failing - meeting <= max(self.resolution * meeting, 1.0 if self.search == "concurrency" else 0.0)

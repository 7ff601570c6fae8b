"""The metric registry: every metric this package measures, gates, holds to a floor or shows, declared once.

A metric is a :class:`MetricInfo`: its unit, which way is better, its default tolerance
when the gate judges it, where its single value sits in a run's JSON, whether a suite
may hold it to a floor, and whether ``qwenperf compare`` shows it as a row. Two families
are rules rather than entries (:class:`Family`): the latency statistics
(:data:`LATENCY`) and the multi-node scaling efficiencies (:data:`SCALING`).
:func:`metric` answers for any name and fails on one it does not know; :func:`find`
answers None instead, for names read from files.

Standard library only: the gate imports it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Direction = Literal["higher", "lower", "none"]
Row = Literal["first", "shown", "none"]
"""A metric's row in ``qwenperf compare`` (when a run has it): ahead of the others, among them, or none."""


@dataclass(frozen=True)
class MetricInfo:
    """What the package knows of one metric."""

    name: str
    unit: str
    direction: Direction
    path: tuple[str, ...]  # where its single value sits in a run's JSON (per-repeat values: ``samples.<name>``)
    tolerance: float | None = None  # the fraction of the baseline a run may be worse by; None: not gated
    floor: bool = False  # a suite may hold it to a floor
    row: Row = "none"

    @property
    def gated(self) -> bool:
        return self.tolerance is not None


@dataclass(frozen=True)
class Family:
    """Metrics alike but for their name, one rule for every name that matches ``pattern``."""

    shape: str  # the names, as messages spell them
    pattern: re.Pattern[str]
    unit: str
    direction: Direction
    tolerance: float | None = None
    floor: bool = False
    row: Row = "none"

    def matches(self, name: str) -> bool:
        return self.pattern.fullmatch(name) is not None

    def member(self, name: str) -> MetricInfo:
        """The entry of one member; a client metric, in the run's ``metrics`` block."""
        if not self.matches(name):
            raise ValueError(f"{name!r} is not one of {self.shape}")
        return MetricInfo(name, self.unit, self.direction, ("metrics", name), self.tolerance, self.floor, self.row)


LATENCY = Family(
    "{mean|median|std|max|p<percentile>}_{ttft|tpot|itl|e2el|scheduling_lag}_ms",
    re.compile(r"(?:mean|median|std|max|p\d+(?:\.\d+)?(?:e[-+]?\d+)?)_(?:ttft|tpot|itl|e2el|scheduling_lag)_ms"),
    "ms",
    "lower",
)
# Per-node throughput at N nodes / at one node. Tight, because the headroom above it is a few percent.
SCALING = Family(
    "scaling_efficiency_n<N>",
    re.compile(r"scaling_efficiency_n(\d+)"),
    "ratio",
    "higher",
    tolerance=0.03,
    floor=True,
    row="shown",
)


def _client(
    name: str, unit: str, direction: Direction, tolerance: float | None = None, *, floor: bool = False, row: Row = "none"
) -> MetricInfo:
    """A ``vllm bench serve`` metric (:mod:`pytest_qwenperf.core.summary`), in the run's ``metrics`` block."""
    return MetricInfo(name, unit, direction, ("metrics", name), tolerance, floor, row)


def _server(name: str, unit: str, *, tolerance: float | None = None, floor: bool = False, row: Row = "none") -> MetricInfo:
    """A rate from the server's counters over the run, in the run's ``server`` block; higher is better."""
    return MetricInfo(name, unit, "higher", ("server", name), tolerance, floor, row)


_SERVER_CORES_BUSY = ("telemetry", "cpu", "groups", "server", "cores_busy", "mean")

# The gated metrics come first: their order is the order of baselines, verdicts and floors' messages.
# Tolerances: throughput of pinned runs repeats within ~3 %, so 5 % is a real change. Goodput
# counts requests under an SLO, a step function of latency, so it swings more. p99 TTFT at
# saturation is queueing time in the tail of a few thousand requests: only a large move means
# something. Prefix hit rate is decided by the workload and the cache policy, so a small drop
# is a behaviour change; speculative acceptance follows the model's numerics. Tokens per joule:
# NVML's energy counter over the whole window is exact to the joule, so it moves with
# throughput and power draw, as tightly as throughput does. Tokens per server CPU-second is
# the CPU build's counterpart (work per unit of device time), steadier than throughput when
# the server waits for its core.
_ENTRIES = (
    _client("total_token_throughput", "tok/s", "higher", 0.05, floor=True, row="first"),
    _client("output_throughput", "tok/s", "higher", 0.05, floor=True, row="first"),
    _client("request_throughput", "req/s", "higher", 0.05, floor=True),
    _client("request_goodput", "req/s", "higher", 0.10, floor=True),
    dataclasses.replace(LATENCY.member("p99_ttft_ms"), tolerance=0.25, row="first"),
    dataclasses.replace(LATENCY.member("p99_tpot_ms"), tolerance=0.10, row="first"),
    _server("prefix_cache_hit_rate", "ratio", tolerance=0.05, floor=True, row="shown"),
    _server("spec_decode_acceptance_rate", "ratio", tolerance=0.10, floor=True, row="shown"),
    MetricInfo("tokens_per_joule", "tok/J", "higher", ("telemetry", "gpu", "tokens_per_joule"), tolerance=0.05, floor=True),
    MetricInfo(
        "tokens_per_server_cpu_s", "tok/CPU-s", "higher", ("telemetry", "cpu", "tokens_per_server_cpu_s"), tolerance=0.05, floor=True,
        row="shown",
    ),
    # A search workload's highest load meeting its SLO, the median of its searches' (one per repeat):
    # concurrent requests or requests/s, as the workload searches. 10 %: about a search's resolution.
    MetricInfo("capacity_at_slo", "load", "higher", ("metrics", "capacity_at_slo"), tolerance=0.10, floor=True, row="first"),
    MetricInfo("capacity_output_throughput", "tok/s", "higher", ("metrics", "capacity_output_throughput"), row="shown"),
    _client("completed", "count", "higher"),
    _client("failed", "count", "lower"),
    _client("total_input_tokens", "count", "none"),
    _client("total_output_tokens", "count", "none"),
    _client("duration", "s", "none"),
    _client("max_output_tokens_per_s", "tok/s", "higher"),
    _client("max_concurrent_requests", "count", "none"),
    _client("achieved_request_rate", "req/s", "none"),
    _client("requested_request_rate", "req/s", "none"),
    # Device utilization: shown next to throughput to explain it, not judged.
    MetricInfo("gpu_utilization", "fraction", "higher", ("telemetry", "gpu", "utilization_mean"), floor=True, row="shown"),
    MetricInfo("gpu_sm_activity", "fraction", "higher", ("telemetry", "gpu", "sm_activity_mean"), row="shown"),
    MetricInfo("gpu_tensor_activity", "fraction", "higher", ("telemetry", "gpu", "tensor_activity_mean"), row="shown"),
    MetricInfo("server_cpu_busy", "cores", "higher", _SERVER_CORES_BUSY, floor=True, row="shown"),  # the CPU build's device
    _server("spec_decode_mean_acceptance_length", "tokens", floor=True),
)
METRICS: Mapping[str, MetricInfo] = MappingProxyType({info.name: info for info in _ENTRIES})
"""Every metric but the families' members, by name, gated ones first."""
GATED = tuple(name for name, info in METRICS.items() if info.gated)
"""The gated metrics besides :data:`SCALING`, in gate order."""
CAPACITY_GATED = ("capacity_at_slo",)
"""What is gated on a capacity search's run, and only there (``Run.gated_samples``)."""
FLOORED = tuple(name for name, info in METRICS.items() if info.floor)
"""The metrics a suite may hold to a floor besides :data:`SCALING`."""


class UnknownMetric(KeyError):
    """A name the registry does not know; the message lists the ones it does."""

    def __str__(self) -> str:
        return str(self.args[0])


def find(name: str) -> MetricInfo | None:
    """The registry's entry for ``name``; None for a name it does not know."""
    if name in METRICS:
        return METRICS[name]
    for family in (LATENCY, SCALING):
        if family.matches(name):
            return family.member(name)
    return None


def metric(name: str) -> MetricInfo:
    """The registry's entry for ``name``; :class:`UnknownMetric` (a KeyError) for a name it does not know."""
    info = find(name)
    if info is None:
        raise UnknownMetric(f"unknown metric {name!r}; known: {', '.join(METRICS)}, {LATENCY.shape}, {SCALING.shape}")
    return info


def gate_order(names: Iterable[str]) -> list[str]:
    """Gated metric names in gate order: :data:`GATED`, then scaling efficiencies by node count."""

    def key(name: str) -> tuple[int, int, str]:
        if name in GATED:
            return (GATED.index(name), 0, name)
        scaling = SCALING.pattern.fullmatch(name)
        return (len(GATED), int(scaling.group(1)) if scaling else 0, name)

    return sorted(names, key=key)

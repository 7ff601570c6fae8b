"""The metric registry: every metric's name, unit, better direction and default tolerance, in one place."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Direction = Literal["higher", "lower", "none"]

# Every metric name -> (unit, which way is better). Latency statistics are a family:
# ``{mean|median|std|max|p<percentile>}_{ttft|tpot|itl|e2el|scheduling_lag}_ms``.
METRIC_SPECS: Mapping[str, tuple[str, Direction]] = MappingProxyType(
    {
        "completed": ("count", "higher"),
        "failed": ("count", "lower"),
        "total_input_tokens": ("count", "none"),
        "total_output_tokens": ("count", "none"),
        "duration": ("s", "none"),
        "request_throughput": ("req/s", "higher"),
        "request_goodput": ("req/s", "higher"),
        "output_throughput": ("tok/s", "higher"),
        "total_token_throughput": ("tok/s", "higher"),
        "max_output_tokens_per_s": ("tok/s", "higher"),
        "max_concurrent_requests": ("count", "none"),
        "achieved_request_rate": ("req/s", "none"),
        "requested_request_rate": ("req/s", "none"),
    }
)
_LATENCY_NAME = re.compile(
    r"(?:mean|median|std|max|p\d+(?:\.\d+)?(?:e[-+]?\d+)?)_(?:ttft|tpot|itl|e2el|scheduling_lag)_ms"
)


def metric_spec(name: str) -> tuple[str, Direction]:
    """(unit, direction) of a metric name; KeyError for names this module never produces."""
    if name in METRIC_SPECS:
        return METRIC_SPECS[name]
    if _LATENCY_NAME.fullmatch(name):
        return ("ms", "lower")
    raise KeyError(f"unknown metric {name!r}")



# The metrics a baseline stores and a verdict gates, with their default tolerance: the
# fraction of the baseline a run may be worse by (lower throughput, higher latency).
# Throughput: pinned runs repeat within ~3 %, so 5 % is a real change. Goodput counts
# requests under an SLO, a step function of latency, so it swings more. p99 TTFT at
# saturation is queueing time in the tail of a few thousand requests: only a large move
# means something. Prefix hit rate is decided by the workload and the cache policy, so a
# small drop is a behaviour change; speculative acceptance follows the model's numerics.
# Tokens per joule: NVML's energy counter over the whole window is exact to the joule, so
# it moves with throughput and power draw, as tightly as throughput does.
GATE_TOLERANCES: Mapping[str, float] = MappingProxyType(
    {
        "total_token_throughput": 0.05,
        "output_throughput": 0.05,
        "request_throughput": 0.05,
        "request_goodput": 0.10,
        "p99_ttft_ms": 0.25,
        "p99_tpot_ms": 0.10,
        "prefix_cache_hit_rate": 0.05,
        "spec_decode_acceptance_rate": 0.10,
        "tokens_per_joule": 0.05,
    }
)
# Multi-node scaling efficiency (per-node throughput at N nodes / at one node): a family,
# ``scaling_efficiency_n<N>``. Tight, because the headroom above it is a few percent.
SCALING_METRIC = re.compile(r"scaling_efficiency_n(\d+)")
SCALING_TOLERANCE = 0.03
# Gated metrics that are not client metrics (metrics.METRIC_SPECS): where they are in a
# run's JSON when it carries no per-repeat samples, their unit and direction.
RUN_FIELDS: Mapping[str, tuple[tuple[str, ...], str, Direction]] = MappingProxyType(
    {
        "prefix_cache_hit_rate": (("server", "prefix_cache_hit_rate"), "ratio", "higher"),
        "spec_decode_acceptance_rate": (("server", "spec_decode_acceptance_rate"), "ratio", "higher"),
        "tokens_per_joule": (("telemetry", "gpu", "tokens_per_joule"), "tok/J", "higher"),
    }
)


@dataclass(frozen=True)
class Gate:
    unit: str
    direction: Direction
    tolerance: float


def gate(name: str) -> Gate | None:
    """How ``name`` is gated by default; None for metrics that are not gated."""
    if SCALING_METRIC.fullmatch(name):
        return Gate("ratio", "higher", SCALING_TOLERANCE)
    if name not in GATE_TOLERANCES:
        return None
    _, unit, direction = RUN_FIELDS[name] if name in RUN_FIELDS else ((), *metric_spec(name))
    return Gate(unit, direction, GATE_TOLERANCES[name])


def gate_order(names: Iterable[str]) -> list[str]:
    """Gated metric names in display order: the table above, then scaling by node count."""
    order = list(GATE_TOLERANCES)

    def key(name: str) -> tuple[int, int, str]:
        if name in GATE_TOLERANCES:
            return (order.index(name), 0, name)
        scaling = SCALING_METRIC.fullmatch(name)
        return (len(order), int(scaling.group(1)) if scaling else 0, name)

    return sorted(names, key=key)


FLOOR_METRICS = ("gpu_utilization", "server_cpu_busy", "spec_decode_mean_acceptance_length")
"""Metrics the perf tests hold to a floor besides the gated higher-is-better ones (:func:`gate`)."""


def floor_metrics() -> list[str]:
    """Every metric a suite may hold to a floor (scaling efficiencies besides, as a family)."""
    higher = [name for name in GATE_TOLERANCES if (g := gate(name)) is not None and g.direction == "higher"]
    return [*higher, *FLOOR_METRICS]

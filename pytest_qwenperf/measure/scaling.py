"""Scaling efficiency: N replicas under N times the load, against one replica under the load once.

efficiency(N) = throughput(N replicas, N× the load) / (N × throughput(1 replica, 1× the load))

"N× the load" is N copies of the workload, interleaved so that request ``i`` of every
copy is sent before request ``i + 1`` of any (a round-robin client then gives each
replica exactly one copy), with N times the concurrency or request rate. Copy ``k`` of a
seeded workload uses seed ``seed + k``: the copies are the same amount of work but not
the same prompts, so a router that sends two copies to one replica gains nothing from
its prefix cache. Copy 0 is the workload itself, the one-replica reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from pytest_qwenperf.core.run import ReplicaScaling, Scaling
from pytest_qwenperf.loadgen.arrivals import Arrival, ClosedLoop, Replay
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.serving.endpoints import EndpointSets
from pytest_qwenperf.suite.workloads import Workload

SCALING_THROUGHPUT = "total_token_throughput"
"""The throughput an efficiency is the ratio of (the ladder's headline figure)."""


@dataclass(frozen=True)
class Route:
    """How ``replicas`` servers are reached: requests to ``load_urls``, /metrics from ``metrics_urls``."""

    replicas: int
    load_urls: tuple[str, ...]
    metrics_urls: tuple[str, ...]


def endpoint_routes(sets: EndpointSets) -> tuple[Route, ...]:
    """One route per endpoint set. A set with one URL per replica is the replicas themselves (their
    /metrics are read); a set with fewer URLs is a Service or gateway in front of them, whose
    /metrics would be one random pod's, so it is not read."""
    return tuple(Route(s.replicas, s.urls, s.urls if len(s.urls) == s.replicas else ()) for s in sets.sets)


def copies_of(workload: Workload, copies: int, tokenizer: PromptTokenizer | None) -> tuple[RequestSpec, ...]:
    """``copies`` interleaved copies of the workload's requests, indexed in sending order."""
    if copies < 1:
        raise ValueError(f"copies must be at least 1, got {copies}")
    seed = getattr(workload, "seed", None)  # the kinds that draw random prompts
    built = [
        (dataclasses.replace(workload, seed=seed + k) if seed is not None and k else workload).build(tokenizer)
        for k in range(copies)
    ]
    interleaved = [spec for group in zip(*built, strict=True) for spec in group]
    return tuple(dataclasses.replace(spec, index=i) for i, spec in enumerate(interleaved))


def times_arrival(arrival: Arrival, factor: int) -> Arrival:
    """The same arrival process carrying ``factor`` times the load. A replay is unchanged: the
    ``factor`` copies of the trace (:func:`copies_of`) go at the same traced times."""
    if isinstance(arrival, ClosedLoop):
        return dataclasses.replace(arrival, concurrency=arrival.concurrency * factor)
    if isinstance(arrival, Replay):
        return arrival
    return dataclasses.replace(
        arrival,
        rate=arrival.rate * factor,
        max_concurrency=arrival.max_concurrency * factor if arrival.max_concurrency else None,
    )


def efficiency(throughput_n: float, throughput_1: float, replicas: int) -> float:
    return throughput_n / (replicas * throughput_1)


@dataclass(frozen=True)
class ScalingSummary:
    """Per replica count: the throughput of each repeat and the efficiency against one replica."""

    throughput: Mapping[int, tuple[float, ...]]  # replicas -> SCALING_THROUGHPUT per repeat
    requests_per_replica: Mapping[str, float | None]  # the largest set: requests each server finished

    @classmethod
    def of(cls, throughput: Mapping[int, Sequence[float]], requests_per_replica: Mapping[str, float | None]) -> ScalingSummary:
        if 1 not in throughput:
            raise ValueError(f"scaling needs the one-replica reference; measured replica counts {sorted(throughput)}")
        return cls(
            MappingProxyType({n: tuple(values) for n, values in sorted(throughput.items())}),
            MappingProxyType(dict(requests_per_replica)),
        )

    def efficiencies(self) -> dict[int, tuple[float, ...]]:
        """Replica count (> 1) → efficiency per repeat (repeat ``r`` against the reference's repeat ``r``)."""
        reference = self.throughput[1]
        return {
            n: tuple(efficiency(t, t1, n) for t, t1 in zip(values, reference, strict=True))
            for n, values in self.throughput.items()
            if n > 1
        }

    def samples(self) -> dict[str, tuple[float, ...]]:
        """``scaling_efficiency_n<N>`` → per-repeat values: the gated metric family."""
        return {f"scaling_efficiency_n{n}": values for n, values in self.efficiencies().items()}

    def request_spread(self) -> float | None:
        """Largest relative distance of a replica's request count from the mean (0.1: within 10 %)."""
        counts = [c for c in self.requests_per_replica.values() if c is not None]
        if not counts or len(counts) < len(self.requests_per_replica):
            return None
        mean = sum(counts) / len(counts)
        return max(abs(c - mean) for c in counts) / mean if mean else None

    def record(self) -> Scaling:
        """What a run keeps of it (its ``scaling`` block)."""
        efficiencies = self.efficiencies()
        return Scaling(
            metric=SCALING_THROUGHPUT,
            replicas={
                str(n): ReplicaScaling(throughput=values, efficiency=efficiencies.get(n) or None)
                for n, values in self.throughput.items()
            },
            requests_per_replica=dict(self.requests_per_replica),
            request_spread=self.request_spread(),
        )

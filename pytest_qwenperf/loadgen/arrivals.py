"""When requests are sent: a closed loop (fixed concurrency), an open loop (an arrival process) or
a replay (each request at its traced time).

A run sends the workload's requests in order and stops at the end of the workload or,
when ``duration_s`` is given to the client, once that much time has passed (requests in
flight then complete and count). Warm-up requests always go as a closed loop first, see
:func:`warmup_concurrency`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

Distribution = Literal["poisson", "constant", "gamma"]


class ArrivalError(ValueError):
    """A parameter of a loop that cannot be used; ``field``, ``expected`` and ``got`` let a caller
    (a suite file, a command line) say where the value came from."""

    def __init__(self, field: str, expected: str, got: object) -> None:
        super().__init__(f"{field}: expected {expected}, got {got!r}")
        self.field = field
        self.expected = expected
        self.got = got


def _whole(value: object, minimum: int) -> bool:
    """An int of at least ``minimum``; a bool is not a number here (TOML's ``true`` is a Python int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _finite_positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class ClosedLoop:
    """Keep ``concurrency`` requests in flight: each finished request is replaced at once.

    Records have ``scheduled_at == sent_at``: a closed loop has no schedule to fall behind.
    """

    concurrency: int

    def __post_init__(self) -> None:
        if not _whole(self.concurrency, 1):
            raise ArrivalError("concurrency", "a whole number of requests in flight >= 1", self.concurrency)


@dataclass(frozen=True)
class OpenLoop:
    """Send at ``rate`` requests/s regardless of completions, like ``vllm bench serve``.

    Inter-arrival times are gamma distributed with shape ``burstiness`` and mean ``1/rate``
    (``poisson`` is burstiness 1, ``constant`` is exactly ``1/rate``). ``max_concurrency``
    caps requests in flight; a request held back by it is sent late, which its record
    shows as scheduling lag.
    """

    rate: float
    distribution: Distribution = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not _finite_positive(self.rate):
            raise ArrivalError("rate", "a finite number of requests per second > 0", self.rate)
        if self.distribution not in get_args(Distribution):
            raise ArrivalError("distribution", f"one of {list(get_args(Distribution))}", self.distribution)
        if not _finite_positive(self.burstiness):
            raise ArrivalError("burstiness", "a finite number > 0 (the gamma shape)", self.burstiness)
        if self.distribution != "gamma" and self.burstiness != 1.0:
            raise ArrivalError("burstiness", "1 unless distribution is 'gamma'", self.burstiness)
        if not _whole(self.seed, 0):
            raise ArrivalError("seed", "a whole number >= 0", self.seed)
        if self.max_concurrency is not None and not _whole(self.max_concurrency, 1):
            raise ArrivalError("max_concurrency", "a whole number of requests in flight >= 1", self.max_concurrency)

    def offsets(self, n: int) -> list[float]:
        """Send times of ``n`` requests, in seconds from the start; the same for the same arguments.

        As in ``vllm bench serve``, the random gaps are rescaled so the last request goes
        at exactly ``n / rate``: throughput then does not depend on the seed's luck.
        """
        if n == 0:
            return []
        if self.distribution == "constant":
            return [(i + 1) / self.rate for i in range(n)]
        rng = np.random.default_rng(self.seed)
        times = np.cumsum(rng.gamma(shape=self.burstiness, scale=1.0 / (self.rate * self.burstiness), size=n))
        return (times * (n / self.rate / times[-1])).tolist()


@dataclass(frozen=True)
class Replay:
    """Send each request at the time its trace recorded (:attr:`RequestSpec.at`), times
    ``time_scale`` (0.5 replays twice as fast), from the first measured request's time.

    There is no cap on requests in flight: a replay that holds requests back is no replay, and
    a request sent late shows as scheduling lag, which makes a run that fell behind
    ``client-bound``.
    """

    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not _finite_positive(self.time_scale):
            raise ArrivalError("time_scale", "a finite number > 0 (0.5 replays twice as fast)", self.time_scale)

    def offsets_of(self, times: Sequence[float | None]) -> list[float]:
        """Send times, in seconds from the start, of requests traced at ``times``."""
        if any(at is None for at in times):
            raise ArrivalError("replay", "a workload whose requests carry their traced send times (kind 'trace')", "requests without them")
        stamps = [at for at in times if at is not None]
        start = stamps[0] if stamps else 0.0
        return [(at - start) * self.time_scale for at in stamps]


Arrival = ClosedLoop | OpenLoop | Replay


def warmup_concurrency(arrival: Arrival, warmup: int) -> int:
    """Concurrency of the warm-up phase: the closed loop's own, else the open loop's cap.

    An uncapped open loop or a replay warms up with all ``warmup`` requests at once, which opens
    as many connections as the measured phase is likely to need.
    """
    if isinstance(arrival, ClosedLoop):
        return arrival.concurrency
    cap = arrival.max_concurrency if isinstance(arrival, OpenLoop) else None
    return cap or max(warmup, 1)


def requested_rate(arrival: Arrival, offsets: Sequence[float] | None) -> float | None:
    """The send rate ``arrival`` asks for, in requests/s; None for a closed loop. A replay's is its
    schedule's, measured the way the achieved rate is: (requests - 1) / send span."""
    if isinstance(arrival, OpenLoop):
        return arrival.rate
    if isinstance(arrival, ClosedLoop) or not offsets or len(offsets) < 2:
        return None
    span = offsets[-1] - offsets[0]
    return (len(offsets) - 1) / span if span > 0 else math.inf

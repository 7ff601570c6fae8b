"""When requests are sent: a closed loop (fixed concurrency), an open loop (an arrival process) or
a replay (each request at its traced time).

A run sends the workload's requests in order and stops at the end of the workload or,
when ``duration_s`` is given to the client, once that much time has passed (requests in
flight then complete and count). Warm-up requests go first as a closed loop (see
:func:`warmup_lanes`; a closed loop with ``ramp_steps`` raises its concurrency in steps), or,
for an open loop with a ``ramp``, at a rate rising to the full one (:meth:`OpenLoop.ramp_offsets`).

A conversation (:class:`~pytest_qwenperf.loadgen.request.Turn`) is sent as one: a closed loop's
lane takes a whole conversation and an open loop's arrival starts one, so ``concurrency`` counts
conversations in flight, ``rate`` conversations started per second, and a ramp or its steps count
conversations too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal, get_args

import numpy as np

from pytest_qwenperf.core.window import Window

Distribution = Literal["poisson", "constant", "gamma"]
Ramp = Literal["linear", "steps"]
Steps = tuple[tuple[int, int], ...]
"""A closed loop's lanes over a run: (sends started before the step, lanes from then on), per step."""


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
    ``ramp_steps``: the warm-up raises the concurrency in that many steps instead of starting
    at full concurrency (:meth:`warmup_lanes`); the measured phase runs at ``concurrency``.
    """

    concurrency: int
    ramp_steps: int | None = None

    def __post_init__(self) -> None:
        if not _whole(self.concurrency, 1):
            raise ArrivalError("concurrency", "a whole number of requests in flight >= 1", self.concurrency)
        if self.ramp_steps is not None and not _whole(self.ramp_steps, 2):
            raise ArrivalError("ramp_steps", "a whole number of warm-up steps >= 2", self.ramp_steps)

    def warmup_lanes(self, n: int) -> Steps:
        """The lanes of a warm-up of ``n`` sends: step k of ``ramp_steps`` runs ``ceil(concurrency * k /
        ramp_steps)`` lanes from the send that starts it on. Each step's share of the sends is in
        proportion to its lanes, so that the steps last about equally long."""
        if self.ramp_steps is None:
            return ((0, self.concurrency),)
        lanes = [-(-self.concurrency * k // self.ramp_steps) for k in range(1, self.ramp_steps + 1)]
        starts = accumulate(lanes[:-1], initial=0)
        return tuple((n * start // sum(lanes), count) for start, count in zip(starts, lanes, strict=True))


@dataclass(frozen=True)
class OpenLoop:
    """Send at ``rate`` requests/s regardless of completions, like ``vllm bench serve``.

    Inter-arrival times are gamma distributed with shape ``burstiness`` and mean ``1/rate``
    (``poisson`` is burstiness 1, ``constant`` is exactly ``1/rate``). ``max_concurrency``
    caps requests in flight; a request held back by it is sent late, which its record
    shows as scheduling lag.

    ``ramp``: the warm-up is sent at a rate rising from 0 to ``rate`` (``"linear"``, or
    ``"steps"``: ``ramp_steps`` equal steps), and the measured phase follows at once at the full
    rate, with the warm-up's requests still in flight, as ``vllm bench serve --ramp-up-strategy``
    does but before the measured phase (:meth:`ramp_offsets`).
    """

    rate: float
    distribution: Distribution = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None
    ramp: Ramp | None = None
    ramp_steps: int | None = None

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
        if self.ramp is not None and self.ramp not in get_args(Ramp):
            raise ArrivalError("ramp", f"one of {list(get_args(Ramp))}", self.ramp)
        if self.ramp == "steps" and not _whole(self.ramp_steps, 2):
            raise ArrivalError("ramp_steps", "a whole number of steps >= 2 (ramp = 'steps' needs them)", self.ramp_steps)
        if self.ramp != "steps" and self.ramp_steps is not None:
            raise ArrivalError("ramp_steps", "no steps unless ramp is 'steps'", self.ramp_steps)

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

    def ramp_offsets(self, n: int) -> list[float]:
        """Send times of the ``n`` warm-up requests under the ramp, in seconds from its start.

        The rate rises from 0 to ``rate``, linearly or in ``ramp_steps`` steps of equal length
        (step k at ``rate * k / ramp_steps``), and request i (from 1) goes when the ramp's expected
        count reaches i: the gaps are even along the rising rate (no random draws: the warm-up is
        not measured), and the n-th request goes at the ramp's end, where the measured phase starts.
        So the ramp lasts ``2 n / rate`` when linear and ``2 n / rate * s / (s + 1)`` in s steps.
        """
        if self.ramp is None:
            raise ValueError("an open loop without a ramp has no ramp offsets")
        if n == 0:
            return []
        if self.ramp == "linear":  # the count by t is rate t^2 / (2 T), n at T
            length = 2 * n / self.rate
            return [length * math.sqrt(i / n) for i in range(1, n + 1)]
        steps = self.ramp_steps
        assert steps is not None  # checked with ramp = "steps"
        step_s = 2 * n / (self.rate * (steps + 1))  # step k sends rate k / steps * step_s: n in all
        times = []
        for i in range(1, n + 1):
            k = next(k for k in range(1, steps + 1) if i * steps * (steps + 1) <= n * k * (k + 1))  # i is due in step k
            before = n * (k - 1) * k / (steps * (steps + 1))  # the count due before step k
            times.append((k - 1) * step_s + (i - before) * steps / (self.rate * k))
        return times


@dataclass(frozen=True)
class Replay:
    """Send each request at the time its trace recorded (:attr:`RequestSpec.at`), times
    ``time_scale`` (0.5 replays twice as fast), from the first measured request's time.

    There is no cap on requests in flight: a replay that holds requests back is no replay, and
    a request sent late shows as scheduling lag, which makes a run that fell behind
    ``client-bound``: its p99 beyond ``max_lag_ms`` (None: the 50 ms every load is held to).
    """

    time_scale: float = 1.0
    max_lag_ms: float | None = None

    def __post_init__(self) -> None:
        if not _finite_positive(self.time_scale):
            raise ArrivalError("time_scale", "a finite number > 0 (0.5 replays twice as fast)", self.time_scale)
        if self.max_lag_ms is not None and not _finite_positive(self.max_lag_ms):
            raise ArrivalError("max_lag_ms", "a finite number of milliseconds > 0 (the p99 send lag a replay may have)", self.max_lag_ms)

    def offsets_of(self, times: Sequence[float | None]) -> list[float]:
        """Send times, in seconds from the start, of requests traced at ``times``."""
        if any(at is None for at in times):
            raise ArrivalError("replay", "a workload whose requests carry their traced send times (kind 'trace')", "requests without them")
        stamps = [at for at in times if at is not None]
        start = stamps[0] if stamps else 0.0
        return [(at - start) * self.time_scale for at in stamps]


Arrival = ClosedLoop | OpenLoop | Replay


def warmup_lanes(arrival: Arrival, warmup: int) -> Steps:
    """The lanes of a warm-up of ``warmup`` sends that goes as a closed loop (all but an open loop's
    ramp): the closed loop's own (in steps with ``ramp_steps``), else the open loop's cap.

    An uncapped open loop or a replay warms up with all ``warmup`` requests at once, which opens
    as many connections as the measured phase is likely to need.
    """
    if isinstance(arrival, ClosedLoop):
        return arrival.warmup_lanes(warmup)
    cap = arrival.max_concurrency if isinstance(arrival, OpenLoop) else None
    return ((0, cap or max(warmup, 1)),)


def window_problem(window: Window, arrival: Arrival, warmup: int) -> str | None:
    """Why a load by ``arrival`` with ``warmup`` requests cannot keep ``window``, or None: a replay
    keeps its trace's own span, a window in lifetimes needs a warm-up before the measured phase to
    time one, and an open loop's batch is full only a lifetime after its start (or at once after a
    ramp)."""
    if isinstance(arrival, Replay):
        return "a replay is measured over its trace's span, not a window"
    ramp = isinstance(arrival, OpenLoop) and arrival.ramp is not None
    if window.lifetimes is not None and (warmup == 0 or ramp):
        return (
            f"a window of {window} needs a warm-up that runs before the measured phase (not a ramp) to time a request's lifetime"
        )
    if isinstance(arrival, OpenLoop) and not ramp and warmup == 0:
        return "an open loop's window needs a warm-up or a ramp: it opens a request's lifetime after the load starts"
    return None


def requested_rate(arrival: Arrival, offsets: Sequence[float] | None) -> float | None:
    """The send rate ``arrival`` asks for, in requests/s; None for a closed loop. A replay's is its
    schedule's, measured the way the achieved rate is: (requests - 1) / send span."""
    if isinstance(arrival, OpenLoop):
        return arrival.rate
    if isinstance(arrival, ClosedLoop) or not offsets or len(offsets) < 2:
        return None
    span = offsets[-1] - offsets[0]
    return (len(offsets) - 1) / span if span > 0 else math.inf

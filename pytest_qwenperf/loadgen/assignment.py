"""What one event loop of the load generator is given to send: the options of a load
(:class:`LoadOptions`), the requests grouped into units (a request alone, or a conversation's turns
in order) and split into warm-up and measured, and their send times (:class:`Assignment`). The
client (:mod:`~pytest_qwenperf.loadgen.client`) sends it; workers (:mod:`~pytest_qwenperf.loadgen.workers`,
:mod:`~pytest_qwenperf.loadgen.ray_workers`) each send a share of one."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.window import Window
from pytest_qwenperf.loadgen.arrivals import Arrival, OpenLoop, Replay, requested_rate, window_problem
from pytest_qwenperf.loadgen.request import RequestSpec

DEFAULT_TIMEOUT_S = 600.0
ROUTINGS = ("round-robin", "least-outstanding")

Job = tuple[int, RequestSpec]  # (position in the workload, request)
Unit = tuple[Job, ...]  # what is sent as one: a request on its own, or a conversation's turns in order


@dataclass(frozen=True)
class LoadOptions:
    """How a run is driven, besides what is sent and when.

    ``warmup``: the first this many requests go first, as a closed loop (an open loop's
    ``ramp``: at its rising rate), and are marked warm-up; with conversations they must be
    whole ones. ``duration_s``: stop sending after this long (requests in flight finish and
    count; no later turn of a conversation is sent past it). ``window``: measure for this long
    once the batch is full, instead (:mod:`~pytest_qwenperf.core.window`); the requests are then
    a supply the window must not exhaust. ``timeout_s`` bounds each request. ``continuous_usage`` asks the server for
    cumulative usage in every chunk, which gives each chunk's token count.

    ``routing`` (one of :data:`ROUTINGS`) picks each request's endpoint. ``"round-robin"``:
    request ``i`` goes to ``endpoints[i % n]``, like a Kubernetes ClusterIP Service.
    ``"least-outstanding"``: to the endpoint with the fewest requests in flight from this
    client when it is sent; ties go to the first in round-robin order from ``i % n``, so
    with equally many in flight everywhere request ``i`` goes where round-robin sends it.
    Every turn of a conversation is routed by its first turn's position: round-robin keeps a
    conversation on one endpoint, whose prefix cache holds its earlier turns (least-outstanding
    still picks per turn). The client only knows its own requests: with several worker processes
    (:mod:`~pytest_qwenperf.loadgen.workers`) each balances its own share, not the total.

    ``api_key``: sent with every request as ``Authorization: Bearer`` (servers run with
    vLLM's ``--api-key``); its ``repr`` does not show it.
    """

    warmup: int = 0
    duration_s: float | None = None
    window: Window | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    continuous_usage: bool = True
    routing: str = "round-robin"
    api_key: ApiKey | None = None

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be at least 0, got {self.warmup}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
        if self.duration_s is not None and self.window is not None:
            raise ValueError("a load is bounded by a duration or measured for a window, not both")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")


def units_of(jobs: Iterable[Job]) -> tuple[Unit, ...]:
    """The jobs grouped into what is sent as one, in the order of their first jobs.

    Turn 0 opens a conversation; turn k joins the earliest opened conversation of its number that
    waits for turn k. So conversation numbers need not be unique: copies of a workload interleaved
    request by request (one per replica, ``measure.scaling.copies_of``) repeat them.
    """
    units: list[list[Job]] = []
    waiting: defaultdict[tuple[int, int], deque[list[Job]]] = defaultdict(deque)  # (conversation, turn it waits for)
    for job in jobs:
        turn = job[1].turn
        if turn is None or turn.number == 0:
            unit = [job]
            units.append(unit)
        elif waiting[turn.conversation, turn.number]:
            unit = waiting[turn.conversation, turn.number].popleft()
            unit.append(job)
        else:
            raise ValueError(
                f"request {job[0]}: turn {turn.number} of conversation {turn.conversation} comes without turn {turn.number - 1} before it"
            )
        if turn is not None:
            waiting[turn.conversation, turn.number + 1].append(unit)
    return tuple(tuple(unit) for unit in units)


def warmup_units(units: Sequence[Unit], warmup: int) -> int:
    """How many units the first ``warmup`` requests make: they must be whole conversations."""
    ends = list(accumulate((len(unit) for unit in units), initial=0))  # the requests before each unit, and all
    if warmup < 0 or warmup > ends[-1]:
        raise ValueError(f"warmup must be between 0 and the number of requests ({ends[-1]}), got {warmup}")
    k = bisect_left(ends, warmup)
    if ends[k] != warmup:
        raise ValueError(f"warmup must be whole conversations, {ends[k - 1]} or {ends[k]} requests here, got {warmup}")
    return k


@dataclass(frozen=True)
class Assignment:
    """What one event loop sends: to which endpoints and as which model, its warm-up and measured
    units, by which arrival and how. ``offsets``: the open loop's or the replay's send times of
    ``units``; ``ramp``: an open loop's ramp's send times of the ``warmup`` units, and ``ramp_s``
    the whole ramp's length (a worker's share keeps it), where the measured phase starts."""

    endpoints: tuple[str, ...]
    model: str
    warmup: tuple[Unit, ...]
    units: tuple[Unit, ...]
    arrival: Arrival
    offsets: tuple[float, ...] | None
    options: LoadOptions
    ramp: tuple[float, ...] | None = None
    ramp_s: float = 0.0

    @classmethod
    def of(
        cls, endpoints: Sequence[str], model: str, requests: Iterable[RequestSpec], arrival: Arrival, options: LoadOptions
    ) -> Assignment:
        """Number the requests and group a conversation's turns into one unit; the first
        ``options.warmup`` requests are the warm-up, the arrival's schedule covers the rest."""
        units = units_of(enumerate(requests))
        warmup = warmup_units(units, options.warmup)
        if options.window is not None and (problem := window_problem(options.window, arrival, warmup)):
            raise ValueError(problem)
        measured = units[warmup:]
        offsets: tuple[float, ...] | None = None
        if isinstance(arrival, OpenLoop):
            offsets = tuple(arrival.offsets(len(measured)))
        elif isinstance(arrival, Replay):
            offsets = tuple(arrival.offsets_of([unit[0][1].at for unit in measured]))
        ramp = tuple(arrival.ramp_offsets(warmup)) if isinstance(arrival, OpenLoop) and arrival.ramp is not None else None
        return cls(tuple(endpoints), model, units[:warmup], measured, arrival, offsets, options, ramp, ramp[-1] if ramp else 0.0)

    def traced(self, start: float) -> Callable[[float], float] | None:
        """In a replay, the clock time a request traced at a time is due, the measured phase
        started at ``start``; None: not a replay."""
        arrival = self.arrival
        if not isinstance(arrival, Replay) or not self.units or self.offsets is None:
            return None
        first, offset = self.units[0][0][1].at, self.offsets[0]  # a worker's share need not hold the trace's first
        assert first is not None  # a replay's requests carry their traced times (Replay.offsets_of)
        return lambda at: start + offset + (at - first) * arrival.time_scale

    @property
    def requested_rate(self) -> float | None:
        """The arrival's; None when conversations of several turns are sent: how fast the server
        answers sets their request rate (their turns' lag still shows a client that fell behind)."""
        if any(len(unit) > 1 for unit in self.units):
            return None
        return requested_rate(self.arrival, self.offsets)

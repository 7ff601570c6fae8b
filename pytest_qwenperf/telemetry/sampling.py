"""The background-thread sampler every telemetry source is built on, and windowed statistics.

A sampler polls something (NVML, /proc, /metrics) at a fixed interval in its own daemon
thread, so the load generator's event loop is never blocked by it. Sample times are
``time.perf_counter()`` seconds, the clock of the request records, so the samples can be
cut to the same steady-state window as the requests. A sampler measures its own timing
(the instrument's jitter is part of the result) and never raises into the run: a failed
poll is counted and reported.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

CLOCK: Callable[[], float] = time.perf_counter
"""The clock of :class:`~pytest_qwenperf.core.records.RequestRecord` times; every sample uses it too."""

Window = tuple[float, float]


class SamplerUnavailable(Exception):
    """A sampler cannot run here (no NVML, no GPU visible); the message says why."""


@dataclass(frozen=True)
class Stats:
    """Mean, median, minimum and maximum of one quantity's samples."""

    mean: float
    median: float
    min: float
    max: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stats | None:
        """Statistics of the values that were read; None when none were."""
        present = [v for v in values if v is not None]
        if not present:
            return None
        return cls(statistics.fmean(present), statistics.median(present), min(present), max(present), len(present))

    def as_json(self) -> dict[str, float | int]:
        return {"mean": self.mean, "median": self.median, "min": self.min, "max": self.max, "count": self.count}


@dataclass(frozen=True)
class SamplerHealth:
    """How well a sampler kept to its schedule, and what went wrong.

    ``jitter_*`` are percentiles of (actual − intended) time between consecutive polls:
    large values mean the host was too busy to sample on time (or polling itself is slow).
    """

    interval_s: float
    polls: int
    failed_polls: int
    jitter_p50_s: float | None
    jitter_p99_s: float | None
    jitter_max_s: float | None
    last_error: str | None
    unavailable: str | None = None  # why the sampler never ran

    def as_json(self) -> dict[str, object]:
        return {
            "interval_s": self.interval_s,
            "polls": self.polls,
            "failed_polls": self.failed_polls,
            "jitter_p50_s": self.jitter_p50_s,
            "jitter_p99_s": self.jitter_p99_s,
            "jitter_max_s": self.jitter_max_s,
            "last_error": self.last_error,
            "unavailable": self.unavailable,
        }


class PeriodicSampler:
    """Calls :meth:`_poll` every ``interval_s`` seconds in a daemon thread until stopped.

    Polls follow a fixed schedule (no drift); a poll that overruns delays the next one
    instead of queueing several. :meth:`stop` lets the thread take one closing poll so
    counters (energy, tokens) cover the run's end. Subclasses prepare in :meth:`_open`
    (raise :class:`SamplerUnavailable` when they cannot run) and release in :meth:`_close`.
    """

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"sampling interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.unavailable: str | None = None
        self._poll_times: list[float] = []
        self._failed = 0
        self._last_error: str | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # subclass hooks ------------------------------------------------------------------
    def _open(self) -> None:
        """Prepare to sample; raise :class:`SamplerUnavailable` if this sampler cannot run."""

    def _poll(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        """Release what :meth:`_open` acquired."""

    # lifecycle -----------------------------------------------------------------------
    def start(self) -> Self:
        """Start sampling; a sampler that cannot run records why and stays idle."""
        try:
            self._open()
        except SamplerUnavailable as exc:
            self.unavailable = str(exc)
            return self
        except Exception as exc:  # telemetry never takes the run down
            self.unavailable = f"could not start: {type(exc).__name__}: {exc}"
            return self
        self._thread = threading.Thread(target=self._run, name=f"qwenperf-{type(self).__name__}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a closing poll, stop the thread and release resources (idempotent)."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join()
        self._thread = None
        try:
            self._close()
        except Exception as exc:  # releasing must not fail the run either
            self._last_error = f"closing: {type(exc).__name__}: {exc}"

    @property
    def running(self) -> bool:
        return self._thread is not None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        due = CLOCK()
        while True:
            self._poll_times.append(CLOCK())
            self._guarded_poll()
            due = max(due + self.interval_s, CLOCK())
            if self._stopping.wait(max(due - CLOCK(), 0.0)):
                break
        self._guarded_poll()  # the closing poll: off schedule, so not in the timing statistics

    def _guarded_poll(self) -> None:
        try:
            self._poll()
        except Exception as exc:  # a sampler never takes the run down
            self._failed += 1
            self._last_error = f"{type(exc).__name__}: {exc}"

    def _note_failure(self, message: str) -> None:
        """A poll that produced no sample without raising (e.g. one replica did not answer)."""
        self._failed += 1
        self._last_error = message

    def health(self) -> SamplerHealth:
        jitter = sorted(b - a - self.interval_s for a, b in itertools.pairwise(self._poll_times))
        return SamplerHealth(
            interval_s=self.interval_s,
            polls=len(self._poll_times),
            failed_polls=self._failed,
            jitter_p50_s=percentile(jitter, 50),
            jitter_p99_s=percentile(jitter, 99),
            jitter_max_s=jitter[-1] if jitter else None,
            last_error=self._last_error,
            unavailable=self.unavailable,
        )


# --- windows ---------------------------------------------------------------------------


def percentile(ordered: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile of an already sorted sequence; None when empty."""
    if not ordered:
        return None
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def inside(at: float, window: Window | None) -> bool:
    """Whether a sample time lies in ``[start, end]`` (every time does when there is no window)."""
    return window is None or window[0] <= at <= window[1]


def counter_increase(
    points: Sequence[tuple[float, float]], window: Window | None, slack: float = 0.0
) -> float | None:
    """How much a cumulative counter grew over ``window``, interpolating linearly between samples.

    ``points`` are (time, value) in time order. None when the samples miss more than
    ``slack`` seconds at either end of the window: an increase over part of it would be
    mistaken for the whole.
    """
    if len(points) < 2:
        return None
    first, last = points[0][0], points[-1][0]
    start, end = window if window is not None else (first, last)
    if start < first - slack or end > last + slack:
        return None
    return _value_at(points, min(end, last)) - _value_at(points, max(start, first))


def _value_at(points: Sequence[tuple[float, float]], at: float) -> float:
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= at <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (at - t0) / (t1 - t0)
    raise ValueError(f"{at} outside the sampled span")

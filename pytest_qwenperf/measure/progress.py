"""A point's progress while it is measured: what the measuring functions tell an observer, and a
meter that words it as status lines.

The measuring functions stay free of any terminal: :func:`~pytest_qwenperf.measure.sequential.measure_point`
and the functions below it take one optional :class:`PointProgress` and tell it when a repeat starts
and ends, when a load run starts (how many requests it sends, warm-up included) and each request
as it finishes. :class:`Meter` is such an observer; its clock is injected, and it hands its lines to
a ``show`` callable, so a terminal (the plugin's), a command's stderr (``qwenperf bisect``) and a
test's list get the same lines. :class:`BootMeter` does the same for servers' boots (a pool's
:class:`~pytest_qwenperf.serving.boot_progress.BootProgress`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.tables import format_duration
from pytest_qwenperf.loadgen.arrivals import Arrival, ClosedLoop, OpenLoop
from pytest_qwenperf.measure.observe import Watching

WINDOW_S = 10.0
"""The output tok/s of a status line: the tokens of the requests finished in this many last seconds."""


class PointProgress(Protocol):
    """What sees a point being measured. Calls come from the thread that measures, in between the
    client's requests (``request_done``), so an observer must be quick."""

    def repeat_started(self, number: int, plan: SequentialPlan, side: str) -> None:
        """Repeat ``number`` (from 1) of at most ``plan.most`` starts; ``side`` names the server
        ("reference", "candidate") when two servers' repeats interleave, else ""."""

    def load_started(self, requests: int, label: str) -> None:
        """A load run of the repeat starts: ``requests`` to send, warm-up included (0: not known, as
        for a load measured over a window); ``label`` says which one when a repeat has several (a
        route's replicas, a search's probe), else ""."""

    def request_done(self, record: RequestRecord) -> None:
        """A request of the load run finished (or failed)."""

    def load_retaken(self, reasons: str) -> None:
        """The load run just finished was spoiled by the machine's other load (``reasons``, as the
        run's conditions name them) and is measured again: a ``load_started`` follows."""

    def repeat_done(self, measured: float | None) -> None:
        """The repeat's last load run finished; ``measured``: its output throughput as the verdicts weigh
        it (:func:`measured_output`), None for a search's repeat."""


def told(
    repeat: Callable[[], Mapping[int, Run]], plan: SequentialPlan, progress: PointProgress | None, side: str = ""
) -> Callable[[], Mapping[int, Run]]:
    """``repeat`` (a repeat's load run per route, by replicas), each call told to ``progress`` (numbered
    from 1) as it starts and ends, with its measured output throughput."""
    if progress is None:
        return repeat
    numbers = itertools.count(1)

    def told_repeat() -> Mapping[int, Run]:
        progress.repeat_started(next(numbers), plan, side)
        result = repeat()
        progress.repeat_done(measured_output(result))
        return result

    return told_repeat


def measured_output(repeat: Mapping[int, Run]) -> float | None:
    """The output tok/s of ``repeat``'s run on the most replicas (a config's own route), over its measured
    requests in the steady state: the sample its verdicts weigh, not its warm-up's or its drain's. None
    for a search's repeat (its figure is a capacity) or a run without the figure."""
    run = repeat[max(repeat)] if repeat else None
    if run is None or run.capacity:
        return None
    return run.metrics.get("output_throughput")


def watched(watching: Watching | None, progress: PointProgress | None) -> Watching | None:
    """A load run's ``watching`` (a search's probe watch, or none) with ``progress`` told of every
    finished request too."""
    if progress is None:
        return watching
    inner = watching.progress if watching else None
    if inner is None:
        return Watching(progress=progress.request_done, stop=watching.stop if watching else None)

    def both(record: RequestRecord) -> None:
        inner(record)
        progress.request_done(record)

    return Watching(progress=both, stop=watching.stop if watching else None)


def load_label(replicas: int | None, probe: Arrival | None) -> str:
    """Which load run of a repeat this is: the route's replicas (None: the config has one, so one
    route) and a search probe's load (None: not a probe)."""
    parts = [] if replicas is None else [f"{replicas} replica{'s' if replicas > 1 else ''}"]
    if isinstance(probe, ClosedLoop):
        parts.append(f"probe at concurrency {probe.concurrency}")
    elif isinstance(probe, OpenLoop):
        parts.append(f"probe at {probe.rate:g} req/s")
    return ", ".join(parts)


def repeat_of(number: int, plan: SequentialPlan) -> str:
    """``repeat 2 of 3``, or ``repeat 4 of 3 (up to 6)`` when the plan may add repeats."""
    extra = f" (up to {plan.most})" if plan.most > plan.first else ""
    return f"repeat {number} of {plan.first}{extra}"


class Meter:
    """A :class:`PointProgress` that words a point's progress as lines for ``show``.

    A status line (the repeat, requests done of the load run's total, output tok/s over the last
    :data:`WINDOW_S` seconds, the load run's elapsed time and its remaining time at the rate so
    far) goes out at most every ``every_s`` seconds (None: never); a finished repeat always gets
    its line (its requests and time, and its measured output tok/s: the sample its verdicts weigh, which
    leaves out the warm-up requests and the drain that the status lines' live rate sees, so a repeat
    slow to warm up after a boot does not read as a slow sample). ``clock`` is in seconds."""

    def __init__(
        self, point: str, show: Callable[[str], None], every_s: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._point, self._show, self._every_s, self._clock = point, show, every_s, clock
        self._repeat = "measuring"
        self._repeat_at = self._load_at = clock()
        self._repeat_requests = 0
        self._label, self._total, self._done = "", 0, 0
        self._recent: deque[tuple[float, int]] = deque()
        self._shown_at: float | None = None

    def repeat_started(self, number: int, plan: SequentialPlan, side: str) -> None:
        now = self._clock()
        self._repeat = f"{side} {repeat_of(number, plan)}" if side else repeat_of(number, plan)
        self._repeat_at, self._repeat_requests = now, 0

    def load_started(self, requests: int, label: str) -> None:
        now = self._clock()
        self._load_at, self._total, self._done, self._label = now, requests, 0, label
        self._recent.clear()
        self._maybe_show(now)

    def request_done(self, record: RequestRecord) -> None:
        now = self._clock()
        self._done += 1
        self._repeat_requests += 1
        self._recent.append((now, record.completion_tokens))
        self._forget(now)
        self._maybe_show(now)

    def load_retaken(self, reasons: str) -> None:
        self._shown_at = self._clock()
        where = f"{self._repeat}, {self._label}" if self._label else self._repeat
        self._show(f"qwenperf {self._point}: {where}: spoiled by the machine's other load ({reasons}), measured again")

    def repeat_done(self, measured: float | None) -> None:
        now = self._clock()
        rate = "" if measured is None else f", {measured:,.0f} out tok/s measured"
        self._shown_at = now
        self._show(f"qwenperf {self._point}: {self._repeat} done, {self._repeat_requests:,} requests in {format_duration(now - self._repeat_at)}{rate}")

    def _maybe_show(self, now: float) -> None:
        if self._every_s is None or (self._shown_at is not None and now - self._shown_at < self._every_s):
            return
        self._shown_at = now
        self._show(self.status(now))

    def _forget(self, now: float) -> None:
        """Drop the finished requests older than the window."""
        while self._recent and self._recent[0][0] <= now - WINDOW_S:
            self._recent.popleft()

    def status(self, now: float) -> str:
        """The status line at ``now``."""
        self._forget(now)
        elapsed = now - self._load_at
        parts = [self._repeat] + ([self._label] if self._label else [])
        if self._total:
            parts.append(f"{self._done:,}/{self._total:,} requests")
        if self._done and elapsed > 0:
            parts.append(f"{sum(tokens for _, tokens in self._recent) / min(WINDOW_S, elapsed):,.0f} out tok/s")
        parts.append(f"{format_duration(elapsed)} elapsed")
        if self._done and self._total and elapsed > 0:
            parts[-1] += f", ~{format_duration((self._total - self._done) * elapsed / self._done)} left"
        return f"qwenperf {self._point}: " + ", ".join(parts)


SLOW_BOOT_S = 60.0
"""A boot that has taken this long is slow: its status line adds the server log's last line, so a
boot stuck loading weights or compiling says where it is (the CPU build's tiny model boots in about 35 s)."""

LOG_LINE_CHARS = 200
"""The most of a log line a boot's status line carries (a terminal's line is cut to its width anyway)."""


class BootMeter:
    """A :class:`~pytest_qwenperf.serving.boot_progress.BootProgress` that words boots as lines for ``show``.

    A boot's status line (its config, the time since its start, what it waits for, and past
    :data:`SLOW_BOOT_S` the log's last line) goes out at its first "not ready yet" and then at most
    every ``every_s`` seconds of that boot (None: never); its end always gets a line. The times are
    the boot's own (``elapsed_s``), so the meter needs no clock. ``side`` names the pool
    (``candidate``; "": the launcher's); ``begin`` runs before the first line while no other boot is
    shown (the terminal ends a point's line there). Replicas boot on threads of their own: calls are
    serialized."""

    def __init__(
        self, show: Callable[[str], None], every_s: float | None, side: str = "", begin: Callable[[], None] | None = None
    ) -> None:
        self._show, self._every_s, self._begin = show, every_s, begin
        self._side = f"{side} " if side else ""
        self._shown: dict[str, float] = {}  # per boot shown and not done, when its last line went out
        self._lock = threading.Lock()

    def waiting(self, config_key: str, elapsed_s: float, phase: str, last_log_line: str | None) -> None:
        if self._every_s is None:
            return
        with self._lock:
            shown = self._shown.get(config_key)
            if shown is not None and elapsed_s - shown < self._every_s:
                return
            self._began(config_key)
            self._shown[config_key] = elapsed_s
            self._show(self.status(config_key, elapsed_s, phase, last_log_line))

    def booted(self, config_key: str, elapsed_s: float) -> None:
        with self._lock:
            self._began(config_key)
            self._shown.pop(config_key, None)
            self._show(f"qwenperf booted {self._side}{config_key} in {format_duration(elapsed_s)}")

    def status(self, config_key: str, elapsed_s: float, phase: str, last_log_line: str | None) -> str:
        """A boot's status line."""
        line = f"qwenperf booting {self._side}{config_key} ({format_duration(elapsed_s)}, {phase})"
        if elapsed_s >= SLOW_BOOT_S and last_log_line:
            line += f"; log: {last_log_line[:LOG_LINE_CHARS]}"
        return line

    def _began(self, config_key: str) -> None:
        if self._begin is not None and not self._shown:
            self._begin()

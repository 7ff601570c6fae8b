"""Keeping a time-bounded load's window while it runs (:mod:`~pytest_qwenperf.core.window`): when it
opens and closes, which requests it waits for, and cutting the ones sent after it closed."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from time import perf_counter

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.window import KeptWindow
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.loadgen.assignment import Assignment

MEASURED = "cut once its window was measured"
"""Why a request in flight was cut when its window had been measured."""


class WindowKeeper:
    """Keeps a time-bounded run's window while it runs (:mod:`~pytest_qwenperf.core.window`).

    A closed loop's window opens once its batch has filled and turned over once: at the end of
    as many measured requests as it has lanes (``turnover``). The measured phase starts from an
    empty batch (the warm-up ended first), so its first wave is sent at once and runs in step,
    all prefills together and then decoding alone; only after it has turned over do the slots
    hold requests at every stage, as they do in a steady state. An open loop's opens at
    ``opens_at``. It closes ``length_s`` later. Every request
    sent before it closes is counted until it ends, and the run sends on while any is in flight.
    Once none is (:meth:`done`), the requests still in flight, all sent after the window closed,
    are cut (``cut``, the requester's ``cut_in_flight``): their connections closed, which vLLM
    takes as an abort. Nothing of them lies inside
    the window, so waiting for their ends would only cost time (a whole request's lifetime).
    Sends are counted at their write (the records' ``sent_at``), not when a lane asks to send: a
    closed loop's lanes all ask at once and write one per loop turn (``requester.SendTurns``), so a request
    counts as inside the window by the same time its record has.
    """

    def __init__(
        self,
        length_s: float,
        lifetime_s: float | None,
        supply: int,
        turnover: int | None,
        opens_at: float | None,
        cut: Callable[[str], None],
    ) -> None:
        self.length_s, self.lifetime_s = length_s, lifetime_s  # the lifetime it was reckoned in; None: seconds
        self.supply = supply  # the measured requests: once all were sent, the requests ran out
        self.turnover, self.opened = turnover, opens_at
        self.sends = self.ends = 0
        self.waiting = 0  # requests sent before the window closed, not yet ended
        self.last_send = -math.inf
        self.cut = cut

    @property
    def closes(self) -> float:
        return math.inf if self.opened is None else self.opened + self.length_s

    def sent(self, at: float) -> bool:
        """A request was written at ``at``; True when the window waits for it to end. Its end is
        told to :meth:`ended` either way."""
        self.sends += 1
        self.last_send = at
        if at < self.closes:
            self.waiting += 1
            return True
        return False

    def ended(self, waited: bool) -> None:
        self.waiting -= waited
        self.ends += 1
        if self.opened is None and self.ends == self.turnover:
            self.opened = perf_counter()
        if waited and not self.waiting:
            self.done()

    def done(self) -> bool:
        """The window has closed and every request it waits for has ended: send no more, and cut
        the requests in flight."""
        if self.waiting or perf_counter() < self.closes:
            return False
        self.cut(MEASURED)  # once cut, nothing more is sent: the next calls find nothing in flight to cut
        return True

    def kept(self) -> KeptWindow | None:
        """The window measured; it closes at the last send where the requests ran out first. None where
        it never opened, or nothing was sent once it had."""
        if self.opened is None:
            return None
        ran_out = self.sends >= self.supply and self.last_send < self.closes
        if ran_out and self.last_send <= self.opened:  # nothing was sent once it opened: no window at all
            return None
        closed = self.last_send if ran_out else self.closes
        return KeptWindow(self.opened, closed, self.length_s, self.lifetime_s, ran_out)


def keeper_of(assignment: Assignment, start: float, lifetime_s: float | None, cut: Callable[[str], None]) -> WindowKeeper | None:
    """The measured phase's window keeper (``cut``: how it cuts the requests in flight once it is
    done), or None when the load is not time-bounded. A closed loop's
    window opens once its batch has turned over; an open loop's one lifetime after the measured
    phase starts, or at once after a ramp (whose requests are in flight already)."""
    window = assignment.options.window
    if window is None:
        return None
    length_s = window.length_s(lifetime_s)
    reckoned_in = lifetime_s if window.lifetimes is not None else None
    supply = sum(map(len, assignment.units))
    if isinstance(assignment.arrival, ClosedLoop):
        return WindowKeeper(length_s, reckoned_in, supply, min(assignment.arrival.concurrency, len(assignment.units)), None, cut)
    opens_at = start if assignment.ramp is not None else start + (lifetime_s or 0.0)
    return WindowKeeper(length_s, reckoned_in, supply, None, opens_at, cut)


def lifetime_of(warmup: Sequence[RequestRecord]) -> float | None:
    """A request's lifetime: the median end-to-end time of the warm-up's completed requests."""
    times = sorted(r.ended_at - r.sent_at for r in warmup if r.ok)
    return times[len(times) // 2] if times else None

"""A time-bounded load's measured window: how long it is asked to be, and what a run kept.

A workload that states a window (``window = "90s"`` or ``window = "4 lifetimes"``) is not bounded
by its request count. Its load runs until the batch is full and has turned over once (the first
wave, sent all at once into an empty batch, runs in step: every prefill together, then decoding
alone), measures for the window, and stops sending once every request sent inside the window has
ended. How each figure counts:

* **Throughput** is the tokens streamed inside the window, over its length (output tokens at
  their chunk's arrival, prompt tokens at the request's first token), so neither the ramp-up nor
  the drain-down tail enters it.
* **Latency and request counts** are those of the requests *sent* inside the window. Chosen by
  when they were sent, not by when they ended, so that long requests count as often as they
  occur: a rule of "ended inside the window" would drop the long requests in flight at its end
  and bias every percentile towards short ones. The load keeps the batch full until the last of
  them has ended, so each ran entirely under the window's load.
* The requests still in flight then were all sent after the window closed, so nothing of them
  lies inside it: they are cut (their connections closed, which vLLM takes as an abort) rather
  than waited for, which would cost up to a whole lifetime more (``RequestRecord.cut``; not a
  failure). The server may have counted a little more of them than the client read, so the
  token cross-check then allows what they could have added, and no more
  (:func:`~pytest_qwenperf.core.summary.cross_check`).

A run thus takes its warm-up, a lifetime for the batch to turn over, the window, and one
lifetime more for the requests sent last inside it to end.

A window in lifetimes is that many times a request's lifetime, the median end-to-end latency of
the warm-up's requests: a window of a few lifetimes sees each of the batch's slots turn over a
few times, whatever the lengths or the hardware. Where the workload's requests run out before
the window closes, the window kept is shorter than the one asked, and where they run out before
the batch has turned over no window opens; either way the run says so (a loss: ``window-short``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

_SPEC = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+)\s*(?P<unit>s|lifetimes?)\s*$")
EXPECTED = 'a positive number of seconds or of request lifetimes, e.g. "90s" or "4 lifetimes"'


@dataclass(frozen=True)
class Window:
    """The window a workload asks for: ``seconds`` or ``lifetimes``, exactly one of them."""

    seconds: float | None = None
    lifetimes: float | None = None

    def __post_init__(self) -> None:
        given = [value for value in (self.seconds, self.lifetimes) if value is not None]
        if len(given) != 1 or not (math.isfinite(given[0]) and given[0] > 0):
            raise ValueError(f"a window needs {EXPECTED}, got {self}")

    @classmethod
    def parse(cls, text: str) -> Window:
        """``"90s"``, ``"90 s"``, ``"4 lifetimes"`` or ``"1 lifetime"``; ValueError naming what is expected."""
        found = _SPEC.match(text) if isinstance(text, str) else None
        if found is None or float(found["number"]) <= 0:
            raise ValueError(f"expected {EXPECTED}, got {text!r}")
        number = float(found["number"])
        return cls(seconds=number) if found["unit"] == "s" else cls(lifetimes=number)

    def length_s(self, lifetime_s: float | None) -> float:
        """The window in seconds, ``lifetime_s`` being a request's lifetime (needed for lifetimes)."""
        if self.seconds is not None:
            return self.seconds
        if lifetime_s is None or not lifetime_s > 0:
            raise ValueError(f"a window of {self} needs a request lifetime from a warm-up, got {lifetime_s!r}")
        assert self.lifetimes is not None
        return self.lifetimes * lifetime_s

    def __str__(self) -> str:
        if self.seconds is not None:
            return f"{self.seconds:g}s"
        return f"{self.lifetimes:g} lifetime{'' if self.lifetimes == 1 else 's'}"


def windowed_fingerprint(fingerprint: str, window: Window | None) -> str:
    """A workload's fingerprint as measured over ``window``: its own without one, else another, as a
    window's figures are not a whole run's (no ramp-up or drain-down in them), nor another window's."""
    if window is None:
        return fingerprint
    return hashlib.sha256(f"{fingerprint} window {window}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class KeptWindow:
    """The window a run measured, on the client's clock: ``[opened, closed)``; ``asked_s`` the length
    asked for, ``lifetime_s`` the lifetime it was reckoned in (None: a window in seconds);
    ``ran_out``: the requests ran out before it closed, so it closed at the last send."""

    opened: float
    closed: float
    asked_s: float
    lifetime_s: float | None = None
    ran_out: bool = False

    @property
    def length_s(self) -> float:
        return self.closed - self.opened

    @property
    def span(self) -> tuple[float, float]:
        return (self.opened, self.closed)

    def short(self) -> str | None:
        """Why the window kept is shorter than the one asked (the requests ran out), or None."""
        if not self.ran_out:
            return None
        return (
            f"the workload's requests ran out {self.length_s:.1f} s into a window of {self.asked_s:.1f} s: "
            "raise its num_prompts, or shorten its window"
        )


def common(windows: Sequence[KeptWindow | None]) -> KeptWindow | None:
    """The window every client worker kept (their overlap; the requests ran out if they did for any
    worker), or None when one of them kept none (its window never opened) or they do not overlap.
    Every worker waited for its own requests sent before its window closed, so the requests sent
    inside the overlap have all ended. The workers start their measured phases together, so the
    overlap falls short of each window by how much later the last one's batch had turned over."""
    kept = [window for window in windows if window is not None]
    if not kept or len(kept) != len(windows):
        return None
    opened, closed = max(w.opened for w in kept), min(w.closed for w in kept)
    if closed <= opened:
        return None
    lifetimes = [w.lifetime_s for w in kept if w.lifetime_s is not None]
    return KeptWindow(
        opened,
        closed,
        max(w.asked_s for w in kept),
        max(lifetimes) if lifetimes else None,
        any(w.ran_out for w in kept),
    )

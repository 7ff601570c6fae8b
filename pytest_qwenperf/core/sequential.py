"""More repeats when the data cannot decide, without raising the false-alarm rate.

Judging a run after its first repeats, and again after each extra one, is several looks
at the same question. Testing every look at the full error rate would raise a false
alarm far more often than the confidence promises (each look is another chance for the
noise to cross the line). The plan spends the error rate ``alpha = 1 - confidence``
across the looks instead: a Lan-DeMets spending function of the Pocock type,
``alpha * ln(1 + (e - 1) * n / most)`` spent by the time ``n`` of at most ``most``
repeats are in, and each look judged at the confidence its increment leaves. By the
union bound the chance of a false alarm over all looks is at most ``alpha`` (half of it
on the regression side), whatever the correlation between looks; it is conservative,
which is the side a gate should err on.

Pocock's shape rather than O'Brien-Fleming's: it spends about half of ``alpha`` at the
first look, so a run that needs no extra repeat is judged nearly as sharply as without
the plan; O'Brien-Fleming's keeps almost everything for the last look, and the first
would be nearly blind.

With no extra repeat allowed (``most == first``) the single look gets the whole
``alpha``: the plain, non-sequential verdict.

Early looks (``least < first``): a point may also be judged before its planned repeats are in,
after ``least`` of them and after each one more, and stop there when every verdict is clearly
decided (``pass``, ``regression`` or ``improvement``: none undecided, none invalid). Those looks
spend :data:`EARLY_SHARE` of ``alpha`` between them, evenly, and the looks from ``first`` on the
rest by the spending above, so the union bound still holds over every look, and the planned look
loses little: its confidence is that of a plan without early looks at 90 % of ``alpha``. An early
look is thus judged at a high confidence: it stops a point only for a change, or a pass, that few
repeats already show beyond doubt (the simulation in ``benchmarks/early_stop.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_qwenperf.core.verdict import Later

EARLY_SHARE = 0.1
"""The share of the error rate the early looks, before the planned repeats are in, spend between them."""


@dataclass(frozen=True)
class SequentialPlan:
    """Looks after ``first`` repeats and after each extra one, up to ``most``; with ``least``, early
    looks after ``least`` repeats and each one more before ``first`` (None: no early look)."""

    confidence: float  # over all looks together
    first: int
    most: int
    least: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if not 1 <= self.first <= self.most:
            raise ValueError(f"repeats must satisfy 1 <= first <= most, got first={self.first}, most={self.most}")
        if self.least is not None and not 2 <= self.least <= self.first:
            raise ValueError(f"the earliest look must come after 2 to first={self.first} repeats, got least={self.least}")

    @property
    def earliest(self) -> int:
        """The repeats of the first look."""
        return self.first if self.least is None else self.least

    def early(self, repeats: int) -> bool:
        """Whether the look after ``repeats`` repeats comes before the planned ones are in."""
        return repeats < self.first

    @property
    def extra(self) -> int:
        """How many repeats the plan may add."""
        return self.most - self.first

    def spent(self, repeats: int) -> float:
        """The error rate spent once ``repeats`` repeats have been judged (0 before the first look)."""
        if repeats < self.earliest:
            return 0.0
        alpha = 1 - self.confidence
        early = EARLY_SHARE * alpha if self.earliest < self.first else 0.0
        if repeats < self.first:
            return early * (repeats - self.earliest + 1) / (self.first - self.earliest)
        if self.most == self.first:
            return alpha
        return early + (alpha - early) * math.log1p((math.e - 1) * min(repeats, self.most) / self.most)

    def later(self, repeats: int, *, both: bool = False) -> Later:
        """What the plan still allows after the look at ``repeats`` repeats (``both``: each side of a
        pair gains a repeat a look), for whether more repeats could settle a verdict."""
        return Later(max(0, self.most - repeats), both)

    def confidence_at(self, repeats: int) -> float:
        """The confidence the look after ``repeats`` repeats is judged at."""
        if not self.earliest <= repeats <= self.most:
            raise ValueError(f"no look after {repeats} repeats: the plan looks after {self.earliest} to {self.most}")
        return 1 - (self.spent(repeats) - self.spent(repeats - 1))

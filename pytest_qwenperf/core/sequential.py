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
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SequentialPlan:
    """Looks after ``first`` repeats and after each extra one, up to ``most``."""

    confidence: float  # over all looks together
    first: int
    most: int

    def __post_init__(self) -> None:
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if not 1 <= self.first <= self.most:
            raise ValueError(f"repeats must satisfy 1 <= first <= most, got first={self.first}, most={self.most}")

    @property
    def extra(self) -> int:
        """How many repeats the plan may add."""
        return self.most - self.first

    def spent(self, repeats: int) -> float:
        """The error rate spent once ``repeats`` repeats have been judged (0 before the first look)."""
        if repeats < self.first:
            return 0.0
        alpha = 1 - self.confidence
        if self.most == self.first:
            return alpha
        return alpha * math.log1p((math.e - 1) * min(repeats, self.most) / self.most)

    def confidence_at(self, repeats: int) -> float:
        """The confidence the look after ``repeats`` repeats is judged at."""
        if not self.first <= repeats <= self.most:
            raise ValueError(f"no look after {repeats} repeats: the plan looks after {self.first} to {self.most}")
        return 1 - (self.spent(repeats) - self.spent(repeats - 1))

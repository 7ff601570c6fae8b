"""Which release regressed: a binary search over the releases between a good and a bad one.

The search is a plain function of a ``step``: measure one release against the good one and say
whether it regressed (:class:`Step`). Each step measures the release and the good release side
by side in one session, repeats interleaved (:func:`~pytest_qwenperf.measure.sequential.measure_interleaved`),
so the good side is measured again at every step and the machine's drift between steps never
decides. The first step checks the bad release itself: if it did not regress against the good
one here, there is nothing to find and the search says so. Then the range halves until the
first regressed release is next to the last good one: at most ``ceil(log2(n - 1)) + 1`` steps
for ``n`` releases, the ends included.

Steps already measured (``done``, from an earlier run that was interrupted) are taken as they
are, so a rerun resumes where the last one stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One release measured against the good one: whether it regressed (a gated metric's verdict
    is ``regression``), the shown metric's figures, and the verdict table that says so."""

    version: str
    regressed: bool
    summary: str  # one line: the shown metric's change and verdict
    table: str = ""  # the rendered verdicts of every gated metric
    metric: str = ""  # the metric the summary and the plot show
    good: float | None = None  # its centre on the good release, measured in this step
    now: float | None = None  # its centre on this release
    ratio: float | None = None  # now / good
    tolerance: float | None = None
    repeats: int = 0  # load runs per side
    good_check: str = ""  # the good release's run of this step against its own reference (empty: not checked)
    good_slow: bool = False  # ... judged a regression there: this machine is slow even on the good release


@dataclass(frozen=True)
class Bisection:
    """The releases in order, the steps taken (in the order they were taken), and the first bad release (None: no regression)."""

    versions: tuple[str, ...]
    steps: tuple[Step, ...]
    first_bad: str | None
    last_good: str | None


def most_steps(n: int) -> int:
    """The most steps :func:`bisect` takes over ``n`` releases, the good and the bad one included."""
    return 1 + math.ceil(math.log2(n - 1)) if n > 2 else 1


def bisect(versions: Sequence[str], step: Callable[[str], Step], done: Mapping[str, Step] | None = None) -> Bisection:
    """The first release of ``versions`` (oldest first: the good one first, the bad one last) that regressed."""
    if len(versions) < 2:
        raise ValueError(f"a bisection needs a good and a bad release, got {list(versions)}")
    if len(set(versions)) != len(versions):
        raise ValueError(f"releases must be distinct, got {list(versions)}")
    known = dict(done or {})
    taken: list[Step] = []

    def measured(version: str) -> Step:
        if version not in known:
            known[version] = step(version)
        taken.append(known[version])
        return known[version]

    if not measured(versions[-1]).regressed:
        return Bisection(tuple(versions), tuple(taken), None, None)
    good, bad = 0, len(versions) - 1
    while bad - good > 1:
        middle = (good + bad) // 2
        if measured(versions[middle]).regressed:
            bad = middle
        else:
            good = middle
    return Bisection(tuple(versions), tuple(taken), versions[bad], versions[good])

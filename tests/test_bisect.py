"""The bisection's search over releases: exact on every position of the first bad release, within
its bound of steps, resumable; its measurement of real releases is in docs/bisect.md."""

from __future__ import annotations

import math

import pytest

from pytest_qwenperf.history.bisect import Step, bisect, most_steps


def releases(n: int) -> list[str]:
    return [f"0.{i}.0" for i in range(n)]


class Slowed:
    """A step that says every release from ``first_bad`` on regressed; the releases it measured, in order."""

    def __init__(self, versions: list[str], first_bad: int | None) -> None:
        self.regressed = set(versions[first_bad:]) if first_bad is not None else set()
        self.measured: list[str] = []

    def __call__(self, version: str) -> Step:
        self.measured.append(version)
        return Step(version, version in self.regressed, "")


@pytest.mark.parametrize("n", range(2, 34))
def test_the_first_bad_release_is_found_wherever_it_is_within_log2_n_plus_one_steps(n: int) -> None:
    versions = releases(n)
    for first_bad in range(1, n):
        step = Slowed(versions, first_bad)
        found = bisect(versions, step)
        assert (found.first_bad, found.last_good) == (versions[first_bad], versions[first_bad - 1])
        assert len(step.measured) == len(set(step.measured)) == len(found.steps) <= most_steps(n) <= math.ceil(math.log2(n)) + 1
        assert versions[0] not in step.measured  # the good release is the reference of every step, never a step


@pytest.mark.parametrize("n", [2, 3, 8, 17])
def test_without_a_regression_at_the_bad_end_the_search_reports_none_after_one_step(n: int) -> None:
    step = Slowed(releases(n), None)
    found = bisect(releases(n), step)
    assert found.first_bad is None and step.measured == [releases(n)[-1]]


def test_steps_already_measured_are_not_measured_again() -> None:
    versions = releases(9)
    first = Slowed(versions, 6)
    whole = bisect(versions, first)
    interrupted = {s.version: s for s in whole.steps[:2]}
    second = Slowed(versions, 6)
    resumed = bisect(versions, second, done=interrupted)
    assert resumed == whole
    assert second.measured == first.measured[2:]


@pytest.mark.parametrize(("versions", "message"), [(["0.1.0"], "needs a good and a bad release"), (["a", "b", "a"], "must be distinct")])
def test_bad_release_lists_are_refused(versions: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bisect(versions, Slowed(versions, None))

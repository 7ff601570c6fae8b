"""The reference a run is judged against when no baseline is stored for it: the history's recent
valid runs of the same identity, pooled as repeats.

Which runs: those the history store holds of the run's identity (hardware, model, suite, config,
argv, workload), valid, whose environment matches the run's in every field the suite's
``must_match`` names; after the latest confirmed change point of any gated metric's series (the
reference never reaches back across a step the history has confirmed, for the better or the
worse); the last ``window`` of them. Pooled (:func:`~pytest_qwenperf.core.combine.pooled`), they are a
baseline like a stored one, named ``history: 5 runs, 2026-11-20 → 25, vLLM 0.32.0``, and judged
with the same verdict rule.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pytest_qwenperf.core.combine import pooled
from pytest_qwenperf.core.environment import must_match_violations
from pytest_qwenperf.core.metrics import GATED
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import Judgement, SessionSpread, session_spread
from pytest_qwenperf.gate.baseline import Baseline, BaselineError, PooledBaseline, baseline_from_run, find_baseline
from pytest_qwenperf.gate.compare import RunSet
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore, SeriesPoint, is_url
from pytest_qwenperf.gate.judge import environment_differences, judge_run, reference_name
from pytest_qwenperf.gate.setups import RunKey
from pytest_qwenperf.history.changes import change_points
from pytest_qwenperf.suite.config import HISTORY_WINDOW


@dataclass(frozen=True)
class HistoryReference:
    """The runs a reference pools, oldest first, and where the window began."""

    runs: tuple[Run, ...]
    after_change: bool  # the window starts at a confirmed change point (not at the window's length)

    @property
    def name(self) -> str:
        """``history: 5 runs, 2026-11-20 → 25, vLLM 0.32.0``: what a verdict names as its reference."""
        dates = [run.context.started[:10] for run in self.runs if run.context.started]
        span = ""
        if dates:
            first, last = dates[0], dates[-1]
            shown_last = last[8:] if last[:8] == first[:8] else last
            span = f", {first}" if first == last else f", {first} → {shown_last}"
        versions = ", ".join(dict.fromkeys(run.context.vllm_version or "unknown" for run in self.runs))
        after = " since a change point" if self.after_change else ""
        return f"history: {len(self.runs)} run{'s' if len(self.runs) != 1 else ''}{after}{span}, vLLM {versions}"

    def baseline(self) -> PooledBaseline:
        """The pooled runs as the baseline a verdict names by :attr:`name`."""
        return PooledBaseline(**msgspec.structs.asdict(self.pooled("the history store")), name=self.name)

    def noise(self) -> dict[str, SessionSpread]:
        """How far these runs (each a session) differ, per gated metric that at least
        :data:`~pytest_qwenperf.core.verdict.MIN_SESSIONS` of them measured."""
        found = {name: session_spread(stored.samples, stored.sessions) for name, stored in self.pooled("").metrics.items()}
        return {name: spread for name, spread in found.items() if spread is not None}

    def pooled(self, source: str, git_commit: str | None = None) -> Baseline:
        """The runs as one baseline: every run's repeats are its samples, each run a session."""
        return baseline_from_run(pooled(self.runs, self.runs[-1], "runs of the history"), source=source, git_commit=git_commit)


@dataclass(frozen=True)
class References:
    """Where a run's reference is looked for: its stored baseline in ``baselines``, else its
    history reference, the last ``window`` valid runs in the store ``history`` (None: no store),
    else nothing. The one choice behind the session's verdicts, ``qwenperf compare --baselines``
    and ``qwenperf bisect``'s check of the good release."""

    baselines: Path
    history: str | None = None
    window: int = HISTORY_WINDOW

    def of(self, run: Run) -> Baseline | None:
        """What ``run`` is judged against (None: nothing). A baseline or store that cannot be read raises
        :class:`~pytest_qwenperf.gate.baseline.BaselineError`."""
        stored = find_baseline(self.baselines, run.identity.baseline())
        if stored is not None or self.history is None:
            return stored
        return history_baseline(self.history, run, self.window)

    def judged(self, run: Run) -> tuple[str, tuple[Judgement, ...]]:
        """``run``'s verdicts against :meth:`of` (``no-baseline`` without one) and the reference's name (empty: none)."""
        reference = self.of(run)
        return (reference_name(reference, run) if reference is not None else ""), judge_run(reference, run)


def history_baseline(where: str, run: Run, window: int) -> Baseline | None:
    """The history reference of ``run`` from the store at ``where``, as a baseline; None where no
    store was made yet or it holds no run that may serve. A store that cannot be read, or a
    machine without the change-point detection (the ``history`` extra), is a
    :class:`~pytest_qwenperf.gate.baseline.BaselineError`: the reference is unknown, not absent."""
    with reading(where) as store:
        found = history_reference(store, run, window) if store is not None else None
    return found.baseline() if found else None


@contextmanager
def reading(where: str) -> Iterator[HistoryStore | None]:
    """The store at ``where`` opened to read (None where none was made yet), its errors and a
    missing change-point detection raised as :class:`~pytest_qwenperf.gate.baseline.BaselineError`."""
    if not is_url(where) and not Path(where).exists():
        yield None
        return
    try:
        with HistoryStore.open(where, create=False) as store:
            yield store
    except HistoryError as exc:
        raise BaselineError(f"the history: {exc}") from None
    except ImportError as exc:
        raise BaselineError(
            f"the history's change points need the history extra ({exc}): pip install 'pytest-qwenperf[history]'"
        ) from None


def comparable_runs(store: HistoryStore, run: Run) -> list[Run]:
    """The valid runs ``store`` holds of ``run``'s identity whose environment matches ``run``'s in
    every field its suite's ``must_match`` names, in the order they started."""
    return [past for past in store.valid_runs(run.identity.baseline()) if _environment_matches(past, run)]


def history_reference(store: HistoryStore, run: Run, window: int) -> HistoryReference | None:
    """The reference for ``run`` from ``store``; None when the store holds no run that may serve."""
    return window_of(comparable_runs(store, run), window)


def window_of(matching: Sequence[Run], window: int) -> HistoryReference | None:
    """The reference drawn from ``matching`` (:func:`comparable_runs`, oldest first); None when empty."""
    if not matching:
        return None
    start = latest_level(matching)
    kept = matching[start:][-window:]
    return HistoryReference(tuple(kept), after_change=start > 0 and len(matching) - start <= window)


def _environment_matches(past: Run, run: Run) -> bool:
    return not must_match_violations(environment_differences(past.context.environment, run), run.must_match)


def latest_level(runs: Sequence[Run]) -> int:
    """Where the last level of ``runs`` begins: the index of the run after the latest confirmed
    change point of any gated metric (0 when there is none)."""
    start = 0
    for name, valued, points in gated_series(runs):
        for change in change_points(points, name):
            if change.confirmed:
                start = max(start, valued[change.index])
    return start


def gated_series(runs: Sequence[Run]) -> Iterator[tuple[str, list[int], list[SeriesPoint]]]:
    """Per gated metric: the indices of the ``runs`` with a value of it, and their series points
    (a change's index counts these runs). Each run's samples are read once."""
    samples = [run.gated_samples() for run in runs]
    for name in GATED:
        valued = [i for i, found in enumerate(samples) if found.get(name)]
        points = [
            SeriesPoint(str(i), runs[i].context.started, "", runs[i].context.vllm_version, samples[i][name]) for i in valued
        ]
        yield name, valued, points


@dataclass(frozen=True)
class Judged:
    """One point of a results file judged against its own reference: its verdicts (``no-baseline``
    where it has none) and the reference's name (empty: none)."""

    path: Path
    key: RunKey
    reference: str
    judgements: tuple[Judgement, ...]


def judged_files(sets: Sequence[RunSet], references: References) -> list[Judged]:
    """Every point of ``sets`` (``qwenperf compare --baselines``) judged as a session judges it."""
    found = []
    for run_set in sets:
        for key, run in run_set.runs.items():
            found.append(Judged(run_set.path, key, *references.judged(run)))
    return found

"""``qwenperf baseline promote``: a curated baseline file from the history's latest stable level.

For each machine, model and workload of the named config in the store, the runs that may serve
are those of the identity its latest valid run has, with that run's must-match environment
(:func:`~pytest_qwenperf.history.reference.comparable_runs`), since the latest confirmed change
point (:func:`~pytest_qwenperf.history.reference.latest_level`), the last ``last`` of them when
given. Pooled with each run a session, they are written through the same rules as
``--qwenperf-update-baselines`` (:func:`~pytest_qwenperf.gate.baseline.replace_baseline`): the
previous file's metrics move to its history, its tolerances are kept, published figures are
replaced only when asked. The provenance names the runs, their dates and vLLM versions, and the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.gate.baseline import BaselineError, BaselineRefused, project_commit, replace_baseline
from pytest_qwenperf.gate.history_store import HistoryStore, SeriesKey
from pytest_qwenperf.history.reference import HistoryReference, comparable_runs, latest_level


@dataclass(frozen=True)
class PromoteRequest:
    """What to promote: a config (its id or ``suite/id``), optionally one workload and one machine,
    the last ``last`` runs of the stable level (None: all of them), and whether published figures may go."""

    config: str
    workload: str | None = None
    hardware: str | None = None
    last: int | None = None
    replace_published: bool = False


@dataclass(frozen=True)
class Promoted:
    """What became of one series: its file, the reference it holds, why it was not written (None: written)."""

    key: SeriesKey
    path: Path | None
    reference: str
    refused: str | None = None


def promote(store: HistoryStore, root: Path, request: PromoteRequest) -> list[Promoted]:
    """Write a baseline under ``root`` for each machine x model x workload of ``request``'s config in ``store``."""
    seen = dict.fromkeys(
        SeriesKey(k.hardware, k.model, k.suite, k.config, k.workload, "")
        for k in store.keys(config=request.config, workload=request.workload)
        if request.hardware is None or k.hardware == request.hardware
    )
    done = []
    for key in seen:
        latest = store.latest_valid_run(key)
        if latest is None:
            done.append(Promoted(key, None, "", "no valid run in the history"))
            continue
        runs = comparable_runs(store, latest)
        start = latest_level(runs)
        kept = runs[start:][-request.last :] if request.last else runs[start:]
        reference = HistoryReference(tuple(kept), after_change=start > 0)
        source = f"qwenperf baseline promote: {reference.name} (from {store.where})"
        path = latest.identity.baseline().path(root)
        try:
            written = replace_baseline(
                root, reference.pooled(source, project_commit()), replace_published=request.replace_published
            )
        except (BaselineRefused, BaselineError) as exc:
            done.append(Promoted(key, path, reference.name, str(exc)))
        else:
            done.append(Promoted(key, written, reference.name))
    return done

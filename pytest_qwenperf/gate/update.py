"""Recording a session's runs (and its canary answers) as the baselines: when, which published figures may go,
and what became of each run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.core.canary import Canary
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.gate.baseline import BaselineError, BaselineRefused, PublishedBaselineKept, write_baseline
from pytest_qwenperf.gate.canary import canary_path, write_canary


@dataclass(frozen=True)
class BaselineOutcome:
    """What became of one run (or canary answer): its file, and why it was not written (None: written)."""

    config_key: str
    path: Path
    refused: str | None = None
    published_kept: bool = False  # refused only because the file holds published figures no one named


@dataclass(frozen=True)
class BaselineUpdate:
    """A session's baseline update: nothing is written when ``failed_tests`` > 0."""

    failed_tests: int
    outcomes: tuple[BaselineOutcome, ...] = ()


def update_baselines(
    root: Path,
    runs: Iterable[Run],
    *,
    failed_tests: int,
    replace_published: Sequence[str],
    source: str,
    canaries: Iterable[Canary] = (),
) -> BaselineUpdate:
    """Write each run as the baseline of its identity under ``root``, and each canary answer as
    its config's stored answer (:func:`~pytest_qwenperf.gate.canary.write_canary`), unless a test failed.

    A stored baseline of published figures is replaced only by the runs of a config whose key
    (e.g. ``b200/dp8``) ``replace_published`` names, or when it names the file itself; a refused run leaves its
    file untouched and the others still go ahead.
    """
    if failed_tests:
        return BaselineUpdate(failed_tests)
    named_files = {Path(name).resolve() for name in replace_published}
    outcomes = []
    for run in runs:
        config_key = run.config_key
        target = run.identity.baseline().path(root)
        replace = config_key in replace_published or target.resolve() in named_files
        try:
            path = write_baseline(root, run, source=source, replace_published=replace)
        except PublishedBaselineKept as exc:
            outcomes.append(BaselineOutcome(config_key, target, str(exc), published_kept=True))
        except (BaselineRefused, BaselineError) as exc:
            outcomes.append(BaselineOutcome(config_key, target, str(exc)))
        else:
            outcomes.append(BaselineOutcome(config_key, path))
    for answer in canaries:
        try:
            outcomes.append(BaselineOutcome(answer.config_key, write_canary(root, answer)))
        except (BaselineRefused, BaselineError) as exc:
            outcomes.append(BaselineOutcome(answer.config_key, canary_path(root, answer), str(exc)))
    return BaselineUpdate(0, tuple(outcomes))

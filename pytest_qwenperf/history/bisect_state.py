"""A bisection's state file: the question it answers and the steps measured so far.

Each step is written as soon as it is measured (atomically, the whole file), so a bisection that
is interrupted, or whose machine goes away, resumes with the steps it had: a step costs minutes
of two servers. The question (the versions in order, the config, the workload, the suite file's
content, the repeats) is kept with them; a state file that answers another question is refused,
not mixed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec

from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.history.bisect import Step

SCHEMA = "qwenperf-bisect/1"


class StateError(Exception):
    """A state file that cannot be read, or that belongs to another bisection."""


@dataclass(frozen=True)
class Question:
    """What a bisection measures: a state file's steps are reused only for the same question."""

    versions: tuple[str, ...]
    config: str
    workload: str
    suite_sha256: str
    repeats: int
    max_repeats: int
    side_by_side: bool


class _File(msgspec.Struct, frozen=True):
    schema: str
    question: Question
    steps: tuple[Step, ...] = ()


def load(path: Path, question: Question) -> dict[str, Step]:
    """The steps ``path`` holds for ``question`` by version (none when the file does not exist)."""
    if not path.exists():
        return {}
    try:
        found = msgspec.json.decode(path.read_bytes(), type=_File)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StateError(f"{path}: not a bisection state file ({SCHEMA}): {exc}") from None
    if found.schema != SCHEMA:
        raise StateError(f"{path}: schema {found.schema!r}, expected {SCHEMA!r}")
    if found.question != question:
        differs = [name for name, value in asdict(question).items() if getattr(found.question, name) != value]
        raise StateError(
            f"{path}: holds the steps of another bisection (it differs in {', '.join(differs)}); "
            "pass another --state, or delete the file to start over"
        )
    return {step.version: step for step in found.steps}


def save(path: Path, question: Question, steps: Mapping[str, Step] | Sequence[Step]) -> None:
    """Write every step measured so far, replacing the file as a whole."""
    listed = tuple(steps.values()) if isinstance(steps, Mapping) else tuple(steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, msgspec.json.format(msgspec.json.encode(_File(SCHEMA, question, listed)), indent=2).decode())

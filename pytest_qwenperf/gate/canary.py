"""Stored canary answers: what a config answered to the correctness canary, beside its baselines.

A config's answer lives at ``baselines/<hardware>/<model-slug>/<config>/canary.json`` (the path of
its identity, whose workload is :data:`~pytest_qwenperf.core.canary.CANARY`; suite files may not
name a workload so) and holds the answer (:class:`~pytest_qwenperf.core.canary.Canary`: identity,
context, prompts, every prompt's output) and ``history``: the context and fingerprint of each
answer it replaced, newest last.

It is written by ``--qwenperf-update-baselines`` with the baselines and by the same rules: atomically,
only from a session without failures, never over a file that cannot be read (it is reported,
naming the file, the field and what was expected), and never over the answer of another identity
(other hardware, model, vLLM flags or prompts): that is a new answer, whose file the old one must
be moved away for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec

from pytest_qwenperf.core.canary import Canary, fingerprint
from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.identity import Context, Text
from pytest_qwenperf.core.textfiles import read_text
from pytest_qwenperf.gate.baseline import BaselineError, BaselineRefused, decode_document, project_commit

SCHEMA = "qwenperf-canary/1"


class CanaryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """An answer the stored one replaced: where and with what it was given, and its fingerprint."""

    context: Context
    fingerprint: Text


class StoredCanary(msgspec.Struct, frozen=True, kw_only=True):
    schema: str = SCHEMA  # checked before the rest is read: see decode_canary
    answer: Canary
    history: tuple[CanaryEntry, ...]  # earlier answers, newest last


_Document = Annotated[StoredCanary, msgspec.Meta(description=f"a {SCHEMA} JSON document")]


def decode_canary(text: str | bytes, where: str) -> StoredCanary:
    """Check and convert a stored canary document; :class:`~pytest_qwenperf.gate.baseline.BaselineError`
    names ``where``, the field and what was expected.

    The schema name first, then what the schema states, then what it cannot: an answer for every
    prompt, and a fingerprint that is its outputs'."""
    stored = decode_document(text, where, SCHEMA, _Document)
    answer = stored.answer
    if len(answer.outputs) != len(answer.prompts):
        raise BaselineError(
            f"{where}: answer.outputs: expected one output per prompt ({len(answer.prompts)}), got {len(answer.outputs)}"
        )
    if answer.fingerprint != fingerprint(answer.outputs):
        raise BaselineError(
            f"{where}: answer.fingerprint: expected the fingerprint of its outputs ({fingerprint(answer.outputs)!r}), "
            f"got {show(answer.fingerprint)}"
        )
    return stored


def load_canary(path: Path) -> StoredCanary:
    """Read and check a stored canary file; errors name the file, the field and what was expected."""
    return decode_canary(read_text(Path(path), "canary file", f"a {SCHEMA} JSON document", BaselineError), str(path))


def canary_path(root: Path, answer: Canary) -> Path:
    """``root/<hardware>/<model-slug>/<config>/canary.json``."""
    return answer.identity.path(root)


def find_canary(root: Path, answer: Canary) -> StoredCanary | None:
    """The stored answer of ``answer``'s hardware, model and config under ``root`` (of whatever
    identity: judging says whether it is comparable); None when there is none yet."""
    path = canary_path(root, answer)
    return load_canary(path) if path.exists() else None


def write_canary(root: Path, answer: Canary, *, git_commit: str | None = None) -> Path:
    """Make ``answer`` the stored one for its config under ``root``; returns the file.

    The answer it replaces moves to ``history`` (its context and fingerprint). ``git_commit``
    defaults to :func:`~pytest_qwenperf.gate.baseline.project_commit`. Raises
    :class:`~pytest_qwenperf.gate.baseline.BaselineRefused` (the file is untouched) when the stored
    answer has another identity, and :class:`~pytest_qwenperf.gate.baseline.BaselineError` when the
    stored file cannot be read.
    """
    path = canary_path(root, answer)
    previous = load_canary(path) if path.exists() else None
    history: tuple[CanaryEntry, ...] = ()
    if previous is not None:
        differences = previous.answer.identity.differences(answer.identity)
        if differences:
            raise BaselineRefused(
                f"{path}: not updated: the answer is not comparable with the stored one (stored vs answer: "
                + "; ".join(differences)
                + "); move the file away to start a new one for the changed setup"
            )
        replaced = CanaryEntry(context=previous.answer.context, fingerprint=previous.answer.fingerprint)
        history = (*previous.history, replaced)
    stored = StoredCanary(
        answer=msgspec.structs.replace(answer, context=msgspec.structs.replace(answer.context, git_commit=git_commit or project_commit())),
        history=history,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(msgspec.to_builtins(stored), indent=2))
    return path

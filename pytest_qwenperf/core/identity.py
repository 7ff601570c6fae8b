"""What a run measured (identity) and where (context): the keys runs and baselines are matched by."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import msgspec

from pytest_qwenperf.core.apikey import redact_argv
from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.machine import Machine

Text = Annotated[str, msgspec.Meta(min_length=1)]
"""A non-empty string."""


def argv_digest(argv: Sequence[str]) -> str:
    """sha256 of the rendered vLLM argv as compact JSON (a list keeps argument boundaries).

    Of the argv with any ``--api-key`` value redacted: the key is not what was measured, so a
    new key leaves runs comparable with their baselines."""
    return hashlib.sha256(json.dumps(redact_argv(argv), separators=(",", ":")).encode()).hexdigest()


def slug(text: str) -> str:
    """A path component: ``Qwen/Qwen3.5-27B-FP8`` → ``Qwen--Qwen3.5-27B-FP8``, ``embedded:tiny`` → ``embedded-tiny``."""
    component = re.sub(r"[^A-Za-z0-9._-]+", "-", text.replace("/", "--")).strip("-")
    if not component.strip("."):
        raise ValueError(f"{text!r} does not make a file name")
    return component


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """What was measured; a run and a baseline compare only when these are equal."""

    hardware: Text
    model: Text
    suite: Text
    config: Text
    argv_sha256: Text
    workload: Text
    workload_fingerprint: Text

    def path(self, root: Path) -> Path:
        """``root/<hardware>/<model-slug>/<config>/<workload>.json``."""
        return root / slug(self.hardware) / slug(self.model) / slug(self.config) / f"{slug(self.workload)}.json"

    def differences(self, other: Identity) -> tuple[str, ...]:
        """``"field: 'mine' vs 'other'"`` for every field that differs."""
        return tuple(
            f"{name}: {getattr(self, name)!r} vs {getattr(other, name)!r}"
            for name in self.__struct_fields__
            if getattr(self, name) != getattr(other, name)
        )


class Context(msgspec.Struct, frozen=True, kw_only=True):
    """Where and with which versions a baseline was measured (or published)."""

    vllm_version: str | None = None
    machine: Machine | None = None  # None: not recorded
    date: str | None = None  # ISO 8601
    git_commit: str | None = None  # this project's commit that measured it
    environment: Environment | None = None  # what ran the server (None: not recorded)



"""What ``qwenperf doctor`` found: one row per check, and the report as JSON or as a table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import msgspec

from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.core.tables import format_table

DOCTOR_SCHEMA = "qwenperf-doctor/1"
"""One ``qwenperf doctor --json`` report."""

Status = Literal["ok", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail")  # in order of severity


@dataclass(frozen=True)
class Reading:
    """What one check read on one GPU (or on the machine): its status, the figure and what to do."""

    status: Status
    figure: str
    advice: str = ""


@dataclass(frozen=True)
class Check:
    """One row of the report. ``gpus``: the NVML indices it is about (empty: not about a GPU);
    ``values``: the figure as numbers, for the JSON (the limits of a suite are set from them)."""

    group: str
    name: str
    status: Status
    figure: str
    advice: str = ""
    gpus: tuple[int, ...] = ()
    values: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, group: str, name: str, reading: Reading, gpus: tuple[int, ...] = ()) -> Check:
        return cls(group, name, reading.status, reading.figure, reading.advice, gpus)

    @property
    def title(self) -> str:
        """The check's name, with the GPUs it is about."""
        return f"{self.name} [GPU {_index_ranges(self.gpus)}]" if self.gpus else self.name

    def as_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "name": self.name,
            "status": self.status,
            "figure": self.figure,
            "advice": self.advice,
            "gpus": list(self.gpus),
            "values": dict(self.values),
        }


def per_gpu(group: str, name: str, readings: Iterable[tuple[int, Reading]]) -> list[Check]:
    """One row per distinct reading: the GPUs that read the same share a row, so eight healthy GPUs are one line."""
    gpus: dict[Reading, list[int]] = {}
    for index, reading in readings:
        gpus.setdefault(reading, []).append(index)
    return [Check.of(group, name, reading, gpus=tuple(indices)) for reading, indices in gpus.items()]


@dataclass(frozen=True)
class DoctorReport:
    """Every check of one doctor run, on the machine it ran on, for a suite (or none)."""

    checks: tuple[Check, ...]
    suite: str | None  # the suite file's path
    machine: Machine
    machine_description: str

    @property
    def status(self) -> Status:
        """The worst status of any check."""
        return max((c.status for c in self.checks), key=STATUSES.index, default="ok")

    @property
    def exit_status(self) -> int:
        """1 when a check failed, else 0: warnings say what to look at, but the machine can run the suite."""
        return 1 if self.status == "fail" else 0

    def counts(self) -> dict[str, int]:
        found = Counter(c.status for c in self.checks)
        return {status: found[status] for status in STATUSES}

    def as_json(self) -> dict[str, object]:
        return {
            "schema": DOCTOR_SCHEMA,
            "suite": self.suite,
            "machine": msgspec.to_builtins(self.machine),
            "status": self.status,
            "counts": self.counts(),
            "checks": [json_safe(c.as_json()) for c in self.checks],
        }

    def table(self) -> str:
        rows = [(c.group, c.title, c.status.upper() if c.status != "ok" else c.status, c.figure, c.advice) for c in self.checks]
        suite = f", suite {self.suite}" if self.suite else ", no suite"
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items())
        lines = [
            f"qwenperf doctor: {self.machine_description}{suite}",
            "",
            *format_table(("group", "check", "status", "figure", "advice"), rows),
        ]
        return "\n".join([*lines, "", f"{counts}: {self.status}"])

    def markdown(self) -> str:
        """The table in GitHub-flavoured markdown (a CI job's summary), failures and warnings first."""
        order = sorted(self.checks, key=lambda c: -STATUSES.index(c.status))
        cells = [(c.group, c.title, f"**{c.status.upper()}**" if c.status != "ok" else "ok", c.figure, c.advice) for c in order]
        suite = f" for `{self.suite}`" if self.suite else ""
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items())
        lines = [f"### qwenperf doctor{suite}: {self.status}", "", f"{self.machine_description}; {counts}", ""]
        lines += ["| group | check | status | figure | advice |", "| --- | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(_cell(text) for text in row) + " |" for row in cells]
        return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _index_ranges(indices: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 5)`` → ``"0-3,5"``."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)

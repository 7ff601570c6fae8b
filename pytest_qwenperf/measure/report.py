"""The session's runs: kept for the tests that compare rungs, written as JSON (the terminal's
table of them is :mod:`~pytest_qwenperf.measure.session_table`).

Each run is kept with the verdicts decided as it was measured (against its baseline, or
against the reference's run when a candidate is measured, at the confidence of its last
look: :mod:`pytest_qwenperf.measure.sequential`) and why its baseline could not be read,
if it could not; the JSON holds the runs and each config's answer to the correctness canary
(:attr:`SessionReport.canaries`), the verdicts of each run and why a run regressed (what the
HTML report shows of a session on its own). A session that measures a
candidate keeps the reference's runs in a report of their own (:attr:`SessionReport.reference`),
written to a file of their own. The report is only added to, and holds immutable records (each
run, its verdicts, each canary answer); how often each server booted is the pool's count, given
when the JSON is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType

import msgspec

from pytest_qwenperf.core.canary import Canary, CanaryJudgement
from pytest_qwenperf.core.files import folder_lock, keep_aside, write_atomically
from pytest_qwenperf.core.formats import SESSION_SCHEMA, json_safe
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.diagnosis import Diagnosis
from pytest_qwenperf.gate.judge import references
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.sleep import TurnCounts
from pytest_qwenperf.suite.cost import PointCost, SessionPlan

SCHEMA = SESSION_SCHEMA


@dataclass(frozen=True)
class ServersSpent:
    """What a session's servers cost beside the measuring: how often each config's server booted and
    the seconds its boots took (the pool keeps both), and the turns its servers took on the GPUs
    through sleep mode (None: they took none)."""

    boots: Mapping[str, int] = field(default_factory=dict)
    boot_seconds: Mapping[str, float] = field(default_factory=dict)
    turns: TurnCounts | None = None


NOTHING_SPENT = ServersSpent()


class SessionReport:
    """Runs by (config key, workload id) with their verdicts, and each config's canary answer."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], Run] = {}
        self._judgements: dict[tuple[str, str], tuple[Judgement, ...]] = {}
        self._unreadable: dict[tuple[str, str], str] = {}
        self._diagnoses: dict[tuple[str, str], Diagnosis] = {}
        self.reference: SessionReport | None = None  # the reference's runs, when these are a candidate's
        self._canaries: dict[str, Canary] = {}
        self._canary_judgements: dict[str, CanaryJudgement] = {}
        self.plans: tuple[SessionPlan, ...] = ()  # what the session was planned to cost, per suite, before it started

    def planned(self, run: Run) -> PointCost | None:
        """The plan's cost of ``run``'s point (None: it was not planned)."""
        for found in self.plans:
            if found.suite == run.identity.suite:
                for point in found.points:
                    if (point.config, point.workload) == (run.identity.config, run.identity.workload):
                        return point
        return None

    @property
    def canaries(self) -> Mapping[str, Canary]:
        """By config key: what each config answered to the correctness canary."""
        return MappingProxyType(self._canaries)

    def add_canary(self, config_key: str, canary: Canary) -> None:
        self._canaries[config_key] = canary

    def add_canary_judgement(self, judged: CanaryJudgement) -> None:
        """Keep a config's canary answer as judged against its reference answer (the stored one, or the launcher's)."""
        self._canary_judgements[judged.config] = judged

    @property
    def runs(self) -> list[Run]:
        return list(self._runs.values())

    def get(self, config_key: str, workload_id: str) -> Run | None:
        return self._runs.get((config_key, workload_id))

    def add(
        self, run: Run, judgements: tuple[Judgement, ...] = (), *, unreadable: str | None = None, diagnosis: Diagnosis | None = None
    ) -> Run:
        """Keep ``run`` with its verdicts, naming the reference they were judged against; returns the
        run as kept. ``unreadable``: why its baseline file could not be read; ``diagnosis``: why it regressed."""
        key = (run.config_key, run.identity.workload)
        named = references(judgements)
        kept = self._runs[key] = msgspec.structs.replace(run, reference=", ".join(named)) if named else run
        self._judgements[key] = judgements
        if unreadable is not None:
            self._unreadable[key] = unreadable
        if diagnosis is not None:
            self._diagnoses[key] = diagnosis
        return kept

    def judgements(self, run: Run) -> tuple[Judgement, ...]:
        """The verdicts ``run`` was added with."""
        return self._judgements.get((run.config_key, run.identity.workload), ())

    def diagnosis(self, run: Run) -> Diagnosis | None:
        """Why ``run`` regressed against its reference, as it was added (None: it did not, or nothing was kept to tell)."""
        return self._diagnoses.get((run.config_key, run.identity.workload))

    def unreadable(self, run: Run) -> str | None:
        """Why the baseline of ``run`` could not be read (None: it could, or there is none)."""
        return self._unreadable.get((run.config_key, run.identity.workload))

    def as_json(self, servers: ServersSpent = NOTHING_SPENT) -> dict[str, object]:
        """The session's JSON, with what its ``servers`` cost beside the measuring. Each plan's points
        carry what they took (``elapsed_s``, None where not measured), beside what they were planned to take."""
        return {
            "schema": SCHEMA,
            "machine": msgspec.to_builtins(detect().machine()),
            "boots": dict(servers.boots),
            "boot_seconds": dict(servers.boot_seconds),
            "turns": asdict(servers.turns) if servers.turns is not None else None,
            "plans": [self._plan_json(found) for found in self.plans],
            "runs": [msgspec.to_builtins(run) for run in self.runs],
            "canaries": [msgspec.to_builtins(canary) for canary in self.canaries.values()],
            "canary_verdicts": [msgspec.to_builtins(judged) for judged in self._canary_judgements.values()],
            "verdicts": [
                {
                    "suite": run.identity.suite,
                    "config": run.identity.config,
                    "workload": run.identity.workload,
                    "judgements": [msgspec.to_builtins(j) for j in self.judgements(run)],
                    "diagnosis": msgspec.to_builtins(self.diagnosis(run)),
                }
                for run in self.runs
                if self.judgements(run)
            ],
        }

    def _plan_json(self, found: SessionPlan) -> dict[str, object]:
        taken = {(run.identity.config, run.identity.workload): run.elapsed_s for run in self.runs if run.identity.suite == found.suite}
        return {**found.as_json(), "points": [{**point.as_json(), "elapsed_s": taken.get((point.config, point.workload))} for point in found.points]}

    def write_json(self, path: Path, servers: ServersSpent = NOTHING_SPENT) -> Path | None:
        """:meth:`as_json` written by :func:`write_session_json`."""
        return write_session_json(path, self.as_json(servers))


def write_session_json(path: Path, data: Mapping[str, object]) -> Path | None:
    """Write a session's JSON atomically; an existing file is kept under a name of its own (see
    :func:`~pytest_qwenperf.core.files.keep_aside`), which is returned.

    Writers of the same path are serialized by a lock on its folder, so sessions that
    finish at the same moment all keep their results: the last as the file, the others
    as kept copies.
    """
    text = json.dumps(json_safe(data), indent=2, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(path.parent):
        kept = keep_aside(path) if path.exists() else None
        write_atomically(path, text)
    return kept

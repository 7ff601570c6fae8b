"""The session's runs: kept for the tests that compare rungs, printed as a table, written as JSON.

Each run is kept with the verdicts decided as it was measured (against its baseline, or
against the reference's run when a candidate is measured, at the confidence of its last
look: :mod:`pytest_qwenperf.measure.sequential`) and why its baseline could not be read,
if it could not; the JSON holds the runs and each config's answer to the correctness canary
(:attr:`SessionReport.canaries`), not the verdicts. A session that measures a
candidate keeps the reference's runs in a report of their own (:attr:`SessionReport.reference`),
written to a file of their own.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec

from pytest_qwenperf.core.canary import Canary
from pytest_qwenperf.core.files import folder_lock, keep_aside, write_atomically
from pytest_qwenperf.core.formats import SESSION_SCHEMA, json_safe
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import Judgement, format_mde
from pytest_qwenperf.gate.judge import losses
from pytest_qwenperf.serving.hardware import detect

SCHEMA = SESSION_SCHEMA


class SessionReport:
    """Runs by (config key, workload id) with their verdicts, and how often each config booted."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], Run] = {}
        self._judgements: dict[tuple[str, str], tuple[Judgement, ...]] = {}
        self._unreadable: dict[tuple[str, str], str] = {}
        self.boots: Counter[str] = Counter()
        self.reference: SessionReport | None = None  # the reference's runs, when these are a candidate's
        self.canaries: dict[str, Canary] = {}  # by config key: what each config answered to the correctness canary

    @property
    def runs(self) -> list[Run]:
        return list(self._runs.values())

    def get(self, config_key: str, workload_id: str) -> Run | None:
        return self._runs.get((config_key, workload_id))

    def add(self, run: Run, judgements: tuple[Judgement, ...] = (), *, unreadable: str | None = None) -> None:
        """Keep ``run`` with its verdicts; ``unreadable``: why its baseline file could not be read."""
        key = (run.config_key, run.identity.workload)
        self._runs[key] = run
        self._judgements[key] = judgements
        if unreadable is not None:
            self._unreadable[key] = unreadable

    def judgements(self, run: Run) -> tuple[Judgement, ...]:
        """The verdicts ``run`` was added with."""
        return self._judgements.get((run.config_key, run.identity.workload), ())

    def unreadable(self, run: Run) -> str | None:
        """Why the baseline of ``run`` could not be read (None: it could, or there is none)."""
        return self._unreadable.get((run.config_key, run.identity.workload))

    def table(self) -> list[str]:
        """One line per run: its figures, the repeats it added and the MDE of its output throughput
        verdict (``—`` where not judged); then how many points took extra repeats."""
        header = (
            f"{'config / workload':<48} {'out tok/s':>10} {'total tok/s':>11} {'TTFT p99':>9} {'TPOT p99':>9} {'ok':>5} "
            f"{'failed, all repeats':>19} {'extra':>5} {'out MDE':>7}"
        )
        lines = [header, "-" * len(header)]
        for run in self.runs:
            v = run.metrics
            name = f"{run.config_key} / {run.identity.workload}"
            mde = next((j.mde for j in self.judgements(run) if j.metric == "output_throughput"), None)
            lines.append(
                f"{name:<48} {v['output_throughput']:>10.1f} {v['total_token_throughput']:>11.1f} "
                f"{v['p99_ttft_ms']:>7.1f}ms {v['p99_tpot_ms']:>7.2f}ms {v['completed']:>5} {run.failed_requests:>19} "
                f"{run.extra_repeats:>5} {format_mde(mde):>7}"
                + _invalid(run)
            )
        extended = [run.extra_repeats for run in self.runs if run.extra_repeats]
        lines.append(
            f"extra repeats, taken while a verdict was noisy or underpowered: {len(extended)} of {len(self.runs)} point(s), "
            f"{sum(extended)} repeat(s) in all"
        )
        return lines

    def as_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "hardware": detect().as_dict(),
            "boots": dict(self.boots),
            "runs": [msgspec.to_builtins(run) for run in self.runs],
            "canaries": [msgspec.to_builtins(canary) for canary in self.canaries.values()],
        }

    def write_json(self, path: Path) -> Path | None:
        """Write atomically; an existing file is kept under a name of its own (see
        :func:`~pytest_qwenperf.core.files.keep_aside`), which is returned.

        Writers of the same path are serialized by a lock on its folder, so sessions that
        finish at the same moment all keep their results: the last as the file, the others
        as kept copies.
        """
        text = json.dumps(json_safe(self.as_json()), indent=2, sort_keys=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(path.parent):
            kept = keep_aside(path) if path.exists() else None
            write_atomically(path, text)
        return kept


def _invalid(run: Run) -> str:
    """A run's reasons to be invalid, as the end of its line (the detail is with its verdicts)."""
    found = losses(run)
    return "  INVALID: " + ", ".join(loss.reason for loss in found) if found else ""

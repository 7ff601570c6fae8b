"""The session's runs: kept for the tests that compare rungs, printed as a table, written as JSON."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec

from pytest_qwenperf.core.files import folder_lock, keep_aside, write_atomically
from pytest_qwenperf.core.formats import SESSION_SCHEMA, json_safe
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.serving.hardware import detect

SCHEMA = SESSION_SCHEMA


class SessionReport:
    """Runs by (config key, workload id), and how often each config booted."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], Run] = {}
        self.boots: Counter[str] = Counter()

    @property
    def runs(self) -> list[Run]:
        return list(self._runs.values())

    def get(self, config_key: str, workload_id: str) -> Run | None:
        return self._runs.get((config_key, workload_id))

    def add(self, run: Run) -> None:
        self._runs[(run.config_key, run.identity.workload)] = run

    def table(self) -> list[str]:
        header = f"{'config / workload':<48} {'out tok/s':>10} {'total tok/s':>11} {'TTFT p99':>9} {'TPOT p99':>9} {'ok':>5} {'failed, all repeats':>19}"
        lines = [header, "-" * len(header)]
        for run in self.runs:
            v = run.metrics
            name = f"{run.config_key} / {run.identity.workload}"
            lines.append(
                f"{name:<48} {v['output_throughput']:>10.1f} {v['total_token_throughput']:>11.1f} "
                f"{v['p99_ttft_ms']:>7.1f}ms {v['p99_tpot_ms']:>7.2f}ms {v['completed']:>5} {run.failed_requests:>19}"
                + (f"  CLIENT-BOUND: {run.client_bound}" if run.client_bound else "")
            )
        return lines

    def as_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "hardware": detect().as_dict(),
            "boots": dict(self.boots),
            "runs": [msgspec.to_builtins(run) for run in self.runs],
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

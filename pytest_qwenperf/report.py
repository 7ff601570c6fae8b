"""The session's runs: kept for the tests that compare rungs, printed as a table, written as JSON."""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from pytest_qwenperf.hardware import detect
from pytest_qwenperf.run import RunResult

SCHEMA = "qwenperf-session/1"


class SessionReport:
    """Runs by (config key, workload id), and how often each config booted."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], RunResult] = {}
        self.boots: Counter[str] = Counter()

    @property
    def runs(self) -> list[RunResult]:
        return list(self._runs.values())

    def get(self, config_key: str, workload_id: str) -> RunResult | None:
        return self._runs.get((config_key, workload_id))

    def add(self, result: RunResult) -> None:
        self._runs[(result.config.key, result.workload.id)] = result

    def table(self) -> list[str]:
        header = f"{'config / workload':<48} {'out tok/s':>10} {'total tok/s':>11} {'TTFT p99':>9} {'TPOT p99':>9} {'ok':>5} {'failed':>6}"
        lines = [header, "-" * len(header)]
        for run in self.runs:
            v = run.summary.values()
            name = f"{run.config.key} / {run.workload.id}"
            lines.append(
                f"{name:<48} {v['output_throughput']:>10.1f} {v['total_token_throughput']:>11.1f} "
                f"{v['p99_ttft_ms']:>7.1f}ms {v['p99_tpot_ms']:>7.2f}ms {v['completed']:>5} {v['failed']:>6}"
                + (f"  CLIENT-BOUND: {run.client_bound}" if run.client_bound else "")
            )
        return lines

    def as_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "hardware": detect().as_dict(),
            "boots": dict(self.boots),
            "runs": [run.as_json() for run in self.runs],
        }

    def write_json(self, path: Path) -> Path | None:
        """Write atomically; an existing file is kept under a timestamped name, which is returned."""
        text = json.dumps(json_safe(self.as_json()), indent=2, sort_keys=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = None
        if path.exists():
            stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(path.stat().st_mtime))
            kept = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
            os.replace(path, kept)
        write_atomically(path, text)
        return kept


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same folder, fsync, rename: readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_safe(value: object) -> object:
    """JSON has no inf/nan: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value

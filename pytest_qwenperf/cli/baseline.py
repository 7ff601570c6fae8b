"""``qwenperf baseline promote``: a baseline file from a history store's latest stable level;
``qwenperf baseline list``: every stored baseline with its age, vLLM version, hardware and provenance."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.core.tables import format_table
from pytest_qwenperf.gate.baseline import Baseline, BaselineError, stored_baselines
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore
from pytest_qwenperf.gate.judge import day_of
from pytest_qwenperf.option_table import BY_NAME

HELP = "promote a history store's latest stable level to a baseline file, or list the stored baselines"
DESCRIPTION = (
    "`qwenperf baseline promote STORE --config ID` writes, for each machine, model and workload of the config in "
    "the history store, a baseline file from the valid runs since the latest confirmed change point (each run a "
    "session, so verdicts against it know how far this runner's sessions differ), with its provenance: the runs, "
    "their dates and vLLM versions, the store. It follows the rules of --qwenperf-update-baselines: the previous "
    "file's metrics move to its history, its tolerances are kept, a file of another identity is refused, and "
    "published figures are replaced only with --replace-published. `qwenperf baseline list` shows every stored "
    "baseline with its age, vLLM version, hardware, sessions and provenance; it writes nothing."
)
ERRORS: tuple[type[Exception], ...] = (HistoryError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("promote", "list"), help="promote a history store's level, or list the baselines")
    parser.add_argument("store", nargs="?", metavar="STORE", help="promote: an SQLite file or a postgresql:// URL")
    BY_NAME["baselines"].add(parser.add_argument, "baseline", default=Path("baselines"))
    parser.add_argument("--config", help="promote: the config (its id, or suite/id)")
    parser.add_argument("--workload", help="promote: only this workload")
    parser.add_argument("--hardware", help="promote: only this machine (its hardware id, as in the baselines folder)")
    parser.add_argument("--last", type=_positive, metavar="N", help="promote: only the last N runs of the stable level")
    parser.add_argument("--replace-published", action="store_true", help="promote: replace a file of published figures")
    parser.add_argument("--json", action="store_true", help="list: machine-readable output")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of runs >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of runs >= 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.store is not None:
            print(f"qwenperf: baseline list: unexpected argument {args.store!r} (list reads --baselines)", file=sys.stderr)
            return 2
        return _list(args.baselines, as_json=args.json)
    if args.store is None or args.config is None:
        print("qwenperf: baseline promote: expected STORE and --config ID", file=sys.stderr)
        return 2
    return _promote(args)


def _promote(args: argparse.Namespace) -> int:
    from pytest_qwenperf.history.promote import PromoteRequest, promote

    request = PromoteRequest(args.config, args.workload, args.hardware, args.last, args.replace_published)
    with HistoryStore.open(args.store, create=False) as store:
        done = promote(store, args.baselines, request)
    if not done:
        filters = ", ".join(
            f"--{n} {v}" for n, v in (("config", args.config), ("workload", args.workload), ("hardware", args.hardware)) if v
        )
        print(f"qwenperf: baseline promote: no series in {args.store} match {filters}", file=sys.stderr)
        return 2
    for outcome in done:
        where = f"{outcome.key.config_key} / {outcome.key.workload} on {outcome.key.hardware}"
        if outcome.refused:
            print(f"not promoted: {where}: {outcome.refused}")
        else:
            print(f"promoted {where} to {outcome.path}: {outcome.reference}")
    return 1 if any(outcome.refused for outcome in done) else 0


@dataclass(frozen=True)
class Listed:
    """One stored baseline as ``qwenperf baseline list`` shows it."""

    baseline: str  # <hardware>/<model>/<config>/<workload>
    age_days: int | None
    vllm_version: str | None
    hardware: str | None
    sessions: int | None  # the most sessions any metric pools (1: one session's repeats)
    provenance: str
    error: str | None = None  # why the file could not be read

    def cells(self) -> tuple[str, ...]:
        age = "—" if self.age_days is None else f"{self.age_days} d"
        return (self.baseline, age, self.vllm_version or "—", self.hardware or "—", str(self.sessions or "—"), self.provenance)


def _list(root: Path, *, as_json: bool) -> int:
    if not root.is_dir():
        print(f"qwenperf: baseline list: {root}: no baselines folder there", file=sys.stderr)
        return 2
    today = datetime.datetime.now(datetime.UTC).date()
    listed = [_listed(root, path, entry, today) for path, entry in stored_baselines(root)]
    if as_json:
        print(json.dumps({"schema": "qwenperf-baselines/1", "baselines": [dataclasses.asdict(b) for b in listed]}, indent=2))
    elif listed:
        print(
            "\n".join(
                format_table(("baseline", "age", "vLLM", "hardware", "sessions", "provenance"), [b.cells() for b in listed])
            )
        )
    else:
        print(f"no baselines under {root}")
    return 1 if any(b.error for b in listed) else 0


def _listed(root: Path, path: Path, entry: Baseline | BaselineError, today: datetime.date) -> Listed:
    name = str(path.relative_to(root).with_suffix(""))
    if isinstance(entry, BaselineError):
        return Listed(name, None, None, None, None, "unreadable", error=str(entry))
    context = entry.context
    recorded = day_of(context.date)
    age = (today - recorded).days if recorded else None
    sessions = max((len(m.sessions) for m in entry.metrics.values() if m.sessions), default=1)
    machine = context.machine or Machine()
    count = f"{machine.gpu_count}x " if machine.gpu_count else ""
    hardware = f"{count}{machine.gpu_name or machine.cpu_model or ''}".strip() or None
    return Listed(name, age, context.vllm_version, hardware, sessions, f"{entry.provenance.kind}: {entry.provenance.source}")

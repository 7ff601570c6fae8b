"""``qwenperf plan``: before anything runs, what a suite's session will cost (``--suite``), or the client
cores and machines a target load needs (``--output-throughput`` / ``--request-rate``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.options import (
    DEFAULT_HISTORY,
    positive_minutes,
    positive_rate,
    positive_tokens_rate,
    tokens_per_chunk,
    whole_number,
)
from pytest_qwenperf.core.tables import format_duration
from pytest_qwenperf.gate.history_store import HistoryError
from pytest_qwenperf.loadgen.sizing import need
from pytest_qwenperf.serving.hardware import Hardware, detect
from pytest_qwenperf.serving.placement import missing_gpus, missing_hardware
from pytest_qwenperf.suite.config import Suite, SuiteError, load_suite
from pytest_qwenperf.suite.cost import Point, PointCost, SessionPlan, planned, points_of
from pytest_qwenperf.suite.traces import TraceError

HELP = "what a suite's session will cost (--suite), or how many client cores and machines a target load needs"
DESCRIPTION = (
    "With --suite: per config x workload its source of throughput (the history's runs, the suite's expected figure, "
    "a floor as a bound, or none), warm-up, time per repeat, repeats planned and at most and a search's probes; one boot "
    "per config; the totals as wall time and GPU-hours (a CPU suite's are 0). Reads the history store, never creates "
    "one. --fail-over MINUTES exits 1 when the worst case is over it (or a point cannot be timed). "
    "With --output-throughput or --request-rate: the client cores a load needs: its requests/s times the client's CPU "
    "per request, plus its streamed chunks/s times the CPU per chunk, both as measured in benchmarks/README.md, each "
    "core planned at most half busy."
)


class PlanError(ValueError):
    """The command line mixes the two plans or misses what one needs."""


ERRORS: tuple[type[Exception], ...] = (PlanError, SuiteError, HistoryError, TraceError)


SESSION = {
    "config": "--config",
    "workload": "--workload",
    "tier": "--tier",
    "candidate": "--candidate",
    "history": "--history",
    "json": "--json",
    "fail_over": "--fail-over",
}
TARGET = {
    "output_throughput": "--output-throughput",
    "request_rate": "--request-rate",
    "output_len": "--output-len",
    "tokens_per_chunk": "--tokens-per-chunk",
    "cores_per_node": "--cores-per-node",
}
"""Each plan's options, by their ``args`` name: one plan's may not come with the other."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    session = parser.add_argument_group("a suite's session")
    session.add_argument("--suite", type=Path, metavar="SUITE", help="the suite file whose session to plan")
    session.add_argument("--config", action="append", metavar="ID", help="only this config (repeatable)")
    session.add_argument("--workload", action="append", metavar="ID", help="only this workload (repeatable)")
    session.add_argument(
        "--tier",
        choices=("nightly", "weekly"),
        help="the nightly run's points (-m \"<hardware> and not weekly\"), or the weekly run's: all (the default)",
    )
    session.add_argument(
        "--candidate",
        action="store_true",
        help="a session that measures a candidate vLLM beside the launcher's (--qwenperf-candidate): each config boots "
        "twice, each repeat is taken on both sides (taking turns through sleep mode on a GPU suite); the MDE is the "
        "pair's, and 'legs MDE' gives the same repeats measured in two sessions apart",
    )
    session.add_argument(
        "--history",
        metavar="PATH_OR_URL",
        help=f"the history store to time points by (default {DEFAULT_HISTORY} where it exists)",
    )
    session.add_argument("--json", action="store_true", help="machine-readable output (schema qwenperf-plan/1)")
    session.add_argument("--fail-over", type=positive_minutes, metavar="MINUTES", help="exit 1 when the worst case takes longer")
    target = parser.add_argument_group("client cores for a target load")
    rate = target.add_mutually_exclusive_group()
    rate.add_argument("--output-throughput", type=positive_tokens_rate, metavar="TOK/S", help="the target: output tokens per second")
    rate.add_argument("--request-rate", type=positive_rate, metavar="REQ/S", help="the target: requests per second")
    target.add_argument("--output-len", type=whole_number(1), help="output tokens per request (a mean)")
    target.add_argument("--tokens-per-chunk", type=tokens_per_chunk, help="tokens a streamed chunk carries (above 1 with MTP; default 1)")
    target.add_argument("--cores-per-node", type=whole_number(1), help="cores of one client machine: how many machines it takes")


def run(args: argparse.Namespace) -> int:
    if args.suite is not None:
        _refuse(args, TARGET, "the client sizing (--output-throughput, --request-rate)", "a suite's session (--suite)")
        return _session(args)
    _refuse(args, SESSION, "a suite's session (--suite)", "the client sizing")
    if args.output_throughput is None and args.request_rate is None:
        raise PlanError("one of the arguments --output-throughput --request-rate is required (or --suite SUITE, to plan a suite's session)")
    if args.output_len is None:
        raise PlanError("the argument --output-len is required with --output-throughput or --request-rate")
    rate = args.request_rate if args.request_rate is not None else args.output_throughput / args.output_len
    found = need(rate, args.output_len, args.tokens_per_chunk or 1.0)
    print("\n".join(found.lines(args.cores_per_node)))
    return 0


def _refuse(args: argparse.Namespace, options: dict[str, str], theirs: str, this: str) -> None:
    """A :class:`PlanError` naming the ``options`` given, which belong to the plan ``theirs``, not ``this``."""
    given = [flag for name, flag in options.items() if getattr(args, name) not in (None, False)]
    if given:
        raise PlanError(f"{', '.join(given)}: {'an option' if len(given) == 1 else 'options'} of {theirs}, not of {this}")


def _session(args: argparse.Namespace) -> int:
    suite = load_suite(args.suite)
    points = points_of(suite, args.config or (), args.workload or (), nightly=args.tier == "nightly")
    where = args.history if args.history is not None else str(DEFAULT_HISTORY) if DEFAULT_HISTORY.is_file() else None
    here = detect()
    skipped = _skipped_here(suite, points, here)
    points = tuple(point for point in points if point[0].id not in skipped)
    if not points:
        raise PlanError(f"{args.suite}: a session on this machine would skip every point: " + "; ".join(skipped.values()))
    # this machine's pace, where the suite states one and the session would run here
    machine = here.id if missing_gpus(suite, here) is None else None
    found = planned(suite, points, where, candidate=args.candidate, machine=machine)
    if args.json:
        print(json.dumps(json_safe({**found.as_json(), "history": where, "skipped": skipped}), indent=2))
    else:
        print("\n".join(table(found, where) + [f"skipped, as a session here skips it: {why}" for why in skipped.values()]))
    return _held(found, args.fail_over)


def _skipped_here(suite: Suite, points: Iterable[Point], here: Hardware) -> dict[str, str]:
    """The configs a session on this machine would skip, and why (a CPU flag it lacks, no nginx),
    where the session would run here: the plan is then of that session. A GPU suite planned away
    from its GPUs is planned whole, for the node it will run on."""
    if missing_gpus(suite, here) is not None:
        return {}
    found = {cfg.id: why for cfg, _ in points if (why := missing_hardware(suite, cfg, here))}
    return dict(sorted(found.items()))


def _held(found: SessionPlan, limit_min: float | None) -> int:
    """0 when the session's worst case is within ``limit_min`` minutes (or no limit is set), else 1 with a line."""
    if limit_min is None:
        return 0
    if found.untimed:
        names = ", ".join(f"{p.config}/{p.workload}" for p in found.untimed)
        print(f"qwenperf plan: cannot hold the session to --fail-over {limit_min:g} min: no figure times {names}", file=sys.stderr)
        return 1
    worst = f"{found.worst_s / 60:.1f} min"
    if found.worst_s > limit_min * 60:
        print(f"qwenperf plan: the worst case, {worst}, is over --fail-over {limit_min:g} min", file=sys.stderr)
        return 1
    print(f"qwenperf plan: the worst case, {worst}, is within --fail-over {limit_min:g} min", file=sys.stderr)
    return 0


def table(found: SessionPlan, history: str | None) -> list[str]:
    """The plan as text: a row per point, each search's probes, the boots, and the session's line."""
    configs = len(found.boots)
    lines = [
        f"{found.suite} ({found.path}): {len(found.points)} point(s) on {configs} config(s), "
        + (f"{found.gpus} GPU(s)" if found.gpus else "no GPU")
        + f"; history: {history or f'none ({DEFAULT_HISTORY} does not exist)'}",
        "",
    ]
    header = (
        f"{'config':<22} {'workload':<30} {'source':<16} {'tok/s':>15} {'warm-up':>8} {'measured':>9} "
        f"{'runs':>9} {'repeat':>9} {'repeats':>7} {'planned':>9} {'worst':>9} {'MDE':>6}"
    ) + (f" {'legs MDE':>8}" if found.pairing else "")
    lines += [header, "-" * len(header)]
    lines += [_row(point) + (f" {_percent(point.legs_mde):>8}" if found.pairing else "") for point in found.points]
    searches = [p for p in found.points if p.timing is not None and p.timing.probes is not None]
    if searches:
        lines += [
            "",
            (
                "searches (a repeat is one search, each after the first from the bracket the one before settled; "
                "planned a quarter of the way from its start to its highest load, at worst its longest probe):"
            ),
        ]
    for point in searches:
        assert point.timing is not None and point.timing.probes is not None
        probes = point.timing.probes
        lines.append(
            f"  {point.config} / {point.workload}: {probes.count} probes, then {probes.later} a repeat, planned at load {probes.load:g} "
            f"({format_duration(probes.planned_s)} each), at worst {format_duration(probes.worst_s)} each"
        )
    windowed = [p for p in found.points if p.timing is not None and p.timing.load_run.window_s is not None]
    if windowed:
        lines += ["", "windows (measured for the window, then one lifetime while the requests sent last inside it end):"]
    for point in windowed:
        assert point.timing is not None
        run = point.timing.load_run
        assert run.window_s is not None
        lifetime = "" if run.lifetime_s is None else f", a request's lifetime ≈ {format_duration(run.lifetime_s)}"
        out = "; its requests run out first: raise its num_prompts" if run.runs_out else ""
        lines.append(f"  {point.config} / {point.workload}: {format_duration(run.window_s)}{lifetime}{out}")
    spreads = {(p.spread, p.spread_from) for p in found.points if p.spread is not None}
    if spreads:
        lines += ["", f"MDE: the throughput MDE at the planned repeats, for repeats that spread by {_told(spreads)}"]
    if found.pairing is not None:
        lines += _pairing_lines(found)
    source = "the suite's boot_s" if found.boot_from == "suite" else "the default: the suite states no boot_s"
    sides = "" if found.pairing is None else " x 2 sides"
    lines += [
        "",
        f"boots: {configs}{sides} x {format_duration(found.boot_s)} ({source}) = {format_duration(found.boots_s)}",
        f"total: planned {format_duration(found.planned_s)}, at most {format_duration(found.worst_s)}",
        found.line(),
    ]
    return lines


def _pairing_lines(found: SessionPlan) -> list[str]:
    """What a session with a candidate adds: how the two take turns, and what the pair sees against two legs."""
    assert found.pairing is not None
    how = (
        f"taking turns through vLLM's sleep mode, {format_duration(found.pairing.turn_s)} a turn (an assumption) at each change of side"
        if found.pairing.turn_s
        else "both awake, side by side"
    )
    drifts = {(p.session_spread, p.session_spread_from) for p in found.points if p.session_spread is not None}
    legs = (
        f"legs MDE: the same repeats in two sessions apart, whose means also drift by {_told(drifts)}"
        if drifts
        else "legs MDE: not known: no history of 3 runs or more and no [suite] session_spread"
    )
    return [f"with a candidate: each repeat on both sides, alternating, {how}; MDE: the pair's, drift between sessions left out", legs]


def _told(spreads: Iterable[tuple[float, str | None]]) -> str:
    """``1.5% (the suite assumes), 2.1% (history)``: spreads and where each came from."""
    return ", ".join(sorted(f"{spread:.1%} ({'history' if kind == 'history' else 'the suite assumes'})" for spread, kind in spreads))


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _row(point: PointCost) -> str:
    timing, repeats = point.timing, f"{point.repeats}/{point.most_repeats}"
    head = f"{point.config:<22} {point.workload:<30} {point.source.label:<16}"
    mde = _percent(point.mde)
    if timing is None or point.planned_s is None or point.worst_s is None:
        return f"{head} {'—':>15} {'—':>8} {'—':>9} {'—':>9} {'—':>9} {repeats:>7} {'—':>9} {'—':>9} {mde:>6}"
    kind = "total" if timing.rate.metric == "total_token_throughput" else "output"
    runs = f"{timing.load_runs} probes" if timing.probes else str(timing.load_runs)
    return (
        f"{head} {f'{timing.rate.tokens_per_s:,.0f} {kind}':>15} {format_duration(timing.load_run.warmup_s):>8} "
        f"{format_duration(timing.load_run.measured_s):>9} {runs:>9} {format_duration(timing.repeat_s):>9} {repeats:>7} "
        f"{format_duration(point.planned_s):>9} {format_duration(point.worst_s):>9} {mde:>6}"
    )

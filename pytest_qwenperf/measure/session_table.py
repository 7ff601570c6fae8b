"""The session's table on the terminal: one line per run of the report, then the extra repeats
taken and the points whose history slid below its last good level."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.tables import format_duration
from pytest_qwenperf.core.verdict import format_mde
from pytest_qwenperf.gate.judge import losses
from pytest_qwenperf.measure.report import SessionReport


@dataclass(frozen=True)
class Column:
    """A column added to the table (``pytest_qwenperf_session_columns``): its header, and its cell
    of each run, right-aligned in ``width`` characters (a longer cell widens its row, not the column)."""

    header: str
    cell: Callable[[Run], str]
    width: int = 10


def session_table(report: SessionReport, columns: Sequence[Column] = ()) -> list[str]:
    """One line per run: its figures, the repeats it added and the MDE of its output throughput
    verdict (``—`` where not judged), then ``columns``; then how many points took extra repeats."""
    added = "".join(f" {column.header:>{column.width}}" for column in columns)
    header = (
        f"{'config / workload':<48} {'out tok/s':>10} {'total tok/s':>11} {'TTFT p99':>9} {'TPOT p99':>9} {'ok':>5} "
        f"{'failed, all repeats':>19} {'extra':>5} {'out MDE':>7} {'took (plan)':>15}{added}  vs"
    )
    lines = [header, "-" * len(header)]
    for run in report.runs:
        v = run.metrics
        name = f"{run.config_key} / {run.identity.workload}"
        mde = next((j.mde for j in report.judgements(run) if j.metric == "output_throughput"), None)
        lines.append(
            f"{name:<48} {v['output_throughput']:>10.1f} {v['total_token_throughput']:>11.1f} "
            f"{v['p99_ttft_ms']:>7.1f}ms {v['p99_tpot_ms']:>7.2f}ms {v['completed']:>5} {run.failed_requests:>19} "
            f"{run.extra_repeats:>5} {format_mde(mde):>7} {_took(report, run):>15}"
            + "".join(f" {column.cell(run):>{column.width}}" for column in columns)
            + f"  {run.reference or '—'}"
            + _invalid(run)
            + _slid(run)
        )
    extended = [run.extra_repeats for run in report.runs if run.extra_repeats]
    lines.append(
        f"extra repeats, taken while a verdict was noisy or underpowered: {len(extended)} of {len(report.runs)} point(s), "
        f"{sum(extended)} repeat(s) in all"
    )
    saved = [run.saved_repeats for run in report.runs if run.saved_repeats]
    if saved:
        lines.append(
            f"stopped early, every verdict decided before the planned repeats were in: {len(saved)} point(s), "
            f"{sum(saved)} repeat(s) saved"
        )
    retaken = retaken_line(report.runs)
    if retaken:
        lines.append(retaken)
    unsettled = sum(1 for run in report.runs if run.needs_sessions)
    if unsettled:
        lines.append(
            f"undecided where only more sessions can settle it, so no repeat was spent on it: {unsettled} point(s) "
            "(the reference's sessions differ too much, or the history holds too few runs to confirm a change)"
        )
    noise = noise_line(report)
    if noise:
        lines.append(noise)
    searched = [f"  {run.config_key} / {run.identity.workload}: {_capacity(run)}" for run in report.runs if run.capacity]
    if searched:
        lines.append("capacity at the SLO (the highest load meeting it; one search per repeat):")
        lines += searched
    replays = [
        f"  {run.config_key} / {run.identity.workload}: "
        + run.trace.describe(run)
        for run in report.runs
        if run.trace is not None
    ]
    if replays:
        lines.append("traces replayed:")
        lines += replays
    slid = [f"  {run.config_key} / {run.identity.workload}: {d.detail}" for run in report.runs for d in run.declines]
    if slid:
        lines.append("below the last good level in the history (a slide the reference slid with):")
        lines += slid
    return lines


def retaken_line(runs: Sequence[Run]) -> str | None:
    """How many load runs were measured again because the machine's other load spoiled them, and
    why (``core.validity.RETAKEN``); None where none was."""
    spoiled = [run for run in runs if run.retaken]
    if not spoiled:
        return None
    reasons = Counter(loss.reason for run in spoiled for loss in run.retaken)
    return (
        f"measured again, spoiled by the machine's other load: {sum(len(run.retaken) for run in spoiled)} load run(s) "
        f"of {len(spoiled)} of {len(runs)} point(s) ({', '.join(f'{reason} {n}' for reason, n in reasons.items())})"
    )


def noise_line(report: SessionReport, name: str = "output_throughput") -> str | None:
    """How this runner's noise compares with the tolerance, once for the session: the median
    spread of a point's repeats, how far the references' sessions differ where they know, and
    the median MDE of ``name``'s verdicts against its tolerance. None where nothing was judged."""
    judged = [(run, j) for run in report.runs for j in report.judgements(run) if j.metric == name and j.mde is not None]
    if not judged:
        return None
    spreads = [_cv((run.samples or {}).get(name) or ()) for run, _ in judged]
    known = [s for s in spreads if s is not None]
    between = [j.between for _, j in judged if j.between is not None]
    tolerances = sorted({j.tolerance for _, j in judged})
    tolerance = f"{tolerances[0]:.0%}" if len(tolerances) == 1 else f"{tolerances[0]:.0%}-{tolerances[-1]:.0%}"
    blind = sum(1 for _, j in judged if j.mde is not None and j.mde > j.tolerance)
    parts = [f"repeats spread {statistics.median(known):.1%} (median CV)" if known else "repeats: one each"]
    if between:
        parts.append(f"sessions differ by {statistics.median(between):.1%} (SD, {len(between)} history reference(s))")
    else:
        parts.append("how far sessions differ is not known (no reference of 3 or more runs)")
    mde = statistics.median(j.mde for _, j in judged if j.mde is not None)
    return (
        f"runner noise, {name}: {', '.join(parts)}; median MDE {format_mde(mde)} against a tolerance of {tolerance}: "
        f"{blind} of {len(judged)} point(s) could not see a change of the tolerance's size"
    )


def _cv(samples: Sequence[float | None]) -> float | None:
    values = [v for v in samples if v is not None]
    if len(values) < 2 or not statistics.fmean(values):
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def _capacity(run: Run) -> str:
    """A search workload's capacity: each search's, with its interval, binding term and probes."""
    searches = []
    for search in run.capacity:
        if search.load is None:
            searches.append(f"none: {search.none_met} ({len(search.probes)} probes)")
            continue
        interval = f" [{search.interval[0]:.3g}, {search.interval[1]:.3g}]" if search.interval else ""
        edges = {"above-highest": ", at the highest load searched", "above-probed": ", at the highest load probed before the probes ran out"}
        edge = edges.get(search.bound, "")
        cliff = ", a cliff" if search.cliff else ""
        searches.append(f"{search.load:.3g}{interval} ({search.binding or 'no term'} binds{cliff}{edge}, {len(search.probes)} probes)")
    return f"{run.capacity[0].unit}: " + "; ".join(searches)


def _took(report: SessionReport, run: Run) -> str:
    """How long measuring the point took, and what the session's plan said it would: ``52 s (48 s)``."""
    point = report.planned(run)
    took = "—" if run.elapsed_s is None else format_duration(run.elapsed_s)
    return took if point is None or point.planned_s is None else f"{took} ({format_duration(point.planned_s)})"


def _slid(run: Run) -> str:
    return "  SLID: " + ", ".join(d.metric for d in run.declines) if run.declines else ""


def _invalid(run: Run) -> str:
    """A run's reasons to be invalid, as the end of its line (the detail is with its verdicts)."""
    found = losses(run)
    return "  INVALID: " + ", ".join(loss.reason for loss in found) if found else ""

"""How a comparison of result files is shown: the table (plain or markdown), the JSON
(``schema`` :data:`SCHEMA`) and the plot. What is compared, and how, is :mod:`pytest_qwenperf.gate.compare`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import msgspec

from pytest_qwenperf.core.canary import CanaryJudgement
from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.tables import format_table
from pytest_qwenperf.core.verdict import COMPARED, MIN_SESSIONS, Judgement, Verdict, format_mde, format_value
from pytest_qwenperf.gate.compare import CompareError, Comparison, Group, Row
from pytest_qwenperf.gate.compare_profiles import profiles_json, render_profiles
from pytest_qwenperf.gate.diagnosis import RANKING, Diagnosis
from pytest_qwenperf.gate.judge import environment_notes
from pytest_qwenperf.gate.pareto import ParetoPoint, by_rung, frontier
from pytest_qwenperf.gate.setups import BENCH_KEY

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SCHEMA = "qwenperf-compare/1"
REFERENCES_SCHEMA = "qwenperf-compare-references/1"  # --baselines: each point against its own reference

_ON_THE_NUMBERS: tuple[Verdict, ...] = ("pass", "regression", "improvement", "noisy", "underpowered")
"""Verdicts decided on the numbers: theirs is the MDE a cell shows (an invalid run's spread is no power)."""

def _delta(row: Row, index: int) -> str:
    judgement = row.judgements[index - 1]
    if judgement is not None:
        return "—" if judgement.ratio is None else f"{judgement.ratio - 1:+.1%}"
    first, now = row.values[0], row.values[index]
    return f"{now / first - 1:+.1%}" if first and now is not None else ""


def _verdict_cell(judgement: Judgement | None, markdown: bool) -> str:
    """The verdict, with its MDE where the spread gives one: ``pass (MDE 3.2%)``."""
    if judgement is None:
        return ""
    label = f"**{judgement.label}**" if markdown and judgement.verdict not in ("pass", "improvement") else judgement.label
    mde = _mde(judgement)
    return label if mde is None else f"{label} (MDE {format_mde(mde)})"


def _mde(judgement: Judgement) -> float | None:
    return judgement.mde if judgement.verdict in _ON_THE_NUMBERS else None


def render(comparison: Comparison, *, markdown: bool = False) -> str:
    """The tables, each followed by the detail of every verdict that is not a pass (metrics with the
    same verdict and detail on one line) and the likely causes where a file's verdicts include a
    regression or a changed output, then how many verdicts rest on one session's repeats, then a
    line counting every verdict."""
    labels = comparison.labels
    header = ["metric", labels[0]]
    for label in labels[1:]:
        header += [label, "Δ", "verdict"]
    lines: list[str] = []
    for group in comparison.groups:
        lines += [f"### {group.title}", ""] if markdown else [group.title]
        rows = []
        for row in group.rows:
            cells = [f"{row.metric} ({row.unit})" if row.unit else row.metric, format_value(row.values[0])]
            for i in range(1, len(labels)):
                cells += [format_value(row.values[i]), _delta(row, i), _verdict_cell(row.judgements[i - 1], markdown)]
            rows.append(cells)
        lines += format_table(header, rows, markdown=markdown)
        same: dict[tuple[str, str, str], list[str]] = {}
        for row in group.rows:
            for label, j in zip(labels[1:], row.judgements, strict=True):
                if j is not None and j.verdict != "pass":
                    same.setdefault((label, j.label, j.detail), []).append(row.metric)
        notes = [f"{label}: {', '.join(names)}: {verdict}: {detail}" for (label, verdict, detail), names in same.items()]
        for i, label in enumerate(labels[1:]):
            judged = [j for row in group.rows if (j := row.judgements[i]) is not None]
            notes += [f"{label}: environment differs (allowed): {d}" for d in environment_notes(judged)]
        if notes:
            lines += [""] + ([f"- {note}" for note in notes] if markdown else notes)
        lines += _render_causes(group, labels, markdown)
        lines += render_profiles(group.profiles, labels, markdown)
        lines.append("")
    lines += _render_canaries(comparison, markdown)
    counts = comparison.verdicts()
    summary = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items())) or "nothing judged"
    alone = sum(1 for _, _, j in comparison.judgements() if j.verdict in COMPARED and j.between is None)
    if alone:
        lines.append(
            f"{alone} verdict(s) rest on the repeats of fewer than {MIN_SESSIONS} sessions: how far this runner's sessions "
            f"differ is unknown, and sessions can differ by more than their repeats (give each side as a directory of "
            f"session files, {MIN_SESSIONS} against one or 2 against 2 at least, or compare sessions recorded with a history)"
        )
    lines.append(f"verdicts against {labels[0]}: {summary}")
    return "\n".join(lines)


def _render_causes(group: Group, labels: Sequence[str], markdown: bool) -> list[str]:
    """Per later file that has them, the group's likely causes, numbered in the order of :data:`RANKING`."""
    lines = []
    for label, diagnosis in zip(labels[1:], group.diagnoses, strict=True):
        if diagnosis is None:
            continue
        what = f"likely causes in {label} against {labels[0]}"
        about = f"{', '.join(diagnosis.changed)} changed; ranked: {RANKING}"
        if markdown:
            lines += ["", f"**{what}** ({about}):", "", *diagnosis.lines()]
        else:
            lines += ["", f"{what} ({about}):", *(f"  {line}" for line in diagnosis.lines())]
    return lines


def _render_canaries(comparison: Comparison, markdown: bool) -> list[str]:
    """The canary answers' table (config; per later file: match rate, drift, verdict), then every
    verdict that is not a pass with its detail."""
    if not comparison.canaries:
        return []
    labels = comparison.labels
    title = f"canary answers (greedy, 8 prompts) against {labels[0]}"
    lines = [f"### {title}", ""] if markdown else [title]
    header = ["config"]
    for label in labels[1:]:
        header += [f"match rate ({label})", f"drift ({label})", f"verdict ({label})"]
    rows = []
    notes = []
    for row in comparison.canaries:
        cells = [row.config]
        for label, j in zip(labels[1:], row.judgements, strict=True):
            if j is None:
                cells += ["", "", ""]
                continue
            _, rate, drift, verdict = j.row()
            cells += [rate, drift, f"**{verdict}**" if markdown and verdict != "pass" else verdict]
            if j.verdict != "pass":
                notes.append(f"{label}: {row.config}: {j.verdict}: {j.detail}")
        rows.append(cells)
    lines += format_table(header, rows, markdown=markdown)
    if notes:
        lines += [""] + ([f"- {note}" for note in notes] if markdown else notes)
    return [*lines, ""]


def as_json(comparison: Comparison, pareto: Sequence[ParetoPoint] | None = None) -> dict[str, object]:
    """Every group, row, value and judgement: ``files`` in column order (the first is the
    reference), per row ``values`` one per file and ``judgements`` one per later file (null
    where a row is shown, not judged; ``mde`` a fraction of the baseline, null where unknown or the
    verdict is not decided on the numbers; ``interval`` the ratio's [low, high] at the verdict's
    confidence, null without a spread; ``between`` how far sessions differ, a fraction, null
    where fewer than 3 sessions and no history told it), and
    ``verdicts`` counted as the summary line does. ``canaries``: per config, one judgement of its
    canary answer per later file (null where the file has no answers), with the match rate, the
    drift and the floor. Per group, ``diagnoses``: one per later file, null unless its verdicts there
    include a regression or its config's canary answer changed, else the likely causes
    (:class:`~pytest_qwenperf.gate.diagnosis.Diagnosis`): ``changed`` (the metrics judged a
    regression, ``canary``) and ``causes`` in rank order, each with ``kind``, ``subject``, ``text``,
    ``figures`` (``name``, ``value``, ``unit``) and ``size`` (a telemetry move over the least it had
    to be; null for the other kinds, and where it is infinite: from or to zero, or repeats without
    spread). A group of bench results has no suite, config,
    workload or hardware (nulls) but ``setups``, one per file (null where a file has none). A group
    where a file's run has an operator profile has ``profiles`` and ``profile_changes``
    (:func:`~pytest_qwenperf.gate.compare_profiles.profiles_json`).
    ``pareto``, only where ``pareto`` points are given (``--pareto``): each point's file label,
    suite, config, workload, ``per_user`` and ``per_device`` output tok/s, ``device`` (``GPU`` or
    ``core``), ``source`` and whether it is on its column's ``frontier`` on its rung.
    JSON-safe (:func:`~pytest_qwenperf.core.formats.json_safe`), as every file this package writes."""
    labels = comparison.labels

    def judgement(label: str, j: Judgement | None) -> dict[str, object] | None:
        return None if j is None else {"file": label} | judgement_json(j)

    document = {
        "schema": SCHEMA,
        "files": [{"label": label, "path": str(path)} for label, path in zip(labels, comparison.paths, strict=True)],
        "groups": [
            _where(group)
            | {
                "rows": [
                    {
                        "metric": row.metric,
                        "unit": row.unit,
                        "values": list(row.values),
                        "judgements": [judgement(label, j) for label, j in zip(labels[1:], row.judgements, strict=True)],
                    }
                    for row in group.rows
                ],
                "diagnoses": [_diagnosis_json(label, d) for label, d in zip(labels[1:], group.diagnoses, strict=True)],
            }
            | (profiles_json(group.profiles, labels) if any(group.profiles) else {})
            for group in comparison.groups
        ],
        "canaries": [
            {"config": row.config, "judgements": [_canary_json(label, j) for label, j in zip(labels[1:], row.judgements, strict=True)]}
            for row in comparison.canaries
        ],
        "verdicts": dict(sorted(comparison.verdicts().items())),
    }
    if pareto is not None:
        document["pareto"] = _pareto_json(pareto)
    return cast(dict[str, object], json_safe(document))


def _pareto_json(points: Sequence[ParetoPoint]) -> list[dict[str, object]]:
    edges = {p for columns in by_rung(points).values() for mine in columns.values() for p in frontier(mine)}
    return [
        {"file": p.label, "suite": p.rung[0], "config": p.rung[1], "workload": p.workload, "per_user": p.per_user}
        | {"per_device": p.per_device, "device": p.device, "source": p.source, "frontier": p in edges}
        for p in points
    ]


def _diagnosis_json(label: str, diagnosis: Diagnosis | None) -> dict[str, object] | None:
    return None if diagnosis is None else {"file": label} | cast(dict[str, object], msgspec.to_builtins(diagnosis))


def _canary_json(label: str, j: CanaryJudgement | None) -> dict[str, object] | None:
    if j is None:
        return None
    found = j.found
    figures = {
        "match_rate": None if found is None else found.match_rate,
        "logprob_drift": None if found is None else found.logprob_drift,
        "first_mismatch": None if found is None else found.first_mismatch,
    }
    return {"file": label, "verdict": j.verdict, "detail": j.detail} | figures | {"floor": msgspec.to_builtins(j.floor)}


def judgement_json(j: Judgement) -> dict[str, object]:
    """One verdict as :func:`as_json` writes it (``metric`` added, for lists without rows)."""
    numbers = {key: getattr(j, key) for key in ("baseline", "now", "ratio", "tolerance", "direction", "between")} | {"mde": _mde(j)}
    numbers["interval"] = None if j.interval is None else list(j.interval)
    return {"metric": j.metric, "verdict": j.verdict, "reason": j.reason or None, "detail": j.detail} | numbers


def _where(group: Group) -> dict[str, object]:
    """A group's suite, config, workload and hardware; the setups, where it has bench results."""
    bench = group.key == BENCH_KEY
    where: dict[str, object] = dict(zip(("suite", "config", "workload"), (None,) * 3 if bench else group.key, strict=True))
    where["hardware"] = None if bench else group.hardware
    if group.setups:
        where["setups"] = [None if setup is None else setup.as_json() for setup in group.setups]
    return where


def plot_throughput(comparison: Comparison, path: Path) -> None:
    """A PNG of total tok/s per rung, one bar per file, one panel per workload."""
    by_workload: dict[str, list[Group]] = {}
    for group in comparison.groups:
        by_workload.setdefault("bench results" if group.key == BENCH_KEY else group.key[2], []).append(group)
    labels = comparison.labels
    figure = _figure("--plot", max(6.0, 1.2 * max(len(g) for g in by_workload.values()) * len(labels)), 3.5 * len(by_workload))
    axes = figure.subplots(len(by_workload), 1, squeeze=False)[:, 0]
    width = 0.8 / len(labels)
    for ax, (workload, groups) in zip(axes, by_workload.items(), strict=True):
        for j, label in enumerate(labels):
            heights = [math.nan if g.throughput[j] is None else g.throughput[j] for g in groups]
            ax.bar([x - 0.4 + (j + 0.5) * width for x in range(len(groups))], heights, width, label=label)
        ticks = ["bench" if g.key == BENCH_KEY else f"{g.key[0]}/{g.key[1]}" for g in groups]
        ax.set_xticks(range(len(groups)), ticks, rotation=15, ha="right")
        ax.set_ylabel("total tok/s")
        ax.set_title(workload)
        ax.legend(title="vLLM", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    _save(figure, path)


def plot_pareto(points: Sequence[ParetoPoint], path: Path) -> None:
    """A PNG of :func:`pareto_figure`."""
    _save(pareto_figure(points), path)


def pareto_figure(points: Sequence[ParetoPoint]) -> Figure:
    """One chart per rung: output tok/s per device against per user, every point coloured by its
    column, each column's points joined along its Pareto frontier. Up to 3 charts a row."""
    rungs = by_rung(points)
    if not rungs:
        raise CompareError("--pareto: the inputs hold no runs to plot")
    labels = list(dict.fromkeys(point.label for point in points))  # one colour per column on every chart
    across = min(3, len(rungs))
    down = -(-len(rungs) // across)
    figure = _figure("--pareto", 5.0 * across + 1.5, 4.0 * down)
    axes = figure.subplots(down, across, squeeze=False).flatten()
    for ax in axes[len(rungs) :]:
        figure.delaxes(ax)
    for ax, (rung, columns) in zip(axes, rungs.items(), strict=False):
        for label, mine in columns.items():
            colour = f"C{labels.index(label)}"
            ax.scatter([p.per_user for p in mine], [p.per_device for p in mine], color=colour, alpha=0.5, s=18, label=label)
            edge = frontier(mine)
            ax.plot([p.per_user for p in edge], [p.per_device for p in edge], color=colour, marker="o")
        devices = " or ".join(sorted({p.device for mine in columns.values() for p in mine}))
        ax.set_title("/".join(rung))
        ax.set_xlabel("output tok/s per user (1000 / mean TPOT)")
        ax.set_ylabel(f"output tok/s per {devices}")
        ax.legend(title="vLLM", fontsize="small")
    figure.tight_layout()
    return figure


def _figure(option: str, width: float, height: float) -> Figure:
    """An empty figure drawn by Agg (no display needed); :class:`CompareError` naming ``option`` without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CompareError(f"{option} needs matplotlib: pip install 'pytest-qwenperf[plot]'") from None
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path) -> None:
    try:
        figure.savefig(path, format="png", dpi=110)
    except OSError as exc:
        raise CompareError(f"{path}: cannot write the plot: {exc.strerror}") from None

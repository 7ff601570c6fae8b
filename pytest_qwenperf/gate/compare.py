"""Compare runs across files (vLLM versions, or config changes): one table per config × workload.

Inputs are session JSON (``--qwenperf-json``: ``{"schema": "qwenperf-session/1", "runs":
[...]}``) and pytest-benchmark JSON (``{"benchmarks": [{"extra_info": {"qwenperf": run}}]}``;
benchmarks without a run are other tests and are skipped). Each file is a column,
labelled by the vLLM version its runs report. The first file is the reference: every
later file's runs are judged against it with the same verdicts as a stored baseline
(:func:`~pytest_qwenperf.core.verdict.judge_against_run`), so a different argv or workload is
"not comparable", never a regression, and a run that lost data on either side (failed
requests, token totals that disagree with the server, a client-bound run, a metric without
a value) is "invalid" with the reason. A config × workload the reference has and a later
file lacks is "missing" in that file's column, one verdict per row, so it counts in the
summary like any other. :data:`LOST_DATA` are the verdicts ``--fail-on`` fails on whatever
else it names.

Rows: the metrics whose :attr:`~pytest_qwenperf.core.metrics.MetricInfo.row` says so,
when a run has them: total and output tok/s, p99 TTFT and TPOT first, then prefix-cache
hit rate, speculative acceptance, multi-node scaling efficiency (``metrics``) and device
utilization from the run's ``telemetry`` block (shown, not judged: utilization explains
a throughput change, it is not a goal). Only the rows shown are judged.

Runs of the same config × workload that appear more than once in one file are pooled
as repeats (their samples joined), so rounds recorded separately still give a spread; the
pool has every repeat's failed requests, token mismatch and client-bound reason, and a
metric that one repeat lacks has no value in the pool.

:func:`as_json` is the machine-readable form (``schema`` :data:`SCHEMA`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast, get_args

import msgspec

from pytest_qwenperf.core.formats import SESSION_SCHEMA, json_safe
from pytest_qwenperf.core.metrics import METRICS, gate_order, metric
from pytest_qwenperf.core.run import Run, RunJsonError, decode_run
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.tables import format_table
from pytest_qwenperf.core.textfiles import read_text
from pytest_qwenperf.core.verdict import Judgement, Verdict, format_value
from pytest_qwenperf.gate.judge import judge_against_run, judge_run

SCHEMA = "qwenperf-compare/1"

_FIRST = tuple(name for name, info in METRICS.items() if info.row == "first")
_NOT_JUDGED = tuple(info for info in METRICS.values() if info.row != "none" and not info.gated)
"""Rows shown, not judged: device utilization."""
FAILABLE: tuple[Verdict, ...] = tuple(v for v in get_args(Verdict) if v != "pass")
LOST_DATA: tuple[Verdict, ...] = ("missing", "invalid")
"""Verdicts ``--fail-on`` fails on whatever it names (unless ``--allow``-ed): a run that lost data never passes."""

RunKey = tuple[str, str, str]  # suite, config id, workload id

_EXPECTED = (
    f'a qwenperf session JSON ({{"schema": "{SESSION_SCHEMA}", "runs": [...]}}, from --qwenperf-json) '
    'or a pytest-benchmark JSON ({"benchmarks": [{"extra_info": {"qwenperf": <run>}}, ...]})'
)


class CompareError(ValueError):
    """An input cannot be compared (unreadable file, unknown metric, no plotting library); exit status 2."""


@dataclass(frozen=True)
class RunSet:
    """The runs of one input file, by config × workload."""

    path: Path
    label: str
    runs: Mapping[RunKey, Run]


# ------------------------------------------------------------------ reading


def _runs_in(path: Path, data: object) -> list[tuple[str, object]]:
    """(where, run JSON) pairs of either input format."""
    if isinstance(data, dict) and data.get("schema") == SESSION_SCHEMA:
        runs = data.get("runs")
        if not isinstance(runs, list) or not runs:
            raise CompareError(f"{path}: runs: expected a non-empty list of runs, got {runs!r:.80}")
        return [(f"{path}: runs[{i}]", run) for i, run in enumerate(runs)]
    if isinstance(data, dict) and "schema" in data:
        raise CompareError(f"{path}: schema: expected {SESSION_SCHEMA!r}, got {data['schema']!r:.80}")
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        found = []
        for i, bench in enumerate(data["benchmarks"]):
            extra = bench.get("extra_info") if isinstance(bench, dict) else None
            if isinstance(extra, dict) and extra.get("qwenperf") is not None:
                found.append((f"{path}: benchmarks[{i}].extra_info.qwenperf", extra["qwenperf"]))
        if not found:
            raise CompareError(
                f"{path}: benchmarks[*].extra_info.qwenperf: expected at least one benchmark carrying a qwenperf run, "
                f"found none in {len(data['benchmarks'])} benchmark(s)"
            )
        return found
    raise CompareError(f"{path}: (top level): expected {_EXPECTED}")


def _pooled(path: Path, key: RunKey, runs: list[Run]) -> Run:
    """Several runs of one key in one file as one run whose samples are all of theirs."""
    distinct = [run for i, run in enumerate(runs) if run not in runs[:i]]
    first = distinct[0]
    if len(distinct) == 1:
        return first
    for other in distinct[1:]:
        differences = first.identity.baseline().differences(other.identity.baseline())
        if differences:
            raise CompareError(
                f"{path}: runs of {'/'.join(key[:2])} on {key[2]}: expected repeats of one setup, but they differ ("
                + "; ".join(differences)
                + ")"
            )
    gated = [run.gated_samples() for run in distinct]
    names = {name for run, found in zip(distinct, gated, strict=True) for name in (*found, *run.lost_values())}
    # A repeat without a number for a metric the others have is a null among the pool's samples.
    samples: dict[str, tuple[float | None, ...]] = {
        name: tuple(s for found in gated for s in found.get(name, (None,))) for name in names
    }
    bound = "; ".join(run.client_bound for run in distinct if run.client_bound) or None
    tokens = next((run.token_check for run in distinct if run.token_check.matches is False), first.token_check)
    return msgspec.structs.replace(
        first,
        metrics={**first.metrics, "failed": sum(run.failed_requests for run in distinct)},
        token_check=tokens,
        samples=samples,
        client=msgspec.structs.replace(first.client, bound=bound),
    )


def load_runs(path: Path) -> RunSet:
    """Read one input file; :class:`CompareError` names the file, the field and what was expected."""
    text = read_text(Path(path), "results file", _EXPECTED, CompareError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not valid JSON ({exc}); expected {_EXPECTED}") from None
    by_key: dict[RunKey, list[Run]] = {}
    versions: set[str] = set()
    for where, data_of_run in _runs_in(path, data):
        try:
            run = decode_run(data_of_run, where)
        except RunJsonError as exc:
            raise CompareError(str(exc)) from None
        identity = run.identity
        by_key.setdefault((identity.suite, identity.config, identity.workload), []).append(run)
        if run.context.vllm_version:
            versions.add(run.context.vllm_version)
    label = ", ".join(sorted(versions)) or Path(path).name
    return RunSet(Path(path), label, {key: _pooled(path, key, runs) for key, runs in by_key.items()})


# ------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class Row:
    metric: str
    unit: str
    values: tuple[float | None, ...]  # one per file
    judgements: tuple[Judgement | None, ...]  # one per file after the first; None: not judged


@dataclass(frozen=True)
class Group:
    key: RunKey
    hardware: str
    rows: tuple[Row, ...]
    throughput: tuple[float | None, ...]  # total tok/s per file, for the plot whatever the rows


@dataclass(frozen=True)
class Comparison:
    labels: tuple[str, ...]
    groups: tuple[Group, ...]
    paths: tuple[Path, ...]  # one per label

    def judgements(self) -> list[tuple[Group, str, Judgement]]:
        """(group, file label, judgement) for every judged cell."""
        return [
            (group, label, judgement)
            for group in self.groups
            for row in group.rows
            for label, judgement in zip(self.labels[1:], row.judgements, strict=True)
            if judgement is not None
        ]

    def verdicts(self) -> Counter[Verdict]:
        return Counter(judgement.verdict for _, _, judgement in self.judgements())


def _utilization(run: Run) -> dict[str, float]:
    """The rows of :data:`_NOT_JUDGED` a run has; a missing or null entry is a sampler that did not run."""
    values = {info.name: run.value(info.name) for info in _NOT_JUDGED}
    return {name: value for name, value in values.items() if value is not None}


def _values(run: Run) -> dict[str, float]:
    """Every metric this comparison can show, as one number (samples at their centre)."""
    gated = {name: centre(samples) for name, samples in run.gated_samples().items()}
    return {**gated, **_utilization(run)}


def _shown(name: str) -> bool:
    return metric(name).row != "none"


def _judged(reference: Run | None, run: Run | None, path: Path, key: RunKey) -> dict[str, Judgement]:
    if run is None:
        return {} if reference is None else _missing(reference, path, key)
    judgements = judge_run(None, run) if reference is None else judge_against_run(reference, run)
    return {j.metric: j for j in judgements}


def _missing(reference: Run, path: Path, key: RunKey) -> dict[str, Judgement]:
    """A "missing" verdict for every gated metric the reference measured (for every one it names,
    when it has no value at all), so the absence counts."""
    gated = reference.gated_samples()
    detail = f"{path.name} has no run of {key[0]}/{key[1]} on {key[2]}; the reference has one"
    judgements = {}
    for name in gate_order(gated or reference.lost_values()):
        spec = metric(name)
        assert spec.tolerance is not None  # runs only carry gated metrics
        samples = gated.get(name)
        base = centre(samples) if samples else None
        tolerance = (reference.tolerances or {}).get(name, spec.tolerance)
        judgements[name] = Judgement(name, spec.unit, spec.direction, base, None, None, tolerance, "missing", detail)
    return judgements


def compare(sets: Sequence[RunSet], metrics: Sequence[str] = ()) -> Comparison:
    """Tables of ``metrics`` (default: the standard rows) per config × workload, judged against ``sets[0]``."""
    keys = list(dict.fromkeys(key for run_set in sets for key in run_set.runs))
    groups = []
    for key in keys:
        runs = [run_set.runs.get(key) for run_set in sets]
        values = [_values(run) if run is not None else {} for run in runs]
        judged = [_judged(runs[0], run, run_set.path, key) for run, run_set in zip(runs[1:], sets[1:], strict=True)]
        present = list(dict.fromkeys([name for v in values for name in v] + [name for j in judged for name in j]))
        names = [m for m in metrics if m in present] if metrics else [m for m in _order(present) if _shown(m)]
        rows = tuple(
            Row(
                name,
                metric(name).unit,
                tuple(v.get(name) for v in values),
                tuple(j.get(name) for j in judged),
            )
            for name in names
        )
        first = next(run for run in runs if run is not None)
        throughput = tuple(v.get("total_token_throughput") for v in values)
        groups.append(Group(key, first.identity.hardware, rows, throughput))
    shown = {row.metric for group in groups for row in group.rows}
    missing = [m for m in metrics if m not in shown]
    if missing:
        present = sorted({name for run_set in sets for run in run_set.runs.values() for name in _values(run)})
        raise CompareError(f"--metric {', '.join(missing)}: no input has it; metrics present: {', '.join(present)}")
    return Comparison(_unique_labels(sets), tuple(groups), tuple(s.path for s in sets))


def _order(names: Sequence[str]) -> list[str]:
    """The first rows first, then the others in the order they were met."""
    return [m for m in _FIRST if m in names] + [m for m in names if m not in _FIRST]


def _unique_labels(sets: Sequence[RunSet]) -> tuple[str, ...]:
    counts = Counter(s.label for s in sets)
    return tuple(s.label if counts[s.label] == 1 else f"{s.label} ({s.path.name})" for s in sets)


# ------------------------------------------------------------------ rendering


def _delta(row: Row, index: int) -> str:
    judgement = row.judgements[index - 1]
    if judgement is not None:
        return "—" if judgement.ratio is None else f"{judgement.ratio - 1:+.1%}"
    first, now = row.values[0], row.values[index]
    return f"{now / first - 1:+.1%}" if first and now is not None else ""


def _verdict_cell(judgement: Judgement | None, markdown: bool) -> str:
    if judgement is None:
        return ""
    return f"**{judgement.label}**" if markdown and judgement.verdict not in ("pass", "improvement") else judgement.label


def render(comparison: Comparison, *, markdown: bool = False) -> str:
    """The tables, each followed by the detail of every verdict that is not a pass (metrics with the
    same verdict and detail on one line), then a line counting every verdict."""
    labels = comparison.labels
    header = ["metric", labels[0]]
    for label in labels[1:]:
        header += [label, "Δ", "verdict"]
    lines: list[str] = []
    for group in comparison.groups:
        suite, config, workload = group.key
        title = f"{suite}/{config} · {workload} ({group.hardware})"
        lines += [f"### {title}", ""] if markdown else [title]
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
        if notes:
            lines += [""] + ([f"- {note}" for note in notes] if markdown else notes)
        lines.append("")
    counts = comparison.verdicts()
    summary = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items())) or "nothing judged"
    lines.append(f"verdicts against {labels[0]}: {summary}")
    return "\n".join(lines)


def as_json(comparison: Comparison) -> dict[str, object]:
    """Every group, row, value and judgement: ``files`` in column order (the first is the
    reference), per row ``values`` one per file and ``judgements`` one per later file (null
    where a row is shown, not judged), and ``verdicts`` counted as the summary line does.
    JSON-safe (:func:`~pytest_qwenperf.core.formats.json_safe`), as every file this package writes."""
    labels = comparison.labels

    def judgement(label: str, j: Judgement | None) -> dict[str, object] | None:
        if j is None:
            return None
        numbers = {key: getattr(j, key) for key in ("baseline", "now", "ratio", "tolerance", "direction")}
        return {"file": label, "verdict": j.verdict, "reason": j.reason or None, "detail": j.detail} | numbers

    document = {
        "schema": SCHEMA,
        "files": [{"label": label, "path": str(path)} for label, path in zip(labels, comparison.paths, strict=True)],
        "groups": [
            {
                "suite": group.key[0],
                "config": group.key[1],
                "workload": group.key[2],
                "hardware": group.hardware,
                "rows": [
                    {
                        "metric": row.metric,
                        "unit": row.unit,
                        "values": list(row.values),
                        "judgements": [judgement(label, j) for label, j in zip(labels[1:], row.judgements, strict=True)],
                    }
                    for row in group.rows
                ],
            }
            for group in comparison.groups
        ],
        "verdicts": dict(sorted(comparison.verdicts().items())),
    }
    return cast(dict[str, object], json_safe(document))


def plot_throughput(comparison: Comparison, path: Path) -> None:
    """A PNG of total tok/s per rung, one bar per file, one panel per workload."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CompareError("--plot needs matplotlib: pip install 'pytest-qwenperf[plot]'") from None
    by_workload: dict[str, list[Group]] = {}
    for group in comparison.groups:
        by_workload.setdefault(group.key[2], []).append(group)
    labels = comparison.labels
    figure = Figure(figsize=(max(6.0, 1.2 * max(len(g) for g in by_workload.values()) * len(labels)), 3.5 * len(by_workload)))
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(by_workload), 1, squeeze=False)[:, 0]
    width = 0.8 / len(labels)
    for ax, (workload, groups) in zip(axes, by_workload.items(), strict=True):
        for j, label in enumerate(labels):
            heights = [math.nan if g.throughput[j] is None else g.throughput[j] for g in groups]
            ax.bar([x - 0.4 + (j + 0.5) * width for x in range(len(groups))], heights, width, label=label)
        ax.set_xticks(range(len(groups)), [f"{g.key[0]}/{g.key[1]}" for g in groups], rotation=15, ha="right")
        ax.set_ylabel("total tok/s")
        ax.set_title(workload)
        ax.legend(title="vLLM", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    try:
        figure.savefig(path, format="png", dpi=110)
    except OSError as exc:
        raise CompareError(f"{path}: cannot write the plot: {exc.strerror}") from None

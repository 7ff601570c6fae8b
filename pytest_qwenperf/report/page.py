"""What the HTML report shows, as plain data the template lays out: the verdict table, each
point's details and the charts, from the columns :func:`~pytest_qwenperf.gate.compare.load_runs`
reads (one session file, or several compared against the first).

One column: the verdicts its session decided as it measured (the session JSON keeps them).
Several: every later column judged against the first, as ``qwenperf compare`` judges them, and
the canary answers compared the same way.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_qwenperf.core.canary import CanaryJudgement
from pytest_qwenperf.core.environment import VERSIONS
from pytest_qwenperf.core.profile import OperatorProfile, share_changes
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.stats import centre, centre_interval
from pytest_qwenperf.core.verdict import Judgement, format_interval, format_mde, format_value
from pytest_qwenperf.gate.compare import CompareError, Comparison, Group, RunSet, compare
from pytest_qwenperf.gate.compare_profiles import SHOWN
from pytest_qwenperf.gate.diagnosis import Diagnosis
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.gate.pareto import points_of
from pytest_qwenperf.gate.setups import BENCH_KEY, RunKey
from pytest_qwenperf.history.report import Series, read_series
from pytest_qwenperf.report import charts

LADDER_METRIC = "output_throughput"
_FIRST: Mapping[str, int] = {"invalid": 0, "regression": 1, "changed-output": 2, "missing": 3, "noisy": 4, "underpowered": 5}
"""The order rows come in: what needs a look first; every other verdict after them."""


@dataclass(frozen=True)
class VerdictRow:
    """One metric of one point in one column against its reference."""

    anchor: str  # the point's details
    point: str  # "config · workload"
    column: str
    metric: str
    baseline: str
    now: str
    change: str  # "+3.1%"
    interval: str  # of the ratio now / reference: "0.912–0.971"
    confidence: str  # the interval's: "95%"; "" without one
    tolerance: str
    mde: str
    verdict: str  # its label
    kind: str  # the verdict itself, for the row's style and the filter
    detail: str
    rank: int  # 0 first


@dataclass(frozen=True)
class Field:
    """One environment or configuration field across the columns; ``changed`` when they differ."""

    name: str
    values: tuple[str, ...]
    changed: bool


@dataclass(frozen=True)
class Point:
    """One (config, workload): each column's run and what the page shows of it."""

    anchor: str
    title: str
    runs: tuple[tuple[str, Run | None], ...]  # (column, its run)
    fields: tuple[Field, ...]
    timelines: tuple[tuple[str, str], ...]  # (column, chart id)
    distributions: str | None  # chart id
    notes: tuple[str, ...]  # the run's conditions, client-bound reason, capacity searches
    causes: tuple[tuple[str, tuple[str, ...]], ...]  # (column, its likely causes) where it regressed or its output changed
    history: str | None  # chart id of its series in the history store, where one was given
    operators: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (column, its top host operators: name, share) from its profile
    operator_changes: tuple[tuple[str, tuple[str, ...]], ...]  # (later column, the host operators whose share moved most)


@dataclass(frozen=True)
class CanaryLine:
    config: str
    column: str
    verdict: str
    match_rate: str
    detail: str


@dataclass(frozen=True)
class Page:
    title: str
    written: str  # ISO 8601, UTC
    columns: tuple[str, ...]
    rows: tuple[VerdictRow, ...]
    points: tuple[Point, ...]
    canaries: tuple[CanaryLine, ...]
    charts: Mapping[str, charts.Spec]  # chart id -> spec
    ladder: str | None
    pareto: str | None
    pareto_missing: str | None  # why capacity probes have no Pareto chart

    @property
    def interval_heading(self) -> str:
        """The interval column's heading: ``95% interval`` where every interval shown is at one
        confidence, else ``interval`` (each cell names its own)."""
        found = {row.confidence for row in self.rows if row.confidence}
        return f"{found.pop()} interval" if len(found) == 1 else "interval"

    @property
    def counts(self) -> dict[str, int]:
        """How many rows have each verdict, in table order."""
        found: dict[str, int] = {}
        for row in self.rows:
            found[row.kind] = found.get(row.kind, 0) + 1
        return found


OPERATORS = 10
"""Host operators by self time a point shows per column."""
HISTORY_METRICS = ("output_throughput", "p99_ttft_ms", "p99_tpot_ms")
"""The series a point's history chart shows, where the store has them."""


def history_series(store: HistoryStore) -> list[Series]:
    """The series of ``store`` a report's points show (:data:`HISTORY_METRICS`), with their change points."""
    return read_series(store, metrics=HISTORY_METRICS)


def page_of(sets: Sequence[RunSet], title: str = "", history: Sequence[Series] = ()) -> Page:
    """The page of ``sets`` (the first is the reference of the others), with each point's series
    from ``history`` (a history store's, :func:`~pytest_qwenperf.history.report.read_series`)."""
    comparison = compare(sets)
    groups = [group for group in comparison.groups if group.key != BENCH_KEY]
    keys = [group.key for group in groups]
    specs: dict[str, charts.Spec] = {}
    points = tuple(_point(group, sets, comparison.labels, specs, history) for group in groups)
    rows = _rows(sets, comparison, keys)
    ladder = _ladder(sets, comparison.labels, keys)
    if ladder is not None:
        specs["ladder"] = ladder
    pareto = _pareto(sets, comparison.labels)
    if isinstance(pareto, dict):
        specs["pareto"] = pareto
    return Page(
        title=title or " vs ".join(comparison.labels),
        written=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        columns=comparison.labels,
        rows=tuple(sorted(rows, key=lambda row: row.rank)),
        points=points,
        canaries=_canaries(comparison, sets),
        charts=specs,
        ladder="ladder" if ladder is not None else None,
        pareto="pareto" if isinstance(pareto, dict) else None,
        pareto_missing=pareto if isinstance(pareto, str) else None,
    )


def anchor_of(key: RunKey) -> str:
    return "point-" + re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(part for part in key if part))


def _title(key: RunKey) -> str:
    suite, config, workload = key
    return f"{suite}/{config} · {workload}" if suite else f"{config} · {workload}"


def _rows(sets: Sequence[RunSet], comparison: Comparison, keys: Sequence[RunKey]) -> list[VerdictRow]:
    """One column: its session's verdicts. Several: each later column's against the first."""
    if len(sets) == 1:
        return [_row(key, sets[0].label, j) for key in keys for j in sets[0].verdicts.get(key, ())]
    return [
        _row(group.key, label, judgement)
        for group in comparison.groups
        if group.key != BENCH_KEY
        for row in group.rows
        for label, judgement in zip(comparison.labels[1:], row.judgements, strict=True)
        if judgement is not None
    ]


def _row(key: RunKey, column: str, judgement: Judgement) -> VerdictRow:
    return VerdictRow(
        anchor=anchor_of(key),
        point=_title(key),
        column=column,
        metric=f"{judgement.metric} ({judgement.unit})" if judgement.unit else judgement.metric,
        baseline=format_value(judgement.baseline),
        now=format_value(judgement.now),
        change="—" if judgement.ratio is None else f"{judgement.ratio - 1:+.1%}",
        interval=format_interval(judgement.interval),
        confidence="" if judgement.interval is None else f"{100 * judgement.confidence:g}%",
        tolerance=f"{judgement.tolerance:.0%}",
        mde=format_mde(judgement.mde),
        verdict=judgement.label,
        kind=judgement.verdict,
        detail=judgement.detail,
        rank=_FIRST.get(judgement.verdict, len(_FIRST)),
    )


def _point(group: Group, sets: Sequence[RunSet], columns: Sequence[str], specs: dict[str, charts.Spec], history: Sequence[Series]) -> Point:
    key = group.key
    anchor = anchor_of(key)
    runs = tuple((column, run_set.runs.get(key)) for column, run_set in zip(columns, sets, strict=True))
    timelines = []
    for i, (column, run) in enumerate(runs):
        if run is not None and run.timeline is not None:
            specs[f"{anchor}-timeline-{i}"] = charts.timeline(run.timeline)
            timelines.append((column, f"{anchor}-timeline-{i}"))
    sides = {column: run.distributions for column, run in runs if run is not None and run.distributions}
    if sides:
        specs[f"{anchor}-latency"] = charts.distributions(sides)
    present = [run for _, run in runs if run is not None]
    mine = _series_of(present[-1], history) if present else []
    if mine:
        specs[f"{anchor}-history"] = charts.history(mine)
    return Point(
        anchor=anchor,
        title=_title(key),
        runs=runs,
        fields=_fields([run for _, run in runs]),
        timelines=tuple(timelines),
        distributions=f"{anchor}-latency" if sides else None,
        notes=tuple(note for run in present for note in _notes(run)),
        causes=_point_causes(key, sets, group, columns),
        history=f"{anchor}-history" if mine else None,
        operators=tuple((column, _top(profile)) for column, profile in zip(columns, group.profiles, strict=False) if profile is not None),
        operator_changes=_share_changes(group.profiles, columns),
    )


def _top(profile: OperatorProfile) -> tuple[tuple[str, str], ...]:
    return tuple((op.name, f"{op.share:.1%}") for op in profile.cpu.operators[:OPERATORS])


def _share_changes(profiles: Sequence[OperatorProfile | None], columns: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Per later column with a profile, the host operators whose share moved most against the first column's."""
    if not profiles or profiles[0] is None:
        return ()
    reference = profiles[0].cpu
    found = []
    for column, profile in zip(columns[1:], profiles[1:], strict=False):
        if profile is not None:
            moved = share_changes(reference, profile.cpu, SHOWN)
            found.append((column, tuple(f"{c.name}: {_share(c.reference)} → {_share(c.now)} ({100 * c.change:+.1f} pt)" for c in moved)))
    return tuple(found)


def _share(share: float | None) -> str:
    return "—" if share is None else f"{share:.1%}"


def _series_of(run: Run, history: Sequence[Series]) -> list[Series]:
    """The series of ``run``'s point on its machine and model, in :data:`HISTORY_METRICS` order."""
    identity = run.identity
    found = {
        series.key.metric: series
        for series in history
        if (series.key.hardware, series.key.model, series.key.suite, series.key.config, series.key.workload)
        == (identity.hardware, identity.model, identity.suite, identity.config, identity.workload)
        and series.points
    }
    return [found[name] for name in HISTORY_METRICS if name in found]


def _point_causes(key: RunKey, sets: Sequence[RunSet], group: Group, columns: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """One column: why its run regressed against the reference its session judged it by, as the
    session decided. Several: each later column's against the first (``qwenperf compare``'s)."""
    if len(sets) == 1:
        found = sets[0].diagnoses.get(key)
        return ((columns[0], _causes(found)),) if found is not None else ()
    return tuple((column, _causes(found)) for column, found in zip(columns[1:], group.diagnoses, strict=False) if found is not None)


def _causes(found: Diagnosis) -> tuple[str, ...]:
    """Each cause as ``kind: what it rests on``, or the line saying none was found."""
    return tuple(f"{cause.kind}: {cause.text}" for cause in found.causes) or found.lines()


def _fields(runs: Sequence[Run | None]) -> tuple[Field, ...]:
    """The versions, GPUs, engine config, KV capacity and argv of each column's run ("—" where a
    column has none), changed ones first: those that differ between the columns that have a run."""
    values = [_described(run) if run is not None else None for run in runs]
    present = [found for found in values if found is not None]
    names = list(dict.fromkeys(name for found in present for name in found))
    fields = [
        Field(name, tuple((found or {}).get(name, "—") for found in values), len({found.get(name) for found in present}) > 1)
        for name in names
    ]
    return tuple(sorted(fields, key=lambda f: not f.changed))


def _described(run: Run) -> dict[str, str]:
    environment = run.context.environment
    found: dict[str, str] = {"vllm_version": run.context.vllm_version or "—"}
    if environment is not None:
        found |= {name: str(getattr(environment, name)) for name in VERSIONS if getattr(environment, name) is not None}
        found |= {f"engine.{key}": value for key, value in sorted(environment.engine.items())}
    kv = run.context.servers[0].get("kv_capacity") if run.context.servers else None
    if isinstance(kv, Mapping):
        found |= {f"kv_capacity.{key}": str(value) for key, value in kv.items() if value is not None}
    found["argv"] = " ".join(run.identity.argv)
    return found


def _notes(run: Run) -> list[str]:
    notes = [f"invalid: {loss.reason}: {loss.detail}" for loss in run.conditions]
    notes += [f"measured again, spoiled by the machine's other load: {loss.reason}: {loss.detail}" for loss in run.retaken]
    if run.client_bound:
        notes.append(f"client-bound: {run.client_bound}")
    for search in run.capacity:
        found = "none met the SLO" if search.load is None else f"{search.load:.3g} ({search.binding or 'no term'} binds)"
        notes.append(f"capacity at SLO by {search.search}: {found}, {len(search.probes)} probes")
    return notes


def _ladder(sets: Sequence[RunSet], columns: Sequence[str], keys: Sequence[RunKey]) -> charts.Spec | None:
    bars = []
    for column, run_set in zip(columns, sets, strict=True):
        for key in keys:
            run = run_set.runs.get(key)
            samples = _samples(run, LADDER_METRIC) if run is not None else ()
            if samples:
                suite, config, workload = key
                rung = f"{suite}/{config}" if suite else config
                bars.append(charts.Bar(rung, workload, column, centre(samples), *centre_interval(samples)))
    return charts.ladder(bars, LADDER_METRIC) if bars else None


def _samples(run: Run, name: str) -> tuple[float, ...]:
    repeats = (run.samples or {}).get(name)
    if repeats and all(v is not None for v in repeats):
        return tuple(float(v) for v in repeats if v is not None)
    value = run.metrics.get(name)
    return (float(value),) if isinstance(value, (int, float)) else ()


def _pareto(sets: Sequence[RunSet], columns: Sequence[str]) -> charts.Spec | str | None:
    """The Pareto chart when capacity probes exist; why not, where a run's device count or figures
    cannot be read (the page says so); None without probes."""
    if not any(result.run.capacity for run_set in sets for result in run_set.results):
        return None
    try:
        points = points_of(sets, columns)
    except CompareError as exc:
        return f"not drawn: {exc}"
    return charts.pareto(points) if points else None


def _canaries(comparison: Comparison, sets: Sequence[RunSet]) -> tuple[CanaryLine, ...]:
    if len(sets) == 1:  # as its session judged each answer (against the stored one), else answered alone
        judged = sets[0].canary_verdicts
        return tuple(
            _canary_line(config, sets[0].label, judged[config])
            if config in judged
            else CanaryLine(config, sets[0].label, "answered", "—", f"{len(answer.outputs)} prompts answered")
            for config, answers in sets[0].canaries.items()
            for answer in answers
        )
    return tuple(
        _canary_line(row.config, label, judgement)
        for row in comparison.canaries
        for label, judgement in zip(comparison.labels[1:], row.judgements, strict=True)
        if judgement is not None
    )


def _canary_line(config: str, column: str, judgement: CanaryJudgement) -> CanaryLine:
    rate = f"{judgement.found.match_rate:.1%}" if judgement.found else "—"
    return CanaryLine(config, column, judgement.verdict, rate, judgement.detail)

"""The series of a history store with their change points, as a terminal table, markdown, JSON and a plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.run import Decline
from pytest_qwenperf.core.tables import format_table
from pytest_qwenperf.gate.history_store import HistoryStore, SeriesKey, SeriesPoint
from pytest_qwenperf.history.changes import MAX_PVALUE, MIN_CHANGE, Change, change_points, decline, levels

SCHEMA = "qwenperf-history/1"
BARS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Series:
    """One series of the store, its valid runs with a value, and its change points."""

    key: SeriesKey
    points: tuple[SeriesPoint, ...]
    changes: tuple[Change, ...]
    tolerance: float  # how much worse than its last good level the series may be (the smallest change kept)

    @property
    def decline(self) -> Decline | None:
        return decline(self.points, self.changes, self.key.metric, self.tolerance)


def read_series(
    store: HistoryStore,
    *,
    config: str | None = None,
    workload: str | None = None,
    metrics: Sequence[str] = (),
    max_pvalue: float = MAX_PVALUE,
    min_change: float = MIN_CHANGE,
) -> list[Series]:
    """Every series of the store that matches, with the changes found in it."""
    found = []
    for key in store.keys(config=config, workload=workload):
        if metrics and key.metric not in metrics:
            continue
        points = tuple(p for p in store.series(key) if p.values and not p.invalid)  # an invalid run is no verdict on vLLM
        changes = change_points(points, key.metric, max_pvalue=max_pvalue, min_change=min_change)
        found.append(Series(key, points, changes, tolerance=min_change))
    return found


def sparkline(values: Sequence[float], marks: Sequence[int] = ()) -> str:
    """One bar per value, scaled between the least and the most; ``|`` before each index in ``marks``."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    bars = [BARS[min(len(BARS) - 1, int((v - low) / span * len(BARS))) if span else len(BARS) // 2] for v in values]
    return "".join(("|" if i in marks else "") + bar for i, bar in enumerate(bars))


def _title(series: Series) -> str:
    info = metric(series.key.metric)
    return (
        f"{series.key.config_key} / {series.key.workload} / {series.key.metric} ({info.unit}, {info.direction} is better) "
        f"on {series.key.hardware}, {series.key.model}"
    )


HEADER = ("change at", "started", "vLLM before → after", "before", "after", "change", "confidence", "points after", "direction")


def _row(change: Change, unit: str) -> tuple[str, ...]:
    versions = f"{change.version_before or '?'} → {change.version_after or '?'}"
    return (
        f"#{change.index + 1}",
        (change.started_after or "?")[:16],
        versions,
        f"{change.before:,.4g} {unit}",
        f"{change.after:,.4g} {unit}",
        f"{change.change:+.1%}",
        f"{change.confidence:.1%}",
        f"{change.points_after}" + ("" if change.confirmed else " (unconfirmed)"),
        change.direction,
    )


def render(found: Sequence[Series], *, markdown: bool = False) -> str:
    """Per series: its title, the runs' levels as a sparkline (``|`` at each change), then its changes.
    Series without a value in any run (a metric the config does not produce, such as a speculative
    rate without speculation) are named once at the end instead."""
    if not found:
        return "no series in the history store match"
    lines: list[str] = []
    empty = [s.key.metric for s in found if not s.points]
    for series in found:
        if not series.points:
            continue
        values = levels(series.points)
        title = _title(series)
        latest = f"latest {values[-1]:,.4g}"
        lines.append(f"### {title}" if markdown else title)
        spark = sparkline(values, [c.index for c in series.changes])
        lines.append(f"{len(values)} runs, {latest}: `{spark}`" if markdown else f"{len(values)} runs, {latest}: {spark}")
        if series.changes:
            if markdown:
                lines.append("")
            lines += format_table(HEADER, [_row(c, metric(series.key.metric).unit) for c in series.changes], markdown=markdown)
        else:
            lines.append("no change point")
        if series.decline is not None:
            lines.append(f"worse than its last good level: {series.decline.detail}")
        lines.append("")
    if empty:
        lines.append(f"no value in any run (left out): {', '.join(sorted(set(empty)))}")
    return "\n".join(lines).rstrip()


def as_json(found: Sequence[Series]) -> dict[str, object]:
    return {
        "schema": SCHEMA,
        "series": [
            {
                "key": {name: getattr(s.key, name) for name in ("hardware", "model", "suite", "config", "workload", "metric")},
                "points": [
                    {"run_key": p.run_key, "started": p.started, "vllm_version": p.vllm_version, "values": list(p.values), "level": level}
                    for p, level in zip(s.points, levels(s.points), strict=True)
                ],
                "changes": [
                    {
                        "index": c.index,
                        "started": c.started_after,
                        "version_before": c.version_before,
                        "version_after": c.version_after,
                        "before": c.before,
                        "after": c.after,
                        "change": c.change,
                        "pvalue": c.pvalue,
                        "confidence": c.confidence,
                        "points_after": c.points_after,
                        "confirmed": c.confirmed,
                        "direction": c.direction,
                    }
                    for c in s.changes
                ],
                "failing": s.decline is not None,
                "decline": None if s.decline is None else msgspec.to_builtins(s.decline),
            }
            for s in found
        ],
    }


def plot(found: Sequence[Series], path: Path) -> None:
    """One panel per series: each run's level (its repeats as dots), a dashed line at each change
    (red when for the worse), the vLLM version written where it changes. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in found if s.points] or found
    fig, axes = plt.subplots(max(1, len(shown)), 1, figsize=(10, 2.8 * max(1, len(shown))), squeeze=False)
    for ax, series in zip(axes[:, 0], shown, strict=False):
        values = levels(series.points)
        xs = range(len(values))
        ax.plot(xs, values, marker="o", linewidth=1)
        for x, point in zip(xs, series.points, strict=True):
            ax.scatter([x] * len(point.values), point.values, s=6, color="grey", alpha=0.6)
        for change in series.changes:
            ax.axvline(change.index - 0.5, linestyle="--", color="red" if change.direction == "worse" else "green")
            ax.text(change.index - 0.5, max(values), f" {change.change:+.1%}", va="top", fontsize=8)
        previous = None
        for x, point in zip(xs, series.points, strict=True):
            if point.vllm_version != previous:
                ax.annotate(point.vllm_version or "?", (x, min(values)), fontsize=7, rotation=90, va="bottom")
                previous = point.vllm_version
        ax.set_title(_title(series), fontsize=9)
        ax.set_ylabel(metric(series.key.metric).unit)
        ax.set_xlabel("run (oldest first)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

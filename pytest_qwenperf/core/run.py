"""One measured run, typed: what :func:`~pytest_qwenperf.measure.run.measure` returns, what the
verdicts, baselines, the session report, pytest-benchmark and ``qwenperf compare`` take.

This module is the record and what it says of itself (its gated samples, the values it lost, its
baseline identity), with the reasons a run's numbers are no verdict (:class:`Loss`, the reason
codes). Its encoded form is a run's JSON: an entry of ``runs`` in the session JSON
(``qwenperf-session/1``), ``extra_info["qwenperf"]`` of a pytest-benchmark JSON, read by
:func:`~pytest_qwenperf.core.run_json.decode_run`; runs are combined into one by
:mod:`~pytest_qwenperf.core.combine`. A run built in memory is taken as it is.

``telemetry`` and ``context.servers`` stay JSON objects: their producers live above the core.

Standard library and msgspec only: the gate imports it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.identity import Context, Identity, Text, argv_digest
from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.core.metrics import CAPACITY_GATED, GATED, find, gate_order
from pytest_qwenperf.core.profile import OperatorProfile
from pytest_qwenperf.core.schema import Count
from pytest_qwenperf.core.timeline import Timeline
from pytest_qwenperf.core.verdict import SessionSpread

Number = int | float | None
"""A metric's value as a run holds it: null (or NaN, in memory) where it was not measured."""


class RunIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """What was measured, with the rendered vLLM argv (a baseline keeps its sha256)."""

    suite: Text
    config: Text
    argv: tuple[str, ...]
    model: Text
    workload: Text
    workload_fingerprint: Text
    hardware: Text

    def baseline(self) -> Identity:
        """The identity a baseline of this run is stored and matched by."""
        return Identity(
            hardware=self.hardware,
            model=self.model,
            suite=self.suite,
            config=self.config,
            argv_sha256=argv_digest(self.argv),
            workload=self.workload,
            workload_fingerprint=self.workload_fingerprint,
        )


class RunContext(msgspec.Struct, frozen=True, kw_only=True):
    """Where the run was measured and with which versions; allowed to differ between compared runs."""

    vllm_version: str | None = None
    machine: Machine | None = None
    servers: tuple[dict[str, Any], ...] = ()  # ``ServerInfo.as_dict()`` per server
    replicas: int | None = None
    routing: str | None = None
    client_cpus: tuple[int, ...] = ()
    started: str | None = None  # ISO 8601, UTC
    environment: Environment | None = None  # what ran the (first) server: versions and engine config


class ServerCounters(msgspec.Struct, frozen=True, kw_only=True):
    """The servers' /metrics counter deltas over the run and the rates taken from them."""

    deltas: dict[str, float | None] = msgspec.field(default_factory=dict)
    prefix_cache_hit_rate: float | None = None
    spec_decode_acceptance_rate: float | None = None  # accepted draft tokens / proposed draft tokens
    spec_decode_mean_acceptance_length: float | None = None  # 1 + accepted tokens per draft

    @classmethod
    def of(cls, deltas: Mapping[str, float | None]) -> ServerCounters:
        accepted_per_draft = _ratio(deltas.get("spec_decode_num_accepted_tokens"), deltas.get("spec_decode_num_drafts"))
        return cls(
            deltas=dict(deltas),
            prefix_cache_hit_rate=_ratio(deltas.get("prefix_cache_hits"), deltas.get("prefix_cache_queries")),
            spec_decode_acceptance_rate=_ratio(
                deltas.get("spec_decode_num_accepted_tokens"), deltas.get("spec_decode_num_draft_tokens")
            ),
            spec_decode_mean_acceptance_length=None if accepted_per_draft is None else 1 + accepted_per_draft,
        )


def _ms(value: Number) -> str:
    return "n/a" if value is None else f"{value:.3g} ms"


def _ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else part / whole


class TokenCheck(msgspec.Struct, frozen=True, kw_only=True):
    """Client token totals against the server's counters: None where the server exposed none."""

    matches: bool | None
    detail: str = ""


# Why a run's numbers are no verdict on vLLM, as reason codes (lower case, words joined by "-"):
# data the run lost here, the device's conditions in ``core.validity`` (``cpu-contention``, ``gpu-shared``, ...).
FAILED_REQUESTS = "failed-requests"
TOKEN_MISMATCH = "token-mismatch"
CLIENT_BOUND = "client-bound"
PROMPT_LENGTHS = "prompt-lengths"
WINDOW_SHORT = "window-short"
NO_VALUE = "no-value"


class Loss(msgspec.Struct, frozen=True, kw_only=True):
    """Why a run's numbers are no verdict on vLLM: a short reason for a table cell, and the detail."""

    reason: str  # "client-bound", "gpu-clock-events"
    detail: str


class Decline(msgspec.Struct, frozen=True, kw_only=True):
    """A gated metric whose level in the history, this run's included, is worse than its last good
    level by more than the tolerance: the slide a window that slides with it would not see
    (``history.changes.decline``)."""

    metric: str
    good: float  # the level before the earliest step for the worse not recovered from
    current: float  # the level since the latest confirmed change
    tolerance: float
    step: int  # that step's run, counted from 1 in the series
    since: str | None  # when the step's first run started
    versions: str | None  # the vLLM versions either side of the step, "0.31.0 → 0.32.0"; None: not recorded

    @property
    def change(self) -> float:
        """The current level against the good one, ``current / good - 1``."""
        return self.current / self.good - 1 if self.good else float("nan")

    @property
    def detail(self) -> str:
        when = f", {self.since[:10]}" if self.since else ""
        versions = f", vLLM {self.versions}" if self.versions else ""
        info = find(self.metric)
        unit = f" {info.unit}" if info else ""
        return (
            f"{self.metric}: the level is {self.change:+.1%} from the last good level {self.good:,.4g}{unit} (before the "
            f"step at run #{self.step}{when}{versions}), beyond the tolerance {self.tolerance:.0%}"
        )


CLOCK_LIMIT_S = 1e-3
"""A client worker's clock offset against the driver's, or its drift over a run, beyond this is reported."""


def session_counts(counts: tuple[int, ...] | None, samples: int) -> tuple[int, ...]:
    """How many of ``samples`` samples each pooled session measured: ``counts`` where they add up
    to ``samples``, else one session of them all."""
    return counts if counts and sum(counts) == samples else (samples,)


class WorkerClock(msgspec.Struct, frozen=True, kw_only=True):
    """A client worker on another node (Ray) and its clock against the driver's: where it ran, the
    offset added to its times (seconds, measured before the run), how far that offset moved by the
    end (its times in between take the offset interpolated between the two), and the round trip the
    offset rests on (it is known to within half of it)."""

    worker: int
    node: str  # the Ray node id
    address: str  # the node's IP address
    pid: int
    offset_s: float
    drift_s: float
    round_trip_s: float

    def reported(self) -> str | None:
        """Why this clock is worth a line (offset or drift beyond :data:`CLOCK_LIMIT_S`); None if not."""
        if abs(self.offset_s) <= CLOCK_LIMIT_S and abs(self.drift_s) <= CLOCK_LIMIT_S:
            return None
        return (
            f"client worker {self.worker} on {self.address}: clock offset {self.offset_s * 1e3:+.2f} ms, "
            f"drift {self.drift_s * 1e3:+.2f} ms over the run (round trip {self.round_trip_s * 1e3:.2f} ms)"
        )


class ClientLoad(msgspec.Struct, frozen=True, kw_only=True):
    bound: str | None = None  # why the client, not the server, limited the run
    cpu_busy: float | None = None  # fraction of the run the client process spent on a CPU
    workers: tuple[WorkerClock, ...] = ()  # client workers on a Ray cluster's nodes, with their clocks


class ReplicaScaling(msgspec.Struct, frozen=True, kw_only=True):
    throughput: tuple[float, ...]  # per repeat
    efficiency: tuple[float, ...] | None = None  # per repeat, against one replica; None for the reference


class Scaling(msgspec.Struct, frozen=True, kw_only=True):
    """Replica counts compared: throughput per repeat and the efficiency against one replica."""

    metric: str
    replicas: dict[str, ReplicaScaling]  # replica count -> its figures
    requests_per_replica: dict[str, float | None]  # the largest set: requests each server finished
    request_spread: float | None  # largest relative distance of a replica's requests from the mean

    def efficiencies(self) -> dict[int, tuple[float, ...]]:
        """Replica count (> 1) → efficiency per repeat."""
        return {int(n): figures.efficiency for n, figures in self.replicas.items() if figures.efficiency}


class Replayed(Protocol):
    """What a trace's run tells of its replay: a suite's :class:`Run` or a ``qwenperf bench`` result."""

    @property
    def metrics(self) -> Mapping[str, Number]: ...
    @property
    def conditions(self) -> Sequence[Loss]: ...
    @property
    def failed_requests(self) -> int: ...
    @property
    def prefix_cache_hit_rate(self) -> float | None: ...


class TraceReplay(msgspec.Struct, frozen=True, kw_only=True):
    """A trace's run, for what its replay is held against. The send lag is in ``metrics``
    (``p50/p99_scheduling_lag_ms``; a replay that fell behind is ``client-bound``) and prompt lengths
    other than the trace's are a condition (``prompt-lengths``)."""

    cacheable_share: float  # of the prompt tokens sent, in blocks an earlier request sent: against the prefix-cache hit rate
    time_scale: float | None = None  # the replay's; None: sent by a loop, not at the traced times
    kv_block: int | None = None  # the server's cache block in tokens, the share counted in whole ones (None: not known)
    fit: str | None = None  # how the trace was fitted to the model's context (None: sent as traced)
    traced_cacheable_share: float | None = None  # with a fit: the share as traced, before it

    def describe(self, run: Replayed) -> str:
        """One line on ``run``, this trace's run: when its requests went against the trace, whether
        their prompt and output lengths were the trace's, and the cache the trace allowed against
        the cache the server hit."""
        when = (
            "sent by a loop, not at the traced times"
            if self.time_scale is None
            else f"sent at the traced times x{self.time_scale:g}, late by p50 {_ms(run.metrics.get('p50_scheduling_lag_ms'))}, "
            f"p99 {_ms(run.metrics.get('p99_scheduling_lag_ms'))}"
        )
        off = [loss.detail for loss in run.conditions if loss.reason == PROMPT_LENGTHS]
        if run.failed_requests:
            off.append(f"{run.failed_requests} request(s) failed or ended short of the traced output length")
        traced = "as traced" if self.fit is None else f"as fitted ({self.fit})"
        lengths = "; ".join(off) or f"prompt and output lengths {traced} (the server's counts)"
        hit_rate = run.prefix_cache_hit_rate
        hits = "prefix caching off or not counted" if hit_rate is None else f"the server hit {hit_rate:.1%}"
        if hit_rate is not None and hit_rate > self.cacheable_share + 0.005:
            hits += ", more than the trace allows: its cache held blocks from before the run (an earlier replay of it)"
        before = "" if self.traced_cacheable_share is None else f" ({self.traced_cacheable_share:.1%} as traced)"
        blocks = "" if self.kv_block is None else f" of {self.kv_block}-token blocks"
        return f"{when}; {lengths}; {self.cacheable_share:.1%} of prompt tokens could hit a prefix cache{blocks}{before}, {hits}"


class CapacityProbe(msgspec.Struct, frozen=True, kw_only=True):
    """One load a capacity search measured: its SLO latencies, output tok/s, and why it was
    stopped or failed, if it was (it then failed the SLO whatever its latencies)."""

    load: float
    latencies: dict[str, float]
    output_throughput: float
    mean_tpot_ms: float | None = None  # for the Pareto view: output tok/s per user is 1000 / it
    stopped: str | None = None


class CapacitySearch(msgspec.Struct, frozen=True, kw_only=True):
    """The highest load meeting the SLO that one search found (``measure.slo_capacity``), with what
    it rests on: every probe, the binding term, a cliff, and the search's own interval."""

    search: str  # "concurrency" or "rate" (requests/s)
    slo: dict[str, float]  # metric -> the most it may be
    load: float | None  # None: no load probed met the SLO
    interval: tuple[float, float] | None
    output_throughput: float | None  # at the capacity
    binding: str | None
    cliff: bool
    bound: str  # measure.slo_capacity.Bound: "found", "below-lowest", "above-highest", "below-probed" or "above-probed"
    probes: tuple[CapacityProbe, ...]

    @property
    def unit(self) -> str:
        return "concurrent requests" if self.search == "concurrency" else "requests/s"

    @property
    def none_met(self) -> str:
        """Why a search found no capacity (``load`` None): the plan's lowest load failed, or the probes ran out before it."""
        if self.bound == "below-probed":
            return f"every load probed failed the SLO, down to {min(p.load for p in self.probes):g}, before the probes ran out"
        return "even the lowest load failed the SLO"


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """One measured run; its fields are the blocks of a run's JSON, in order."""

    identity: RunIdentity
    context: RunContext
    metrics: dict[str, Number]  # ``vllm bench serve``'s names; the median repeat's
    steady_state: dict[str, Number] | None = None
    server: ServerCounters = msgspec.field(default_factory=ServerCounters)
    token_check: TokenCheck
    client: ClientLoad
    telemetry: dict[str, Any] | None = None  # ``TelemetrySummary.as_json()``
    requests_per_server: dict[str, float | None] = msgspec.field(default_factory=dict)
    scaling: Scaling | None = None  # set when replica counts were compared
    samples: dict[str, tuple[float | None, ...]] | None = None  # metric -> one value per repeat
    extra_repeats: Count = 0  # repeats added after the first ones because the verdicts could not decide
    saved_repeats: Count = 0  # planned repeats not taken: an early look found every verdict decided (core.sequential)
    needs_sessions: bool = False  # stopped with a verdict undecided that no repeat of this session could settle: only more sessions can
    elapsed_s: float | None = None  # wall seconds measuring the point took (every repeat, warm-up and probe; not the boot); None: not timed
    tolerances: dict[str, float] | None = None  # the suite's, per gated metric
    must_match: tuple[str, ...] = ()  # the suite's: environment fields a comparison needs equal (``core.environment``)
    baseline_max_age_days: int | None = None  # the suite's: a stored baseline older than this is named stale
    conditions: tuple[Loss, ...] = ()  # what was wrong with the device while it ran (``core.validity``)
    retaken: tuple[Loss, ...] = ()  # the conditions of load runs measured again, spoiled by the machine's other load (``core.validity.RETAKEN``)
    reference: str | None = None  # what its verdicts were judged against ("stored baseline", "history: 5 runs, ..."); None: nothing
    declines: tuple[Decline, ...] = ()  # gated metrics the history shows worse than their last good level (no boiling frog)
    runner_noise: dict[str, SessionSpread] = msgspec.field(default_factory=dict)  # gated metric -> how far this runner's sessions differ, from its history
    sessions: dict[str, tuple[int, ...]] | None = None  # gated metric -> how many of its samples each pooled session measured; None: one session
    trace: TraceReplay | None = None  # set when the workload is a trace
    capacity: tuple[CapacitySearch, ...] = ()  # a search workload's: one search per repeat; ``metrics`` are then its chosen probe's
    timeline: Timeline | None = None  # the run over time (``core.timeline``); None: not kept
    distributions: dict[str, tuple[float, ...]] = msgspec.field(default_factory=dict)  # latency -> its percentiles 0..100 (``core.summary.latency_quantiles``)
    profile: OperatorProfile | None = None  # operators by self time in one extra, unmeasured repeat (``core.profile``); None: not profiled

    @property
    def config_key(self) -> str:
        """The serving config's key, unique across suites (``ServingConfig.key``: ``b200/dp8``)."""
        return f"{self.identity.suite}/{self.identity.config}" if self.identity.suite else self.identity.config

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        return self.server.prefix_cache_hit_rate

    @property
    def failed_requests(self) -> int:
        """Requests that failed in any repeat: ``metrics`` is the median repeat's alone."""
        failed = finite_number(self.metrics.get("failed")) or 0.0
        repeats = (self.samples or {}).get("failed")
        if repeats:
            failed = max(failed, math.fsum(v for v in repeats if v is not None))
        return int(failed)

    @property
    def client_bound(self) -> str | None:
        return self.client.bound or None

    @property
    def baseline_context(self) -> Context:
        """The run's context as a baseline stores it (:func:`context_of`)."""
        return context_of(self.context.vllm_version, self.context.machine, self.context.started, self.context.environment)

    def value(self, name: str) -> float | None:
        """The finite number at the metric's registry path (``metrics.<name>``, ``telemetry.gpu...``);
        None where the run has none."""
        info = find(name)
        return None if info is None else finite_number(_leaf(self, info.path))

    def sessions_of(self, name: str, samples: int) -> tuple[int, ...]:
        """How many of the run's ``samples`` samples of ``name`` each session measured: one session
        unless the run pooled several whose counts still add up."""
        return session_counts((self.sessions or {}).get(name), samples)

    def gated_samples(self) -> dict[str, tuple[float, ...]]:
        """Every gated metric the run has a number for: ``samples.<name>`` when the run carries
        them (one value per repeat), else its single value at the registry path; in gate order."""
        return self._gated()[0]

    def lost_values(self) -> dict[str, str]:
        """Gated metric the run names without a number (a null, a NaN, among its samples or as
        its single value) -> where; data the run lost, which the verdicts decide about."""
        return self._gated()[1]

    def _gated(self) -> tuple[dict[str, tuple[float, ...]], dict[str, str]]:
        """A capacity search's probes ran at loads the search chose, which differ from one search to
        the next: only the capacity itself compares, so it alone is gated on such a run."""
        repeats = self.samples or {}
        found: dict[str, tuple[float, ...]] = {}
        lost: dict[str, str] = {}
        for name in {*self.metrics, *GATED, *repeats}:
            info = find(name)
            if info is None or not info.gated or (self.capacity and name not in CAPACITY_GATED):
                continue
            if not self.capacity and name in CAPACITY_GATED:
                continue
            if name in repeats:
                values = repeats[name]
                gaps = [i for i, v in enumerate(values) if finite_number(v) is None]
                if gaps:
                    lost[name] = f"samples.{name}[{gaps[0]}] is {json.dumps(values[gaps[0]])}"
                else:
                    found[name] = tuple(float(v) for v in values if v is not None)
                continue
            leaf = _leaf(self, info.path)
            value = finite_number(leaf)
            if value is not None:
                found[name] = (value,)
            elif leaf is None or isinstance(leaf, float):  # a null or a NaN: named without a number
                lost[name] = f"{'.'.join(info.path)} is {json.dumps(leaf)}"
        return {name: found[name] for name in gate_order(found)}, {name: lost[name] for name in gate_order(lost)}


def context_of(vllm_version: str | None, machine: Machine | None, date: str | None, environment: Environment | None = None) -> Context:
    """Where and with which versions something was measured, as a baseline or a stored canary answer
    keeps it (an empty text, an unknown CPU model, is null)."""
    return Context(
        vllm_version=vllm_version or None,
        machine=machine.known() if machine is not None else None,
        date=date or None,
        environment=environment,
    )


_ABSENT = object()


def _leaf(node: object, path: Sequence[str]) -> object:
    """The value at ``path`` through the run's blocks and JSON objects; ``_ABSENT`` where a step is missing."""
    for key in path:
        if isinstance(node, msgspec.Struct) and key in node.__struct_fields__:
            node = getattr(node, key)
        elif isinstance(node, Mapping) and key in node:
            node = node[key]
        else:
            return _ABSENT
    return node


def finite_number(value: object) -> float | None:
    """A finite number as a float; None for anything else (null, NaN, an infinity, absent)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None

"""Serving configurations and suite files: what to start, as data.

A suite file (TOML) names its hardware, its model, a ladder of serving configs (each
rung may inherit from an earlier one and change one thing) and the workloads to run on
them. Loading gives frozen :class:`ServingConfig` objects whose vLLM flags are already
rendered to argv; nothing here starts a process.

Kept as one module though over 400 lines: it is the schema of one file, the suite TOML,
and its errors name file, table and key through one set of helpers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.apikey import SERVER_ENV, is_api_key_option
from pytest_qwenperf.core.canary import CANARY, EXACT, CanaryFloor
from pytest_qwenperf.core.capacity import Search, SearchPlan, Slo
from pytest_qwenperf.core.environment import check_must_match
from pytest_qwenperf.core.identity import Identity, argv_digest
from pytest_qwenperf.core.metrics import FLOORED, GATED, SCALING, find
from pytest_qwenperf.core.summary import GoodputSLO
from pytest_qwenperf.core.textfiles import read_text
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.core.window import EXPECTED as WINDOW_EXPECTED
from pytest_qwenperf.core.window import Window, windowed_fingerprint
from pytest_qwenperf.loadgen.arrivals import Arrival, ArrivalError, ClosedLoop, OpenLoop, Replay, window_problem
from pytest_qwenperf.suite import embedded
from pytest_qwenperf.suite.workloads import ConversationWorkload, TraceWorkload, Workload, workload_from_dict

FlagValue = str | int | float | bool | dict[str, Any] | list[Any]

Routing = Literal["round-robin", "least-outstanding", "nginx"]
CapacityRelation = Literal["above", "not-below"]
Tier = Literal["nightly", "weekly"]
"""How often a suite measures a config or a workload: every night, or in the weekly run only (which
measures every point). A point is weekly where its config, its workload or a config its test also
measures is (``suite.selectors.tier_of``); pytest marks it ``weekly``, so the nightly run is
``-m "b200 and not weekly"``."""
"""How each config of a ``capacity_order`` stands to the one before it: carries more (``above``), or
at least as much within the search's resolution (``not-below``: a rung that need not add capacity
at this workload, only never lose it)."""
ROUTINGS: tuple[Routing, ...] = typing.get_args(Routing)
"""How the load reaches a config's replicas: the client round-robins per request (as a
Kubernetes ClusterIP does), the client sends each request to the replica with the fewest
in flight, or a real nginx with ``least_conn`` stands in front of them (the production
setup)."""


class SuiteError(ValueError):
    """A suite file is malformed; the message names the file, the key and what was expected."""


class ExpectedThroughput(schema.Shape, frozen=True):
    """What a config is expected to carry, as a suite file states it (a config's ``expected`` table):
    the throughput ``qwenperf plan`` times a point by when the history holds no run of it
    (:mod:`pytest_qwenperf.suite.cost`). A config's whole figure (all its replicas together), as its
    runs record it; not inherited, so each rung states its own."""

    total_token_throughput: Annotated[float, Meta(gt=0, description="tokens per second > 0")] | None = None
    output_throughput: Annotated[float, Meta(gt=0, description="tokens per second > 0")] | None = None


SAFE_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
"""Config ids and workload names: each names a folder or file of the baselines (``baseline.Identity.path``),
a pytest id and a Kubernetes label value, so one path component of plain characters."""
_SAFE_ID_EXPECTED = "letters, digits, '.', '_' and '-', beginning and ending with a letter or digit (it names baseline files)"



@dataclass(frozen=True)
class ServingConfig:
    """One serving configuration (a rung), identified by ``id`` across runs and baselines."""

    id: str
    model: str  # a HF id, a local folder, or an embedded model (``embedded:tiny``, ``embedded:gpu``)
    vllm_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    served_model_name: str | None = None
    description: str = ""
    inherits: str | None = None
    cpu_flags_any: tuple[str, ...] = ()  # the CPU needs one of these /proc/cpuinfo flags
    suite: str = ""  # the suite that defines it; ids are unique within a suite only
    improves: bool = False  # the ladder claims this rung is at least as fast as the one it inherits
    replicas: int = 1  # independent vLLM servers, each with its own device slice and N-th of the load
    routing: str = "round-robin"  # how requests reach the replicas: one of ROUTINGS
    canary: CanaryFloor | None = None  # the suite's floor for its canary answer against the rung it inherits
    expected: ExpectedThroughput | None = None  # the throughput the suite expects of it (``qwenperf plan``); None: not stated
    tier: Tier = "nightly"  # "weekly": only the weekly run measures it (marker ``weekly``; see ``suite.selectors.tier_of``)

    @property
    def key(self) -> str:
        """Unique across suites: ``b200/dp8``."""
        return f"{self.suite}/{self.id}" if self.suite else self.id


    @property
    def speculative(self) -> bool:
        return "--speculative-config" in self.vllm_args

    @property
    def canary_floor(self) -> CanaryFloor | None:
        """How far this rung's canary answer must agree with the rung it inherits: its ``canary``
        table; without one, a speculative rung must give the same tokens (speculative decoding
        is lossless), and any other rung is not held to its parent's answer."""
        if self.inherits is None:
            return None
        return self.canary or (EXACT if self.speculative else None)


PROBE_ROUNDS = 2
"""Requests a concurrency search's probe measures per stream (:meth:`SuiteWorkload.at_load`)."""
PROBE_MIN_REQUESTS = 64
"""The fewest requests a search's probe measures: enough for its p99 to mean something."""
PROBE_SPAN_S = 15.0
"""Seconds of arrivals a rate search's probe measures (:meth:`SuiteWorkload.at_load`): many request
lifetimes of a CPU or chat workload, for its queue to settle or to grow past the SLO."""


@dataclass(frozen=True)
class SuiteWorkload:
    """A workload as a suite runs it: what to send, how, on which rungs, and what must hold.

    The first ``warmup`` requests of the workload warm the server up and are not measured.
    ``floors`` maps a metric to per-config minimums (``"*"`` for every other config).
    """

    workload: Workload
    arrival: Arrival
    warmup: int = 0
    configs: tuple[str, ...] = ()  # empty: every config of the suite
    slo: GoodputSLO | None = None
    floors: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    expected: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()  # throughput -> per config, as floors: what ``qwenperf plan`` times it by
    search: SearchPlan | None = None  # find the highest load meeting ``slo`` instead of measuring ``arrival``'s
    capacity_order: tuple[tuple[str, float], ...] = ()  # configs by rising capacity, each with the factor it must reach over the first
    capacity_relation: CapacityRelation = "above"  # how each config of capacity_order stands to the one before it
    window: Window | None = None  # measure for this long once the batch is full (core.window); None: the whole workload
    tier: Tier = "nightly"  # "weekly": only the weekly run measures it

    @property
    def id(self) -> str:
        return self.workload.id

    def fingerprint(self) -> str:
        """What its runs are measured on: the workload's requests, and the window they are measured over."""
        return windowed_fingerprint(self.workload.fingerprint(), self.window)

    def capacity_slo(self) -> Slo:
        """The search's targets: the p99 of each latency the workload's SLO limits."""
        if self.slo is None:
            raise ValueError(f"workload {self.id!r} has no slo to search against")
        return Slo({f"p99_{key}_ms": limit for key, limit in self.slo.limits().items()})

    def at_load(self, load: float) -> SuiteWorkload:
        """This workload at another load of its search: a concurrency, or a request rate.

        At concurrency c a probe measures :data:`PROBE_ROUNDS` rounds of every stream (c x
        :data:`PROBE_ROUNDS` requests), at rate r the requests of :data:`PROBE_SPAN_S` seconds (r x
        :data:`PROBE_SPAN_S`); at least :data:`PROBE_MIN_REQUESTS`, at most what the workload
        measures. A probe of a low load then takes about as long as one of a high load, not several
        times longer (at a fixed count, a probe at an eighth of the rate took eight times as long), and
        a concurrency probe keeps its concurrency to the end."""
        if isinstance(self.arrival, ClosedLoop):
            return self._probing(dataclasses.replace(self.arrival, concurrency=int(load)), PROBE_ROUNDS * int(load))
        if isinstance(self.arrival, OpenLoop):
            return self._probing(dataclasses.replace(self.arrival, rate=load), math.ceil(PROBE_SPAN_S * load))
        raise ValueError(f"workload {self.id!r}: a replay has no load to search over")

    def _probing(self, arrival: Arrival, wanted: int) -> SuiteWorkload:
        """This workload under ``arrival``, measuring ``wanted`` requests within the bounds of :meth:`at_load`."""
        probe = dataclasses.replace(self, arrival=arrival)
        total = self.workload.num_prompts
        if total is None or "num_prompts" not in self.workload.__dataclass_fields__:
            return probe
        measured = min(total - self.warmup, max(PROBE_MIN_REQUESTS, wanted))
        return dataclasses.replace(probe, workload=dataclasses.replace(self.workload, num_prompts=self.warmup + measured))

    def runs_on(self, config_id: str) -> bool:
        return not self.configs or config_id in self.configs

    def expected_rate(self, metric: str, config_id: str) -> float | None:
        """The throughput the suite expects of this workload on ``config_id`` (its ``expected`` table;
        None: not stated here, the config's own figure then stands)."""
        for name, per_config in self.expected:
            if name == metric:
                table = dict(per_config)
                return table.get(config_id, table.get("*"))
        return None

    def floor(self, metric: str, config_id: str) -> float | None:
        for name, per_config in self.floors:
            if name == metric:
                table = dict(per_config)
                return table.get(config_id, table.get("*"))
        return None


def tiny_cpu_config(config_id: str = "cpu-base", extra_args: tuple[str, ...] = ()) -> ServingConfig:
    """The embedded default outside any suite: the tiny model on the CPU build."""
    return ServingConfig(
        id=config_id,
        model=embedded.TINY_MODEL_REF,
        vllm_args=embedded.CPU_BASE_ARGS + extra_args,
        env=embedded.CPU_ENV,
        served_model_name=embedded.TINY_MODEL_NAME,
    )


def render_flags(flags: Mapping[str, FlagValue]) -> tuple[str, ...]:
    """``{"max-model-len": 4096, "enable-prefix-caching": False, "speculative-config": {...}}`` → argv.

    Booleans use vLLM's ``--x`` / ``--no-x`` pairs, tables become JSON (as
    ``--speculative-config`` expects) and lists give one flag followed by its values.
    """
    argv: list[str] = []
    for name, value in flags.items():
        flag = f"--{name}"
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{name}")
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return tuple(argv)


HISTORY_WINDOW = 7
"""The last valid runs of the history a run is judged against when no baseline is stored, each a
session: a week of nights. Measured on 12 real sessions of this project's 2-vCPU runner
(``benchmarks/history_window.py``, tolerance 10 %, 400 draws; benchmarks/README.md): windows of
3, 5, 7 and 10 runs judged an unchanged session ``regression`` 5, 11, 6.75 and 13.5 % of the time
and a 20 % slower one 37, 45, 59 and 64 %, median MDE 24, 18, 15 and 15 %. Seven is the shortest
window past which the MDE stops shrinking much (the t quantile with 6 df), and a week of nights."""
BASELINE_MAX_AGE_DAYS = 90
"""A stored baseline older than this is named stale beside its verdicts: a quarter of nightly runs,
about three vLLM releases, after which the machine, its driver and the suite have usually moved."""


@dataclass(frozen=True)
class Suite:
    """A loaded suite file."""

    path: Path
    name: str
    hardware: str
    model: str
    configs: tuple[ServingConfig, ...]
    workloads: tuple[SuiteWorkload, ...] = ()
    description: str = ""
    gpus: int = 0  # GPUs one node must have (0: a CPU suite)
    ladder_tolerance: float = 0.10  # an improving rung may be this much slower before the ladder test fails
    repeats: int = 3  # load runs per (config, workload): the spread a verdict weighs changes against
    max_repeats: int | None = None  # load runs a point may take while its verdicts cannot decide; None: the repeats in force
    tolerances: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # per gated metric, for baselines recorded from this suite
    validity: ValidityLimits = ValidityLimits()  # when the device's conditions make a run invalid
    must_match: tuple[str, ...] = ()  # environment fields a comparison needs equal (``core.environment``)
    canary_floor: CanaryFloor = EXACT  # a config's canary answer against another session's (the [canary] table)
    history_window: int = HISTORY_WINDOW  # valid runs of the history a run without a stored baseline is judged against
    baseline_max_age_days: int = BASELINE_MAX_AGE_DAYS  # a stored baseline older than this is named stale
    boot_s: float | None = None  # seconds one server takes to boot (``qwenperf plan``); None: ``suite.cost``'s default for CPU or GPU
    repeat_spread: float | None = None  # how far a repeat's throughput is assumed to spread (CV), for the plan's MDE
    session_spread: float | None = None  # how far sessions apart are assumed to drift (CV), for the plan's MDE of two legs
    min_repeats: int | None = None  # the earliest look, before the planned repeats are in (core.sequential); None: none
    # machine id (Hardware.id) -> the pace its runs keep against the expected figures (``qwenperf plan``)
    pace: tuple[tuple[str, float], ...] = ()

    def config(self, config_id: str) -> ServingConfig:
        for cfg in self.configs:
            if cfg.id == config_id:
                return cfg
        raise SuiteError(f"{self.path}: no config {config_id!r}; configs are {[c.id for c in self.configs]}")

    def identity(self, config_id: str, workload_id: str, *, hardware: str | None = None) -> Identity:
        """The identity a run of ``config_id`` × ``workload_id`` from this suite has today.

        ``hardware``: the hardware id (``Hardware.id``); default the suite's hardware, which
        is the id of GPU hardware (a CPU id also names the CPU model and cores).
        """
        config = self.config(config_id)
        workload = next((w for w in self.workloads if w.id == workload_id), None)
        if workload is None or not workload.runs_on(config_id):
            raise SuiteError(f"{self.path}: workload {workload_id!r} does not run on config {config_id!r}")
        return Identity(
            hardware=hardware or self.hardware,
            model=config.model,
            suite=self.name,
            config=config.id,
            argv_sha256=argv_digest(config.vllm_args),
            workload=workload.id,
            workload_fingerprint=workload.fingerprint(),
        )


def load_suite(path: Path | str) -> Suite:
    """Read and check a suite file; every error names the file, the key and what was expected."""
    path = Path(path)
    text = read_text(path, "suite file", "a TOML suite file ([suite], [[config]], [[workload]])", SuiteError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    file = schema.convert(data, _SuiteFile, lambda m: SuiteError(f"{path}: {m.text(_field(data, m.path))}"))
    suite = file.suite
    wrong = check_must_match(suite.must_match)
    if wrong:
        raise SuiteError(f"{path}: suite.must_match: {wrong}")
    if suite.max_repeats is not None and suite.max_repeats < suite.repeats:
        raise _fail(path, "suite.max_repeats", f"a whole number of load runs >= suite.repeats ({suite.repeats})", suite.max_repeats)
    if suite.min_repeats is not None and suite.min_repeats > suite.repeats:
        raise _fail(
            path, "suite.min_repeats", f"a whole number of repeats from 2 to suite.repeats ({suite.repeats})", suite.min_repeats
        )
    if suite.model.startswith("embedded:") and suite.model not in embedded.EMBEDDED:
        raise _fail(path, "suite.model", f"a Hugging Face id, a folder or one of {', '.join(embedded.EMBEDDED)}", suite.model)
    served = suite.served_model_name
    if served is None:
        served = embedded.served_name(suite.model)
    base = _Rung(_flags(path, suite.vllm, "suite.vllm"), _env(path, suite.env, "suite.env"), 1, ROUTINGS[0])
    rungs: dict[str, _Rung] = {}
    configs = []
    for n, entry in enumerate(file.config):
        config_id = _safe_id(path, entry.id, f"config[{n}].id")
        where = f"config {config_id!r}"
        if config_id in rungs:
            raise SuiteError(f"{path}: {where}: id used twice")
        parent = entry.inherits
        if parent is not None and parent not in rungs:
            raise SuiteError(f"{path}: {where}.inherits: expected the id of an earlier config, got {parent!r}")
        if entry.improves and parent is None:
            raise _fail(path, f"{where}.improves", "improves only on a rung that inherits from another", entry.improves)
        if entry.canary is not None and parent is None:
            raise _fail(path, f"{where}.canary", "a canary floor only on a rung that inherits from another", msgspec.to_builtins(entry.canary))
        if entry.expected is not None:
            _expected(path, entry.expected, f"{where}.expected")
        inherited = rungs[parent] if parent else base
        rung = rungs[config_id] = _Rung(
            {**inherited.flags, **_flags(path, entry.vllm, f"{where}.vllm")},
            {**inherited.env, **_env(path, entry.env, f"{where}.env")},
            inherited.replicas if entry.replicas is None else entry.replicas,
            inherited.routing if entry.routing is None else entry.routing,
        )
        configs.append(
            ServingConfig(
                id=config_id,
                model=suite.model,
                vllm_args=render_flags(rung.flags),
                env=tuple(sorted(rung.env.items())),
                served_model_name=served,
                description=entry.description,
                inherits=parent,
                suite=suite.name,
                improves=entry.improves,
                cpu_flags_any=entry.cpu_flags_any,
                replicas=rung.replicas,
                routing=rung.routing,
                canary=entry.canary,
                expected=entry.expected,
                tier=entry.tier,
            )
        )
    _one_file_each(path, [c.id for c in configs], "config")
    workloads = tuple(_suite_workload(path, entry, f"workload[{n}]", set(rungs)) for n, entry in enumerate(file.workload))
    if len({w.id for w in workloads}) != len(workloads):
        raise SuiteError(f"{path}: workload: two workloads have the same id: {[w.id for w in workloads]}")
    return Suite(
        path=path,
        name=suite.name,
        hardware=suite.hardware,
        model=suite.model,
        configs=tuple(configs),
        workloads=workloads,
        description=suite.description,
        gpus=suite.gpus,
        ladder_tolerance=suite.ladder_tolerance,
        repeats=suite.repeats,
        max_repeats=suite.max_repeats,
        tolerances=_tolerances(path, suite.tolerances),
        validity=suite.validity,
        must_match=suite.must_match,
        canary_floor=file.canary,
        history_window=suite.history_window,
        baseline_max_age_days=suite.baseline_max_age_days,
        boot_s=suite.boot_s,
        repeat_spread=suite.repeat_spread,
        session_spread=suite.session_spread,
        min_repeats=suite.min_repeats,
        pace=tuple(sorted(suite.pace.items())),
    )


# --------------------------------------------------------------------------- #
# The file's shape: what a schema can say. Rules between values are checked by load_suite.
# --------------------------------------------------------------------------- #

_NonEmpty = Annotated[str, Meta(min_length=1, description="a non-empty string")]
_Strings = Annotated[tuple[str, ...], Meta(description="an array of strings")]
_Fraction = Annotated[float, Meta(ge=0, lt=1, description="a fraction between 0 and 1")]
_Env = Annotated[
    dict[str, Annotated[str, Meta(description="a string (the variable's value)")]],
    Meta(description="a table of strings (environment variables)"),
]
_Flags = Annotated[
    dict[str, Annotated[FlagValue, Meta(description="a string, number, boolean, table or array")]],
    Meta(description="a table of vLLM flags"),
]
_LOAD = "a table such as { concurrency = 32 }, { rate = 10 } or { replay = true }"
_CANARY = "a table such as { match_rate = 0.5, logprob_drift = 0.2 }"
_EXPECTED = "a table such as { total_token_throughput = 22300.0 } (or output_throughput)"


class _SuiteTable(schema.Shape, frozen=True):
    name: _NonEmpty
    hardware: _NonEmpty
    model: _NonEmpty
    gpus: Annotated[int, Meta(ge=0, description="a whole number of GPUs per node")] = 0
    served_model_name: Annotated[str, Meta(description="a string")] | None = None
    description: Annotated[str, Meta(description="a string")] = ""
    env: _Env = msgspec.field(default_factory=dict)
    vllm: _Flags = msgspec.field(default_factory=dict)
    ladder_tolerance: _Fraction = 0.10
    repeats: Annotated[int, Meta(ge=1, description="a whole number of load runs >= 1")] = 3
    max_repeats: Annotated[int, Meta(ge=1, description="a whole number of load runs >= 1")] | None = None
    tolerances: Annotated[dict[str, _Fraction], Meta(description="a table of gated metric = fraction")] = msgspec.field(
        default_factory=dict
    )
    validity: Annotated[ValidityLimits, Meta(description="a table of condition = largest share")] = ValidityLimits()
    must_match: _Strings = ()
    history_window: Annotated[int, Meta(ge=1, description="a whole number of runs >= 1")] = HISTORY_WINDOW
    baseline_max_age_days: Annotated[int, Meta(ge=1, description="a whole number of days >= 1")] = BASELINE_MAX_AGE_DAYS
    boot_s: Annotated[float, Meta(gt=0, le=86_400, description="a number of seconds > 0, at most a day (one server's boot)")] | None = None
    repeat_spread: (
        Annotated[float, Meta(gt=0, lt=1, description="a fraction > 0 and < 1 (a repeat's coefficient of variation)")] | None
    ) = None
    session_spread: (
        Annotated[float, Meta(gt=0, lt=1, description="a fraction > 0 and < 1 (how far sessions apart drift, as a coefficient of variation)")]
        | None
    ) = None
    min_repeats: Annotated[int, Meta(ge=2, description="a whole number of repeats >= 2 (the earliest look)")] | None = None
    pace: Annotated[
        dict[str, Annotated[float, Meta(gt=0, le=100, description="a factor > 0 (this machine's throughput over the expected figures')")]],
        Meta(description='a table of machine id = factor, such as { "cpu-amd-epyc-2c" = 0.5 }'),
    ] = msgspec.field(default_factory=dict)


class _ConfigTable(schema.Shape, frozen=True):
    """A rung; ``None`` where the rung keeps what it inherits."""

    id: _NonEmpty
    inherits: Annotated[str, Meta(description="the id of an earlier config")] | None = None
    description: Annotated[str, Meta(description="a string")] = ""
    env: _Env = msgspec.field(default_factory=dict)
    vllm: _Flags = msgspec.field(default_factory=dict)
    cpu_flags_any: _Strings = ()
    improves: Annotated[bool, Meta(description="true or false")] = False
    replicas: Annotated[int, Meta(ge=1, description="a whole number of vLLM servers >= 1")] | None = None
    routing: Annotated[Routing, Meta(description=f"one of {list(ROUTINGS)}")] | None = None
    canary: Annotated[CanaryFloor, Meta(description=_CANARY)] | None = None  # not inherited: it is about this rung's change
    expected: Annotated[ExpectedThroughput, Meta(description=_EXPECTED)] | None = None  # not inherited: each rung carries its own
    tier: Annotated[Tier, Meta(description=_TIER)] = "nightly"  # not inherited: a rung runs as often as it says


_TIER = '"nightly" or "weekly"'
_SEARCH = 'a table such as { by = "concurrency", lowest = 1, highest = 64 }'


class _SearchTable(schema.Shape, frozen=True):
    """A [[workload]]'s ``search``: the load it varies and the range (the start is its ``load``)."""

    by: Annotated[Search, Meta(description='"concurrency" or "rate"')]
    lowest: Annotated[float, Meta(gt=0, description="a load > 0")]
    highest: Annotated[float, Meta(gt=0, description="a load > 0")]
    resolution: Annotated[float, Meta(gt=0, lt=1, description="a fraction of the load in (0, 1)")] = 0.10
    max_probes: Annotated[int, Meta(ge=2, description="a whole number of probes >= 2")] = 12


class _RunTable(schema.Shape, frozen=True):
    """A [[workload]] table's keys that say how the suite runs it (the others describe the workload)."""

    load: Annotated[dict[str, Any], Meta(description=_LOAD)]
    warmup: Annotated[int, Meta(ge=0, description="a whole number of requests >= 0, below num_prompts")] = 0
    configs: _Strings = ()
    slo: Annotated[str, Meta(description='a goodput string such as "ttft:500 tpot:50"')] | None = None
    floors: Annotated[
        dict[
            str,
            Annotated[
                dict[str, Annotated[float, Meta(description="a finite number (the minimum)")]],
                Meta(description='a table of config id (or "*") = minimum'),
            ],
        ],
        Meta(description="a table of metric = { config = minimum }"),
    ] = msgspec.field(default_factory=dict)
    expected: Annotated[
        dict[
            str,
            Annotated[
                dict[str, Annotated[float, Meta(gt=0, description="tokens per second > 0")]],
                Meta(description='a table of config id (or "*") = tokens per second'),
            ],
        ],
        Meta(description="a table of throughput = { config = tokens per second }"),
    ] = msgspec.field(default_factory=dict)
    search: Annotated[_SearchTable, Meta(description=_SEARCH)] | None = None
    window: Annotated[str, Meta(description=WINDOW_EXPECTED)] | None = None
    tier: Annotated[Tier, Meta(description=_TIER)] = "nightly"
    capacity_order: _Strings = ()
    capacity_relation: Annotated[CapacityRelation, Meta(description='"above" or "not-below"')] = "above"
    capacity_factors: Annotated[
        dict[str, Annotated[float, Meta(ge=1.0, description="a factor >= 1 over the first config of capacity_order")]],
        Meta(description="a table of config id = factor"),
    ] = msgspec.field(default_factory=dict)


class _SuiteFile(schema.Shape, frozen=True):
    suite: Annotated[_SuiteTable, Meta(description="a table")]
    config: Annotated[
        tuple[Annotated[_ConfigTable, Meta(description="a [[config]] table")], ...],
        Meta(min_length=1, description="at least one [[config]] table"),
    ]
    workload: tuple[Annotated[dict[str, Any], Meta(description="a [[workload]] table")], ...] = ()
    canary: Annotated[CanaryFloor, Meta(description=_CANARY)] = EXACT


@dataclass(frozen=True)
class _Rung:
    """What a config hands down to the configs that inherit from it."""

    flags: dict[str, FlagValue]
    env: dict[str, str]
    replicas: int
    routing: Routing


def _field(data: Mapping[str, Any], path: tuple[schema.Step, ...]) -> str:
    """A path as the file's reader names it: ``config 'base'.vllm``, not ``config[0].vllm``, once the entry has an id."""
    if len(path) > 2 and path[0] in ("config", "workload") and isinstance(path[1], int):
        key = "id" if path[0] == "config" else "name"
        name = data[path[0]][path[1]].get(key)
        if path[2] != key and isinstance(name, str) and SAFE_ID.fullmatch(name):
            return f"{path[0]} {name!r}.{schema.field_name(path[2:])}"
    return schema.field_name(path)


def _fail(path: Path, key: str, expected: str, got: object) -> SuiteError:
    return SuiteError(f"{path}: {key}: expected {expected}, got {got!r}")


def _expected(path: Path, expected: ExpectedThroughput, key: str) -> None:
    """An ``expected`` table names at least one figure, each finite (TOML has ``inf``)."""
    figures = msgspec.structs.asdict(expected)
    if all(value is None for value in figures.values()):
        raise _fail(path, key, _EXPECTED, {})
    for name, value in figures.items():
        if value is not None and not math.isfinite(value):
            raise _fail(path, f"{key}.{name}", "a finite number of tokens per second > 0", value)


def _tolerances(path: Path, tolerances: Mapping[str, float]) -> Mapping[str, float]:
    for name in tolerances:
        info = find(name)
        if info is None or not info.gated:
            raise _fail(path, f"suite.tolerances.{name}", f"a gated metric, one of {list(GATED)} or {SCALING.shape}", name)
    return MappingProxyType(dict(tolerances))


def _safe_id(path: Path, value: str, key: str) -> str:
    if not SAFE_ID.fullmatch(value):
        raise _fail(path, key, f"an id of {_SAFE_ID_EXPECTED}", value)
    return value


def _one_file_each(path: Path, ids: Sequence[str], key: str) -> None:
    """No two ids may name the same baseline file, on case-insensitive file systems (macOS, Windows) either.

    An id of :data:`SAFE_ID` is its own file name (``baseline.slug`` leaves such text as it is),
    so only letter case can make two ids one file."""
    seen: dict[str, str] = {}
    for name in ids:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise SuiteError(
                f"{path}: {key}: ids {other!r} and {name!r} map to the same baseline file name {name!r}; "
                "expected ids that differ in more than letter case"
            )


def _env(path: Path, env: dict[str, str], key: str) -> dict[str, str]:
    if SERVER_ENV in env:
        raise _no_api_key(path, f"{key}.{SERVER_ENV}")
    return env


def _flags(path: Path, flags: dict[str, FlagValue], key: str) -> dict[str, FlagValue]:
    for name in flags:
        if is_api_key_option(f"--{name}"):
            raise _no_api_key(path, f"{key}.{name}")
        if name.startswith("-") or "_" in name:
            raise _fail(path, f"{key}.{name}", "a flag name as vLLM spells it, without leading dashes (max-model-len)", name)
    return flags


def _no_api_key(path: Path, key: str) -> SuiteError:
    """A key in a suite file would be committed with it and printed by ``qwenperf show``; refused without echoing it."""
    return SuiteError(
        f"{path}: {key}: an API key does not belong in a suite file; set {SERVER_ENV} in the environment of "
        "the pytest run instead (the servers the plugin starts get it from there, and its requests carry it)"
    )


def _suite_workload(path: Path, entry: Mapping[str, Any], where: str, config_ids: set[str]) -> SuiteWorkload:
    name = entry.get("name")
    if isinstance(name, str):
        where = f"workload {_safe_id(path, name, f'{where}.name')!r}"
        if name.casefold() == CANARY:
            raise _fail(path, f"{where}.name", f"a name other than {CANARY!r}, which names the file of a config's canary answer", name)
    source = f"{path}: {where}"
    run = schema.convert(
        {k: v for k, v in entry.items() if k in _RunTable.__struct_fields__},
        _RunTable,
        lambda m: SuiteError(f"{source}.{m.text()}"),
    )
    try:
        workload = workload_from_dict({k: v for k, v in entry.items() if k not in _RunTable.__struct_fields__}, source=source)
    except ValueError as exc:
        raise SuiteError(str(exc)) from None
    if isinstance(workload, TraceWorkload) and not Path(workload.path).is_absolute():
        workload = dataclasses.replace(workload, path=str(path.parent / workload.path))  # beside the suite file
    arrival = _arrival(path, run.load, f"{where}.load")
    if isinstance(arrival, Replay) and not isinstance(workload, TraceWorkload):
        raise _fail(path, f"{where}.load.replay", "a workload of kind 'trace' (only a trace has send times to replay)", workload.kind)
    # A JSONL workload without num_prompts sends every line: the count is known once the file is read.
    if workload.num_prompts is not None and run.warmup >= workload.num_prompts:
        raise _fail(path, f"{where}.warmup", f"a whole number of requests below num_prompts ({workload.num_prompts})", run.warmup)
    _check_warmup(path, run.warmup, where, arrival, workload)
    unknown = [c for c in run.configs if c not in config_ids]
    if unknown:
        raise _fail(path, f"{where}.configs", f"ids of configs of this suite {sorted(config_ids)}", unknown)
    slo = None
    if run.slo is not None:
        try:
            slo = GoodputSLO.parse(run.slo)
        except ValueError as exc:
            raise _fail(path, f"{where}.slo", str(exc), run.slo) from None
    floors = _floors(path, run.floors, f"{where}.floors", run.configs or sorted(config_ids))
    expected = _expected_rates(path, run.expected, f"{where}.expected", run.configs or sorted(config_ids))
    search = _search(path, run, f"{where}", arrival, workload)
    order = _capacity_order(path, run, where, run.configs or sorted(config_ids), search)
    window = _window(path, run, where, arrival)
    return SuiteWorkload(
        workload, arrival, run.warmup, run.configs, slo, floors, expected, search, order, run.capacity_relation, window, run.tier
    )


def _window(path: Path, run: _RunTable, where: str, arrival: Arrival) -> Window | None:
    """A workload's measured window; a search's probes measure their own rounds instead."""
    if run.window is None:
        return None
    try:
        window = Window.parse(run.window)
    except ValueError:
        raise _fail(path, f"{where}.window", WINDOW_EXPECTED, run.window) from None
    if run.search is not None:
        raise _fail(path, f"{where}.window", "no window with a search (each probe measures its own rounds)", run.window)
    problem = window_problem(window, arrival, run.warmup)
    if problem:
        raise _fail(path, f"{where}.window", problem, run.window)
    return window


def _check_warmup(path: Path, warmup: int, where: str, arrival: Arrival, workload: Workload) -> None:
    """A conversation's warm-up is whole conversations (the client sends a conversation as one),
    and a ramp needs a warm-up to rise over."""
    if isinstance(workload, ConversationWorkload) and warmup % workload.turns:
        raise _fail(path, f"{where}.warmup", f"whole conversations: a multiple of turns ({workload.turns}) requests", warmup)
    ramp = "ramp" if isinstance(arrival, OpenLoop) and arrival.ramp is not None else None
    if isinstance(arrival, ClosedLoop) and arrival.ramp_steps is not None:
        ramp = "ramp_steps"
    if ramp is not None and warmup == 0:
        raise _fail(path, f"{where}.warmup", f"warm-up requests (>= 1) for load.{ramp} to raise the load over", warmup)


def _search(path: Path, run: _RunTable, where: str, arrival: Arrival, workload: Workload) -> SearchPlan | None:
    """The search plan of a workload's ``search`` table, starting at its ``load``; it needs an ``slo``
    and a load of the kind it varies."""
    if run.search is None:
        return None
    table, key = run.search, f"{where}.search"
    if run.slo is None:
        raise _fail(path, f"{where}.slo", "an SLO to search against (a search needs one)", None)
    if any(value == 0 for value in GoodputSLO.parse(run.slo).limits().values()):
        raise _fail(path, f"{where}.slo", "limits > 0 (a capacity search holds the p99 of each to it)", run.slo)
    if table.by == "concurrency" and isinstance(arrival, ClosedLoop):
        start = float(arrival.concurrency)
    elif table.by == "rate" and isinstance(arrival, OpenLoop):
        start = arrival.rate
    else:
        wanted = "{ concurrency = N }" if table.by == "concurrency" else "{ rate = R }"
        raise _fail(path, f"{where}.load", f"a load of the kind the search varies, {wanted}", run.load)
    try:
        plan = SearchPlan(table.by, start, table.lowest, table.highest, table.resolution, table.max_probes)
    except ValueError as exc:
        raise _fail(path, key, f"lowest <= the load's {start:g} <= highest", f"{table.lowest:g}, {table.highest:g}") from exc
    measured = None if workload.num_prompts is None else workload.num_prompts - run.warmup
    if table.by == "concurrency" and measured is not None and table.highest > measured / PROBE_ROUNDS:
        raise _fail(
            path, f"{key}.highest", f"at most 1/{PROBE_ROUNDS} of the measured requests ({measured // PROBE_ROUNDS}), so that every probe keeps its concurrency", table.highest
        )
    return plan


def _capacity_order(
    path: Path, run: _RunTable, where: str, config_ids: Sequence[str], search: SearchPlan | None
) -> tuple[tuple[str, float], ...]:
    """``capacity_order`` with each config's ``capacity_factors`` entry: the least multiple of the first
    config's capacity it must reach (1.0: none besides being above the one before it)."""
    if not run.capacity_order:
        if run.capacity_factors:
            raise _fail(path, f"{where}.capacity_factors", "a capacity_order the factors apply to", dict(run.capacity_factors))
        return ()
    if search is None:
        raise _fail(path, f"{where}.capacity_order", "a search table (an order of capacities needs them measured)", list(run.capacity_order))
    for config_id in run.capacity_order:
        if config_id not in config_ids:
            raise _fail(path, f"{where}.capacity_order", f"configs this workload runs on {list(config_ids)}", config_id)
    for config_id in run.capacity_factors:
        if config_id not in run.capacity_order[1:]:
            raise _fail(path, f"{where}.capacity_factors.{config_id}", f"a config after the first of capacity_order {list(run.capacity_order)}", config_id)
    return tuple((config_id, run.capacity_factors.get(config_id, 1.0)) for config_id in run.capacity_order)


#: The keys of each kind of load, by the key that names the kind.
_LOAD_KEYS = {
    "concurrency": ("a closed loop (concurrency = N)", ("concurrency", "ramp_steps")),
    "rate": ("an open loop (rate = R)", ("rate", "distribution", "burstiness", "seed", "max_concurrency", "ramp", "ramp_steps")),
    "replay": ("a replay (replay = true)", ("replay", "time_scale", "max_lag_ms")),
}


def _arrival(path: Path, load: dict[str, Any], key: str) -> Arrival:
    """``{ concurrency = N, ramp_steps = S }`` (a closed loop, :class:`ClosedLoop`'s fields), ``{ rate = R, ... }``
    (an open loop, :class:`OpenLoop`'s fields) or ``{ replay = true, time_scale = S, max_lag_ms = L }`` (a trace at its
    own times, :class:`Replay`)."""
    named = next((k for k in _LOAD_KEYS if k in load), None)
    if named is None:
        raise _fail(path, key, _LOAD, load)
    kind, allowed = _LOAD_KEYS[named]
    unknown = sorted(set(load) - set(allowed))
    if unknown:
        raise SuiteError(f"{path}: {key}.{unknown[0]}: unknown key for {kind}; expected only {list(allowed)}")
    try:
        if "concurrency" in load:
            return ClosedLoop(**load)
        if "rate" in load:
            return OpenLoop(**load)
        if load["replay"] is not True:
            raise ArrivalError("replay", "true (replay the trace at its recorded times)", load["replay"])
        return Replay(**{k: v for k, v in load.items() if k != "replay"})
    except ArrivalError as exc:
        raise _fail(path, f"{key}.{exc.field}", exc.expected, exc.got) from None


def _expected_rates(
    path: Path, data: Mapping[str, Mapping[str, float]], key: str, config_ids: Sequence[str]
) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """``throughput = { config = tokens/s }``: what a workload is expected to carry per config, where
    its shape makes the config's own figure wrong for it (a prefill-heavy workload's tokens/s)."""
    rates = [field.name for field in msgspec.structs.fields(ExpectedThroughput)]
    for metric in data:
        if metric not in rates:
            raise _fail(path, f"{key}.{metric}", f"one of {rates}", metric)
    return _per_config(path, data, key, config_ids, "a finite number of tokens per second")


def _floors(
    path: Path, data: Mapping[str, Mapping[str, float]], key: str, config_ids: Sequence[str]
) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """``metric = { config = minimum }``: a metric the perf tests hold to a floor, configs this workload runs on."""
    for metric in data:
        info = find(metric)
        if info is None or not info.floor:
            raise _fail(path, f"{key}.{metric}", f"a metric with a floor, one of {list(FLOORED)} or {SCALING.shape}", metric)
    return _per_config(path, data, key, config_ids, "a finite number (the minimum)")


def _per_config(
    path: Path, data: Mapping[str, Mapping[str, float]], key: str, config_ids: Sequence[str], number: str
) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """A ``metric = { config = number }`` table whose metrics are checked: each config one this workload
    runs on (or ``"*"``), each number finite (``number`` says what it is); as the suite keeps it."""
    for metric, per_config in data.items():
        for config_id, value in per_config.items():
            if config_id != "*" and config_id not in config_ids:
                raise _fail(
                    path, f"{key}.{metric}.{config_id}", f'a config this workload runs on {list(config_ids)} or "*"', config_id
                )
            if not math.isfinite(value):
                raise _fail(path, f"{key}.{metric}.{config_id}", number, value)
    return tuple((metric, tuple(per_config.items())) for metric, per_config in data.items())

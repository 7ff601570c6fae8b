"""Serving configurations and suite files: what to start, as data.

A suite file (TOML) names its hardware, its model, a ladder of serving configs (each
rung may inherit from an earlier one and change one thing) and the workloads to run on
them. Loading gives frozen :class:`ServingConfig` objects whose vLLM flags are already
rendered to argv; nothing here starts a process.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_qwenperf.core.apikey import SERVER_ENV, is_api_key_option
from pytest_qwenperf.core.identity import Identity, argv_digest
from pytest_qwenperf.core.metrics import FLOORED, GATED, SCALING, find
from pytest_qwenperf.core.summary import GoodputSLO
from pytest_qwenperf.core.textfiles import read_text
from pytest_qwenperf.loadgen.arrivals import Arrival, ArrivalError, ClosedLoop, OpenLoop
from pytest_qwenperf.suite import embedded
from pytest_qwenperf.suite.workloads import Workload, workload_from_dict

FlagValue = str | int | float | bool | dict[str, Any] | list[Any]

ROUTINGS = ("round-robin", "least-outstanding", "nginx")
"""How the load reaches a config's replicas: the client round-robins per request (as a
Kubernetes ClusterIP does), the client sends each request to the replica with the fewest
in flight, or a real nginx with ``least_conn`` stands in front of them (the production
setup)."""


class SuiteError(ValueError):
    """A suite file is malformed; the message names the file, the key and what was expected."""


SAFE_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
"""Config ids and workload names: each names a folder or file of the baselines (``baseline.Identity.path``),
a pytest id and a Kubernetes label value, so one path component of plain characters."""
_SAFE_ID_EXPECTED = "letters, digits, '.', '_' and '-', beginning and ending with a letter or digit (it names baseline files)"



@dataclass(frozen=True)
class ServingConfig:
    """One serving configuration (a rung), identified by ``id`` across runs and baselines."""

    id: str
    model: str  # a HF id, a local folder, or ``embedded:tiny``
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

    @property
    def key(self) -> str:
        """Unique across suites: ``b200/dp8``."""
        return f"{self.suite}/{self.id}" if self.suite else self.id


    @property
    def speculative(self) -> bool:
        return "--speculative-config" in self.vllm_args


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

    @property
    def id(self) -> str:
        return self.workload.id

    def runs_on(self, config_id: str) -> bool:
        return not self.configs or config_id in self.configs

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
    tolerances: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # per gated metric, for baselines recorded from this suite

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
            workload_fingerprint=workload.workload.fingerprint(),
        )


def load_suite(path: Path | str) -> Suite:
    """Read and check a suite file; every error names the file, the key and what was expected."""
    path = Path(path)
    text = read_text(path, "suite file", "a TOML suite file ([suite], [[config]], [[workload]])", SuiteError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    reader = _Reader(path)
    suite = reader.table(data, "suite")
    reader.only_keys(data, "", {"suite", "config", "workload"})
    reader.only_keys(
        suite,
        "suite",
        {
            "name",
            "hardware",
            "gpus",
            "model",
            "served_model_name",
            "description",
            "env",
            "vllm",
            "ladder_tolerance",
            "repeats",
            "tolerances",
        },
    )
    suite_name = reader.string(suite, "suite.name")
    model = reader.string(suite, "suite.model")
    served = reader.optional_string(suite, "suite.served_model_name")
    if served is None and model == embedded.TINY_MODEL_REF:
        served = embedded.TINY_MODEL_NAME
    base_env = reader.env(suite.get("env", {}), "suite.env")
    base_flags = reader.flags(suite.get("vllm", {}), "suite.vllm")

    rungs: dict[str, tuple[dict[str, FlagValue], dict[str, str], int, str]] = {}
    configs = []
    entries = data.get("config", [])
    if not isinstance(entries, list) or not entries:
        raise SuiteError(f"{path}: config: expected at least one [[config]] table")
    for n, entry in enumerate(entries):
        where = f"config[{n}]"
        if not isinstance(entry, dict):
            raise SuiteError(f"{path}: {where}: expected a table, got {entry!r}")
        reader.only_keys(
            entry, where, {"id", "inherits", "description", "env", "vllm", "cpu_flags_any", "improves", "replicas", "routing"}
        )
        config_id = _safe_id(reader, reader.string(entry, f"{where}.id"), f"{where}.id")
        where = f"config {config_id!r}"
        if config_id in rungs:
            raise SuiteError(f"{path}: {where}: id used twice")
        parent = reader.optional_string(entry, f"{where}.inherits")
        if parent is not None and parent not in rungs:
            raise SuiteError(f"{path}: {where}.inherits: expected the id of an earlier config, got {parent!r}")
        flags, env, replicas, routing = rungs[parent] if parent else (base_flags, base_env, 1, ROUTINGS[0])
        flags = {**flags, **reader.flags(entry.get("vllm", {}), f"{where}.vllm")}
        env = {**env, **reader.env(entry.get("env", {}), f"{where}.env")}
        replicas = _replicas(reader, entry.get("replicas", replicas), f"{where}.replicas")
        routing = entry.get("routing", routing)
        if routing not in ROUTINGS:
            raise reader.fail(f"{where}.routing", f"one of {list(ROUTINGS)}", routing)
        rungs[config_id] = (flags, env, replicas, routing)
        configs.append(
            ServingConfig(
                id=config_id,
                model=model,
                vllm_args=render_flags(flags),
                env=tuple(sorted(env.items())),
                served_model_name=served,
                description=reader.optional_string(entry, f"{where}.description") or "",
                inherits=parent,
                suite=suite_name,
                improves=reader.boolean(entry, f"{where}.improves", parent is not None),
                cpu_flags_any=tuple(reader.strings(entry.get("cpu_flags_any", []), f"{where}.cpu_flags_any")),
                replicas=replicas,
                routing=routing,
            )
        )
    _one_file_each(reader, [c.id for c in configs], "config")
    gpus = suite.get("gpus", 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise reader.fail("suite.gpus", "a whole number of GPUs per node", gpus)
    workloads = tuple(
        _suite_workload(reader, entry, f"workload[{n}]", set(rungs)) for n, entry in enumerate(data.get("workload", []))
    )
    if len({w.id for w in workloads}) != len(workloads):
        raise SuiteError(f"{path}: workload: two workloads have the same id: {[w.id for w in workloads]}")
    return Suite(
        path=path,
        name=suite_name,
        hardware=reader.string(suite, "suite.hardware"),
        model=model,
        configs=tuple(configs),
        workloads=workloads,
        description=reader.optional_string(suite, "suite.description") or "",
        gpus=gpus,
        ladder_tolerance=_fraction(reader, suite.get("ladder_tolerance", 0.10), "suite.ladder_tolerance"),
        repeats=_repeats(reader, suite.get("repeats", 3)),
        tolerances=_tolerances(reader, suite.get("tolerances", {})),
    )


def _tolerances(reader: _Reader, value: object) -> Mapping[str, float]:
    if not isinstance(value, dict):
        raise reader.fail("suite.tolerances", "a table of gated metric = fraction", value)
    for name in value:
        info = find(name)
        if info is None or not info.gated:
            raise reader.fail(f"suite.tolerances.{name}", f"a gated metric, one of {list(GATED)} or {SCALING.shape}", name)
    return MappingProxyType({name: _fraction(reader, v, f"suite.tolerances.{name}") for name, v in value.items()})


def _safe_id(reader: _Reader, value: str, key: str) -> str:
    if not SAFE_ID.fullmatch(value):
        raise reader.fail(key, f"an id of {_SAFE_ID_EXPECTED}", value)
    return value


def _one_file_each(reader: _Reader, ids: Sequence[str], key: str) -> None:
    """No two ids may name the same baseline file, on case-insensitive file systems (macOS, Windows) either.

    An id of :data:`SAFE_ID` is its own file name (``baseline.slug`` leaves such text as it is),
    so only letter case can make two ids one file."""
    seen: dict[str, str] = {}
    for name in ids:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise SuiteError(
                f"{reader.path}: {key}: ids {other!r} and {name!r} map to the same baseline file name {name!r}; "
                "expected ids that differ in more than letter case"
            )


def _replicas(reader: _Reader, value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise reader.fail(key, "a whole number of vLLM servers >= 1", value)
    return value


def _repeats(reader: _Reader, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise reader.fail("suite.repeats", "a whole number of load runs >= 1", value)
    return value


def _fraction(reader: _Reader, value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise reader.fail(key, "a fraction between 0 and 1", value)
    return float(value)


_RUN_KEYS = {"load", "warmup", "configs", "slo", "floors"}


def _suite_workload(reader: _Reader, entry: object, where: str, config_ids: set[str]) -> SuiteWorkload:
    if not isinstance(entry, dict):
        raise reader.fail(where, "a [[workload]] table", entry)
    if "name" in entry:
        if isinstance(entry["name"], str):
            _safe_id(reader, entry["name"], f"{where}.name")
        where = f"workload {entry['name']!r}"
    source = f"{reader.path}: {where}"
    try:
        workload = workload_from_dict({k: v for k, v in entry.items() if k not in _RUN_KEYS}, source=source)
    except ValueError as exc:
        raise SuiteError(str(exc)) from None
    arrival = _arrival(reader, entry.get("load"), f"{where}.load")
    warmup = entry.get("warmup", 0)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup < workload.num_prompts:
        raise reader.fail(f"{where}.warmup", f"a whole number of requests below num_prompts ({workload.num_prompts})", warmup)
    configs = tuple(reader.strings(entry.get("configs", []), f"{where}.configs"))
    unknown = [c for c in configs if c not in config_ids]
    if unknown:
        raise reader.fail(f"{where}.configs", f"ids of configs of this suite {sorted(config_ids)}", unknown)
    slo = None
    if "slo" in entry:
        try:
            slo = GoodputSLO.parse(entry["slo"]) if isinstance(entry["slo"], str) else None
        except ValueError as exc:
            raise reader.fail(f"{where}.slo", str(exc), entry["slo"]) from None
        if slo is None:
            raise reader.fail(f"{where}.slo", 'a goodput string such as "ttft:500 tpot:50"', entry["slo"])
    floors = _floors(reader, entry.get("floors", {}), f"{where}.floors", configs or sorted(config_ids))
    return SuiteWorkload(workload, arrival, warmup, configs, slo, floors)


_OPEN_LOOP_KEYS = ("rate", "distribution", "burstiness", "seed", "max_concurrency")


def _arrival(reader: _Reader, load: object, key: str) -> Arrival:
    """``{ concurrency = N }`` (a closed loop) or ``{ rate = R, ... }`` (an open loop, :class:`OpenLoop`'s fields)."""
    if not isinstance(load, dict) or not ({"concurrency", "rate"} & set(load)):
        raise reader.fail(key, "a table such as { concurrency = 32 } or { rate = 10 }", load)
    closed = "concurrency" in load
    allowed = ("concurrency",) if closed else _OPEN_LOOP_KEYS
    unknown = sorted(set(load) - set(allowed))
    if unknown:
        kind = "a closed loop (concurrency = N)" if closed else "an open loop (rate = R)"
        raise SuiteError(f"{reader.path}: {key}.{unknown[0]}: unknown key for {kind}; expected only {list(allowed)}")
    try:
        return ClosedLoop(load["concurrency"]) if closed else OpenLoop(**load)
    except ArrivalError as exc:
        raise reader.fail(f"{key}.{exc.field}", exc.expected, exc.got) from None


def _floors(
    reader: _Reader, data: object, key: str, config_ids: Sequence[str]
) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """``metric = { config = minimum }``: a metric the perf tests hold to a floor, configs this workload runs on."""
    if not isinstance(data, dict):
        raise reader.fail(key, "a table of metric = { config = minimum }", data)
    floors = []
    for metric, per_config in data.items():
        info = find(metric)
        if info is None or not info.floor:
            raise reader.fail(f"{key}.{metric}", f"a metric with a floor, one of {list(FLOORED)} or {SCALING.shape}", metric)
        if not isinstance(per_config, dict):
            raise reader.fail(f"{key}.{metric}", 'a table of config id (or "*") = minimum', per_config)
        for config_id, minimum in per_config.items():
            if config_id != "*" and config_id not in config_ids:
                raise reader.fail(f"{key}.{metric}.{config_id}", f'a config this workload runs on {list(config_ids)} or "*"', config_id)
            if isinstance(minimum, bool) or not isinstance(minimum, (int, float)) or not math.isfinite(minimum):
                raise reader.fail(f"{key}.{metric}.{config_id}", "a finite number (the minimum)", minimum)
        floors.append((metric, tuple((c, float(v)) for c, v in per_config.items())))
    return tuple(floors)


class _Reader:
    """Typed access to parsed TOML with errors that say file, key and expectation."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, expected: str, got: object) -> SuiteError:
        return SuiteError(f"{self.path}: {key}: expected {expected}, got {got!r}")

    def table(self, data: Mapping[str, Any], key: str) -> dict[str, Any]:
        value = data.get(key)
        if not isinstance(value, dict):
            raise self.fail(key, "a table", value)
        return value

    def only_keys(self, data: Mapping[str, Any], where: str, allowed: set[str]) -> None:
        unknown = sorted(set(data) - allowed)
        if unknown:
            prefix = f"{where}." if where else ""
            raise SuiteError(f"{self.path}: {prefix}{unknown[0]}: unknown key; expected one of {sorted(allowed)}")

    def string(self, data: Mapping[str, Any], key: str) -> str:
        value = data.get(key.rsplit(".", 1)[-1])
        if not isinstance(value, str) or not value:
            raise self.fail(key, "a non-empty string", value)
        return value

    def optional_string(self, data: Mapping[str, Any], key: str) -> str | None:
        value = data.get(key.rsplit(".", 1)[-1])
        if value is not None and not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def boolean(self, data: Mapping[str, Any], key: str, allowed: bool) -> bool:
        value = data.get(key.rsplit(".", 1)[-1], False)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        if value and not allowed:
            raise self.fail(key, "improves only on a rung that inherits from another", value)
        return value

    def strings(self, data: object, key: str) -> list[str]:
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise self.fail(key, "an array of strings", data)
        return data

    def env(self, data: object, key: str) -> dict[str, str]:
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise self.fail(key, "a table of strings (environment variables)", data)
        if SERVER_ENV in data:
            raise self.no_api_key(f"{key}.{SERVER_ENV}")
        return dict(data)

    def no_api_key(self, key: str) -> SuiteError:
        """A key in a suite file would be committed with it and printed by ``qwenperf show``;
        refused without echoing it."""
        return SuiteError(
            f"{self.path}: {key}: an API key does not belong in a suite file; set {SERVER_ENV} in the environment of "
            "the pytest run instead (the servers the plugin starts get it from there, and its requests carry it)"
        )

    def flags(self, data: object, key: str) -> dict[str, FlagValue]:
        if not isinstance(data, dict):
            raise self.fail(key, "a table of vLLM flags", data)
        for name, value in data.items():
            if is_api_key_option(f"--{name}"):
                raise self.no_api_key(f"{key}.{name}")
            if name.startswith("-") or "_" in name:
                raise self.fail(f"{key}.{name}", "a flag name as vLLM spells it, without leading dashes (max-model-len)", name)
            if not isinstance(value, (str, int, float, bool, dict, list)):
                raise self.fail(f"{key}.{name}", "a string, number, boolean, table or array", value)
        return dict(data)

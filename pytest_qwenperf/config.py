"""Serving configurations and suite files: what to start, as data.

A suite file (TOML) names its hardware, its model, a ladder of serving configs (each
rung may inherit from an earlier one and change one thing) and the workloads to run on
them. Loading gives frozen :class:`ServingConfig` objects whose vLLM flags are already
rendered to argv; nothing here starts a process.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_qwenperf import embedded
from pytest_qwenperf.server import ServerSpec

FlagValue = str | int | float | bool | dict[str, Any] | list[Any]


class SuiteError(ValueError):
    """A suite file is malformed; the message names the file, the key and what was expected."""


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

    def server_spec(self, *, launcher: tuple[str, ...], boot_timeout_s: float) -> ServerSpec:
        return ServerSpec(
            model=embedded.resolve_model(self.model),
            args=self.vllm_args,
            name=self.id,
            served_model_name=self.served_model_name,
            env=self.env,
            launcher=launcher,
            boot_timeout_s=boot_timeout_s,
        )


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
    description: str = ""

    def config(self, config_id: str) -> ServingConfig:
        for cfg in self.configs:
            if cfg.id == config_id:
                return cfg
        raise SuiteError(f"{self.path}: no config {config_id!r}; configs are {[c.id for c in self.configs]}")


def load_suite(path: Path | str) -> Suite:
    """Read and check a suite file; every error names the file, the key and what was expected."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read suite file: {exc.strerror}") from None
    reader = _Reader(path)
    suite = reader.table(data, "suite")
    reader.only_keys(data, "", {"suite", "config"})
    reader.only_keys(suite, "suite", {"name", "hardware", "model", "served_model_name", "description", "env", "vllm"})
    model = reader.string(suite, "suite.model")
    served = reader.optional_string(suite, "suite.served_model_name")
    if served is None and model == embedded.TINY_MODEL_REF:
        served = embedded.TINY_MODEL_NAME
    base_env = reader.env(suite.get("env", {}), "suite.env")
    base_flags = reader.flags(suite.get("vllm", {}), "suite.vllm")

    rungs: dict[str, tuple[dict[str, FlagValue], dict[str, str]]] = {}
    configs = []
    entries = data.get("config", [])
    if not isinstance(entries, list) or not entries:
        raise SuiteError(f"{path}: config: expected at least one [[config]] table")
    for n, entry in enumerate(entries):
        where = f"config[{n}]"
        if not isinstance(entry, dict):
            raise SuiteError(f"{path}: {where}: expected a table, got {entry!r}")
        reader.only_keys(entry, where, {"id", "inherits", "description", "env", "vllm"})
        config_id = reader.string(entry, f"{where}.id")
        where = f"config {config_id!r}"
        if config_id in rungs:
            raise SuiteError(f"{path}: {where}: id used twice")
        parent = reader.optional_string(entry, f"{where}.inherits", key="inherits")
        if parent is not None and parent not in rungs:
            raise SuiteError(f"{path}: {where}.inherits: expected the id of an earlier config, got {parent!r}")
        flags, env = rungs[parent] if parent else (base_flags, base_env)
        flags = {**flags, **reader.flags(entry.get("vllm", {}), f"{where}.vllm")}
        env = {**env, **reader.env(entry.get("env", {}), f"{where}.env")}
        rungs[config_id] = (flags, env)
        configs.append(
            ServingConfig(
                id=config_id,
                model=model,
                vllm_args=render_flags(flags),
                env=tuple(sorted(env.items())),
                served_model_name=served,
                description=reader.optional_string(entry, f"{where}.description", key="description") or "",
                inherits=parent,
            )
        )
    return Suite(
        path=path,
        name=reader.string(suite, "suite.name"),
        hardware=reader.string(suite, "suite.hardware"),
        model=model,
        configs=tuple(configs),
        description=reader.optional_string(suite, "suite.description", key="description") or "",
    )


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

    def optional_string(self, data: Mapping[str, Any], where: str, key: str | None = None) -> str | None:
        value = data.get(key or where.rsplit(".", 1)[-1])
        if value is not None and not isinstance(value, str):
            raise self.fail(where, "a string", value)
        return value

    def env(self, data: object, key: str) -> dict[str, str]:
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise self.fail(key, "a table of strings (environment variables)", data)
        return dict(data)

    def flags(self, data: object, key: str) -> dict[str, FlagValue]:
        if not isinstance(data, dict):
            raise self.fail(key, "a table of vLLM flags", data)
        for name, value in data.items():
            if name.startswith("-") or "_" in name:
                raise self.fail(f"{key}.{name}", "a flag name as vLLM spells it, without leading dashes (max-model-len)", name)
            if not isinstance(value, (str, int, float, bool, dict, list)):
                raise self.fail(f"{key}.{name}", "a string, number, boolean, table or array", value)
        return dict(data)

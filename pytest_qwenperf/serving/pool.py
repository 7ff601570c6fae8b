"""Servers shared by many consumers: each config boots at most once, failures are remembered.

The pytest fixtures sit on top of this, but it is plain Python: a script that runs a
ladder uses the same pool.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.options import DEFAULT_BOOT_TIMEOUT_S
from pytest_qwenperf.serving.boot_progress import BootProgress, BootWatch
from pytest_qwenperf.serving.replicas import ReplicaSet, replica_specs
from pytest_qwenperf.serving.server import (
    DEFAULT_LAUNCHER,
    ExternalServer,
    ManagedServer,
    Server,
    ServerError,
    ServerSpec,
)
from pytest_qwenperf.serving.sleep import SLEEP_FLAG, Turns
from pytest_qwenperf.suite import embedded
from pytest_qwenperf.suite.config import ServingConfig
from pytest_qwenperf.suite.vllm_args import ParserUnavailable, ProfilerSwitch, launcher_python, profiler_switch


def server_spec(
    config: ServingConfig,
    *,
    launcher: tuple[str, ...],
    boot_timeout_s: float,
    cpus: frozenset[int] = frozenset(),
    api_key: ApiKey | None = None,
    profiler: ProfilerSwitch | None = None,
    vllm_cache: Path | None = None,
    sleep_mode: bool = False,
) -> ServerSpec:
    """How to start one server of ``config`` (the embedded model is built here when needed);
    ``vllm_cache``: the folder its vLLM keeps compiled graphs and model facts in (``VLLM_CACHE_ROOT``;
    None: vLLM's own default, ``~/.cache/vllm``), so that a runner's next session boots from them;
    ``sleep_mode``: started with ``--enable-sleep-mode``, to take turns on the GPUs (:mod:`~pytest_qwenperf.serving.sleep`)."""
    cache = (("VLLM_CACHE_ROOT", str(vllm_cache.resolve())),) if vllm_cache is not None else ()
    return ServerSpec(
        model=embedded.resolve_model(config.model),
        args=config.vllm_args + ((SLEEP_FLAG,) if sleep_mode else ()),
        name=config.id,
        served_model_name=config.served_model_name,
        env=config.env + cache,
        launcher=launcher,
        boot_timeout_s=boot_timeout_s,
        cpus=cpus,
        api_key=api_key,
        profiler=profiler,
    )

@dataclass(frozen=True)
class PoolSettings:
    """How servers are obtained: booted with ``launcher``, or taken from ``endpoints``."""

    log_dir: Path
    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S
    endpoints: tuple[str, ...] = ()
    endpoint_model: str | None = None  # the served model the endpoints must list (None: whichever they serve)
    api_key: ApiKey | None = None  # booted servers require it (through their environment); requests carry it
    profile: bool = False  # boot servers with vLLM's torch profiler on (off until /start_profile)
    boot_progress: BootProgress | None = None  # told of each boot as it waits for readiness (None: nobody)
    vllm_cache: Path | None = None  # vLLM's cache folder for booted servers (VLLM_CACHE_ROOT); None: vLLM's default
    # Servers booted in sleep mode take turns on the GPUs with every other server of these turns (the
    # launcher's and a candidate's pools share them): the one handed out is awake. None: all stay awake.
    turns: Turns | None = None


class BootFailedEarlier(ServerError):
    """A config whose boot already failed in this pool is not booted again."""


class ServerPool:
    """Boots each :class:`ServingConfig` once and hands out the running server."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.boots: Counter[str] = Counter()
        self.boot_seconds: dict[str, float] = {}  # config key -> seconds its boots took, until ready or failed
        self.booting_s = 0.0  # wall seconds callers waited on boots
        self._running: dict[str, ManagedServer | ReplicaSet] = {}
        self._failed: dict[str, ServerError] = {}
        self._external: ExternalServer | None = None
        self._profiler: ProfilerSwitch | None = None

    def get(self, config: ServingConfig, cpus: frozenset[int] = frozenset(), gpus: tuple[str, ...] = ()) -> Server:
        """The running server for ``config`` (on ``cpus`` if given), booting it on first use.

        A config of several replicas boots them all, each on its share of ``cpus`` and of
        the GPUs ``gpus`` (``CUDA_VISIBLE_DEVICES`` ids; empty: leave GPUs alone).
        """
        if self.settings.endpoints:
            return self._external_server()
        key = config.key
        turns = self.settings.turns
        if key in self._running:
            if turns is not None:
                turns.take(self._running[key])
            return self._running[key]
        if key in self._failed:
            raise BootFailedEarlier(f"config {key!r} failed to boot earlier in this session:\n{self._failed[key]}")
        waited = time.monotonic()
        try:
            if turns is not None:
                turns.rest()  # the GPUs' memory is the new server's to take
            booted = self._boot(key, self._server(config, cpus, gpus))
            if booted is not None and turns is not None:
                turns.join(booted)
        finally:
            self.booting_s += time.monotonic() - waited
        if booted is None:
            raise self._failed[key]
        return booted

    def _server(self, config: ServingConfig, cpus: frozenset[int], gpus: tuple[str, ...]) -> ManagedServer | ReplicaSet:
        """The (not yet started) server of ``config`` on ``cpus`` and ``gpus``."""
        spec = server_spec(
            config,
            launcher=self.settings.launcher,
            boot_timeout_s=self.settings.boot_timeout_s,
            cpus=cpus,
            api_key=self.settings.api_key,
            profiler=self._profiler_switch(),
            vllm_cache=self.settings.vllm_cache,
            sleep_mode=self.settings.turns is not None,
        )
        watch = BootWatch(self.settings.boot_progress, config.key) if self.settings.boot_progress is not None else None
        if config.replicas == 1:
            return ManagedServer(spec, self.settings.log_dir, watch)
        specs = replica_specs(spec, config.replicas, gpu_devices=gpus)
        return ReplicaSet(config.id, specs, self.settings.log_dir, routing=config.routing, watch=watch)

    def _boot(self, key: str, server: ManagedServer | ReplicaSet) -> ManagedServer | ReplicaSet | None:
        """Start ``server`` as config ``key``'s: kept as running, or its error kept as the config's
        (None returned); the boot's count and seconds are kept either way."""
        self.boots[key] += 1
        started = time.monotonic()
        try:
            server.start()
        except ServerError as exc:
            self._failed[key] = exc
            return None
        finally:
            self.boot_seconds[key] = self.boot_seconds.get(key, 0.0) + time.monotonic() - started
        self._running[key] = server
        return server

    def _profiler_switch(self) -> ProfilerSwitch | None:
        """How the launcher's vLLM turns its profiler on, asked of its parser once (None: not profiling)."""
        if self.settings.profile and self._profiler is None:
            python = launcher_python(self.settings.launcher)
            try:
                self._profiler = profiler_switch(python)
            except ParserUnavailable as exc:
                raise ServerError(f"cannot tell how the launcher's vLLM turns its profiler on: {exc}") from None
        return self._profiler

    def release(self, key: str) -> None:
        """Stop the server of config ``key`` (no more consumers); a later :meth:`get` boots it again."""
        server = self._running.pop(key, None)
        if server is not None:
            if self.settings.turns is not None:
                self.settings.turns.leave(server)
            server.stop()

    def close(self) -> None:
        """Stop every server; every one is attempted even if one fails to stop."""
        errors = []
        for key in list(self._running):
            try:
                self.release(key)
            except Exception as exc:  # keep stopping the others
                errors.append(f"{key}: {exc}")
        if errors:
            raise ServerError("could not stop every server: " + "; ".join(errors))

    def _external_server(self) -> ExternalServer:
        if self._external is None:
            # Whatever model the endpoints serve is the one measured; it is recorded in ``info``.
            self._external = ExternalServer(
                self.settings.endpoints,
                self.settings.endpoint_model,
                self.settings.boot_timeout_s,
                self.settings.api_key,
                self.settings.boot_progress,
            ).wait_ready()
        return self._external

"""Several independent vLLM servers for one serving config, and how the load reaches them.

A config with ``replicas = N`` runs N servers, each on its own slice of the machine (a
set of CPU cores on the CPU build, ``CUDA_VISIBLE_DEVICES`` of TP×PP×DP GPUs on GPU
hosts), with its own port and log. They boot in parallel and stop together; when one
fails to boot, the others are stopped and the error names it. The load reaches them by
the config's routing (:data:`~pytest_qwenperf.suite.config.ROUTINGS`): the client itself, or a
real nginx in front of them (:class:`~pytest_qwenperf.serving.router.NginxRouter`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pytest_qwenperf.core.parallel import gpus_per_server
from pytest_qwenperf.serving.boot_progress import BootWatch
from pytest_qwenperf.serving.process import ServerError, StartStop
from pytest_qwenperf.serving.router import NginxRouter
from pytest_qwenperf.serving.server import ManagedServer, ServerInfo, ServerSpec


class ReplicaError(ServerError):
    """A replica failed to boot, or stopped while the load ran; the message names it."""


def split_cpus(cpus: frozenset[int], replicas: int) -> tuple[frozenset[int], ...]:
    """``cpus`` cut into ``replicas`` disjoint, contiguous, equal slices (the rest left over).

    An empty set (no pinning) gives every replica no pinning.
    """
    if not cpus:
        return (frozenset(),) * replicas
    ordered = sorted(cpus)
    size = len(ordered) // replicas
    if size == 0:
        raise ReplicaError(f"{replicas} replicas need at least one CPU each; only CPUs {ordered} are given to the servers")
    return tuple(frozenset(ordered[i * size : (i + 1) * size]) for i in range(replicas))


def split_gpus(devices: Sequence[str], per_replica: int, replicas: int) -> tuple[str, ...]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each replica: consecutive groups of ``devices``."""
    needed = per_replica * replicas
    if needed > len(devices):
        raise ReplicaError(
            f"{replicas} replicas of {per_replica} GPU(s) each need {needed} GPUs; {len(devices)} are visible ({list(devices)})"
        )
    return tuple(",".join(devices[i * per_replica : (i + 1) * per_replica]) for i in range(replicas))


def replica_specs(spec: ServerSpec, replicas: int, *, gpu_devices: Sequence[str] = ()) -> tuple[ServerSpec, ...]:
    """``spec`` as ``replicas`` servers named ``<name>-r<i>``, each on its slice of
    ``spec.cpus`` and, when ``gpu_devices`` are given, of the GPUs."""
    cpus = split_cpus(spec.cpus, replicas)
    gpus = split_gpus(gpu_devices, gpus_per_server(spec.args), replicas) if gpu_devices else ()
    specs = []
    for i in range(replicas):
        env = dict(spec.env) | ({"CUDA_VISIBLE_DEVICES": gpus[i]} if gpus else {})
        specs.append(dataclasses.replace(spec, name=f"{spec.name}-r{i}", cpus=cpus[i], env=tuple(sorted(env.items()))))
    return tuple(specs)


class ReplicaSet(StartStop):
    """N managed servers of one config, booted in parallel, stopped together.

    ``base_urls`` are the replicas themselves (their /metrics, prefix-cache resets);
    ``load_urls`` is where requests go: the replicas, or the router in front of them.
    """

    def __init__(
        self, name: str, specs: Sequence[ServerSpec], log_dir: Path, *, routing: str = "round-robin", watch: BootWatch | None = None
    ) -> None:
        if not specs:
            raise ValueError("a replica set needs at least one server spec")
        self.name = name
        self.replicas = tuple(ManagedServer(spec, log_dir, watch.replica(i) if watch else None) for i, spec in enumerate(specs))
        self.routing = routing
        self.log_dir = log_dir
        self._router: NginxRouter | None = None

    # Server protocol -------------------------------------------------------------
    @property
    def base_urls(self) -> tuple[str, ...]:
        return tuple(r.base_url for r in self.replicas)

    @property
    def load_urls(self) -> tuple[str, ...]:
        return (self._router.base_url,) if self._router is not None else self.base_urls

    @property
    def model(self) -> str:
        return self.replicas[0].model

    @property
    def info(self) -> tuple[ServerInfo, ...]:
        return tuple(info for r in self.replicas for info in r.info)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(pid for r in self.replicas for pid in r.pids)

    @property
    def router(self) -> NginxRouter | None:
        """The nginx in front of the replicas while it runs (routing ``nginx``)."""
        return self._router

    # lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Boot every replica at once (and the router); on any failure stop them all and say which failed."""
        try:
            with ThreadPoolExecutor(len(self.replicas), thread_name_prefix="qwenperf-boot") as pool:
                outcomes = list(pool.map(_boot, self.replicas))
            failed = [(r, error) for r, error in zip(self.replicas, outcomes, strict=True) if error is not None]
            if failed:
                names = ", ".join(r.spec.name for r, _ in failed)
                first = failed[0][1]
                raise ReplicaError(f"replica(s) {names} of {len(self.replicas)} failed to boot; the first error:\n{first}") from first
            if self.routing == "nginx":
                self._router = NginxRouter(self.base_urls, self.log_dir, name=f"{self.name}-router")
                self._router.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the router and every replica (each is attempted even if another fails)."""
        router, self._router = self._router, None
        errors = []
        if router is not None:
            try:
                router.stop()
            except Exception as exc:
                errors.append(f"router: {exc}")
        with ThreadPoolExecutor(len(self.replicas), thread_name_prefix="qwenperf-stop") as pool:
            for replica, outcome in zip(self.replicas, pool.map(_stop, self.replicas), strict=True):
                if outcome is not None:
                    errors.append(f"{replica.spec.name}: {outcome}")
        if errors:
            raise ReplicaError("could not stop every replica: " + "; ".join(errors))

    def check_alive(self) -> None:
        """Raise :class:`ReplicaError` naming every replica whose server is no longer running."""
        dead = []
        for replica in self.replicas:
            try:
                replica.check_alive()
            except ServerError as exc:
                dead.append(f"replica {exc}")
        if dead:
            raise ReplicaError(f"{len(dead)} of {len(self.replicas)} replicas of {self.name} stopped:\n" + "\n".join(dead))


def _boot(replica: ManagedServer) -> BaseException | None:
    try:
        replica.start()
    except BaseException as exc:  # collected, then raised naming the replica
        return exc
    return None


def _stop(replica: ManagedServer) -> BaseException | None:
    try:
        replica.stop()
    except Exception as exc:
        return exc
    return None

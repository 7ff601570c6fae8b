"""Where a config runs on this machine: whether it can at all, and on which CPUs and GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_qwenperf.serving.hardware import Hardware, hardware_name, satisfies
from pytest_qwenperf.serving.router import RouterUnavailable, find_nginx
from pytest_qwenperf.suite import embedded
from pytest_qwenperf.suite.config import ServingConfig, Suite


def missing_gpus(suite: Suite, hw: Hardware) -> str | None:
    """Why no config of ``suite`` can run on ``hw`` (it needs GPUs that ``hw`` lacks), or None."""
    if suite.gpus and (not satisfies(hw.kind, suite.hardware) or hw.gpu_count < suite.gpus):
        return f"needs {suite.gpus}x {hardware_name(suite.hardware)} GPUs (suite {suite.path.name}); found {hw.describe()}"
    return None


def missing_hardware(suite: Suite, cfg: ServingConfig, hw: Hardware) -> str | None:
    """Why ``cfg`` cannot run on ``hw`` (a skip reason naming need and finding), or None."""
    gpus = missing_gpus(suite, hw)
    if gpus is not None:
        return gpus
    if cfg.cpu_flags_any and not set(cfg.cpu_flags_any) & hw.cpu_flags:
        return f"needs a CPU with one of {list(cfg.cpu_flags_any)} (config {cfg.key}); found {hw.cpu_model or 'a CPU'} without"
    if cfg.routing == "nginx":
        try:
            find_nginx()
        except RouterUnavailable as exc:
            return f"config {cfg.key} routes through nginx: {exc}"
    return None


@dataclass(frozen=True)
class Placement:
    """The CPUs the servers and the load generator are pinned to (empty: not pinned)."""

    server_cpus: frozenset[int]
    client_cpus: frozenset[int]


def placement(
    cfg: ServingConfig, hw: Hardware, *, server_cpus: frozenset[int] | None = None, client_cpus: frozenset[int] | None = None
) -> Placement:
    """Server and client CPUs: as given, else disjoint cores for the CPU build (repeatable figures).

    When either is given, both are taken as given (the other unpinned). Otherwise the CPU
    build's servers get every CPU of ``hw`` but the last, the client the last; replicas split
    the servers' CPUs. When there are only as many CPUs as replicas, each replica gets one
    and the client is not pinned (it shares them: a 2-core machine measuring 2 replicas).
    GPU configs are not pinned.
    """
    if server_cpus is not None or client_cpus is not None:
        return Placement(server_cpus or frozenset(), client_cpus or frozenset())
    cpus = sorted(hw.cpu_ids)
    if not embedded.on_cpu_build(cfg.model) or len(cpus) < 2:
        return Placement(frozenset(), frozenset())
    if len(cpus) - 1 >= cfg.replicas:
        return Placement(frozenset(cpus[:-1]), frozenset(cpus[-1:]))
    if len(cpus) >= cfg.replicas:
        return Placement(frozenset(cpus), frozenset())
    return Placement(frozenset(), frozenset())


def gpu_ids(cfg: ServingConfig, hw: Hardware) -> tuple[str, ...]:
    """The GPUs a config's replicas share out (its own CUDA_VISIBLE_DEVICES, else every GPU of ``hw``); none for one server."""
    if cfg.replicas == 1:
        return ()
    visible = dict(cfg.env).get("CUDA_VISIBLE_DEVICES")
    return tuple(visible.split(",")) if visible else tuple(str(i) for i in range(hw.gpu_count))

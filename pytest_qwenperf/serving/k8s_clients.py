"""The client side of a rung on Kubernetes (``qwenperf render-k8s --clients N``): a KubeRay
``RayCluster`` whose worker pods hold the client workers, and a ``RayJob`` that joins it and runs
``qwenperf bench --ray auto`` against the servers' Service.

The head pod offers no CPU to Ray (``num-cpus: 0``), so every client worker (one CPU each, placed
with Ray's ``SPREAD`` strategy: ``loadgen.ray_workers``) runs on a worker pod; the pods are sized
so that the workers fit, ``cpus_per_pod`` each. The job's entrypoint runs on the head and drives
the load from the workers; its result is the bench's output in the job's log. Both objects are
KubeRay's ``ray.io/v1`` kinds, checked in the tests against the CRDs' own schemas.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from pytest_qwenperf.serving.k8s import PORT

RAY_VERSION = "2.52.0"
"""The Ray release the rendered cluster declares (``rayVersion``); it must match the image's."""


@dataclass(frozen=True)
class ClientPods:
    """``workers`` client processes (one CPU each) on Ray worker pods of ``cpus_per_pod`` CPUs,
    from ``image`` (Ray and ``pytest-qwenperf[ray]`` installed), sending the load that
    ``bench_args`` give ``qwenperf bench``."""

    workers: int
    image: str
    cpus_per_pod: int = 8
    bench_args: tuple[str, ...] = ()

    @property
    def pods(self) -> int:
        return math.ceil(self.workers / self.cpus_per_pod)


def render_client_manifests(server: dict[str, Any], clients: ClientPods) -> list[dict[str, Any]]:
    """The ``RayCluster`` and the ``RayJob`` for the servers whose Service is ``server`` (as
    :func:`~pytest_qwenperf.serving.k8s.render_manifests` renders it), in its namespace."""
    if clients.workers < 1 or clients.cpus_per_pod < 1:
        raise ValueError(f"clients: expected at least one worker and one CPU a pod, got {clients.workers} and {clients.cpus_per_pod}")
    name = server["metadata"]["name"]
    cluster = f"{name}-clients"
    labels = {"app.kubernetes.io/name": "qwenperf-clients", "app.kubernetes.io/instance": name}
    namespace = server["metadata"].get("namespace")
    placed = {"namespace": namespace} if namespace else {}
    memory = f"{2 * clients.cpus_per_pod}Gi"
    ray_cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": cluster, "labels": labels, **placed},
        "spec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},  # no client worker on the head: it runs the job's driver
                "template": {"spec": {"containers": [_container("ray-head", clients.image, 2, "8Gi")]}},
            },
            "workerGroupSpecs": [
                {
                    "groupName": "clients",
                    "replicas": clients.pods,
                    "minReplicas": clients.pods,
                    "maxReplicas": clients.pods,
                    "rayStartParams": {"num-cpus": str(clients.cpus_per_pod)},
                    "template": {"spec": {"containers": [_container("ray-worker", clients.image, clients.cpus_per_pod, memory)]}},
                }
            ],
        },
    }
    bench = ["qwenperf", "bench", "--ray", "auto", "--workers", str(clients.workers), "--endpoint", f"http://{name}:{PORT}"]
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": f"{name}-load", "labels": labels, **placed},
        "spec": {
            "entrypoint": shlex.join([*bench, "--progress", "off", *clients.bench_args]),
            "clusterSelector": {"ray.io/cluster": cluster},
        },
    }
    return [ray_cluster, job]


def _container(name: str, image: str, cpus: int, memory: str) -> dict[str, Any]:
    amount = {"cpu": str(cpus), "memory": memory}
    return {"name": name, "image": image, "resources": {"requests": amount, "limits": amount}}

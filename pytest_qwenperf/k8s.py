"""Kubernetes manifests that run one rung of a suite on N nodes: ``qwenperf render-k8s``.

One Deployment of N pods, each pod a whole node's worth of the rung (the suite's ``gpus``
per pod, kept on separate nodes by pod anti-affinity), running exactly the argv
``qwenperf show`` prints, behind a ClusterIP Service: kube-proxy spreads connections over
the pods, the plain round-robin the write-up measured at 96.5 % scaling efficiency over 12
nodes. Pods carry the ``prometheus.io/*`` scrape annotations so a cluster's Prometheus
collects vLLM's ``/metrics``; probes use vLLM's ``/health``. Point the suite at the
Service's URL to measure the rung at that node count.
"""

from __future__ import annotations

import re
from typing import Any

from pytest_qwenperf.config import ServingConfig, Suite, SuiteError

PORT = 8000
# The vLLM release the b200 ladder was published with; pass ``--image`` for another.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.18.0"
# Loading 27B of weights, compiling and capturing CUDA graphs takes minutes: the startup
# probe allows 30 minutes before the liveness probe may restart a pod that is still loading.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 180


def render_manifests(
    suite: Suite, config_id: str, replicas: int, *, image: str = DEFAULT_IMAGE, namespace: str | None = None
) -> list[dict[str, Any]]:
    """The Deployment and the Service, as Kubernetes API objects (plain dicts, ready for YAML)."""
    if replicas < 1:
        raise SuiteError(f"replicas must be at least 1, got {replicas}")
    cfg = suite.config(config_id)
    if cfg.model.startswith("embedded:"):
        raise SuiteError(
            f"{suite.path}: config {cfg.id!r}: the model {cfg.model!r} is generated on the machine that runs the suite; "
            "render-k8s needs a model the pods can download (a Hugging Face id)"
        )
    name = _dns_label(f"qwenperf-{suite.name}-{cfg.id}")
    labels = {"app.kubernetes.io/name": "qwenperf-vllm", "app.kubernetes.io/instance": name}
    metadata: dict[str, Any] = {"name": name, "labels": {**labels, "qwenperf/suite": suite.name, "qwenperf/config": cfg.id}}
    if namespace:
        metadata["namespace"] = namespace
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"},
                },
                "spec": _pod_spec(suite, cfg, image, labels),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {"type": "ClusterIP", "selector": labels, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }
    return [deployment, service]


def container_args(cfg: ServingConfig) -> list[str]:
    """``vllm serve``'s arguments: the model, the rung's argv unchanged, then where to listen."""
    served = ["--served-model-name", cfg.served_model_name] if cfg.served_model_name else []
    return [cfg.model, *cfg.vllm_args, *served, "--host", "0.0.0.0", "--port", str(PORT)]


def _pod_spec(suite: Suite, cfg: ServingConfig, image: str, labels: dict[str, str]) -> dict[str, Any]:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    container: dict[str, Any] = {
        "name": "vllm",
        "image": image,
        "command": ["vllm", "serve"],
        "args": container_args(cfg),
        "env": [{"name": key, "value": value} for key, value in cfg.env],
        "ports": [{"name": "http", "containerPort": PORT}],
        "startupProbe": {**health, "periodSeconds": STARTUP_PERIOD_S, "failureThreshold": STARTUP_FAILURES},
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        # Tensor parallelism exchanges through shared memory; a container's default /dev/shm is 64 MiB.
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if suite.gpus:
        gpus = {"nvidia.com/gpu": str(suite.gpus)}
        container["resources"] = {"requests": gpus, "limits": gpus}
    return {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        # One pod per node: each pod is a whole node's worth of the rung (its `gpus`).
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        },
        "terminationGracePeriodSeconds": 60,
    }


def _dns_label(text: str) -> str:
    """A Kubernetes object name: lowercase alphanumerics and '-', at most 63 characters."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:63].rstrip("-")

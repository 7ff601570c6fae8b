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

import argparse
import re
from dataclasses import dataclass
from typing import Any

from pytest_qwenperf.core.apikey import SERVER_ENV
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteError

PORT = 8000
# The vLLM release the b200 ladder was published with; pass ``--image`` for another.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.18.0"
# Loading 27B of weights, compiling and capturing CUDA graphs takes minutes: the startup
# probe allows 30 minutes before the liveness probe may restart a pod that is still loading.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 180

_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # a DNS subdomain
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class SecretKeyRef:
    """Where the pods read vLLM's API key: key ``key`` of the Secret ``name`` in their namespace.

    The key reaches vLLM as ``VLLM_API_KEY`` from the Secret, so it is in neither the manifest
    nor the container's argv. vLLM 0.32 asks for it under ``/v1`` only: the ``/health``
    probes and Prometheus' ``/metrics`` scrapes below need none (see :mod:`pytest_qwenperf.core.apikey`).
    """

    name: str
    key: str = "api-key"

    @classmethod
    def parse(cls, text: str) -> SecretKeyRef:
        """``NAME`` or ``NAME:KEY``, as ``--api-key-secret`` takes it (an argparse ``type``)."""
        name, colon, key = text.partition(":")
        ref = cls(name, key) if colon else cls(name)
        if len(ref.name) > 253 or not _SECRET_NAME.fullmatch(ref.name):
            raise argparse.ArgumentTypeError(
                f"expected NAME[:KEY] with NAME a Secret's name (lowercase letters, digits, '-' and '.'), got {text!r}"
            )
        if len(ref.key) > 253 or not _SECRET_KEY.fullmatch(ref.key):
            raise argparse.ArgumentTypeError(f"expected NAME[:KEY] with KEY of letters, digits, '-', '_' and '.', got {text!r}")
        return ref

    def env_var(self) -> dict[str, Any]:
        return {"name": SERVER_ENV, "valueFrom": {"secretKeyRef": {"name": self.name, "key": self.key}}}


def render_manifests(
    suite: Suite,
    config_id: str,
    replicas: int,
    *,
    image: str = DEFAULT_IMAGE,
    namespace: str | None = None,
    api_key_secret: SecretKeyRef | None = None,
) -> list[dict[str, Any]]:
    """The Deployment and the Service, as Kubernetes API objects (plain dicts, ready for YAML).

    ``api_key_secret``: the servers require the API key stored there (vLLM's ``--api-key``)."""
    if replicas < 1:
        raise SuiteError(f"replicas must be at least 1, got {replicas}")
    cfg = suite.config(config_id)
    if cfg.model.startswith("embedded:"):
        raise SuiteError(
            f"{suite.path}: config {cfg.id!r}: the model {cfg.model!r} is generated on the machine that runs the suite; "
            "render-k8s needs a model the pods can download (a Hugging Face id)"
        )
    name = _object_name(suite, cfg)
    labels = {"app.kubernetes.io/name": "qwenperf-vllm", "app.kubernetes.io/instance": name}
    metadata: dict[str, Any] = {"name": name, "labels": {**labels, "qwenperf/suite": suite.name, "qwenperf/config": cfg.id}}
    if namespace:
        if not is_namespace(namespace):
            raise ValueError(f"namespace: expected {_NAMESPACE_RULE}, got {namespace!r}")
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
                "spec": _pod_spec(suite, cfg, image, labels, api_key_secret),
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


def _pod_spec(
    suite: Suite, cfg: ServingConfig, image: str, labels: dict[str, str], api_key_secret: SecretKeyRef | None
) -> dict[str, Any]:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    container: dict[str, Any] = {
        "name": "vllm",
        "image": image,
        "command": ["vllm", "serve"],
        "args": container_args(cfg),
        "env": [{"name": key, "value": value} for key, value in cfg.env] + ([api_key_secret.env_var()] if api_key_secret else []),
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


MAX_NAME = 63
_RFC1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")


_NAMESPACE_RULE = f"a Kubernetes namespace (at most {MAX_NAME} lowercase letters, digits and '-', beginning and ending with a letter or digit)"


def is_namespace(value: str) -> bool:
    """A valid namespace name: an RFC 1123 label."""
    return len(value) <= MAX_NAME and _RFC1123_LABEL.fullmatch(value) is not None


def namespace_option(value: str) -> str:
    """``--namespace``, checked at argument parsing (an argparse ``type``)."""
    if not is_namespace(value):
        raise argparse.ArgumentTypeError(f"expected {_NAMESPACE_RULE}, got {value!r}")
    return value


def object_name(suite: Suite, cfg: ServingConfig) -> str:
    """``qwenperf-<suite>-<config>``, lowercased, other characters as '-': an RFC 1035 label, as a
    Service's name must be (it starts with a letter). Checked by :func:`_check_names`."""
    return re.sub(r"[^a-z0-9]+", "-", f"qwenperf-{suite.name}-{cfg.id}".lower()).strip("-")


def _object_name(suite: Suite, cfg: ServingConfig) -> str:
    """The objects' name, refused (never cut short) when Kubernetes would not take it, and when
    another config of the suite maps to the same name (one would replace the other when applied);
    the suite's name and the config id must be valid label values too."""
    for field, value in (("suite.name", suite.name), (f"config {cfg.id!r}.id", cfg.id)):
        if len(value) > MAX_NAME or not _LABEL_VALUE.fullmatch(value):
            raise SuiteError(
                f"{suite.path}: {field}: expected a Kubernetes label value (at most {MAX_NAME} letters, digits, '-', '_' "
                f"and '.', beginning and ending with a letter or digit) for render-k8s, got {value!r}"
            )
    name = object_name(suite, cfg)
    if len(name) > MAX_NAME:
        raise SuiteError(
            f"{suite.path}: config {cfg.id!r}: the Kubernetes object name {name!r} has {len(name)} characters; "
            f"expected at most {MAX_NAME}: shorten the config id or suite.name"
        )
    same = [other.id for other in suite.configs if other.id != cfg.id and object_name(suite, other) == name]
    if same:
        raise SuiteError(
            f"{suite.path}: config {cfg.id!r}: its Kubernetes object name {name!r} is also config {same[0]!r}'s; "
            "expected config ids that differ in more than letter case and punctuation"
        )
    return name

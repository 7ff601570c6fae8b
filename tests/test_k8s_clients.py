"""``qwenperf render-k8s --clients N``: the client side of a rung on Kubernetes, a KubeRay
RayCluster and a RayJob, checked against KubeRay's own CRD schemas (the ``v1`` openAPIV3Schema of
``ray.io_rayclusters.yaml`` and ``ray.io_rayjobs.yaml`` at kuberay commit feeaf72fa, kept in
``tests/data/kuberay/``)."""

from __future__ import annotations

import gzip
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from pytest_qwenperf.serving.k8s_clients import ClientPods, render_client_manifests

SUITES = Path(__file__).resolve().parents[1] / "perf_tests" / "suites"
SCHEMAS = Path(__file__).parent / "data" / "kuberay"


def strict(node: Any) -> Any:
    """The schema as ``kubectl apply`` holds an object to it (strict field validation, its default):
    an object with declared properties has no others, unless it keeps unknown fields."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    found = {key: strict(value) for key, value in node.items()}
    if "properties" in found and "additionalProperties" not in found and not found.get("x-kubernetes-preserve-unknown-fields"):
        found["additionalProperties"] = False
    return found


def schema(kind: str) -> dict[str, Any]:
    return strict(json.loads(gzip.decompress((SCHEMAS / f"{kind.lower()}s.v1.json.gz").read_bytes())))


def assert_valid(manifest: dict[str, Any]) -> None:
    jsonschema.validate(manifest, schema(manifest["kind"]))


def render(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "render-k8s", str(SUITES / "b200.toml"), "--config", "dp8-ctx4k-fp8kv-mtp1"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_write_ups_clients_for_12_nodes_are_a_valid_ray_cluster_and_job() -> None:
    load = "--input-len 1024 --output-len 512 --num-prompts 65536 --max-concurrency 49152"
    done = render("--replicas", "12", "--namespace", "bench", "--clients", "32", "--client-image", "registry.example/qwenperf-ray:1",
                  "--bench-args", load)  # fmt: skip
    assert done.returncode == 0, done.stderr
    deployment, service, cluster, job = yaml.safe_load_all(done.stdout)
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 12
    for manifest in (cluster, job):
        assert_valid(manifest)
        assert manifest["metadata"]["namespace"] == "bench"
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    assert workers["replicas"] == 4 and workers["rayStartParams"] == {"num-cpus": "8"}  # 32 workers on pods of 8 CPUs
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}  # no client worker beside the driver
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:8] == ["qwenperf", "bench", "--ray", "auto", "--workers", "32", "--endpoint", f"http://{service['metadata']['name']}:8000"]
    assert argv[-8:] == ["--input-len", "1024", "--output-len", "512", "--num-prompts", "65536", "--max-concurrency", "49152"]


def test_a_misspelt_field_fails_the_crd_schema() -> None:
    server = {"metadata": {"name": "qwenperf-b200-x"}}
    cluster, job = render_client_manifests(server, ClientPods(3, "img", cpus_per_pod=2))
    assert cluster["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    broken = json.loads(json.dumps(cluster))
    broken["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        assert_valid(broken)
    misspelt = json.loads(json.dumps(job))
    misspelt["spec"]["clusterSelect"] = misspelt["spec"].pop("clusterSelector")
    with pytest.raises(jsonschema.ValidationError, match="'clusterSelect' was unexpected"):
        assert_valid(misspelt)


def test_client_options_without_what_they_need_are_clear_errors() -> None:
    no_image = render("--clients", "4")
    assert no_image.returncode == 2 and "--clients needs --client-image" in no_image.stderr
    stray = render("--bench-args", "--input-len 1024")
    assert stray.returncode == 2 and "are for the clients' job: give --clients N" in stray.stderr

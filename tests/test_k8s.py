"""``qwenperf render-k8s``: manifests that the Kubernetes object schema accepts, carrying the rung's exact argv."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from pytest_qwenperf.serving.k8s import container_args, render_manifests
from pytest_qwenperf.suite.config import SuiteError, load_suite

SUITES = Path(__file__).resolve().parents[1] / "perf_tests" / "suites"
B200 = SUITES / "b200.toml"
MODELS = {("apps/v1", "Deployment"): "V1Deployment", ("v1", "Service"): "V1Service"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_qwenperf.cli.main", *args], capture_output=True, text=True, check=False)


def as_model(manifest: dict[str, Any]) -> Any:
    """The manifest read into the kubernetes client's model of its kind (required fields checked)."""
    kind = MODELS[(manifest["apiVersion"], manifest["kind"])]
    return ApiClient()._ApiClient__deserialize(manifest, kind)  # the client's own JSON -> model path


def assert_valid(manifest: dict[str, Any]) -> None:
    """Valid per the Kubernetes object schema: read into the typed model and written back
    unchanged, so no field is unknown, misspelt or of the wrong type (those are dropped or fail)."""
    model = as_model(manifest)
    assert ApiClient().sanitize_for_serialization(model) == manifest


def test_the_write_ups_last_rung_on_12_nodes() -> None:
    done = cli("render-k8s", str(B200), "--config", "dp8-ctx4k-fp8kv-mtp1", "--replicas", "12")
    assert done.returncode == 0, done.stderr
    assert "&id" not in done.stdout and "*id" not in done.stdout  # no YAML anchors: every field written out
    deployment, service = yaml.safe_load_all(done.stdout)
    for manifest in (deployment, service):
        assert_valid(manifest)
    shown = json.loads(cli("show", str(B200), "--config", "dp8-ctx4k-fp8kv-mtp1", "--json").stdout)["configs"][0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"]
    args = container["args"]
    assert args[0] == shown["model"] == "Qwen/Qwen3.5-27B-FP8"
    assert args[1 : 1 + len(shown["argv"])] == shown["argv"]  # exactly the argv `qwenperf show` prints
    assert args[1 + len(shown["argv"]) :] == ["--host", "0.0.0.0", "--port", "8000"]
    assert {e["name"]: e["value"] for e in container.get("env", [])} == shown["env"]
    assert deployment["spec"]["replicas"] == 12
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}  # a whole node per pod
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("suite", ["b200", "h200"])
def test_every_gpu_rung_renders_valid_manifests(suite: str) -> None:
    loaded = load_suite(SUITES / f"{suite}.toml")
    for cfg in loaded.configs:
        for manifest in render_manifests(loaded, cfg.id, 2, namespace="perf"):
            assert_valid(manifest)
            assert manifest["metadata"]["namespace"] == "perf" and len(manifest["metadata"]["name"]) <= 63


def test_a_misspelt_field_fails_the_schema_check() -> None:
    """The check above can fail: a field the schema does not know does not survive the round trip."""
    deployment, _ = render_manifests(load_suite(B200), "dp8", 1)
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/health"}}
    with pytest.raises(AssertionError):
        assert_valid(deployment)
    deployment, _ = render_manifests(load_suite(B200), "dp8", 1)
    del deployment["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(ValueError, match="name"):
        as_model(deployment)


def test_container_args_name_the_served_model_when_the_config_does() -> None:
    cfg = load_suite(B200).config("dp8")
    renamed = dataclasses.replace(cfg, served_model_name="qwen")
    assert container_args(renamed)[-6:-4] == ["--served-model-name", "qwen"]


def test_bad_requests_are_clear_errors() -> None:
    done = cli("render-k8s", str(B200), "--config", "nope", "--replicas", "2")
    assert done.returncode == 2 and "no config 'nope'" in done.stderr
    done = cli("render-k8s", str(B200), "--config", "dp8", "--replicas", "0")
    assert done.returncode == 2 and "--replicas: expected a whole number >= 1" in done.stderr
    with pytest.raises(SuiteError, match="generated on the machine that runs the suite"):
        render_manifests(load_suite(SUITES / "cpu.toml"), "base", 1)


def _suite_with_ids(tmp_path: Path, *ids: str, name: str = "gpu") -> Path:
    path = tmp_path / "suite.toml"
    configs = "".join(f'[[config]]\nid = "{config_id}"\n' for config_id in ids)
    path.write_text(f'[suite]\nname = "{name}"\nhardware = "b200"\nmodel = "Qwen/Qwen3-8B"\n{configs}')
    return path


def test_object_names_are_refused_not_cut_short_or_shared(tmp_path: Path) -> None:
    suite = load_suite(_suite_with_ids(tmp_path, "dp8.fp8", "dp8-fp8", "x" * 60))
    with pytest.raises(SuiteError, match=r"config 'dp8-fp8': its Kubernetes object name 'qwenperf-gpu-dp8-fp8' is also config 'dp8.fp8'"):
        render_manifests(suite, "dp8-fp8", 1)
    with pytest.raises(SuiteError, match=rf"config '{'x' * 60}': the Kubernetes object name 'qwenperf-gpu-x+' has 73 characters; expected at most 63"):
        render_manifests(suite, "x" * 60, 1)
    suite = load_suite(_suite_with_ids(tmp_path, "dp8", name="my suite"))
    with pytest.raises(SuiteError, match=r"suite.name: expected a Kubernetes label value .* got 'my suite'"):
        render_manifests(suite, "dp8", 1)


def test_object_names_and_labels_are_what_kubernetes_accepts() -> None:
    """RFC 1035 names (a Service's rule: a letter first, at most 63), label values within their rule."""
    for path in (B200, SUITES / "h200.toml"):
        loaded = load_suite(path)
        for cfg in loaded.configs:
            deployment, service = render_manifests(loaded, cfg.id, 1)
            for manifest in (deployment, service):
                name = manifest["metadata"]["name"]
                assert len(name) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
                for value in manifest["metadata"]["labels"].values():
                    assert len(value) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value), value


@pytest.mark.parametrize("namespace", ["Perf", "perf_tests", "-perf", "p" * 64, ""])
def test_a_bad_namespace_fails_at_argument_parsing(namespace: str) -> None:
    done = cli("render-k8s", str(B200), "--config", "dp8", f"--namespace={namespace}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "argument --namespace: expected a Kubernetes namespace (at most 63 lowercase letters, digits and '-'" in done.stderr
    with pytest.raises(ValueError, match="namespace: expected a Kubernetes namespace"):
        render_manifests(load_suite(B200), "dp8", 1, namespace=namespace or "-")

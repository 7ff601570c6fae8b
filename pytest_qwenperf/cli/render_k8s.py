"""``qwenperf render-k8s``: Kubernetes manifests that run one config on N nodes."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import yaml

from pytest_qwenperf.core.options import whole_number
from pytest_qwenperf.serving.k8s import DEFAULT_IMAGE, SecretKeyRef, namespace_option, render_manifests
from pytest_qwenperf.serving.k8s_clients import ClientPods, render_client_manifests
from pytest_qwenperf.suite.config import SuiteError, load_suite

HELP = "print Kubernetes manifests that run one config on N nodes (Deployment + ClusterIP Service), and its clients on Ray"
DESCRIPTION = (
    "YAML for kubectl apply: N pods of the config, one per node, each with the suite's GPUs, "
    "running exactly the argv `qwenperf show` prints, behind a ClusterIP Service. With --clients: a KubeRay RayCluster "
    "for that many client workers and a RayJob that runs `qwenperf bench --ray auto` against the Service "
    "(its load from --bench-args)."
)


class RenderError(Exception):
    """Options that do not make a manifest, with what to give."""


ERRORS: tuple[type[Exception], ...] = (SuiteError, RenderError)


class _PlainDumper(yaml.SafeDumper):
    """Writes a value shared by several fields (the pod labels) out at each, not as &anchors:
    manifests are read by people before they are applied."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", type=Path, metavar="SUITE")
    parser.add_argument("--config", required=True, help="the config id to run")
    parser.add_argument("--replicas", type=whole_number(1), default=1, help="pods, one per node (default %(default)s)")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="container image with vLLM (default %(default)s)")
    parser.add_argument("--namespace", type=namespace_option, help="namespace for both objects (default: kubectl's current one)")
    parser.add_argument(
        "--api-key-secret",
        type=SecretKeyRef.parse,
        metavar="NAME[:KEY]",
        help="the servers require the API key held in this Secret (key KEY, default api-key), read as VLLM_API_KEY: "
        "the manifest names the Secret and never holds the key (kubectl create secret generic NAME --from-literal=api-key=...)",
    )
    clients = parser.add_argument_group("clients on Ray (KubeRay)")
    clients.add_argument("--clients", type=whole_number(1), metavar="N", help="client worker processes, one CPU each, on Ray worker pods")
    clients.add_argument("--client-image", metavar="IMAGE", help="an image with Ray and pytest-qwenperf[ray] installed (needed with --clients)")
    clients.add_argument("--client-pod-cpus", type=whole_number(1), default=8, help="CPUs of one client pod (default %(default)s)")
    clients.add_argument(
        "--bench-args", type=shlex.split, default=[], metavar="ARGS", help="the load qwenperf bench sends, e.g. '--input-len 1024 --output-len 512'"
    )


def run(args: argparse.Namespace) -> int:
    suite = load_suite(args.suite)
    manifests = render_manifests(
        suite, args.config, args.replicas, image=args.image, namespace=args.namespace, api_key_secret=args.api_key_secret
    )
    if args.clients is None and args.bench_args:
        raise RenderError(f"bench arguments {' '.join(args.bench_args)!r} are for the clients' job: give --clients N")
    if args.clients is not None:
        if args.client_image is None:
            raise RenderError("--clients needs --client-image: an image with Ray and pytest-qwenperf[ray] installed")
        pods = ClientPods(args.clients, args.client_image, args.client_pod_cpus, tuple(args.bench_args))
        service = next(m for m in manifests if m["kind"] == "Service")
        manifests += render_client_manifests(service, pods)
    print(yaml.dump_all(manifests, Dumper=_PlainDumper, sort_keys=False), end="")
    return 0

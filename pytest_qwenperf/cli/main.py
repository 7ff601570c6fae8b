"""The ``qwenperf`` command: thin over the library, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from pytest_qwenperf.cli.bench import BenchError
from pytest_qwenperf.cli.bench import add_arguments as add_bench_arguments
from pytest_qwenperf.cli.bench import run as run_bench
from pytest_qwenperf.core.options import whole_number
from pytest_qwenperf.gate import compare
from pytest_qwenperf.serving.k8s import DEFAULT_IMAGE, SecretKeyRef, namespace_option
from pytest_qwenperf.suite.config import Suite, SuiteError, load_suite
from pytest_qwenperf.suite.tiny_model import (
    TinyModelFolderError,
    TinyModelSpec,
    ensure_tiny_model,
    write_tiny_model,
)


def _tiny_model(args: argparse.Namespace) -> int:
    spec = TinyModelSpec(seed=args.seed)
    try:
        path = write_tiny_model(args.dir, spec) if args.dir else ensure_tiny_model(spec)
    except TinyModelFolderError as exc:
        print(f"qwenperf tiny-model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _lint(args: argparse.Namespace) -> int:
    """Exit 1 when a suite or a flag fails the check, 2 when the check cannot run (``--python`` without vLLM)."""
    from pytest_qwenperf.suite.vllm_args import ParserUnavailable, check_configs

    failures = 0
    for path in args.suites:
        try:
            suite = load_suite(path)
        except SuiteError as exc:
            print(f"FAIL {exc}")
            failures += 1
            continue
        try:
            checks = check_configs(suite.configs, suite=str(path), python=args.python)
        except ParserUnavailable as exc:
            print(f"qwenperf lint: --python {exc}", file=sys.stderr)
            return 2
        for check in checks:
            if check.ok:
                print(f"ok   {path}: {check.config_id} (vLLM {check.vllm_version})")
            else:
                print(f"FAIL {check.error}")
                failures += 1
    return 1 if failures else 0


def _show(args: argparse.Namespace) -> int:
    suite = load_suite(args.suite)
    configs = [suite.config(args.config)] if args.config else list(suite.configs)
    if args.json:
        print(json.dumps(_suite_json(suite, configs), indent=2))
        return 0
    print(f"{suite.name}: {suite.model} on {suite.hardware}  ({suite.path})")
    for cfg in configs:
        parent = f"  (inherits {cfg.inherits})" if cfg.inherits else ""
        print(f"\n[{cfg.id}]{parent} {cfg.description}")
        print("  argv: " + shlex.join(cfg.vllm_args))
        for key, value in cfg.env:
            print(f"  env:  {key}={value}")
        if cfg.replicas > 1:
            print(f"  replicas: {cfg.replicas} (routing {cfg.routing})")
    return 0


def _suite_json(suite: Suite, configs: list) -> dict:
    return {
        "suite": suite.name,
        "hardware": suite.hardware,
        "model": suite.model,
        "configs": [
            {
                "id": cfg.id,
                "inherits": cfg.inherits,
                "description": cfg.description,
                "model": cfg.model,
                "served_model_name": cfg.served_model_name,
                "argv": list(cfg.vllm_args),
                "env": dict(cfg.env),
                "replicas": cfg.replicas,
                "routing": cfg.routing,
            }
            for cfg in configs
        ],
    }


def _render_k8s(args: argparse.Namespace) -> int:
    import yaml

    class _PlainDumper(yaml.SafeDumper):
        """Writes a value shared by several fields (the pod labels) out at each, not as &anchors:
        manifests are read by people before they are applied."""

        def ignore_aliases(self, data: object) -> bool:
            return True

    from pytest_qwenperf.serving.k8s import render_manifests

    suite = load_suite(args.suite)
    manifests = render_manifests(
        suite, args.config, args.replicas, image=args.image, namespace=args.namespace, api_key_secret=args.api_key_secret
    )
    print(yaml.dump_all(manifests, Dumper=_PlainDumper, sort_keys=False), end="")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """``--fail-on`` fails on the verdicts it names and on :data:`compare.LOST_DATA` unless ``--allow``-ed."""
    allowed, named = set(args.allow or ()), set(args.fail_on or ())
    if allowed & named:
        both = ", ".join(sorted(allowed & named))
        print(f"qwenperf: --allow {both} contradicts --fail-on {both}: give one of them", file=sys.stderr)
        return 2
    try:
        comparison = compare.compare([compare.load_runs(p) for p in (args.reference, *args.files)], args.metric or ())
        if args.plot:
            compare.plot_throughput(comparison, args.plot)
    except compare.CompareError as exc:
        print(f"qwenperf: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(compare.as_json(comparison), indent=2))
    else:
        print(compare.render(comparison, markdown=args.markdown))
    failing_on = named | (set(compare.LOST_DATA) - allowed) if named else set()
    failing = {verdict: n for verdict, n in sorted(comparison.verdicts().items()) if verdict in failing_on}
    if failing:
        print("qwenperf: failing on " + ", ".join(f"{n} {verdict}" for verdict, n in failing.items()), file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwenperf", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser(
        "tiny-model",
        help="write the embedded tiny Qwen3 model (deterministic, no network)",
        description="Write the tiny Qwen3 model into DIR, or into the cache ($QWENPERF_CACHE) when DIR is omitted; "
        "prints the folder. DIR must be new, empty, or written by an earlier `qwenperf tiny-model` (reused for the "
        "same seed, rewritten for another); a folder holding any other file is refused (exit 2) and left untouched.",
    )
    tiny.add_argument(
        "dir", nargs="?", type=Path, help="target folder: new, empty or our own (default: the cache, reused if present)"
    )
    tiny.add_argument("--seed", type=int, default=TinyModelSpec.seed, help="weights and tokenizer seed (default %(default)s)")
    tiny.set_defaults(run=_tiny_model)

    lint = commands.add_parser(
        "lint",
        help="check suite files and their flags against the installed vLLM's own parser",
        description="Exit 1 if any suite file is malformed or any config has a flag vLLM would reject; "
        "exit 2 if the check cannot run (--python is no Python with vLLM).",
    )
    lint.add_argument("suites", nargs="+", type=Path, metavar="SUITE")
    lint.add_argument("--python", default=sys.executable, help="Python whose vLLM to check against (default: this one)")
    lint.set_defaults(run=_lint)

    show = commands.add_parser("show", help="print a suite's resolved configs and their vLLM argv")
    show.add_argument("suite", type=Path, metavar="SUITE")
    show.add_argument("--config", help="only this config id")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=_show)

    render = commands.add_parser(
        "render-k8s",
        help="print Kubernetes manifests that run one config on N nodes (Deployment + ClusterIP Service)",
        description="YAML for kubectl apply: N pods of the config, one per node, each with the suite's GPUs, "
        "running exactly the argv `qwenperf show` prints, behind a ClusterIP Service.",
    )
    render.add_argument("suite", type=Path, metavar="SUITE")
    render.add_argument("--config", required=True, help="the config id to run")
    render.add_argument("--replicas", type=whole_number(1), default=1, help="pods, one per node (default %(default)s)")
    render.add_argument("--image", default=DEFAULT_IMAGE, help="container image with vLLM (default %(default)s)")
    render.add_argument("--namespace", type=namespace_option, help="namespace for both objects (default: kubectl's current one)")
    render.add_argument(
        "--api-key-secret",
        type=SecretKeyRef.parse,
        metavar="NAME[:KEY]",
        help="the servers require the API key held in this Secret (key KEY, default api-key), read as VLLM_API_KEY: "
        "the manifest names the Secret and never holds the key (kubectl create secret generic NAME --from-literal=api-key=...)",
    )
    render.set_defaults(run=_render_k8s)

    bench = commands.add_parser(
        "bench",
        help="drive a workload against running servers and report vllm-bench-serve-style metrics",
        description="Load-test already-running OpenAI-compatible vLLM servers with the suite's load generator.",
    )
    add_bench_arguments(bench)
    bench.set_defaults(run=run_bench)

    comparing = commands.add_parser(
        "compare",
        help="compare runs across vLLM versions (or config changes), with verdicts against the first file",
        description="Tables per config x workload: one column per file (session JSON from --qwenperf-json or "
        "pytest-benchmark JSON), deltas and verdicts against REFERENCE. A run that lost data (failed requests, token "
        "totals that disagree with the server, client-bound, a metric without a value) is 'invalid: <why>', a "
        "config x workload that REFERENCE has and a FILE lacks is 'missing'. Exit 1 on a --fail-on verdict, "
        "exit 2 for an unreadable input.",
    )
    comparing.add_argument("reference", type=Path, metavar="REFERENCE", help="the file the others are judged against")
    comparing.add_argument("files", nargs="+", type=Path, metavar="FILE")
    comparing.add_argument(
        "--fail-on",
        action="append",
        choices=compare.FAILABLE,
        metavar="VERDICT",
        help=f"exit 1 when any metric gets this verdict (repeatable; one of {', '.join(compare.FAILABLE)}); "
        f"given at all, {' and '.join(compare.LOST_DATA)} fail too unless --allow-ed",
    )
    comparing.add_argument(
        "--allow",
        action="append",
        choices=compare.LOST_DATA,
        metavar="VERDICT",
        help=f"do not fail on this verdict that --fail-on fails on by default (repeatable; {' or '.join(compare.LOST_DATA)})",
    )
    output = comparing.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="GitHub-flavoured markdown (for $GITHUB_STEP_SUMMARY)")
    output.add_argument("--json", action="store_true", help=f"machine-readable output (schema {compare.SCHEMA})")
    comparing.add_argument("--plot", type=Path, metavar="PNG", help="also write total tok/s per rung and file as a PNG")
    comparing.add_argument("--metric", action="append", metavar="NAME", help="only these metrics (repeatable)")
    comparing.set_defaults(run=_compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. SIGTERM takes Ctrl-C's path (inside an asyncio run, asyncio's own SIGINT
    handler cancels the tasks) and either ends with one line and exit status 128 + the signal's number."""
    args = build_parser().parse_args(argv)
    terminated = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True
        on_sigint = signal.getsignal(signal.SIGINT)
        if not callable(on_sigint):  # SIGINT ignored (a background job): there is no handler to take
            raise KeyboardInterrupt
        on_sigint(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return int(args.run(args))
    except (SuiteError, BenchError) as exc:
        print(f"qwenperf: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # a bench run says how far it got in the exception
        received = signal.SIGTERM if terminated else signal.SIGINT
        print(f"qwenperf: interrupted by {received.name}{f' {exc}' if str(exc) else ''}", file=sys.stderr)
        return 128 + received
    except BrokenPipeError:  # `qwenperf compare ... | head`: the reader left; end quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())

"""The ``qwenperf`` command: thin over the library, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_qwenperf.config import Suite, SuiteError, load_suite
from pytest_qwenperf.tiny_model import TinyModelSpec, ensure_tiny_model, write_tiny_model


def _tiny_model(args: argparse.Namespace) -> int:
    spec = TinyModelSpec(seed=args.seed)
    path = write_tiny_model(args.dir, spec) if args.dir else ensure_tiny_model(spec)
    print(path)
    return 0


def _lint(args: argparse.Namespace) -> int:
    from pytest_qwenperf.vllm_args import check_configs

    failures = 0
    for path in args.suites:
        try:
            suite = load_suite(path)
        except SuiteError as exc:
            print(f"FAIL {exc}")
            failures += 1
            continue
        for check in check_configs(suite.configs, suite=str(path), python=args.python):
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
            }
            for cfg in configs
        ],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwenperf", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser(
        "tiny-model",
        help="write the embedded tiny Qwen3 model (deterministic, no network)",
        description="Write the tiny Qwen3 model into DIR, or into the cache ($QWENPERF_CACHE) when DIR is omitted; "
        "prints the folder.",
    )
    tiny.add_argument("dir", nargs="?", type=Path, help="target folder (default: the cache, reused if present)")
    tiny.add_argument("--seed", type=int, default=TinyModelSpec.seed, help="weights and tokenizer seed (default %(default)s)")
    tiny.set_defaults(run=_tiny_model)

    lint = commands.add_parser(
        "lint",
        help="check suite files and their flags against the installed vLLM's own parser",
        description="Exit 1 if any suite file is malformed or any config has a flag vLLM would reject.",
    )
    lint.add_argument("suites", nargs="+", type=Path, metavar="SUITE")
    lint.add_argument("--python", default=sys.executable, help="Python whose vLLM to check against (default: this one)")
    lint.set_defaults(run=_lint)

    show = commands.add_parser("show", help="print a suite's resolved configs and their vLLM argv")
    show.add_argument("suite", type=Path, metavar="SUITE")
    show.add_argument("--config", help="only this config id")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except SuiteError as exc:
        print(f"qwenperf: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

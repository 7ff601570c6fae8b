"""``qwenperf show``: a suite's resolved configs and their vLLM argv."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteError, load_suite

HELP = "print a suite's resolved configs and their vLLM argv"
DESCRIPTION = None
ERRORS: tuple[type[Exception], ...] = (SuiteError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", type=Path, metavar="SUITE")
    parser.add_argument("--config", help="only this config id")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    suite = load_suite(args.suite)
    configs = [suite.config(args.config)] if args.config else list(suite.configs)
    if args.json:
        print(json.dumps(suite_json(suite, configs), indent=2))
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


def suite_json(suite: Suite, configs: Sequence[ServingConfig]) -> dict[str, object]:
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

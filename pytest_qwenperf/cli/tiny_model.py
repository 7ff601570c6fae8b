"""``qwenperf tiny-model``: write an embedded Qwen3 model (the tiny one unless ``--model`` names another)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from pytest_qwenperf.suite.embedded import EMBEDDED, TINY_MODEL_REF
from pytest_qwenperf.suite.tiny_model import TinyModelFolderError, TinyModelSpec, ensure_tiny_model, write_tiny_model

HELP = "write an embedded Qwen3 model: the tiny one, or embedded:gpu (deterministic, no network)"
DESCRIPTION = (
    "Write the tiny Qwen3 model into DIR, or into the cache ($QWENPERF_CACHE) when DIR is omitted; "
    "prints the folder. DIR must be new, empty, or written by an earlier `qwenperf tiny-model` (reused for the "
    "same seed, rewritten for another); a folder holding any other file is refused (exit 2) and left untouched."
)
ERRORS: tuple[type[Exception], ...] = ()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir", nargs="?", type=Path, help="target folder: new, empty or our own (default: the cache, reused if present)"
    )
    parser.add_argument("--seed", type=int, default=TinyModelSpec.seed, help="weights and tokenizer seed (default %(default)s)")
    parser.add_argument(
        "--model", choices=tuple(EMBEDDED), default=TINY_MODEL_REF, help="which embedded model (default %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    spec = dataclasses.replace(EMBEDDED[args.model].spec, seed=args.seed)
    try:
        path = write_tiny_model(args.dir, spec) if args.dir else ensure_tiny_model(spec)
    except TinyModelFolderError as exc:
        print(f"qwenperf tiny-model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0

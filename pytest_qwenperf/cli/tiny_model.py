"""``qwenperf tiny-model``: write the embedded tiny Qwen3 model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_qwenperf.suite.tiny_model import TinyModelFolderError, TinyModelSpec, ensure_tiny_model, write_tiny_model

HELP = "write the embedded tiny Qwen3 model (deterministic, no network)"
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


def run(args: argparse.Namespace) -> int:
    spec = TinyModelSpec(seed=args.seed)
    try:
        path = write_tiny_model(args.dir, spec) if args.dir else ensure_tiny_model(spec)
    except TinyModelFolderError as exc:
        print(f"qwenperf tiny-model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0

"""The ``qwenperf`` command: thin over the library, one subcommand per job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_qwenperf.tiny_model import TinyModelSpec, ensure_tiny_model, write_tiny_model


def _tiny_model(args: argparse.Namespace) -> int:
    spec = TinyModelSpec(seed=args.seed)
    path = write_tiny_model(args.dir, spec) if args.dir else ensure_tiny_model(spec)
    print(path)
    return 0


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())

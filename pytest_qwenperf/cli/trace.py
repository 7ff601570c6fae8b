"""``qwenperf trace``: write a synthetic trace in Mooncake's JSONL format (bursty arrivals,
long-tailed lengths, shared prefixes), the same for the same arguments on every machine."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from pytest_qwenperf.suite.traces import SyntheticShape, TraceError, cacheable_share, synthetic_trace, write_jsonl

HELP = "write a synthetic trace (Mooncake JSONL) to replay with a workload of kind 'trace'"
DESCRIPTION = (
    "Write a synthetic request trace to PATH in Mooncake's JSONL format (timestamp in ms, input_length, "
    "output_length, hash_ids of 512-token blocks): gamma-distributed gaps (burstiness below 1 is bursty), "
    "lognormal lengths around the medians, and shared prefixes of whole blocks. An existing PATH is refused."
)
ERRORS: tuple[type[Exception], ...] = (TraceError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="the new .jsonl file")
    for field in dataclasses.fields(SyntheticShape):
        default = field.default
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=type(default), default=default, help="default %(default)s"
        )


def run(args: argparse.Namespace) -> int:
    shape = SyntheticShape(**{field.name: getattr(args, field.name) for field in dataclasses.fields(SyntheticShape)})
    entries = synthetic_trace(shape)
    write_jsonl(entries, args.path)
    span = entries[-1].timestamp_ms / 1000
    print(
        f"{args.path}: {len(entries)} requests over {span:.1f} s, "
        f"{cacheable_share(entries):.1%} of prompt tokens in blocks sent before"
    )
    return 0

"""``qwenperf trace``: write a synthetic trace in Mooncake's JSONL format (bursty arrivals,
long-tailed lengths, shared prefixes), the same for the same arguments on every machine; or read a
real one, cut a window of it, fit it to a context and report its shape before a replay."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from pytest_qwenperf.core.options import positive_seconds, seconds, whole_number
from pytest_qwenperf.suite.trace_files import read_trace, write_jsonl
from pytest_qwenperf.suite.traces import FITS, SyntheticShape, Trace, TraceError, TraceShape, synthetic_trace

HELP = "write a synthetic trace (Mooncake JSONL), or report the shape of a window of a real one"
DESCRIPTION = (
    "Write a synthetic request trace to PATH in Mooncake's JSONL format (timestamp in ms, input_length, "
    "output_length, hash_ids of 512-token blocks): gamma-distributed gaps (burstiness below 1 is bursty), "
    "lognormal lengths around the medians, and shared prefixes of whole blocks. With --read, report the shape of a "
    "trace instead (its window from --start for --span, fitted with --fit): arrival rate over time, bursts, lengths and "
    "the cacheable share; PATH, if given, receives the window as traced. An existing PATH is refused."
)
ERRORS: tuple[type[Exception], ...] = (TraceError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, nargs="?", help="the new .jsonl file (needed without --read)")
    synthetic = parser.add_argument_group("a synthetic trace")
    for field in dataclasses.fields(SyntheticShape):
        default = field.default
        synthetic.add_argument(f"--{field.name.replace('_', '-')}", type=type(default), default=default, help="default %(default)s")
    real = parser.add_argument_group("a trace read (--read)")
    real.add_argument("--read", type=Path, metavar="TRACE", help="a Mooncake or Bailian .jsonl, or a timestamp,input_len,output_len .csv trace")
    real.add_argument("--start", type=seconds, default=0.0, metavar="S", help="the window's start, seconds after the first request (default 0)")
    real.add_argument("--span", type=positive_seconds, metavar="S", help="the window's length in seconds (default: to the end)")
    real.add_argument("--fit", choices=FITS, help="also show the window fitted to --context tokens a request (a suite's fit)")
    real.add_argument("--context", type=whole_number(2), metavar="TOKENS", help="the context --fit fits to")
    real.add_argument(
        "--kv-block",
        type=whole_number(1),
        default=1,
        metavar="TOKENS",
        help="count the cacheable share in whole cache blocks of this size, as a server caches (vLLM's block_size: "
        "128 on the CPU build, 16 on most GPUs; default 1: every shared token)",
    )


def run(args: argparse.Namespace) -> int:
    if args.read is not None:
        return _read(args)
    if args.path is None:
        raise TraceError("PATH is needed to write a synthetic trace (or --read a trace to see its shape)")
    shape = SyntheticShape(**{field.name: getattr(args, field.name) for field in dataclasses.fields(SyntheticShape)})
    entries = synthetic_trace(shape)
    write_jsonl(Trace(entries), args.path)
    span = entries[-1].timestamp_ms / 1000
    print(f"{args.path}: {len(entries)} requests over {span:.1f} s, {Trace(entries).cacheable_share():.1%} of prompt tokens in blocks sent before")
    return 0


def _read(args: argparse.Namespace) -> int:
    if (args.fit is None) != (args.context is None):
        raise TraceError("--fit and --context go together: how to fit, and the context in tokens")
    window = read_trace(args.read).window(args.start, args.span)
    end = "the end" if args.span is None else f"{args.start + args.span:g} s"
    print(f"{args.read}, from {args.start:g} s to {end}:")
    print("\n".join(f"  {line}" for line in TraceShape.of(window, args.kv_block).lines()))
    if args.fit is not None:
        fitted = window.fitted(args.context, args.fit)
        print(f"fitted ({fitted.fit}):")
        print("\n".join(f"  {line}" for line in TraceShape.of(fitted, args.kv_block).lines()))
    if args.path is not None:
        write_jsonl(window, args.path)
        print(f"the window as traced written to {args.path}")
    return 0

"""``qwenperf plan``: the client cores and machines a target load needs, before anything runs."""

from __future__ import annotations

import argparse

from pytest_qwenperf.core.options import positive_rate, positive_tokens_rate, tokens_per_chunk, whole_number
from pytest_qwenperf.loadgen.sizing import need

HELP = "how many client cores and machines a target load needs (from the client's measured CPU per request and chunk)"
DESCRIPTION = (
    "The client cores a load needs: its requests/s times the client's CPU per request, plus its streamed chunks/s times "
    "the CPU per chunk, both as measured in benchmarks/README.md, each core planned at most half busy."
)
ERRORS: tuple[type[Exception], ...] = ()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    rate = parser.add_mutually_exclusive_group(required=True)
    rate.add_argument("--output-throughput", type=positive_tokens_rate, metavar="TOK/S", help="the target: output tokens per second")
    rate.add_argument("--request-rate", type=positive_rate, metavar="REQ/S", help="the target: requests per second")
    parser.add_argument("--output-len", type=whole_number(1), required=True, help="output tokens per request (a mean)")
    parser.add_argument(
        "--tokens-per-chunk", type=tokens_per_chunk, default=1.0, help="tokens a streamed chunk carries (above 1 with MTP; default 1)"
    )
    parser.add_argument("--cores-per-node", type=whole_number(1), help="cores of one client machine: how many machines it takes")


def run(args: argparse.Namespace) -> int:
    rate = args.request_rate if args.request_rate is not None else args.output_throughput / args.output_len
    found = need(rate, args.output_len, args.tokens_per_chunk)
    print("\n".join(found.lines(args.cores_per_node)))
    return 0

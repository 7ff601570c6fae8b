"""Parsers for option values: used as argparse ``type=`` callables and for ini values alike,
so a bad value fails at argument parsing with a message that says what was expected."""

from __future__ import annotations

import argparse
import shlex
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_qwenperf.endpoints import EndpointSets


def launcher_argv(value: str) -> tuple[str, ...]:
    """``"vllm serve"`` → ``("vllm", "serve")``; the model and flags are appended to it."""
    argv = tuple(shlex.split(value))
    if not argv:
        raise argparse.ArgumentTypeError("expected a command such as 'vllm serve', got an empty string")
    return argv


def positive_seconds(value: str) -> float:
    return _positive(value, "seconds")


def positive_rate(value: str) -> float:
    return _positive(value, "requests per second")


def _positive(value: str, unit: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of {unit}, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of {unit}, got {value!r}")
    return number


def whole_number(minimum: int) -> Callable[[str], int]:
    """A parser for whole numbers of at least ``minimum``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value!r}")
        return number

    return parse


def endpoint_url(value: str) -> str:
    """An ``http(s)://host:port`` base URL of an OpenAI-compatible server (no ``/v1``)."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise argparse.ArgumentTypeError(f"expected a URL like http://10.0.0.5:8000, got {value!r}")
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        raise argparse.ArgumentTypeError(f"give the server's base URL without /v1, got {value!r}")
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


def endpoints_file(value: str) -> EndpointSets:
    """The path of an endpoints file (:mod:`pytest_qwenperf.endpoints`), read and checked."""
    from pytest_qwenperf.endpoints import EndpointsFileError, load_endpoint_sets  # lazily: endpoints imports this module

    try:
        return load_endpoint_sets(value)
    except EndpointsFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cpu_list(value: str) -> frozenset[int]:
    """``"0-3,6"`` → ``{0, 1, 2, 3, 6}`` (the format of taskset and cpusets)."""
    cpus: set[int] = set()
    try:
        for part in value.split(","):
            low, _, high = part.strip().partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a CPU list like 0-3,6, got {value!r}") from None
    if not cpus:
        raise argparse.ArgumentTypeError(f"expected a CPU list like 0-3,6, got {value!r}")
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))

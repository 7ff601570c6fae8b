"""Parsers for option values: used as argparse ``type=`` callables and for ini values alike,
so a bad value fails at argument parsing with a message that says what was expected."""

from __future__ import annotations

import argparse
import math
import re
import shlex
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.core.window import Window

DEFAULT_BOOT_TIMEOUT_S = 1800.0
"""How long a server may take to become ready unless told otherwise (``--qwenperf-boot-timeout``):
generous, since loading a 27B checkpoint on 8 GPUs and compiling graphs takes many minutes."""

DEFAULT_HISTORY = Path(".qwenperf") / "history.sqlite"
"""The history store a session records in when none is named (``--qwenperf-history``): under the
rootdir, like pytest's own cache, in a folder whose ``.gitignore`` keeps it out of git."""


def launcher_argv(value: str) -> tuple[str, ...]:
    """``"vllm serve"`` → ``("vllm", "serve")``; the model and flags are appended to it."""
    try:
        argv = tuple(shlex.split(value))
    except ValueError as exc:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"expected a command line that a POSIX shell could split, got {value!r}: {exc}") from None
    if not argv:
        raise argparse.ArgumentTypeError("expected a command such as 'vllm serve', got an empty string")
    return argv


def measured_window(value: str) -> Window:
    """``"90s"`` or ``"4 lifetimes"``: a time-bounded load's window (:mod:`~pytest_qwenperf.core.window`)."""
    try:
        return Window.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_seconds(value: str) -> float:
    return _positive(value, "seconds")


def seconds(value: str) -> float:
    """A finite number of seconds >= 0 (an offset, a pause)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {value!r}")
    return number


def positive_factor(value: str) -> float:
    """A finite factor > 0 (0.5: half)."""
    number = _positive(value, "times")
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite factor, got {value!r}")
    return number


def positive_minutes(value: str) -> float:
    return _positive(value, "minutes")


def positive_rate(value: str) -> float:
    return _positive(value, "requests per second")


def positive_tokens_rate(value: str) -> float:
    return _positive(value, "tokens per second")


def tokens_per_chunk(value: str) -> float:
    """Tokens one streamed chunk carries: 1, or more under speculative decoding."""
    number = _positive(value, "tokens")
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 token a chunk, got {value!r}")
    return number


def _positive(value: str, unit: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of {unit}, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of {unit}, got {value!r}")
    return number


def fraction(value: str) -> float:
    """A number from 0 to 1 inclusive, e.g. ``0.05`` (5 %)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 1 (e.g. 0.05 for 5 %), got {value!r}")
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


_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<userinfo>.*)@", re.DOTALL)


def redact_credentials(url: str) -> str:
    """``url`` with its ``user:password@`` masked as ``user:***@``: everything up to the last ``@``, as
    a password may hold any character. A user name without a password may be a token: masked whole."""

    def mask(match: re.Match[str]) -> str:
        user, colon, _ = match["userinfo"].partition(":")
        return f"{match['scheme'] or ''}{user + ':***' if colon else '***'}@"

    return _USERINFO.sub(mask, url, count=1)


def masked_repr(value: object) -> str:
    """``repr(value)`` with every string in it (in lists and tables too) shown as :func:`redact_credentials` masks it."""
    if isinstance(value, str):
        return repr(redact_credentials(value))
    if isinstance(value, list):
        return "[" + ", ".join(masked_repr(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{masked_repr(k)}: {masked_repr(v)}" for k, v in value.items()) + "}"
    return repr(value)


def endpoint_url(value: str) -> str:
    """An ``http://host:port`` base URL of an OpenAI-compatible server (no ``/v1``).

    ``https`` is refused here, at argument parsing: the load generator speaks plain HTTP/1.1
    on its own sockets (it reads kernel receive timestamps off them), so a TLS endpoint
    would otherwise fail only after the probes. So are credentials in the URL, which
    nothing would send; messages mask the password. Every refusal is an
    ``ArgumentTypeError``: argparse prints its message, where for any other exception it
    would echo the raw value.
    """
    shown = masked_repr(value)
    try:
        parsed = urllib.parse.urlsplit(value)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a URL like http://10.0.0.5:8000, got {shown}") from None
    if parsed.scheme == "https":
        raise argparse.ArgumentTypeError(
            f"expected an http:// URL, got {shown}: the load generator speaks plain HTTP, without TLS; measure over http "
            "from inside the cluster, or forward a port (kubectl port-forward svc/NAME 8000) and give http://127.0.0.1:8000"
        )
    if parsed.scheme != "http" or not parsed.hostname:
        raise argparse.ArgumentTypeError(f"expected a URL like http://10.0.0.5:8000, got {shown}")
    if "@" in parsed.netloc:
        raise argparse.ArgumentTypeError(f"expected a URL without user:password@, got {shown}: credentials in a URL are not sent")
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        raise argparse.ArgumentTypeError(f"give the server's base URL without /v1, got {shown}")
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))



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


@dataclass(frozen=True)
class ProgressSetting:
    """Whether points show their progress, and the seconds between two status lines in a log."""

    on: bool = True
    every_s: float = 30.0


def progress_setting(text: str) -> ProgressSetting:
    """``off``, ``on`` or the seconds between two status lines in a log (``0``: one per finished request)."""
    word = text.strip().lower()
    if word in ("off", "on"):
        return ProgressSetting(on=word == "on")
    try:
        seconds = float(word)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"expected off, on or the seconds between two progress lines in a log (>= 0), got {text!r}")
    return ProgressSetting(every_s=seconds)

"""The JSON files this package writes: their schema names, what JSON cannot hold, and how a value
is quoted in a file's fault (read through :mod:`pytest_qwenperf.core.schema`)."""

from __future__ import annotations

import math

SESSION_SCHEMA = "qwenperf-session/1"
"""A pytest session's runs (``--qwenperf-json``)."""
BENCH_SCHEMA = "qwenperf-bench/1"
"""One ``qwenperf bench --json`` result."""


def json_safe(value: object) -> object:
    """JSON has no inf/nan: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def show(value: object) -> str:
    """A value as an error message quotes it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

"""The JSON files this package writes: their schema names, and what JSON cannot hold."""

from __future__ import annotations

import math

SESSION_SCHEMA = "qwenperf-session/1"
"""A pytest session's runs (``--qwenperf-json``)."""


def json_safe(value: object) -> object:
    """JSON has no inf/nan: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value

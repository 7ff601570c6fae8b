"""A run's JSON read back: :func:`decode_run` makes a :class:`~pytest_qwenperf.core.run.Run` of
it (an entry of ``runs`` in the session JSON, ``extra_info["qwenperf"]`` of a pytest-benchmark
JSON, a row of the history), checking what a schema states, then what it cannot (:func:`_check`),
and :class:`RunJsonError` names where, the field and what was expected.

Standard library and msgspec only: the gate imports it.
"""

from __future__ import annotations

import math

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.machine import upgraded
from pytest_qwenperf.core.metrics import GATED, find
from pytest_qwenperf.core.run import Run, finite_number

MISSING = "nothing (the field is missing)"
"""What a message says a missing field got."""

_ABSENT = object()


class RunJsonError(ValueError):
    """A run's JSON lacks a field or holds a wrong one; the message names where, the field and what was expected."""


def decode_run(data: object, where: str = "run") -> Run:
    """A run from parsed JSON; :class:`RunJsonError` names ``where``, the field and what was expected.
    A run written before the machine had one record is read too (:func:`~pytest_qwenperf.core.machine.upgraded`)."""
    run = schema.convert(upgraded(data), Run, lambda m: RunJsonError(f"{where}: {m.text(show=show, absent=MISSING)}"), null=True)
    fault = _check(run)
    if fault:
        raise RunJsonError(f"{where}: {fault}")
    return run


def _check(run: Run) -> str | None:
    """What a schema cannot say about a run: the failed requests, the samples of a gated metric
    that has no gap, the tolerances (``field: expected ..., got ...``); None when all hold."""
    failed = run.metrics.get("failed", _ABSENT)
    number = finite_number(failed)
    if number is None or number < 0:
        return _fault("metrics.failed", "a finite, non-negative number", failed)
    for name, values in (run.samples or {}).items():
        info = find(name)
        checked = name == "failed" or (info is not None and info.gated and all(v is not None and math.isfinite(v) for v in values))
        if not checked:
            continue
        if not values:
            return _fault(f"samples.{name}", "a non-empty list of finite, non-negative numbers", list(values))
        for i, v in enumerate(values):
            if v is None or not math.isfinite(v) or v < 0:
                return _fault(f"samples.{name}[{i}]", "a finite, non-negative number", v)
    for name, fraction in (run.tolerances or {}).items():
        info = find(name)
        if info is None or not info.gated:
            return _fault(f"tolerances.{name}", "a gated metric (" + ", ".join(GATED) + ")", name)
        if not (math.isfinite(fraction) and 0 <= fraction < 1):
            return _fault(f"tolerances.{name}", "a fraction in [0, 1)", fraction)
    return None


def _fault(field: str, expected: str, got: object) -> str:
    return f"{field}: expected {expected}, got {MISSING if got is _ABSENT else show(got)}"

"""The JSON files this package writes: their schema names, what JSON cannot hold, and how a file's
fault is told (the field, as ``a.b[0]``, and what was expected)."""

from __future__ import annotations

import math
import re
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import msgspec

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


def show(value: object) -> str:
    """A value as an error message quotes it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_LOCATED = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_MISSING_FIELD = re.compile(r"Object missing required field `(?P<name>[^`]+)`")
_ENUM = re.compile(r"Invalid enum value (?P<got>.+)")


def field_error(error: msgspec.ValidationError, target: Any, data: object) -> str:
    """``field: what was expected`` for msgspec's error on ``data`` (parsed JSON) decoded as ``target``.

    msgspec's ``$.a.b[0]`` becomes ``a.b[0]``; the entry of a JSON object keyed by name that
    msgspec shows as ``[...]`` is found again in ``data`` and named (``metrics.p99_ttft_ms``);
    a literal's allowed values are listed."""
    steps, what = _located(error, target, data)
    field = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in steps).lstrip(".")
    return f"{field or '(top level)'}: {what}"


def _located(error: msgspec.ValidationError, target: Any, data: object) -> tuple[list[str | int], str]:
    """The steps to the faulty field and what was expected there."""
    match = _LOCATED.fullmatch(str(error))
    assert match is not None  # the pattern matches any text
    what, path = match["what"], match["path"] or ""
    steps: list[str | int] = []
    for name, index in _STEP.findall(path):
        if index == "...":  # an entry of a JSON object: find which one
            value_type = _inner(target, "...")
            for key, value in data.items() if isinstance(data, Mapping) else ():
                try:
                    msgspec.convert(value, value_type)
                except msgspec.ValidationError as inner:
                    rest, what = _located(inner, value_type, value)
                    return [*steps, str(key), *rest], what
            return [*steps, "[...]"], _expected(what, target)
        step: str | int = int(index) if index else name
        target, data = _inner(target, step), _child(data, step)
        steps.append(step)
    missing = _MISSING_FIELD.fullmatch(what)
    if missing:
        return [*steps, missing["name"]], "expected a value, got nothing (the field is missing)"
    return steps, _expected(what, target)


def _expected(what: str, target: Any) -> str:
    """msgspec's message in this package's words: ``expected ..., got ...``."""
    enum = _ENUM.fullmatch(what)
    choices = get_args(_bare(target)) if get_origin(_bare(target)) is Literal else ()
    if enum and choices:
        return "expected one of " + ", ".join(repr(c) for c in choices) + f", got {enum['got']}"
    return what[:1].lower() + what[1:]


def _bare(target: Any) -> Any:
    """``target`` without ``Annotated`` constraints, and ``X | None`` as ``X``."""
    while get_origin(target) is Annotated:
        target = get_args(target)[0]
    if get_origin(target) in (Union, types.UnionType):
        members = [m for m in get_args(target) if m is not type(None)]
        if len(members) == 1:
            return _bare(members[0])
    return target


def _inner(target: Any, step: str | int) -> Any:
    """The type one step into ``target``: a struct's field, an object's values, a list's items."""
    target = _bare(target)
    if isinstance(target, type) and issubclass(target, msgspec.Struct):
        return get_type_hints(target, include_extras=True).get(str(step), Any)
    args = get_args(target)
    if get_origin(target) in (dict, Mapping) and len(args) == 2:
        return args[1]
    if get_origin(target) in (list, tuple, Sequence) and args:
        return args[0]
    return Any


def _child(data: object, step: str | int) -> object:
    if isinstance(step, int):
        return data[step] if isinstance(data, (list, tuple)) and step < len(data) else None
    return data.get(step) if isinstance(data, Mapping) else None

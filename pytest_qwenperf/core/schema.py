"""Input files as msgspec Structs, and their mismatches in the words of the file.

A suite or endpoints file is parsed by ``tomllib``, a run or baseline JSON by ``json``, and
converted to Structs that state each table's keys, types and ranges; rules between values
(inheritance, ids used twice, a value that is the centre of its samples) stay with the code
that loads it. msgspec names a mismatch by its path only
(``Expected `int` >= 1 - at `$.set[0].replicas```); :func:`convert` adds the value found
there and says what was expected in the words of the field's ``Meta(description=...)``, or of
its type, so that a message reads ``set[0].replicas: expected a whole number of replicas >= 1, got 0``.

Standard library and msgspec only: the gate reads its files through it.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import msgspec

T = TypeVar("T")
Count = Annotated[int, msgspec.Meta(ge=0)]
"""A whole number >= 0, as a record keeps counts."""
Step = str | int
"""A key of a table or an index of an array, on the way from the top of a file to a value."""


class Shape(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A table of an input file: a key it does not name is an error, not ignored.

    Subclasses say ``frozen=True`` again: mypy does not carry it over from a base."""


@dataclass(frozen=True)
class Mismatch:
    """Where parsed data departs from its shape: the path to the value, the value and what was expected there.

    For a key that is missing, ``got`` is None; for a key the table does not have, ``expected``
    names the keys it has.
    """

    path: tuple[Step, ...]
    got: object
    expected: str
    unknown_key: bool = False
    missing: bool = False

    @property
    def field(self) -> str:
        return field_name(self.path)

    def text(self, field: str | None = None, show: Callable[[object], str] = repr, absent: str | None = None) -> str:
        """``field: expected ..., got ...``; ``field`` (default :attr:`field`, ``(top level)`` for the
        whole document) as the caller spells the path; ``absent``, when given, is what a missing key got."""
        field = (self.field or "(top level)") if field is None else field
        if self.unknown_key:
            return f"{field}: unknown key; expected {self.expected}"
        got = absent if self.missing and absent is not None else show(self.got)
        return f"{field}: expected {self.expected}, got {got}"


def convert(data: object, shape: type[T], fail: Callable[[Mismatch], Exception], *, null: bool = False) -> T:
    """``data`` (parsed TOML or JSON) as ``shape``, or ``fail``'s exception for the first mismatch msgspec finds.

    ``null``: the format has one (JSON), so an expectation says ``or null`` where the shape allows it."""
    try:
        return msgspec.convert(data, shape)
    except msgspec.ValidationError as exc:
        raise fail(_mismatch(data, shape, str(exc), null)) from None


def field_name(path: Sequence[Step]) -> str:
    """``set[1].urls[0]``: keys joined by dots, indexes in brackets."""
    return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).removeprefix(".")


_MESSAGE = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<path>.*)`)?", re.DOTALL)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>.*)`")
_MISSING = re.compile(r"Object missing required field `(?P<key>.*)`")


@dataclass(frozen=True)
class _Node:
    """One value on msgspec's path, with the type the shape gives it."""

    path: tuple[Step, ...]
    value: object
    hint: Any
    field: bool  # a Struct's field, not an item of an array or table


def _mismatch(data: object, shape: Any, message: str, null: bool) -> Mismatch:
    """The :class:`Mismatch` a msgspec ValidationError ``message`` about ``data`` converted to ``shape`` reports."""
    parsed = _MESSAGE.fullmatch(message)
    assert parsed is not None, "the pattern matches any text"
    what = parsed["what"]
    nodes = _walk(data, shape, [m[1] or (int(m[2]) if m[2].isdigit() else None) for m in _STEP.finditer(parsed["path"] or "")])
    last = nodes[-1]
    fields = _fields(last.hint)
    if unknown := _UNKNOWN.fullmatch(what):
        got = last.value.get(unknown["key"]) if isinstance(last.value, dict) else None
        return Mismatch((*last.path, unknown["key"]), got, f"one of {sorted(fields)}", unknown_key=True)
    if (missing := _MISSING.fullmatch(what)) and missing["key"] in fields:
        hint = fields[missing["key"]]
        return Mismatch((*last.path, missing["key"]), None, _expected(hint, _absent(hint), null), missing=True)
    # The deepest field on the path, or an item below it that has a description of its own: an
    # environment table is named as a whole, a URL in a list of URLs by its index; an item of a
    # field without a description (a number among samples) by its own path.
    named = next(n for n in reversed(nodes) if n.field or _description(n.hint))
    if not _description(named.hint):
        named = nodes[-1]
    return Mismatch(named.path, named.value, _expected(named.hint, what, null))


def _walk(data: object, shape: Any, steps: Sequence[Step | None]) -> list[_Node]:
    """The values msgspec's path passes through; ``None`` stands for the key of a table's item that did not fit."""
    nodes = [_Node((), data, shape, field=True)]
    for step in steps:
        node = nodes[-1]
        bare, value = _bare(node.hint), node.value
        if isinstance(step, str) and isinstance(value, dict) and step in _fields(bare):
            nodes.append(_Node((*node.path, step), value.get(step), _fields(bare)[step], field=True))
        elif isinstance(step, int) and isinstance(value, list):
            nodes.append(_Node((*node.path, step), value[step], typing.get_args(bare)[0], field=False))
        elif step is None and isinstance(value, dict):
            key_hint, item_hint = typing.get_args(bare)
            misfit = [k for k, v in value.items() if not (_fits(k, key_hint) and _fits(v, item_hint))]
            if not misfit:
                break
            nodes.append(_Node((*node.path, misfit[0]), value[misfit[0]], item_hint, field=False))
        else:
            break
    return nodes


def _fields(hint: Any) -> dict[str, Any]:
    """The keys of a Struct's table and their types; none for anything else."""
    bare = _bare(hint)
    if isinstance(bare, type) and issubclass(bare, msgspec.Struct):
        return {f.encode_name: f.type for f in msgspec.structs.fields(bare)}
    return {}


def _fits(value: object, hint: Any) -> bool:
    try:
        msgspec.convert(value, hint)
    except msgspec.ValidationError:
        return False
    return True


def _bare(hint: Any) -> Any:
    return _unwrap(hint)[0]


def _description(hint: Any) -> str | None:
    return _unwrap(hint)[1]


def _unwrap(hint: Any) -> tuple[Any, str | None]:
    """``hint`` without its ``Annotated`` metadata and its ``| None``, and the first ``Meta(description=...)`` on the way."""
    description = None
    while True:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        arms = [a for a in args if a is not type(None)]
        if origin is Annotated:
            hint = args[0]
            description = description or next((m.description for m in args[1:] if isinstance(m, msgspec.Meta) and m.description), None)
        elif origin in (typing.Union, types.UnionType) and len(arms) == 1:
            hint = arms[0]
        else:
            return hint, description


def _absent(hint: Any) -> str:
    """msgspec's message for a value of ``hint`` that is missing: ``Expected `object`, got ...``."""
    try:
        msgspec.convert(msgspec.UNSET, hint)
    except msgspec.ValidationError as exc:
        return str(exc)
    return "Expected a value"


_CONSTRAINT = re.compile(r"Expected `[^`]*`(?P<bounds>.*?)(?:, got `[^`]*`)?")


def _expected(hint: Any, what: str, null: bool) -> str:
    """The description of ``hint``; else, for a plain type, its words and the bounds msgspec names
    (``a string of length >= 1``); else msgspec's (``what``: `` `object` ``)."""
    description = _description(hint)
    if description:
        return description
    bare = _bare(hint)
    if bare in (int, float, str, bool) or typing.get_origin(bare) in (Literal, typing.Union, types.UnionType):
        bounds = _CONSTRAINT.fullmatch(what)
        words = _describe(bare) + (bounds["bounds"] if bounds else "")
        return words + " or null" if null and _fits(None, hint) else words
    return re.sub(r"^Expected |, got `[^`]*`$", "", what)


def _describe(hint: Any) -> str:
    """A type in the words of a file's reader: ``an integer``, ``one of 'completions', 'chat'``."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint) if arg is not type(None))
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return words.get(hint, getattr(hint, "__name__", str(hint)))

"""Trace files: the formats a :class:`~pytest_qwenperf.suite.traces.Trace` is read from and written to.

* **Mooncake JSONL** (kvcache-ai/Mooncake ``FAST25-release/traces``): ``timestamp`` in
  **milliseconds** from the trace's start, ``input_length`` and ``output_length`` in tokens, and
  ``hash_ids``: the prompt's **512-token** blocks, in order, each id naming one block's content
  (the ids are chained: an id stands for its block *and* everything before it).
* **Bailian JSONL** (alibaba-edu/qwen-bailian-usagetraces-anon: Qwen's service on Aliyun
  Bailian, the KVCache@ATC'25 traces): one line per request with ``chat_id``, ``parent_chat_id``
  (-1 opens a conversation), ``turn``, ``timestamp`` in **seconds**, the lengths and ``hash_ids``
  of **16-token** blocks. A request whose parent is in the file is a later turn of the parent's
  conversation (:attr:`~pytest_qwenperf.suite.traces.TraceEntry.session`); its ``input_length``
  and blocks already hold the conversation so far. A replay sends a conversation's turns in
  order, each once the one before it has been answered and not before its traced time.
* **CSV** with the header ``timestamp,input_len,output_len`` (milliseconds, as Mooncake's):
  lengths only, no shared blocks.

The format of a ``.jsonl`` file is its first line's: a line with ``chat_id`` is Bailian's.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

import msgspec

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.run_json import MISSING
from pytest_qwenperf.suite.traces import BLOCK_TOKENS, Trace, TraceEntry, TraceError

BAILIAN_BLOCK_TOKENS = 16
"""Tokens per hash id in the Bailian traces (SipHash of 16-token blocks)."""


def read_trace(path: Path) -> Trace:
    """A Mooncake or Bailian JSONL (``.jsonl``) or ``timestamp,input_len,output_len`` CSV
    (``.csv``) trace; :class:`TraceError` names the file, the line, the field and what was expected.

    A file is parsed once while it is unchanged (same size and modification time): a replay's
    repeats build their prompts from it and check the cache share against it each time."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc})") from None
    return _parsed(path.resolve(), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _parsed(path: Path, mtime_ns: int, size: int) -> Trace:
    """:func:`read_trace` of ``path`` as it was at ``mtime_ns`` and ``size`` (the cache key)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc})") from None
    if path.suffix == ".csv":
        trace = Trace(tuple(_csv_entries(path, text)))
    elif path.suffix in (".jsonl", ".json"):
        trace = _jsonl_trace(path, text)
    else:
        raise TraceError(f"{path}: expected a .jsonl (Mooncake or Bailian) or .csv (timestamp,input_len,output_len) trace")
    if not trace.entries:
        raise TraceError(f"{path}: the trace has no requests")
    for line, (before, after) in enumerate(itertools.pairwise(trace.entries), start=2):
        if after.timestamp_ms < before.timestamp_ms:
            raise TraceError(f"{path}: request {line}: timestamp: expected requests in the order sent, got {after.timestamp_ms} after {before.timestamp_ms}")
    return trace


_LENGTH = msgspec.Meta(ge=1, description="a whole number of tokens >= 1")


class _MooncakeLine(msgspec.Struct, frozen=True):
    """One line of a Mooncake trace; fields it does not name are allowed (newer traces add some)."""

    timestamp: Annotated[float, msgspec.Meta(ge=0, description="milliseconds from the trace's start (a number >= 0)")]
    input_length: Annotated[int, _LENGTH]
    output_length: Annotated[int, _LENGTH]
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0)], ...] = ()


class _BailianLine(msgspec.Struct, frozen=True):
    """One line of a Bailian trace (``type``, text/search/image/file, is not needed to replay it)."""

    chat_id: Annotated[int, msgspec.Meta(ge=0, description="a whole number >= 0")]
    parent_chat_id: Annotated[int, msgspec.Meta(ge=-1, description="the chat_id of the turn before, or -1")]
    turn: Annotated[int, msgspec.Meta(ge=1, description="the turn's number in its conversation (1 opens it)")]
    timestamp: Annotated[float, msgspec.Meta(ge=0, description="seconds from the trace's start (a number >= 0)")]
    input_length: Annotated[int, _LENGTH]
    output_length: Annotated[int, _LENGTH]
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0)], ...] = ()


class _CsvRow(msgspec.Struct, frozen=True):
    timestamp: Annotated[float, msgspec.Meta(ge=0, description="milliseconds from the trace's start (a number >= 0)")]
    input_len: Annotated[int, _LENGTH]
    output_len: Annotated[int, _LENGTH]


def _jsonl_trace(path: Path, text: str) -> Trace:
    lines = list(_json_lines(path, text))
    if not lines:
        return Trace(())
    if isinstance(lines[0][1], dict) and "chat_id" in lines[0][1]:
        return Trace(tuple(_bailian_entries(lines)), BAILIAN_BLOCK_TOKENS)
    entries = []
    for where, data in lines:
        row = schema.convert(data, _MooncakeLine, _failure(where), null=True)
        entries.append(TraceEntry(row.timestamp, row.input_length, row.output_length, row.hash_ids))
    return Trace(tuple(entries))


def _json_lines(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            data = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise TraceError(f"{where}: expected one JSON object per line ({exc})") from None
        yield where, data


def _bailian_entries(lines: list[tuple[str, Any]]) -> Iterator[TraceEntry]:
    """Each line's request; a turn whose parent is in the file joins the parent's conversation
    (named by its first turn's chat id), one whose parent is not (a slice of a longer trace) opens one."""
    session_of: dict[int, int] = {}  # chat_id -> its conversation
    last_turn: dict[int, int] = {}  # conversation -> the last turn number read
    for where, data in lines:
        row = schema.convert(data, _BailianLine, _failure(where), null=True)
        if row.chat_id in session_of:
            raise TraceError(f"{where}: chat_id: expected each request's own id, got {row.chat_id} a second time")
        session = session_of.get(row.parent_chat_id, row.chat_id)
        if row.turn <= last_turn.get(session, 0):
            raise TraceError(f"{where}: turn: expected turns in order, got {row.turn} after turn {last_turn[session]} of its conversation")
        session_of[row.chat_id], last_turn[session] = session, row.turn
        yield TraceEntry(round(row.timestamp * 1000, 3), row.input_length, row.output_length, row.hash_ids, session)


def _csv_entries(path: Path, text: str) -> Iterator[TraceEntry]:
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    fields = list(_CsvRow.__struct_fields__)
    if header is None or [h.strip() for h in header] != fields:
        raise TraceError(f"{path}: line 1: expected the header {','.join(fields)}, got {header!r}")
    for number, cells in enumerate(rows, start=2):
        if not cells:
            continue
        where = f"{path}: line {number}"
        if len(cells) != len(fields):
            raise TraceError(f"{where}: expected {len(fields)} fields ({','.join(fields)}), got {len(cells)}")
        data = {name: _number(cell) for name, cell in zip(fields, cells, strict=True)}
        row = schema.convert(data, _CsvRow, _failure(where))
        yield TraceEntry(row.timestamp, row.input_len, row.output_len)


def _failure(where: str) -> Callable[[schema.Mismatch], Exception]:
    return lambda mismatch: TraceError(f"{where}: {mismatch.text(show=show, absent=MISSING)}")


def _number(cell: str) -> object:
    """A CSV cell as an int or a float where it is one, else the text (for the error)."""
    cell = cell.strip()
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


def write_jsonl(trace: Trace, path: Path) -> None:
    """``trace`` as a new JSONL trace at ``path`` (an existing file is an error, never overwritten):
    Mooncake's format, or Bailian's where it has conversations or 16-token blocks (each written
    turn's parent the turn written before it in its conversation; the first written opens it)."""
    if trace.block_tokens == BLOCK_TOKENS and not any(e.session is not None for e in trace.entries):
        lines = [
            {"timestamp": e.timestamp_ms, "input_length": e.input_length, "output_length": e.output_length, "hash_ids": list(e.hash_ids)}
            for e in trace.entries
        ]
    elif trace.block_tokens == BAILIAN_BLOCK_TOKENS:
        lines = list(_bailian_lines(trace))
    else:
        raise TraceError(
            f"{path}: a trace of {trace.block_tokens}-token blocks cannot be written: Mooncake's are {BLOCK_TOKENS}, "
            f"Bailian's {BAILIAN_BLOCK_TOKENS} (write the window as traced, before a fit)"
        )
    try:
        with Path(path).open("x", encoding="utf-8") as out:
            out.writelines(f"{json.dumps(line)}\n" for line in lines)
    except FileExistsError:
        raise TraceError(f"{path}: a file is already there; not overwritten") from None


def _bailian_lines(trace: Trace) -> Iterator[dict[str, Any]]:
    last: dict[int, tuple[int, int]] = {}  # conversation -> (its last written chat_id, turn)
    for chat_id, e in enumerate(trace.entries):
        parent, turn = last.get(e.session, (-1, 0)) if e.session is not None else (-1, 0)
        if e.session is not None:
            last[e.session] = (chat_id, turn + 1)
        yield {
            "chat_id": chat_id, "parent_chat_id": parent, "turn": turn + 1, "timestamp": round(e.timestamp_ms / 1000, 6),
            "input_length": e.input_length, "output_length": e.output_length, "hash_ids": list(e.hash_ids),
        }  # fmt: skip

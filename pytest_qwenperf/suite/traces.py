"""Request traces: when a production service was sent what, replayed token-exactly.

Two formats, one entry per request, in the order sent:

* **Mooncake JSONL** (kvcache-ai/Mooncake ``FAST25-release/traces``): ``timestamp`` in
  **milliseconds** from the trace's start, ``input_length`` and ``output_length`` in tokens, and
  ``hash_ids``: the prompt's **512-token** blocks, in order, each id naming one block's content
  (the ids are chained: an id stands for its block *and* everything before it).
* **CSV** with the header ``timestamp,input_len,output_len`` (milliseconds, as Mooncake's):
  lengths only, no shared blocks.

A prompt is built from its hash ids: each id's block is 512 token ids drawn from the workload's
seed and that id (the same id, the same tokens, in every request and on every machine), joined
in order and cut to exactly ``input_length`` tokens; where the blocks are fewer than the length
asks, the rest is tokens of that request alone. So the prompt has exactly the traced length, and
two requests that share leading hash ids share exactly those blocks' tokens: prefix caching sees
what production saw. (Other tools get one of these wrong: GuideLLM reads the timestamps as
seconds; vLLM's ``timed_trace`` dataset defaults to 16-token blocks, which caps a prompt at 16
tokens per hash id; SGLang builds 128 "hi" tokens per hash and ignores ``input_length``.)

:func:`synthetic_trace` writes a small trace with bursty arrivals, long-tailed lengths and
shared prefixes, so a suite can replay a trace with no download.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.run import MISSING

BLOCK_TOKENS = 512
"""Tokens per hash id in Mooncake's traces."""


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class TraceEntry:
    """One traced request."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def read_trace(path: Path) -> tuple[TraceEntry, ...]:
    """A Mooncake JSONL (``.jsonl``) or ``timestamp,input_len,output_len`` CSV (``.csv``) trace;
    :class:`TraceError` names the file, the line, the field and what was expected.

    A file is parsed once while it is unchanged (same size and modification time): a replay's
    repeats build their prompts from it and check the cache share against it each time."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc})") from None
    return _parsed(path.resolve(), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _parsed(path: Path, mtime_ns: int, size: int) -> tuple[TraceEntry, ...]:
    """:func:`read_trace` of ``path`` as it was at ``mtime_ns`` and ``size`` (the cache key)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc})") from None
    if path.suffix == ".csv":
        entries = list(_csv_entries(path, text))
    elif path.suffix in (".jsonl", ".json"):
        entries = list(_jsonl_entries(path, text))
    else:
        raise TraceError(f"{path}: expected a .jsonl (Mooncake) or .csv (timestamp,input_len,output_len) trace")
    if not entries:
        raise TraceError(f"{path}: the trace has no requests")
    for line, (before, after) in enumerate(itertools.pairwise(entries), start=2):
        if after.timestamp_ms < before.timestamp_ms:
            raise TraceError(f"{path}: request {line}: timestamp: expected requests in the order sent, got {after.timestamp_ms} after {before.timestamp_ms}")
    return tuple(entries)


class _MooncakeLine(msgspec.Struct, frozen=True):
    """One line of a Mooncake trace; fields it does not name are allowed (newer traces add some)."""

    timestamp: Annotated[float, msgspec.Meta(ge=0, description="milliseconds from the trace's start (a number >= 0)")]
    input_length: Annotated[int, msgspec.Meta(ge=1, description="a whole number of tokens >= 1")]
    output_length: Annotated[int, msgspec.Meta(ge=1, description="a whole number of tokens >= 1")]
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0)], ...] = ()


class _CsvRow(msgspec.Struct, frozen=True):
    timestamp: Annotated[float, msgspec.Meta(ge=0, description="milliseconds from the trace's start (a number >= 0)")]
    input_len: Annotated[int, msgspec.Meta(ge=1, description="a whole number of tokens >= 1")]
    output_len: Annotated[int, msgspec.Meta(ge=1, description="a whole number of tokens >= 1")]


def _jsonl_entries(path: Path, text: str) -> Iterator[TraceEntry]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            data = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise TraceError(f"{where}: expected one JSON object per line ({exc})") from None
        row = schema.convert(data, _MooncakeLine, _failure(where), null=True)
        yield TraceEntry(row.timestamp, row.input_length, row.output_length, row.hash_ids)


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


def send_offsets(entries: Sequence[TraceEntry]) -> list[float]:
    """When each request was sent, in seconds from the first request (a replay scales them:
    :class:`~pytest_qwenperf.loadgen.arrivals.Replay`)."""
    start = entries[0].timestamp_ms if entries else 0.0
    return [(entry.timestamp_ms - start) / 1000 for entry in entries]


def prompt_ids(entry: TraceEntry, index: int, block: Callable[[int], Sequence[int]], tail: Callable[[int, int], Sequence[int]]) -> tuple[int, ...]:
    """``entry``'s prompt, exactly ``input_length`` ids: its hash ids' blocks (``block(id)``, each
    :data:`BLOCK_TOKENS` ids) in order, cut to the length, then ``tail(index, n)``: ``n`` ids of
    this request alone where the blocks fall short."""
    ids: list[int] = []
    for hash_id in entry.hash_ids:
        if len(ids) >= entry.input_length:
            break
        ids.extend(block(hash_id))
    ids = ids[: entry.input_length]
    if len(ids) < entry.input_length:
        ids.extend(tail(index, entry.input_length - len(ids)))
    return tuple(ids)


def cacheable_share(entries: Sequence[TraceEntry]) -> float:
    """The share of all prompt tokens in blocks an earlier request already sent (its hash id was
    seen before): what a prefix cache large enough for the whole trace could have hit."""
    seen: set[int] = set()
    hit = total = 0
    for entry in entries:
        total += entry.input_length
        for position, hash_id in enumerate(entry.hash_ids):
            tokens = min(BLOCK_TOKENS, entry.input_length - position * BLOCK_TOKENS)
            if tokens <= 0:
                break
            if hash_id in seen:
                hit += tokens
            seen.add(hash_id)
    return hit / total if total else 0.0


@dataclass(frozen=True)
class SyntheticShape:
    """What :func:`synthetic_trace` draws: ``requests`` arriving at ``rate`` per second in bursts
    (gamma gaps of shape ``burstiness``, below 1: bursty), lognormal lengths around the medians
    (``sigma`` their spread: a long tail), and ``prefixes`` shared system prompts of
    ``prefix_blocks`` blocks, one of which starts each request."""

    requests: int = 200
    rate: float = 4.0
    burstiness: float = 0.3
    input_median: int = 1_024
    output_median: int = 64
    sigma: float = 0.8
    prefixes: int = 4
    prefix_blocks: int = 1
    max_input: int = 8_192
    max_output: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("requests", 1), ("input_median", 1), ("output_median", 1), ("prefixes", 1), ("prefix_blocks", 0), ("seed", 0)):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= low):
                raise TraceError(f"{name}: expected a whole number >= {low}, got {value!r}")
        for name in ("rate", "burstiness"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise TraceError(f"{name}: expected a finite number > 0, got {getattr(self, name)!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise TraceError(f"sigma: expected a finite number >= 0 (the lognormal's spread), got {self.sigma!r}")
        if self.max_input < self.input_median or self.max_output < self.output_median:
            raise TraceError(
                f"max_input, max_output: expected at least their medians ({self.input_median}, {self.output_median}), "
                f"got {self.max_input}, {self.max_output}"
            )


def synthetic_trace(shape: SyntheticShape) -> tuple[TraceEntry, ...]:
    """A trace in Mooncake's terms, the same for the same ``shape`` on every machine: each request
    opens with one of the shared prefixes' blocks, then blocks of its own."""
    rng = np.random.default_rng(shape.seed)
    gaps = rng.gamma(shape.burstiness, 1.0 / (shape.rate * shape.burstiness), size=shape.requests)
    times = np.cumsum(gaps) - gaps[0]
    inputs = np.clip(np.rint(rng.lognormal(math.log(shape.input_median), shape.sigma, shape.requests)), 1, shape.max_input)
    outputs = np.clip(np.rint(rng.lognormal(math.log(shape.output_median), shape.sigma, shape.requests)), 1, shape.max_output)
    prefix_of = rng.integers(0, shape.prefixes, size=shape.requests)
    next_id = shape.prefixes * shape.prefix_blocks
    entries = []
    for i in range(shape.requests):
        length = int(inputs[i])
        blocks = math.ceil(length / BLOCK_TOKENS)
        shared = [int(prefix_of[i]) * shape.prefix_blocks + b for b in range(shape.prefix_blocks)][:blocks]
        own = list(range(next_id, next_id + blocks - len(shared)))
        next_id += len(own)
        entries.append(TraceEntry(round(float(times[i]) * 1000, 3), length, int(outputs[i]), tuple(shared + own)))
    return tuple(entries)


def write_jsonl(entries: Sequence[TraceEntry], path: Path) -> None:
    """``entries`` as a new Mooncake JSONL trace at ``path`` (an existing file is an error, never overwritten)."""
    lines = (
        json.dumps({"timestamp": e.timestamp_ms, "input_length": e.input_length, "output_length": e.output_length, "hash_ids": list(e.hash_ids)})
        for e in entries
    )
    try:
        with Path(path).open("x", encoding="utf-8") as out:
            out.writelines(f"{line}\n" for line in lines)
    except FileExistsError:
        raise TraceError(f"{path}: a file is already there; not overwritten") from None

"""Request traces: when a production service was sent what, replayed token-exactly.

A trace is its requests in the order sent (:class:`TraceEntry`: the send time, the lengths and
the prompt's blocks as hash ids) and how many tokens a block holds; the files it is read from
(Mooncake's, Bailian's, a CSV) are :mod:`~pytest_qwenperf.suite.trace_files`.

A prompt is built from its hash ids: each id's block is a block's worth of token ids drawn from the workload's
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

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BLOCK_TOKENS = 512
"""Tokens per hash id in Mooncake's traces."""


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class TraceEntry:
    """One traced request. ``session``: the conversation it is a turn of, where the trace says
    (Bailian's), its turns in the order sent; None: a request on its own."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    session: int | None = None


def send_offsets(entries: Sequence[TraceEntry]) -> list[float]:
    """When each request was sent, in seconds from the first request (a replay scales them:
    :class:`~pytest_qwenperf.loadgen.arrivals.Replay`)."""
    start = entries[0].timestamp_ms if entries else 0.0
    return [(entry.timestamp_ms - start) / 1000 for entry in entries]


def prompt_ids(entry: TraceEntry, index: int, block: Callable[[int], Sequence[int]], tail: Callable[[int, int], Sequence[int]]) -> tuple[int, ...]:
    """``entry``'s prompt, exactly ``input_length`` ids: its hash ids' blocks (``block(id)``, each
    a block's worth of ids) in order, cut to the length, then ``tail(index, n)``: ``n`` ids of
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


FITS = ("scale", "cap")
"""How a trace is made to fit a model's context (:meth:`Trace.fitted`)."""


@dataclass(frozen=True)
class Trace:
    """A trace's requests in the order sent, and how many tokens each hash id's block stands for
    (:data:`BLOCK_TOKENS` as traced; fewer once :meth:`fitted` scaled it). ``fit``: how it was
    fitted, in words (empty: as traced)."""

    entries: tuple[TraceEntry, ...]
    block_tokens: int = BLOCK_TOKENS
    fit: str = ""

    def cacheable_share(self, kv_block: int = 1) -> float:
        """The share of all prompt tokens in blocks an earlier request already sent (its hash id was
        seen before), from the prompt's start: what a prefix cache large enough for the whole trace
        could have hit. ``kv_block``: the server's cache block in tokens, where known; a server
        caches only whole blocks of its own and computes a prompt's last token, so each prompt's
        cacheable tokens are then rounded down to whole blocks short of its last token (with
        blocks of 512 and 128, little is lost; with a trace scaled to blocks of 8, most is)."""
        seen: set[int] = set()
        hit = total = 0
        for entry in self.entries:
            total += entry.input_length
            shared, leading = 0, True
            for position, hash_id in enumerate(entry.hash_ids):
                tokens = min(self.block_tokens, entry.input_length - position * self.block_tokens)
                if tokens <= 0:
                    break
                leading = leading and hash_id in seen
                shared += tokens if leading else 0
                seen.add(hash_id)
            if kv_block > 1:
                shared = min(shared, entry.input_length - 1) // kv_block * kv_block
            hit += shared
        return hit / total if total else 0.0

    def window(self, start_s: float = 0.0, span_s: float | None = None) -> Trace:
        """The requests sent from ``start_s`` after the trace's first, for ``span_s`` seconds (None:
        to the end), their times as traced; a window without a request is a :class:`TraceError`."""
        first = self.entries[0].timestamp_ms
        end = math.inf if span_s is None else start_s + span_s
        kept = tuple(e for e in self.entries if start_s <= (e.timestamp_ms - first) / 1000 < end)
        if not kept:
            span = "the end" if span_s is None else f"{end:g} s"
            last = (self.entries[-1].timestamp_ms - first) / 1000
            raise TraceError(f"no request was sent from {start_s:g} s to {span} (the trace spans {last:g} s)")
        return dataclasses.replace(self, entries=kept)

    def longest(self) -> int:
        """The most tokens one request needs in the context: its prompt and its output."""
        return max(e.input_length + e.output_length for e in self.entries)

    def fitted(self, context: int, how: str) -> Trace:
        """The trace made to fit ``context`` tokens per request (prompt and output), its send times
        untouched, and requests that shared hash ids still sharing exactly those blocks' tokens.

        - ``scale``: every length divided by the least power of two that fits, rounded up, and the
          blocks with them (512 tokens a block at 1/32 are 16): each prompt still covers as many
          blocks as traced, so the same requests share the same blocks, each a 32nd of its size.
        - ``cap``: lengths kept where they fit; an output longer than half the context is cut to
          half, then a prompt longer than what is left is cut at its end (its blocks past the cut are
          never sent; the ones before stay whole and shared)."""
        if how not in FITS:
            raise TraceError(f"fit: expected one of {', '.join(FITS)}, got {how!r}")
        if how == "cap":
            return self._capped(context)
        for divisor in (d for d in (2**i for i in range(10)) if self.block_tokens % d == 0):
            scaled = tuple(
                dataclasses.replace(e, input_length=-(-e.input_length // divisor), output_length=-(-e.output_length // divisor))
                for e in self.entries
            )
            if max(e.input_length + e.output_length for e in scaled) <= context:
                said = "as traced (it fits)" if divisor == 1 else f"lengths scaled by 1/{divisor}, blocks of {self.block_tokens // divisor} tokens"
                return Trace(scaled, self.block_tokens // divisor, f"{said}, to fit {context:,} tokens")
        raise TraceError(
            f"fit_context: {context:,} tokens cannot hold the longest request even at 1/{self.block_tokens} of its length "
            f"({self.longest():,} tokens as traced); use fit = \"cap\" or a larger context"
        )

    def _capped(self, context: int) -> Trace:
        if context < 2:
            raise TraceError(f"fit_context: expected at least 2 tokens to cap a trace to, got {context}")
        entries, cut = [], 0
        for e in self.entries:
            output = min(e.output_length, context // 2)
            prompt = min(e.input_length, context - output)
            cut += (output, prompt) != (e.output_length, e.input_length)
            blocks = e.hash_ids[: -(-prompt // self.block_tokens)]
            entries.append(dataclasses.replace(e, input_length=prompt, output_length=output, hash_ids=blocks))
        return Trace(tuple(entries), self.block_tokens, f"{cut} of {len(entries)} requests capped, to fit {context:,} tokens")


@dataclass(frozen=True)
class Spread:
    """Quantiles of one quantity over a trace's requests."""

    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        p50, p90, p99 = np.quantile(np.asarray(values, dtype=float), (0.5, 0.9, 0.99))
        return cls(float(p50), float(p90), float(p99), float(max(values)))

    def __str__(self) -> str:
        return f"p50 {self.p50:,.0f}, p90 {self.p90:,.0f}, p99 {self.p99:,.0f}, max {self.max:,.0f}"


@dataclass(frozen=True)
class TraceShape:
    """What a replay of a trace asks of a server and of the client: how many requests over how long,
    the arrival rate per ``bin_s`` seconds, bursts (requests sent in the same millisecond), the
    lengths and the cacheable share."""

    requests: int
    span_s: float
    bin_s: float
    rates: tuple[float, ...]  # requests per second in each bin, from the first request
    bursts: Spread  # requests per distinct send time
    input_lengths: Spread
    output_lengths: Spread
    cacheable_share: float

    kv_block: int = 1  # the cache block the share is counted in (1: every shared token)
    turns: Spread | None = None  # turns per conversation, where the trace has conversations

    @classmethod
    def of(cls, trace: Trace, kv_block: int = 1, bins: int = 12) -> TraceShape:
        entries = trace.entries
        offsets = send_offsets(entries)
        span = offsets[-1]
        bin_s = span / bins if span > 0 else 1.0
        counts = np.bincount(np.minimum((np.asarray(offsets) / bin_s).astype(int), bins - 1), minlength=bins)
        same_ms = np.unique(np.round([e.timestamp_ms for e in entries]), return_counts=True)[1]
        return cls(
            requests=len(entries),
            span_s=span,
            bin_s=bin_s,
            rates=tuple(float(c) / bin_s for c in counts),
            bursts=Spread.of([float(c) for c in same_ms]),
            input_lengths=Spread.of([e.input_length for e in entries]),
            output_lengths=Spread.of([e.output_length for e in entries]),
            cacheable_share=trace.cacheable_share(kv_block),
            kv_block=kv_block,
            turns=_turns(entries),
        )

    def lines(self) -> list[str]:
        rates = " ".join(f"{r:.2g}" for r in self.rates)
        return [
            f"{self.requests} requests over {self.span_s:,.1f} s ({self.requests / self.span_s if self.span_s else 0:.2f} req/s)",
            f"arrivals per {self.bin_s:.3g} s, req/s: {rates}",
            f"requests sent in the same millisecond: {self.bursts}",
            f"input tokens: {self.input_lengths}",
            f"output tokens: {self.output_lengths}",
            f"{self.cacheable_share:.1%} of prompt tokens in blocks sent before (a prefix cache could hit them"
            + (f" in whole {self.kv_block}-token blocks)" if self.kv_block > 1 else ")"),
        ] + ([f"turns per conversation: {self.turns}"] if self.turns is not None else [])


def _turns(entries: Sequence[TraceEntry]) -> Spread | None:
    """Turns per conversation; None where no request is a turn of one."""
    counts: dict[int, int] = {}
    for entry in entries:
        if entry.session is not None:
            counts[entry.session] = counts.get(entry.session, 0) + 1
    return Spread.of(list(counts.values())) if counts else None


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

"""Every token-carrying chunk of a run's records as flat arrays, for the figures computed over chunks.

A run of 512 requests streaming 256 tokens each has 131,072 chunks. Walking them one by one in
Python for each figure (inter-token latencies, busiest second, tokens in the steady window, the
timeline's bins) cost the client about 1 us of CPU per chunk after the run, as much as a tenth of
what reading them cost; one pass into arrays and array operations over them cost about a tenth of
that (``benchmarks/README.md`` "Lean"). The values are the ones the per-chunk loops gave: the same
floating-point operations on the same numbers, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import cast

import numpy as np
import numpy.typing as npt

from pytest_qwenperf.core.records import RequestRecord


@dataclass(frozen=True)
class Chunks:
    """The chunks of some records, record after record: when each arrived, how many tokens it
    carried and whether it is its record's first. A response that was not streamed counts as one
    chunk of all its tokens at its end."""

    times: npt.NDArray[np.float64]  # perf_counter seconds
    tokens: npt.NDArray[np.int64]
    first: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> Chunks:
        lengths = [_length(r) for r in records]
        n = sum(lengths)
        times = np.fromiter(chain.from_iterable(r.chunk_times or (r.ended_at,) for r in records), np.float64, count=n)
        tokens = np.fromiter(
            chain.from_iterable(r.chunk_tokens if r.chunk_times else (r.completion_tokens,) for r in records), np.int64, count=n
        )
        first = np.zeros(n, dtype=bool)
        first[np.cumsum([0, *lengths[:-1]], dtype=np.int64)[: len(records)]] = True
        streamed = np.repeat(np.array([bool(r.chunk_times) for r in records], dtype=bool), lengths)
        empty = np.flatnonzero(streamed & (tokens < 1))
        if empty.size:
            record = records[int(np.searchsorted(np.cumsum(lengths), empty[0], side="right"))]
            raise ValueError(f"request {record.index}: a chunk carried {tokens[empty[0]]} tokens; only token chunks are recorded")
        return cls(times, tokens, first)

    def inter_token_latencies(self) -> npt.NDArray[np.float64]:
        """Per-token gaps in seconds, record after record: k gaps of g/k for a k-token chunk after a
        gap g, and k - 1 zeros within a record's first chunk of k tokens."""
        gaps = np.zeros(len(self.times))
        later = ~self.first[1:]
        np.divide(np.diff(self.times), self.tokens[1:], out=gaps[1:], where=later)
        return np.repeat(gaps, np.where(self.first, np.maximum(self.tokens - 1, 0), self.tokens))

    def tokens_per_bin(self, origin: float, width: float, bins: int) -> npt.NDArray[np.float64]:
        """Tokens arriving in each of ``bins`` bins of ``width`` seconds from ``origin`` (floats,
        whole numbers); a chunk before the first bin counts in it, one after the last in the last
        (the run's last instant ends the last bin)."""
        index = np.clip(np.floor((self.times - origin) / width), 0, bins - 1).astype(np.int64)
        counts: npt.NDArray[np.float64] = np.bincount(index, weights=self.tokens, minlength=bins).astype(np.float64, copy=False)
        return counts

    def tokens_within(self, start: float, end: float) -> int:
        """Tokens of the chunks that arrived in ``[start, end)``."""
        return int(self.tokens[(self.times >= start) & (self.times < end)].sum())


def _length(record: RequestRecord) -> int:
    if len(record.chunk_tokens) != len(record.chunk_times):
        raise ValueError(
            f"request {record.index}: {len(record.chunk_times)} chunk times but {len(record.chunk_tokens)} chunk token counts"
        )
    return len(record.chunk_times) or 1


def floats(values: npt.NDArray[np.float64]) -> list[float]:
    """``values`` as a list of Python floats."""
    return cast(list[float], values.tolist())

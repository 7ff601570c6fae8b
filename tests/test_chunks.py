"""The chunks of a run as arrays give exactly what walking them chunk by chunk gives: the
inter-token latencies, the tokens per bin (the edges clamped) and within a window, record after
record, for streamed and unstreamed responses and chunks of several tokens."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.core.chunks import Chunks, floats
from pytest_qwenperf.core.records import RequestRecord


@st.composite
def records(draw: st.DrawFn) -> list[RequestRecord]:
    found = []
    for index in range(draw(st.integers(1, 6))):
        sent = draw(st.floats(0, 5))
        tokens = draw(st.lists(st.integers(1, 4), max_size=6))
        gaps = draw(st.lists(st.floats(1e-4, 2), min_size=len(tokens), max_size=len(tokens)))
        times = tuple(sent + sum(gaps[: i + 1]) for i in range(len(tokens)))
        ended = (times[-1] if times else sent) + draw(st.floats(0, 1))
        completion = sum(tokens) if tokens else draw(st.integers(0, 5))
        found.append(RequestRecord(index, "e", sent, sent, ended, times, tuple(tokens), completion_tokens=completion))
    return found


def arrivals(record: RequestRecord) -> list[tuple[float, int]]:
    return list(zip(record.chunk_times, record.chunk_tokens, strict=True)) or [(record.ended_at, record.completion_tokens)]


def gaps_one_by_one(run: list[RequestRecord]) -> list[float]:
    gaps: list[float] = []
    for record in run:
        (previous, first), *rest = arrivals(record)
        gaps += [0.0] * (first - 1)
        for at, tokens in rest:
            gaps += [(at - previous) / tokens] * tokens
            previous = at
    return gaps


@given(records())
def test_inter_token_latencies_equal_the_chunk_by_chunk_ones_exactly(run: list[RequestRecord]) -> None:
    assert floats(Chunks.of(run).inter_token_latencies()) == gaps_one_by_one(run)


@given(records(), st.floats(0.05, 3), st.integers(1, 40))
def test_tokens_per_bin_count_every_token_once_with_the_edges_clamped(run: list[RequestRecord], width: float, bins: int) -> None:
    origin = min(r.sent_at for r in run)
    expected = [0] * bins
    for record in run:
        for at, tokens in arrivals(record):
            expected[min(bins - 1, max(0, math.floor((at - origin) / width)))] += tokens
    assert floats(Chunks.of(run).tokens_per_bin(origin, width, bins)) == expected


@given(records(), st.floats(0, 6), st.floats(0, 6))
def test_tokens_within_a_window_count_the_chunks_that_arrived_in_it(run: list[RequestRecord], a: float, b: float) -> None:
    start, end = min(a, b), max(a, b)
    expected = sum(tokens for record in run for at, tokens in arrivals(record) if start <= at < end)
    assert Chunks.of(run).tokens_within(start, end) == expected


def test_a_chunk_without_tokens_is_refused_naming_its_request() -> None:
    good = RequestRecord(3, "e", 0.0, 0.0, 1.0, (0.5,), (1,), completion_tokens=1)
    bad = RequestRecord(7, "e", 0.0, 0.0, 1.0, (0.5, 0.7), (1, 0), completion_tokens=1)
    with pytest.raises(ValueError, match=r"request 7: a chunk carried 0 tokens"):
        Chunks.of([good, bad])


def test_times_and_token_counts_of_different_lengths_are_refused_naming_the_request() -> None:
    bad = RequestRecord(5, "e", 0.0, 0.0, 1.0, (0.5, 0.7), (1,), completion_tokens=2)
    with pytest.raises(ValueError, match=r"request 5: 2 chunk times but 1 chunk token counts"):
        Chunks.of([bad])

"""A run's :class:`~pytest_qwenperf.core.timeline.Timeline` from its request records and its
samplers' points.

The client's quantities come from the request records: output tok/s counts each streamed
chunk's tokens in the bin it arrived in, and in-flight requests are averaged over the bin
(each request counts for the part of the bin it was open). The samplers' quantities
(:data:`~pytest_qwenperf.core.timeline.SERIES` names them) are the mean of the samples taken in
a bin; a bin without one is None rather than a made-up value (a sampler polls about once a
second, so in a short run's narrow bins most are None, and a chart joins the samples either
side). Bins are at least :data:`~pytest_qwenperf.core.timeline.MIN_BIN_S` wide and at most
:data:`~pytest_qwenperf.core.timeline.MAX_BINS` cover a run, so a long run stays a few kilobytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from pytest_qwenperf.core.chunks import Chunks, floats
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.timeline import MAX_BINS, MIN_BIN_S, SERIES, SIGNIFICANT, Timeline


def timeline(
    records: Sequence[RequestRecord], sampled: Mapping[str, Iterable[tuple[float, float]]], window: tuple[float, float] | None
) -> Timeline | None:
    """The timeline of a run of ``records``, with the samplers' ``sampled`` points (a name of
    :data:`SERIES` -> (clock time, value), the records' clock) and its steady-state ``window``
    (that clock too); None for a run without records."""
    if not records:
        return None
    unknown = sorted(set(sampled) - set(SERIES))
    if unknown:
        raise ValueError(f"unknown timeline series {unknown}; expected names among {sorted(SERIES)}")
    origin = min(r.sent_at for r in records)
    end = max(r.ended_at for r in records)
    bin_s = max(MIN_BIN_S, (end - origin) / MAX_BINS)
    bins = max(1, math.ceil((end - origin) / bin_s))
    series = {"output_tok_s": _output(records, origin, bin_s, bins), "in_flight": _in_flight(records, origin, bin_s, bins)}
    for name, points in sampled.items():
        binned = _means(points, origin, bin_s, bins)
        if any(v is not None for v in binned):
            series[name] = binned
    shifted = (window[0] - origin, window[1] - origin) if window else None
    return Timeline(bin_s=bin_s, window=shifted, series={name: series[name] for name in SERIES if name in series})


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}")


def _output(records: Sequence[RequestRecord], origin: float, bin_s: float, bins: int) -> tuple[float | None, ...]:
    return tuple(_rounded(count / bin_s) for count in floats(Chunks.of(records).tokens_per_bin(origin, bin_s, bins)))


def _in_flight(records: Sequence[RequestRecord], origin: float, bin_s: float, bins: int) -> tuple[float | None, ...]:
    """Requests open in each bin, averaged over the bin."""
    open_s = [0.0] * bins
    for record in records:
        start, stop = record.sent_at - origin, record.ended_at - origin
        for i in range(_bin(record.sent_at, origin, bin_s, bins), _bin(record.ended_at, origin, bin_s, bins) + 1):
            open_s[i] += max(0.0, min(stop, (i + 1) * bin_s) - max(start, i * bin_s))
    return tuple(_rounded(seconds / bin_s) for seconds in open_s)


def _means(points: Iterable[tuple[float, float]], origin: float, bin_s: float, bins: int) -> tuple[float | None, ...]:
    """The mean of the points in each bin; a point outside the run's bins is left out."""
    sums, counts = [0.0] * bins, [0] * bins
    for at, value in points:
        i = math.floor((at - origin) / bin_s)
        if 0 <= i < bins and math.isfinite(value):
            sums[i] += value
            counts[i] += 1
    return tuple(_rounded(total / n) if n else None for total, n in zip(sums, counts, strict=True))


def _bin(at: float, origin: float, bin_s: float, bins: int) -> int:
    """The bin of a record's time; the run's last instant falls in its last bin."""
    return min(bins - 1, max(0, math.floor((at - origin) / bin_s)))

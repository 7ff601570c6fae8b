"""Benchmark metrics from :class:`~pytest_qwenperf.core.records.RequestRecord` s, defined like ``vllm bench serve``.

Numbers here are meant to be compared with ``vllm bench serve`` result JSON, so names
and formulas follow ``vllm/benchmarks/serve.py::calculate_metrics`` and the client
timing in ``vllm/benchmarks/lib/endpoint_request_func.py`` (vLLM 0.32.0):

* TTFT = first token-carrying chunk - ``sent_at`` (``output.ttft = timestamp - st``).
* E2EL = last token-carrying chunk - ``sent_at`` (``output.latency = most_recent_timestamp - st``;
  "only token chunks advance the request end", so the usage chunk and ``[DONE]`` are
  not part of it). A completed request without streamed chunks has TTFT = E2EL =
  ``ended_at - sent_at``, as vLLM's non-streaming clients do.
* TPOT = (E2EL - TTFT) / (completion_tokens - 1), only for requests with more than one
  output token; goodput treats the others as TPOT 0 (``all_tpots``).
* Statistics: ``mean_*``, ``median_*``, ``std_*`` (``np.std``, population) and one
  ``p{p}_*`` per requested percentile (``np.percentile``, linear) in milliseconds, with
  vLLM's key spelling (``p99``, ``p99.9``) and its zero fill (``np.percentile(x or 0, p)``)
  when nothing completed. ``median_*`` is always present; ``p50_*`` only when 50 is asked for.
* ``request_throughput`` = completed / duration, ``output_throughput`` = completion
  tokens of completed requests / duration, ``total_token_throughput`` adds their prompt
  tokens, ``request_goodput`` = completed requests meeting every SLO (``slo >= value``) /
  duration (only when SLOs are given).
* ``max_output_tokens_per_s`` / ``max_concurrent_requests``: vLLM's one-second buckets
  from the first completed request's start.

Differences on purpose:

* ITL is per token: a chunk carrying k tokens after a gap g contributes k gaps of g/k,
  and the extra tokens of the first chunk contribute gaps of 0 (they arrived with the
  first token). vLLM appends one gap per chunk (``output.itl.append(timestamp -
  most_recent_timestamp)``), which hides speculative decoding's bursts; both agree when
  every chunk carries one token. A request's ITLs sum to E2EL - TTFT, so their mean is
  its TPOT. ``max_output_tokens_per_s`` counts tokens per chunk for the same reason.
* Completed means :attr:`RequestRecord.ok` (HTTP 200, usage, not truncated), where
  vLLM's ``success`` only needs a first chunk. Other requests count in ``failed``, but for
  those cut (:attr:`RequestRecord.cut`), and contribute no tokens and no latencies.
* Duration is from the first ``sent_at`` to the last ``ended_at`` of the non-warmup
  records unless the caller passes one; vLLM times ``asyncio.gather`` of all requests
  (``benchmark_duration``), which is the same span plus scheduling overhead.
* Warmup records never enter results (vLLM's warmup is a separate test request).

Ours besides vLLM's: ``achieved_request_rate`` ((sent - 1) / send span, so a constant
rate r reads r exactly; ``inf`` when all were sent at one instant),
``requested_request_rate``, and ``p50/p99/max_scheduling_lag_ms``.

Kept as one module though over 400 lines: every metric follows the one definition above,
and the whole-run and windowed figures share those formulas; apart they would each need them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from pytest_qwenperf.core.chunks import Chunks, floats
from pytest_qwenperf.core.metrics import Direction, metric
from pytest_qwenperf.core.records import RequestRecord

_MIN_SEND_RATIO = 0.95  # open loop: sending slower than this share of the requested rate is client-bound
_SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class Metric:
    name: str
    value: float | int
    unit: str
    direction: Direction

    @classmethod
    def of(cls, name: str, value: float | int) -> Metric:
        info = metric(name)
        return cls(name, value, info.unit, info.direction)


@dataclass(frozen=True)
class RunSummary:
    metrics: Mapping[str, Metric]

    @classmethod
    def from_values(cls, values: Mapping[str, float | int]) -> RunSummary:
        return cls(MappingProxyType({name: Metric.of(name, value) for name, value in values.items()}))

    def values(self) -> dict[str, float | int]:
        """Flat name -> value, with ``vllm bench serve``'s key names."""
        return {name: metric.value for name, metric in self.metrics.items()}

    def __getitem__(self, name: str) -> Metric:
        return self.metrics[name]


# --- per request ---------------------------------------------------------------------


def _first_token_at(record: RequestRecord) -> float:
    return record.chunk_times[0] if record.chunk_times else record.ended_at


def _last_token_at(record: RequestRecord) -> float:
    return record.chunk_times[-1] if record.chunk_times else record.ended_at


def _ttft(record: RequestRecord) -> float:
    return _first_token_at(record) - record.sent_at


def _e2el(record: RequestRecord) -> float:
    return _last_token_at(record) - record.sent_at


def _tpot(record: RequestRecord) -> float | None:
    if record.completion_tokens <= 1:
        return None
    return (_e2el(record) - _ttft(record)) / (record.completion_tokens - 1)


def inter_token_latencies(record: RequestRecord) -> list[float]:
    """Per-token gaps in seconds: k gaps of g/k for a k-token chunk after a gap g, 0 within the first chunk."""
    return floats(Chunks.of([record]).inter_token_latencies())


@dataclass(frozen=True)
class GoodputSLO:
    """Per-request service level objectives in milliseconds, as ``vllm bench serve --goodput``."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        limits = self.limits()
        if not limits:
            raise ValueError("a goodput SLO needs at least one of ttft_ms, tpot_ms, e2el_ms")
        for key, value in limits.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"goodput SLO {key}:{value!r} must be a non-negative number of milliseconds")

    @classmethod
    def parse(cls, spec: str) -> GoodputSLO:
        """Parse vLLM's ``--goodput`` syntax: space-separated ``KEY:VALUE``, KEY in ttft/tpot/e2el, VALUE in ms."""
        expected = (
            f'expected space-separated "KEY:VALUE" pairs, KEY one of {", ".join(_SLO_KEYS)} '
            'and VALUE in milliseconds, e.g. "ttft:500 tpot:50"'
        )
        pairs = spec.split()
        if not pairs:
            raise ValueError(f"empty goodput SLO: {expected}")
        limits: dict[str, float] = {}
        for pair in pairs:
            key, colon, raw = pair.partition(":")
            if not colon:
                raise ValueError(f"goodput SLO {pair!r} has no ':'; {expected}")
            if key not in _SLO_KEYS:
                raise ValueError(f"unknown goodput SLO key {key!r} in {pair!r}; {expected}")
            if key in limits:
                raise ValueError(f"goodput SLO key {key!r} given twice; {expected}")
            try:
                limits[key] = float(raw)
            except ValueError:
                raise ValueError(f"goodput SLO {key} value {raw!r} is not a number; {expected}") from None
        return cls(**{f"{key}_ms": value for key, value in limits.items()})

    def limits(self) -> dict[str, float]:
        """The SLOs that are set, by vLLM key (``ttft``, ``tpot``, ``e2el``), in ms."""
        limits = {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2el": self.e2el_ms}
        return {key: value for key, value in limits.items() if value is not None}

    def met_by(self, record: RequestRecord) -> bool:
        """Whether a completed request meets every SLO (vLLM: ``slo >= value``; TPOT 0 for one-token outputs)."""
        observed = {"ttft": _ttft(record), "tpot": _tpot(record) or 0.0, "e2el": _e2el(record)}
        return all(limit / 1000 >= observed[key] for key, limit in self.limits().items())


# --- whole run -----------------------------------------------------------------------


def _measured(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """Non-warmup records in send order (a fixed order keeps float sums reproducible)."""
    return sorted((r for r in records if not r.warmup), key=lambda r: (r.sent_at, r.index))


def _per_s(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)  # vLLM's key spelling: p99, p99.9


def _stats(family: str, seconds: Sequence[float] | npt.NDArray[np.float64], percentiles: Sequence[float]) -> dict[str, float]:
    data = seconds if len(seconds) else 0  # vLLM's zero fill when nothing was measured
    stats = {
        f"mean_{family}_ms": float(np.mean(data) * 1000),
        f"median_{family}_ms": float(np.median(data) * 1000),
        f"std_{family}_ms": float(np.std(data) * 1000),
    }
    for p in percentiles:
        stats[f"p{_p_word(p)}_{family}_ms"] = float(np.percentile(data, p) * 1000)
    return stats


def _latency_stats(completed: Sequence[RequestRecord], chunks: Chunks, percentiles: Sequence[float]) -> dict[str, float]:
    tpots = [tpot for r in completed if (tpot := _tpot(r)) is not None]
    itls = chunks.inter_token_latencies()
    return {
        **_stats("ttft", [_ttft(r) for r in completed], percentiles),
        **_stats("tpot", tpots, percentiles),
        **_stats("itl", itls, percentiles),
        **_stats("e2el", [_e2el(r) for r in completed], percentiles),
    }


QUANTILES = tuple(range(101))
"""The percentiles a run keeps of each latency, for its distribution (``latency_quantiles``)."""


def latency_quantiles(records: Iterable[RequestRecord]) -> dict[str, tuple[float, ...]]:
    """The distribution of each latency of the completed non-warm-up requests, as its percentiles
    :data:`QUANTILES` in milliseconds (``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2el_ms``), computed
    as the run's ``p99_*`` figures are; a latency nothing measured is left out."""
    completed = [r for r in _measured(records) if r.ok]
    families: dict[str, Sequence[float] | npt.NDArray[np.float64]] = {
        "ttft_ms": [_ttft(r) for r in completed],
        "tpot_ms": [tpot for r in completed if (tpot := _tpot(r)) is not None],
        "itl_ms": Chunks.of(completed).inter_token_latencies(),
        "e2el_ms": [_e2el(r) for r in completed],
    }
    return {
        name: tuple(float(f"{v * 1000:.4g}") for v in np.percentile(seconds, QUANTILES))
        for name, seconds in families.items()
        if len(seconds)
    }


def _peaks(completed: Sequence[RequestRecord], chunks: Chunks) -> dict[str, float | int]:
    """vLLM's busiest one-second bucket of output tokens and of concurrent requests (``chunks``: ``completed``'s)."""
    if not completed:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    origin = min(r.sent_at for r in completed)
    buckets = int(np.ceil(max(r.sent_at + _e2el(r) for r in completed) - origin)) + 1
    tokens = chunks.tokens_per_bin(origin, 1.0, buckets)
    concurrent = np.zeros(buckets)
    for r in completed:
        concurrent[int(r.sent_at - origin) : int(r.sent_at + _e2el(r) - origin) + 1] += 1
    return {"max_output_tokens_per_s": float(tokens.max()), "max_concurrent_requests": int(concurrent.max())}


def _send_rate(run: Sequence[RequestRecord]) -> float:
    if len(run) < 2:
        return 0.0
    span = max(r.sent_at for r in run) - min(r.sent_at for r in run)
    return (len(run) - 1) / span if span > 0 else math.inf


def summarize(
    records: Iterable[RequestRecord],
    *,
    duration_s: float | None = None,
    window: tuple[float, float] | None = None,
    percentiles: Sequence[float] = (50, 90, 99),
    goodput_slo: GoodputSLO | None = None,
    requested_rate: float | None = None,
) -> RunSummary:
    """Metrics of the non-warmup records, named and computed as ``vllm bench serve``: over the
    whole run, or over ``window`` (``[start, end)``, see :func:`_in_window`)."""
    run = _measured(records)
    if window is not None:
        if duration_s is not None:
            raise ValueError("a summary is over a duration or over a window, not both")
        run, duration_s, total_input, total_output = _in_window(run, window)
        completed = [r for r in run if r.ok]
    else:
        completed = [r for r in run if r.ok]
        if duration_s is None:
            duration_s = max(r.ended_at for r in run) - run[0].sent_at if run else 0.0
        elif duration_s <= 0:
            raise ValueError(f"duration_s must be positive, got {duration_s}")
        total_input = sum(r.prompt_tokens for r in completed)
        total_output = sum(r.completion_tokens for r in completed)
    values: dict[str, float | int] = {
        "duration": duration_s,
        "completed": len(completed),
        "failed": sum(1 for r in run if not r.ok and not r.cut),  # a request cut is not a failure
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": _per_s(len(completed), duration_s),
    }
    if goodput_slo is not None:
        values["request_goodput"] = _per_s(sum(goodput_slo.met_by(r) for r in completed), duration_s)
    values["output_throughput"] = _per_s(total_output, duration_s)
    values["total_token_throughput"] = _per_s(total_input + total_output, duration_s)
    chunks = Chunks.of(completed)
    values |= _latency_stats(completed, chunks, percentiles)
    values |= _peaks(completed, chunks)
    values["achieved_request_rate"] = _send_rate(run)
    if requested_rate is not None:
        values["requested_request_rate"] = requested_rate
    lags = [r.scheduling_lag for r in run] or [0.0]
    values["p50_scheduling_lag_ms"] = float(np.percentile(lags, 50) * 1000)
    values["p99_scheduling_lag_ms"] = float(np.percentile(lags, 99) * 1000)
    values["max_scheduling_lag_ms"] = max(lags) * 1000
    return RunSummary.from_values(values)


# --- steady state --------------------------------------------------------------------


def steady_window(records: Iterable[RequestRecord]) -> tuple[float, float] | None:
    """(start, end) of the run's steady state, or None when it has none.

    Start: the first moment the number of in-flight non-warmup requests reaches 90 % of
    its maximum (ramp-up is over). End: the last ``sent_at``; after it the run only drains.
    """
    run = _measured(records)
    if len(run) < 2:
        return None
    # At equal times ends sort before sends, so a closed loop's hand-off is not counted twice.
    events = sorted([(r.sent_at, 1) for r in run] + [(r.ended_at, -1) for r in run])
    levels = []
    in_flight = 0
    for at, change in events:
        in_flight += change
        levels.append((at, in_flight))
    peak = max(level for _, level in levels)
    start = next(at for at, level in levels if 10 * level >= 9 * peak)
    end = run[-1].sent_at
    return (start, end) if end > start else None


def _in_window(run: Sequence[RequestRecord], window: tuple[float, float]) -> tuple[list[RequestRecord], float, int, int]:
    """The requests sent inside ``[start, end)``, its length, and the prompt and output tokens of
    the run's completed requests that came inside it (:mod:`~pytest_qwenperf.core.window`).

    Output tokens count at their chunk's arrival and prompt tokens at the request's first token,
    whenever the request was sent. Requests are chosen by when they were sent, not by when they
    ended: a rule of "ended inside" would drop the long requests in flight at the end and bias
    every latency towards short ones. The caller keeps the requests sent inside it until they end
    (the steady state ends at the last send; a time-bounded run waits for them).
    """
    start, end = window
    if end <= start:
        raise ValueError(f"empty window {window}")
    completed = [r for r in run if r.ok]
    output_tokens = Chunks.of(completed).tokens_within(start, end)
    prompt_tokens = sum(r.prompt_tokens for r in completed if start <= _first_token_at(r) < end)
    return [r for r in run if start <= r.sent_at < end], end - start, prompt_tokens, output_tokens


# --- sanity checks -------------------------------------------------------------------


@dataclass(frozen=True)
class TokenCrossCheck:
    """Client usage totals against the server's ``/metrics`` counter deltas over the same run."""

    client_prompt: int
    client_generation: int
    server_prompt: float | None
    server_generation: float | None
    requests_without_usage: int  # their tokens reached the server's counters but not the client's
    matches: bool | None  # None: the server exposed neither counter
    cut: int = 0  # requests cut once their window was measured: the server may have counted more of them
    slack: tuple[float, float] = (0.0, 0.0)  # how many more prompt / generation tokens the server may count for them

    def describe(self) -> str:
        client = f"client {self.client_prompt} prompt / {self.client_generation} generation tokens"
        if self.matches is None:
            return f"{client}; the server exposed no token counters to compare with"
        server = f"server {_count(self.server_prompt)} prompt / {_count(self.server_generation)} generation tokens"
        if self.cut:
            within = (
                f" within what {self.cut} request(s) cut at the window's end may have left unread "
                f"(up to {_count(self.slack[0])} prompt / {_count(self.slack[1])} generation tokens more)"
            )
            return f"token counts {'agree' if self.matches else 'differ'}{within}: {client}, {server}"
        if self.matches:
            return f"token counts agree: {client}, {server}"
        hint = (
            f"; {self.requests_without_usage} request(s) got no usage: the server may have counted tokens the client could not"
            if self.requests_without_usage
            else "; another client may have used the server, or the counters were read at the wrong time"
        )
        return f"token counts differ: {client} vs {server}{hint}"


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.15g}"


def cross_check(
    records: Iterable[RequestRecord], server_prompt_delta: float | None, server_generation_delta: float | None
) -> TokenCrossCheck:
    """Compare usage totals of all records (warmup and failed included: the server counted them
    too) with the deltas of ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``.

    Requests cut once their window was measured (:attr:`RequestRecord.cut`) count what the client
    read of them, and the server may have counted more: a prompt the client saw no usage of (vLLM
    counts it at the first token), and output tokens up to ``max_tokens`` generated before the
    abort reached the engine. The server's counts must then lie between the client's and that
    much more (unbounded where the record does not know the prompt's or the output's length)."""
    records = list(records)
    client_prompt = sum(r.prompt_tokens for r in records)
    client_generation = sum(r.completion_tokens for r in records)
    cut = [r for r in records if r.cut]
    slack = (
        math.fsum(math.inf if r.expected_prompt_tokens is None else r.expected_prompt_tokens for r in cut if not r.prompt_tokens),
        math.fsum(math.inf if r.expected_output_tokens is None else r.expected_output_tokens - r.completion_tokens for r in cut),
    )
    compared = [
        client <= server <= client + more
        for client, server, more in (
            (client_prompt, server_prompt_delta, slack[0]),
            (client_generation, server_generation_delta, slack[1]),
        )
        if server is not None
    ]
    return TokenCrossCheck(
        client_prompt=client_prompt,
        client_generation=client_generation,
        server_prompt=server_prompt_delta,
        server_generation=server_generation_delta,
        requests_without_usage=sum(1 for r in records if r.prompt_tokens == 0 and r.completion_tokens == 0 and not r.cut),
        matches=all(compared) if compared else None,
        cut=len(cut),
        slack=slack,
    )


def prompt_lengths_off(records: Iterable[RequestRecord]) -> str | None:
    """Why the prompts the server counted are not the ones sent, or None: a request sent as token
    ids whose usage counts another number of prompt tokens (a server that adds or drops tokens,
    or a proxy that rewrote the body) measured other work than the workload asked for."""
    answered = [r for r in records if r.expected_prompt_tokens is not None and r.prompt_tokens]
    off = [r for r in answered if r.prompt_tokens != r.expected_prompt_tokens]
    if not off:
        return None
    first = off[0]
    return (
        f"{len(off)} of {len(answered)} request(s) counted other prompt lengths than the token ids sent "
        f"(request {first.index}: {first.expected_prompt_tokens} sent, {first.prompt_tokens} counted)"
    )


LAG_P99_LIMIT_S = 0.05
"""The p99 send lag beyond which a load's client fell behind (a replay may state its own)."""


def client_bound_reason(
    records: Iterable[RequestRecord],
    *,
    requested_rate: float | None = None,
    lag_p99_limit_s: float = LAG_P99_LIMIT_S,
    client_cpu_busy_fraction: float | None = None,
    busy_limit: float = 0.95,
) -> str | None:
    """Why the load generator, not the server, limited this run; None when it kept up."""
    run = _measured(records)
    reasons = []
    if requested_rate is not None and math.isfinite(requested_rate) and len(run) >= 2:
        achieved = _send_rate(run)
        if achieved < _MIN_SEND_RATIO * requested_rate:
            reasons.append(
                f"sent {achieved:.3g} req/s, below {_MIN_SEND_RATIO:.0%} of the requested {requested_rate:.3g} req/s"
            )
    if run:
        lag_p99 = float(np.percentile([r.scheduling_lag for r in run], 99))
        if lag_p99 > lag_p99_limit_s:
            reasons.append(f"p99 scheduling lag {lag_p99 * 1000:.1f} ms exceeds {lag_p99_limit_s * 1000:.1f} ms")
    if client_cpu_busy_fraction is not None and client_cpu_busy_fraction >= busy_limit:
        reasons.append(f"client process busy {client_cpu_busy_fraction:.0%} of the run (limit {busy_limit:.0%})")
    return "; ".join(reasons) or None

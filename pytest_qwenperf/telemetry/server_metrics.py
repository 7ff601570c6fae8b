"""vLLM's Prometheus ``/metrics``: snapshots summed over engines, and deltas between two.

Parsed with ``prometheus_client``'s own text parser. Metric names drift between vLLM
releases, so every quantity is looked up through a list of aliases (newest first), and a
quantity the server does not expose is ``None`` (unavailable), never an error. A page
that is not Prometheus text at all (an error page from a proxy, binary) raises
:class:`MetricsUnreadable` saying what it is instead; callers treat it as no ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pytest_qwenperf.core.http import http_get

# canonical name → Prometheus family names, newest first (REFERENCE: metric-name history)
COUNTERS: Mapping[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "num_preemptions": ("vllm:num_preemptions",),
    "request_success": ("vllm:request_success",),  # finished requests, any finish reason
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts",),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
}
GAUGES: Mapping[str, tuple[str, ...]] = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}


@dataclass(frozen=True)
class MetricsSnapshot:
    """Counters and gauges of one or more servers, each summed over ``engine`` labels and servers."""

    values: Mapping[str, float | None]

    def __getitem__(self, name: str) -> float | None:
        return self.values[name]


_FAMILIES = frozenset(name for names in (*COUNTERS.values(), *GAUGES.values()) for name in names)


class MetricsUnreadable(ValueError):
    """A ``/metrics`` page that is not Prometheus text; the message says what it is instead."""


def excerpt(data: bytes | str, limit: int = 60) -> str:
    """The start of an answer, for messages about what it was instead of what was expected."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def page_text(body: bytes) -> str:
    """A ``/metrics`` body as text; :class:`MetricsUnreadable` when it is not UTF-8 (the exposition format's encoding)."""
    try:
        return body.decode()
    except UnicodeDecodeError as exc:
        raise MetricsUnreadable(f"not UTF-8 text (byte 0x{body[exc.start]:02x} at offset {exc.start})") from None


def metric_families(text: str) -> list[Metric]:
    """Every family of a page; :class:`MetricsUnreadable` when the parser cannot read it."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError as exc:  # the parser's only error: a line it cannot read
        raise MetricsUnreadable(f"not Prometheus text ({exc}; it begins {excerpt(text)})") from None


def series_values(text: str) -> dict[str, list[float]]:
    """Family name (counters without ``_total``) → the value of each labelled series (engine).

    Only the lines of the families above reach the parser: a vLLM page has hundreds of
    lines (histogram buckets, process metrics) and parsing all of them takes ~15 ms of the
    interpreter, which a poller shares with the load generator. A page with none of them
    is parsed whole: another exporter's page gives no values, one that is not Prometheus
    text raises :class:`MetricsUnreadable`.
    """
    wanted = "\n".join(line for line in text.splitlines() if _family_of(line) in _FAMILIES)
    series: dict[str, list[float]] = {}
    for family in metric_families(wanted):
        for sample in family.samples:
            # A counter's value is its _total sample (with or without a matching TYPE line).
            series.setdefault(sample.name.removesuffix("_total"), []).append(sample.value)
    if not series:
        metric_families(text)
    return series


def _family_of(line: str) -> str | None:
    """The family a sample line belongs to; None for comments and ``_created`` timestamps."""
    if line.startswith("#") or not line.strip():
        return None
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return None if name.endswith("_created") else name.removesuffix("_total")


def snapshot_of(series: Mapping[str, Sequence[float]]) -> MetricsSnapshot:
    """The canonical quantities, each summed over its series (engines), through the aliases."""
    values = {
        canonical: next((sum(series[name]) for name in names if name in series), None)
        for canonical, names in {**COUNTERS, **GAUGES}.items()
    }
    return MetricsSnapshot(MappingProxyType(values))


def parse_metrics(text: str) -> MetricsSnapshot:
    """One server's ``/metrics`` text → snapshot of the canonical quantities."""
    return snapshot_of(series_values(text))


def combine(snapshots: Iterable[MetricsSnapshot]) -> MetricsSnapshot:
    """Sum several servers' snapshots (replicas behind one config); unavailable stays unavailable."""
    snapshots = list(snapshots)
    values = {}
    for name in {**COUNTERS, **GAUGES}:
        parts = [s[name] for s in snapshots]
        values[name] = None if not parts or any(p is None for p in parts) else sum(p for p in parts if p is not None)
    return MetricsSnapshot(MappingProxyType(values))


def counter_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float | None]:
    """How much each counter grew between two snapshots (None when unavailable in either)."""
    deltas: dict[str, float | None] = {}
    for name in COUNTERS:
        a, b = before[name], after[name]
        deltas[name] = None if a is None or b is None else b - a
    return deltas


def scrape_each(base_urls: Iterable[str], timeout: float = 10.0) -> list[MetricsSnapshot]:
    """Fetch ``/metrics`` of every server, one snapshot each (blocking; call it off the event loop).

    Raises ``OSError`` when a server does not answer 200 and :class:`MetricsUnreadable` when
    it answers with something else than Prometheus text.
    """
    snapshots = []
    for url in base_urls:
        status, body = http_get(f"{url}/metrics", timeout=timeout)
        if status != 200:
            raise OSError(f"{url}/metrics returned HTTP {status}")
        try:
            snapshots.append(parse_metrics(page_text(body)))
        except MetricsUnreadable as exc:
            raise MetricsUnreadable(f"{url}/metrics answered 200 but is {exc}") from None
    return snapshots


def scrape(base_urls: Iterable[str], timeout: float = 10.0) -> MetricsSnapshot:
    """``/metrics`` of every server, combined."""
    return combine(scrape_each(base_urls, timeout))

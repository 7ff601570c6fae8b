"""The /metrics poller against real HTTP servers serving real Prometheus text."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pytest_qwenperf.serving.process import free_port
from pytest_qwenperf.telemetry.gauges import MetricsPoller, gauge_sample

DATA = Path(__file__).parent / "data"
TOKENS_PER_S = 1000.0  # per engine


class FakeEngines(Collector):
    """What a vLLM replica with ``engines`` data-parallel engines exposes, computed at scrape time.

    Each engine's token counter grows at ``TOKENS_PER_S`` by the clock; ``scraped`` keeps the
    time of every scrape, so a test knows the counters' true increase between two polls
    (the poller's own times for them may be later on a loaded machine, and that is its figure).
    """

    def __init__(self, engines: int, kv_usage: list[float], *, old_names: bool = False) -> None:
        self.engines, self.kv_usage, self.old_names = engines, kv_usage, old_names
        self.started = time.perf_counter()
        self.running = 8.0
        self.scraped: list[float] = []

    def tokens_between(self, first: int, last: int) -> float:
        """How much the counters of all engines grew from scrape ``first`` to scrape ``last``."""
        return self.engines * TOKENS_PER_S * (self.scraped[last] - self.scraped[first])

    def collect(self) -> Iterator:
        labels = ["model_name", "engine"]
        running = GaugeMetricFamily("vllm:num_requests_running", "running", labels=labels)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "waiting", labels=labels)
        kv_name = "vllm:gpu_cache_usage_perc" if self.old_names else "vllm:kv_cache_usage_perc"
        kv = GaugeMetricFamily(kv_name, "kv", labels=labels)
        tokens = CounterMetricFamily("vllm:generation_tokens", "generated", labels=labels)
        self.scraped.append(time.perf_counter())
        for engine in range(self.engines):
            label = ["m", str(engine)]
            running.add_metric(label, self.running)
            waiting.add_metric(label, 2.0)
            kv.add_metric(label, self.kv_usage[engine])
            tokens.add_metric(label, TOKENS_PER_S * (self.scraped[-1] - self.started), created=self.started)
        yield from (running, waiting, kv, tokens)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[], bytes]], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(page: Callable[[], bytes]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = page() if self.path == "/metrics" else b""
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def registry_page(*collectors: Collector) -> Callable[[], bytes]:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return lambda: generate_latest(registry)


def poll(urls: list[str], seconds: float, interval_s: float = 0.05) -> MetricsPoller:
    with MetricsPoller(urls, interval_s=interval_s) as poller:
        time.sleep(seconds)
    return poller


def test_gauges_are_summed_over_engines_and_replicas_and_kv_usage_averaged(serve) -> None:
    a, b = FakeEngines(2, [0.2, 0.4]), FakeEngines(2, [0.6, 0.8], old_names=True)  # an older vLLM on replica b
    poller = poll([serve(registry_page(a)), serve(registry_page(b))], seconds=0.6)

    sample = poller.samples[0]
    assert sample.running == 32 and sample.waiting == 8  # 2 replicas × 2 engines
    assert sample.kv_cache_usage == pytest.approx(0.5)  # each engine's pool is its own: the mean, not the sum
    summary = poller.summary()
    assert summary.samples == len(poller.samples) >= 3  # 13 when every poll is on time
    assert summary.running.mean == 32 and summary.waiting.max == 8
    assert summary.kv_cache_usage.median == pytest.approx(0.5)
    # 4 engines, each generating 1000 tokens/s by the wall clock: what all of them generated between the
    # first poll and the last, over the time between the two
    generated = a.tokens_between(0, -1) + b.tokens_between(0, -1)
    assert summary.rates["generation_tokens"] == pytest.approx(generated / (poller.samples[-1].at - poller.samples[0].at))
    assert summary.rates["prompt_tokens"] is None  # not exposed here: unavailable, not an error
    assert summary.health.failed_polls == 0


def test_a_window_selects_the_polls_inside_it(serve) -> None:
    engines = FakeEngines(1, [0.1])
    url = serve(registry_page(engines))
    with MetricsPoller([url], interval_s=0.05) as poller:
        time.sleep(0.3)
        engines.running = 64.0
        time.sleep(0.4)
    later = [s for s in poller.samples if s.running == 64]
    window = (later[0].at, later[-1].at)
    summary = poller.summary(window)
    assert summary.running.min == 64 and summary.samples == len(later)
    first, last = poller.samples.index(later[0]), poller.samples.index(later[-1])  # a scrape per poll, in order
    assert summary.rates["generation_tokens"] == pytest.approx(engines.tokens_between(first, last) / (window[1] - window[0]))


def test_a_real_vllm_page_gives_its_gauges_and_counters(serve) -> None:
    text = (DATA / "vllm-0.32.0-ngram-spec-after.prom").read_bytes()
    poller = poll([serve(lambda: text)], seconds=0.2)
    sample = poller.samples[0]
    assert (sample.running, sample.waiting, sample.kv_cache_usage) == (0, 0, 0)
    assert sample.counters["generation_tokens"] == 320 and sample.counters["prompt_tokens"] == 1120
    assert poller.summary().rates["generation_tokens"] == 0  # an idle server: the counters do not move


def test_a_replica_that_does_not_answer_fails_the_poll_without_ending_it(serve) -> None:
    good = serve(registry_page(FakeEngines(1, [0.3])))
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    poller = poll([good, refused], seconds=0.3)
    health = poller.health()
    assert poller.samples == []  # a sum missing a replica would read as a drop in load
    assert health.failed_polls == health.polls + 1  # every poll, and the closing one
    assert "Connection refused" in (health.last_error or "")

    poller = poll([good, f"{good}/elsewhere"], seconds=0.2)  # answers, but not with 200
    assert poller.samples == [] and "HTTP 404" in (poller.health().last_error or "")


def test_gauge_sample_of_pages_without_vllm_metrics_is_unavailable() -> None:
    sample = gauge_sample(1.0, ["python_gc_objects_collected_total 3.0\n"])
    assert (sample.running, sample.waiting, sample.kv_cache_usage) == (None, None, None)
    assert set(sample.counters.values()) == {None}

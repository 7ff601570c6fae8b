"""A trace replayed as recorded: its prompt and output lengths, its send times, its token totals
against the server's counters, and the prefix cache its shared blocks allow against the cache the
server hit."""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import ServingConfig

#: The cacheable share is counted in the server's own cache blocks, short of each prompt's last
#: token, as vLLM caches (``TraceReplay.kv_block``); below this share of it, the cache lost blocks
#: the trace shares (evicted, or the prompts did not share what they should).
HIT_SHARE_FLOOR = 0.8


@pytest.mark.qwenperf_select("trace")
def test_trace_replayed_as_recorded(qwenperf_run: Run, serving_config: ServingConfig) -> None:
    trace = qwenperf_run.trace
    assert trace is not None, "a trace's run carries what its replay is held against"
    assert trace.time_scale is not None, "the trace was sent by a loop, not at its recorded times"
    reasons = {loss.reason for loss in qwenperf_run.conditions}
    assert "prompt-lengths" not in reasons, "the server counted other prompt lengths than the trace's"
    assert qwenperf_run.client_bound is None, f"the replay fell behind its trace: {qwenperf_run.client_bound}"
    assert qwenperf_run.failed_requests == 0, f"{qwenperf_run.failed_requests} request(s) failed or ended short of the trace's output length"
    # Exactly, and compared at all: a replay is held to the server's own token counts, not to a check that found no counters.
    tokens = qwenperf_run.token_check
    assert tokens.matches is True, f"the replay's token totals against the server's /metrics: {tokens.detail or 'not compared'}"
    if "--no-enable-prefix-caching" in serving_config.vllm_args:
        return  # nothing to hold the trace's shared blocks against
    hit_rate = qwenperf_run.server.prefix_cache_hit_rate
    assert hit_rate is not None, f"prefix caching is on for {serving_config.key}, but the server counted no prefix-cache queries"
    assert hit_rate <= trace.cacheable_share + 0.005, (
        f"the server hit {hit_rate:.1%} of prompt tokens, more than the {trace.cacheable_share:.1%} the trace's shared blocks allow"
    )
    assert hit_rate >= HIT_SHARE_FLOOR * trace.cacheable_share, (
        f"the server hit {hit_rate:.1%} of prompt tokens of the {trace.cacheable_share:.1%} the trace's shared blocks allow"
    )

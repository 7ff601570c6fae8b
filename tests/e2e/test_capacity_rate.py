"""A capacity search over request rate on the real CPU build: the search brackets and bisects the
highest rate whose p99 TTFT and p99 TPOT stay within the SLO, a probe far past that rate is stopped
early as over-saturated, and the session's run keeps every probe.

The SLO is met at tens of requests per second by the tiny model on one core (about 50 to 150 in
runs here) and broken well below the search's highest rate. The first probe runs at 256
requests/s, past every capacity measured, so that some probe is over-saturated on a fast runner
too: starting at 64, CI's runner (2026-11-27) met the SLO at 128 in one probe and missed it in
another, and the search never went higher. A probe at a high rate measures the workload's 800
requests, so a rate past the capacity keeps sending for seconds while its queue and TTFT grow,
long enough for the watch to stop it; one at a low rate measures 15 s of its arrivals. A stop is
held to be above the capacity found: a significant but tiny TTFT slope once stopped a probe far
inside it.

The search reaches down to 4 requests/s: a slow CI runner (2026-12-01) met the TTFT limit at 16
but not the TPOT one (p99 58 ms), and a search whose lowest load was 16 found nothing. It settles
at a bracket within half its lower load and may spend 12 probes: with a resolution of 0.25 and 7
probes, CI's runner (2026-12-02) met the SLO at 32, failed it at 45 and 38, and failed it again
when 32 was confirmed (p99 TPOT 28 then 39 ms against 30) on the last probe, with no probe left to
go lower. What this test shows is a search that brackets, bisects and stops a saturated probe,
not a fine capacity.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.tiny import inner_session, suite_toml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

LOWEST, HIGHEST = 4.0, 1024.0

SUITE = suite_toml(
    "rate-search",
    f"""
[[config]]
id = "tiny"

[[workload]]
name = "rate-isl32-osl64"
kind = "random"
input_len = 32
output_len = 64
num_prompts = 832
warmup = 32
load = {{ rate = 256 }}
slo = "ttft:300 tpot:30"
search = {{ by = "rate", lowest = {LOWEST}, highest = {HIGHEST}, resolution = 0.5, max_probes = 12 }}
floors = {{ capacity_at_slo = {{ "*" = {LOWEST} }} }}
""",
    suite="repeats = 1",
)


def test_a_rate_search_finds_the_capacity_and_stops_a_saturated_probe_early(pytester: pytest.Pytester) -> None:
    (pytester.path / "suite.toml").write_text(SUITE)
    pytester.makepyfile(test_capacity=(ROOT / "perf_tests" / "test_capacity.py").read_text())
    result = inner_session(pytester, "test_capacity.py", "rate", "-k", "found_and_above", "--qwenperf-no-history", "-rA")
    out = result.stdout.str()
    result.assert_outcomes(passed=1)
    (run,) = json.loads((pytester.path / "rate.json").read_text())["runs"]
    (search,) = run["capacity"]
    assert search["search"] == "rate" and search["bound"] == "found", search
    capacity, probes = search["load"], search["probes"]
    assert LOWEST <= capacity < HIGHEST, search
    assert run["metrics"]["capacity_at_slo"] == capacity
    slo = search["slo"]

    def meets(probe: dict) -> bool:
        return probe["stopped"] is None and all(probe["latencies"].get(name, float("inf")) <= limit for name, limit in slo.items())

    assert any(meets(p) and p["load"] <= capacity for p in probes), probes
    assert not any(meets(p) for p in probes if p["load"] > capacity * 1.5), probes
    stopped = [p for p in probes if p["stopped"] and "over-saturated" in p["stopped"]]
    assert stopped, f"no probe was stopped as over-saturated: {probes}\n{out}"
    assert all(p["load"] > capacity for p in stopped), probes

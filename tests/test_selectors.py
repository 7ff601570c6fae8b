"""Which (config, workload) pairs of a suite each kind of test runs on."""

from __future__ import annotations

import pytest

from pytest_qwenperf.suite.selectors import SELECTORS, selected_pairs, tier_of
from tests.test_baseline import suite


def _ids(selector: str, *, deployed_sets: bool = False) -> list[str]:
    return [f"{p.config.key}/{p.workload.id}" for p in selected_pairs([suite("cpu")], selector, deployed_sets=deployed_sets)]


def test_every_pair_a_workload_runs_on_in_suite_workload_config_order() -> None:
    cpu = suite("cpu")
    pairs = selected_pairs([cpu, suite("b200")], "all")
    assert all(p.workload.runs_on(p.config.id) for p in pairs)
    assert [p.suite.name for p in pairs] == sorted((p.suite.name for p in pairs), key=["cpu", "b200"].index)
    first = [p for p in pairs if p.workload.id == cpu.workloads[0].id]
    assert [p.config.id for p in first] == [c.id for c in cpu.configs if cpu.workloads[0].runs_on(c.id)]
    assert "cpu/replicas-2/scaling-isl128-osl128" in _ids("all") and "cpu/base/scaling-isl128-osl128" not in _ids("all")


def test_each_selector_keeps_its_kind_of_pair() -> None:
    assert _ids("ladder") == ["cpu/ngram-spec/isl128-osl128"]  # the rungs that claim to improve
    assert _ids("prefix-cache") == ["cpu/prefix-cache/shared-prefix-pl1536"]
    assert _ids("speculative") == ["cpu/ngram-spec/isl128-osl128", "cpu/ngram-spec/capacity-tpot-isl64-osl128"]
    assert _ids("scaling") == ["cpu/replicas-2/scaling-isl128-osl128"]
    # The canary is per config: once each, on its first workload.
    assert _ids("canary") == [
        "cpu/base/isl128-osl128",
        "cpu/ctx-short/isl128-osl128",
        "cpu/fp8kv/isl128-osl128",
        "cpu/ngram-spec/isl128-osl128",
        "cpu/seqs-32/isl128-osl128",
        "cpu/replicas-2/scaling-isl128-osl128",
        "cpu/prefix-cache/shared-prefix-pl1536",
    ]
    # fp8kv has a canary table; ngram-spec is speculative, so it must give its parent's tokens.
    assert _ids("canary-floor") == ["cpu/fp8kv/isl128-osl128", "cpu/ngram-spec/isl128-osl128"]
    assert _ids("trace") == ["cpu/prefix-cache/trace-synthetic"]
    searched = [
        "cpu/seqs-32/capacity-isl64-osl128",
        "cpu/ctx-short/capacity-isl64-osl128",
        "cpu/ctx-short/capacity-tpot-isl64-osl128",
        "cpu/ngram-spec/capacity-tpot-isl64-osl128",
    ]
    assert _ids("capacity") == [i for i in _ids("all") if i in searched] and len(searched) == 4
    # one per workload with an order, on the last config of it
    assert _ids("capacity-order") == ["cpu/ctx-short/capacity-isl64-osl128", "cpu/ngram-spec/capacity-tpot-isl64-osl128"]
    # the shared-prefix and trace workloads have no SLO and no CPU floor
    unchecked = [i for i in _ids("all") if not i.endswith(("/shared-prefix-pl1536", "/trace-synthetic"))]
    assert _ids("slo") == unchecked  # a search holds its chosen probe to its SLO
    assert _ids("utilization") == [i for i in unchecked if i not in searched]


def test_deployed_sets_are_what_scales_so_scaling_keeps_every_config() -> None:
    assert _ids("scaling", deployed_sets=True) == _ids("all")
    assert _ids("ladder", deployed_sets=True) == _ids("ladder")


def test_an_unknown_selector_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"^qwenperf_select\('fastest'\): expected one of \[") as caught:
        selected_pairs([suite("cpu")], "fastest")
    assert str(sorted(SELECTORS)) in str(caught.value)


def test_a_test_is_weekly_where_its_config_its_workload_or_a_config_it_also_measures_is() -> None:
    b200 = suite("b200")
    tiers = {
        (selector, p.config.id, p.workload.id): tier_of(selector, b200, p.config, p.workload)
        for selector in ("all", "ladder", "capacity", "capacity-order")
        for p in selected_pairs([b200], selector)
    }
    assert tiers["all", "dp8-ctx4k-fp8kv-mtp1", "isl1024-osl512"] == "nightly"
    assert tiers["all", "dp8", "isl1024-osl512"] == "weekly"  # its config
    assert tiers["all", "dp8-ctx4k-fp8kv", "isl256-osl2048"] == "weekly"  # its workload
    assert tiers["ladder", "dp8-ctx4k-fp8kv-mtp1", "isl1024-osl512"] == "nightly"  # its parent is nightly too
    assert tiers["ladder", "dp8-ctx4k-fp8kv", "isl1024-osl512"] == "weekly"  # it also boots dp8-ctx4k, a weekly rung
    assert tiers["capacity", "dp8-ctx4k-fp8kv-mtp1", "capacity-chat-isl512-osl128"] == "weekly"  # its workload (the searches)
    assert tiers["capacity-order", "dp8-ctx4k-fp8kv-mtp1", "capacity-chat-isl512-osl128"] == "weekly"
    assert {tier for (_, config, _), tier in tiers.items() if config in ("tp8", "dp8", "dp8-ctx4k")} == {"weekly"}
    cpu = {(p.config.id, p.workload.id): tier_of("all", suite("cpu"), p.config, p.workload) for p in selected_pairs([suite("cpu")], "all")}
    weekly = {pair for pair, tier in cpu.items() if tier == "weekly"}
    assert {workload for config, workload in weekly if config != "seqs-32"} == {"capacity-isl64-osl128", "capacity-tpot-isl64-osl128"}
    assert ("seqs-32", "isl128-osl128") in weekly  # its config: its cap binds only in a search
    assert "nightly" in cpu.values()

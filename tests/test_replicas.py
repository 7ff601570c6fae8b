"""Replica placement, N× the load and the scaling arithmetic (no server needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.core.parallel import gpus_per_server
from pytest_qwenperf.loadgen.arrivals import ClosedLoop, OpenLoop
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.measure.scaling import ScalingSummary, copies_of, times_arrival
from pytest_qwenperf.serving.replicas import (
    ReplicaError,
    replica_specs,
    split_cpus,
    split_gpus,
)
from pytest_qwenperf.serving.server import ServerSpec
from pytest_qwenperf.suite.config import SuiteError, load_suite
from pytest_qwenperf.suite.tiny_model import ensure_tiny_model
from pytest_qwenperf.suite.workloads import FixedWorkload, RandomWorkload


@pytest.fixture(scope="module")
def tiny_tokenizer() -> PromptTokenizer:
    return PromptTokenizer.load(ensure_tiny_model())


@given(st.sets(st.integers(0, 255), min_size=1, max_size=64), st.integers(1, 16))
def test_cpu_slices_are_disjoint_equal_and_inside_the_given_cpus(cpus: set[int], replicas: int) -> None:
    if len(cpus) < replicas:
        with pytest.raises(ReplicaError, match=f"{replicas} replicas need at least one CPU each"):
            split_cpus(frozenset(cpus), replicas)
        return
    slices = split_cpus(frozenset(cpus), replicas)
    assert len(slices) == replicas
    assert len({len(s) for s in slices}) == 1 and len(slices[0]) == len(cpus) // replicas
    assert set().union(*slices) <= cpus
    assert sum(len(s) for s in slices) == len(set().union(*slices))  # disjoint


def test_no_cpus_means_no_pinning_for_any_replica() -> None:
    assert split_cpus(frozenset(), 3) == (frozenset(),) * 3


@pytest.mark.parametrize(
    ("argv", "gpus"),
    [
        ((), 1),
        (("--tensor-parallel-size", "8"), 8),
        (("-tp", "2", "--pipeline-parallel-size", "2"), 4),
        (("--data-parallel-size", "8", "--max-model-len", "4096"), 8),
    ],
)
def test_gpus_per_server_is_tp_times_pp_times_dp(argv: tuple[str, ...], gpus: int) -> None:
    assert gpus_per_server(argv) == gpus


def test_gpu_slices_are_consecutive_groups() -> None:
    assert split_gpus([str(i) for i in range(8)], 2, 4) == ("0,1", "2,3", "4,5", "6,7")
    with pytest.raises(ReplicaError, match="3 replicas of 4 GPU"):
        split_gpus([str(i) for i in range(8)], 4, 3)


def test_replica_specs_get_their_own_name_cpus_and_gpus() -> None:
    spec = ServerSpec(model="m", args=("-tp", "2"), name="dp", env=(("A", "1"),), cpus=frozenset({0, 1, 2, 3}))
    specs = replica_specs(spec, 2, gpu_devices=("4", "5", "6", "7"))
    assert [s.name for s in specs] == ["dp-r0", "dp-r1"]
    assert [s.cpus for s in specs] == [frozenset({0, 1}), frozenset({2, 3})]
    assert [dict(s.env) for s in specs] == [{"A": "1", "CUDA_VISIBLE_DEVICES": "4,5"}, {"A": "1", "CUDA_VISIBLE_DEVICES": "6,7"}]
    assert {s.args for s in specs} == {spec.args}


def test_copies_interleave_so_round_robin_gives_each_replica_one_copy() -> None:
    fixed = FixedWorkload(prompt="hi", output_len=3, num_prompts=5)
    copies = copies_of(fixed, 3, None)
    assert [spec.index for spec in copies] == list(range(15))
    assert [copies[i].prompt for i in range(0, 15, 3)] == [spec.prompt for spec in fixed.build(None)]


def test_seeded_copies_are_the_same_work_but_other_prompts(tiny_tokenizer) -> None:
    workload = RandomWorkload(input_len=16, output_len=8, num_prompts=6, seed=3)
    one = workload.build(tiny_tokenizer)
    two = copies_of(workload, 2, tiny_tokenizer)
    first, second = two[0::2], two[1::2]
    assert [s.prompt for s in first] == [s.prompt for s in one]  # copy 0 is the workload itself
    assert [s.max_tokens for s in second] == [s.max_tokens for s in one]
    assert [len(s.prompt) for s in second] == [len(s.prompt) for s in one]
    assert not {s.prompt for s in second} & {s.prompt for s in one}


def test_times_arrival_multiplies_the_load() -> None:
    assert times_arrival(ClosedLoop(32), 3) == ClosedLoop(96)
    assert times_arrival(ClosedLoop(32, ramp_steps=4), 2) == ClosedLoop(64, ramp_steps=4)  # the warm-up still ramps
    scaled = times_arrival(OpenLoop(rate=2.5, distribution="gamma", burstiness=0.5, max_concurrency=10, seed=4), 4)
    assert scaled == OpenLoop(rate=10.0, distribution="gamma", burstiness=0.5, max_concurrency=40, seed=4)


def test_efficiency_pairs_each_repeat_with_its_reference() -> None:
    summary = ScalingSummary.of({1: [100.0, 110.0], 2: [190.0, 198.0]}, {"a": 50, "b": 46})
    assert summary.efficiencies() == {2: (0.95, 0.9)}
    assert summary.samples() == {"scaling_efficiency_n2": (0.95, 0.9)}
    assert summary.request_spread() == pytest.approx(2 / 48)
    assert summary.record().replicas["2"].efficiency == (0.95, 0.9)


def test_scaling_needs_the_one_replica_reference() -> None:
    with pytest.raises(ValueError, match="one-replica reference"):
        ScalingSummary.of({2: [1.0]}, {})


def test_unknown_replica_counts_make_no_spread() -> None:
    assert ScalingSummary.of({1: [1.0], 2: [2.0]}, {"a": 3, "b": None}).request_spread() is None


def _suite(tmp_path: Path, config_lines: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(
        textwrap.dedent(
            """
            [suite]
            name = "t"
            hardware = "cpu"
            model = "embedded:tiny"
            [[config]]
            id = "one"
            """
        )
        + textwrap.dedent(config_lines)
    )
    return path


def test_replicas_and_routing_are_inherited_and_overridden(tmp_path: Path) -> None:
    suite = load_suite(
        _suite(
            tmp_path,
            """
            [[config]]
            id = "two"
            inherits = "one"
            replicas = 2
            routing = "nginx"
            [[config]]
            id = "two-lo"
            inherits = "two"
            routing = "least-outstanding"
            """,
        )
    )
    assert [(c.replicas, c.routing) for c in suite.configs] == [(1, "round-robin"), (2, "nginx"), (2, "least-outstanding")]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("replicas = 0", "config 'one'.replicas: expected a whole number of vLLM servers >= 1, got 0"),
        ("replicas = true", "config 'one'.replicas: expected a whole number of vLLM servers >= 1, got True"),
        ('routing = "haproxy"', "config 'one'.routing: expected one of ['round-robin', 'least-outstanding', 'nginx'], got 'haproxy'"),
    ],
)
def test_bad_replicas_or_routing_name_file_field_and_expectation(tmp_path: Path, line: str, message: str) -> None:
    path = _suite(tmp_path, line + "\n")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert str(info.value) == f"{path}: {message}"

"""Where a config runs: the skip reason when this machine cannot run it, and its CPUs and GPUs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_qwenperf.serving import placement as placement_module
from pytest_qwenperf.serving.hardware import Hardware, gpu_kind, satisfies
from pytest_qwenperf.serving.placement import Placement, gpu_ids, missing_hardware, placement
from pytest_qwenperf.serving.router import RouterUnavailable
from pytest_qwenperf.suite.config import ServingConfig, load_suite, tiny_cpu_config
from tests.test_baseline import suite

FOUR_CPUS = Hardware(kind="cpu", cpu_model="Test CPU", cpu_ids=frozenset({0, 1, 2, 3}))
EIGHT_B200 = Hardware(kind="b200", gpu_name="NVIDIA B200", gpu_count=8, driver="580", cpu_ids=frozenset(range(64)))
GPU_CONFIG = ServingConfig(id="gpu", model="Qwen/Qwen3.5-27B-FP8")


def test_the_cpu_build_places_server_and_client_on_disjoint_cores() -> None:
    assert placement(tiny_cpu_config(), FOUR_CPUS) == Placement(frozenset({0, 1, 2}), frozenset({3}))
    assert placement(GPU_CONFIG, EIGHT_B200) == Placement(frozenset(), frozenset())  # GPU servers are not pinned
    one_cpu = dataclasses.replace(FOUR_CPUS, cpu_ids=frozenset({5}))
    assert placement(tiny_cpu_config(), one_cpu) == Placement(frozenset(), frozenset())


def test_cpus_given_are_taken_as_given_and_the_other_side_is_not_pinned() -> None:
    assert placement(tiny_cpu_config(), FOUR_CPUS, server_cpus=frozenset({0})) == Placement(frozenset({0}), frozenset())
    assert placement(GPU_CONFIG, EIGHT_B200, client_cpus=frozenset({63})) == Placement(frozenset(), frozenset({63}))


def test_replicas_split_the_server_cores_and_the_client_shares_them_only_when_it_must() -> None:
    fits = dataclasses.replace(tiny_cpu_config(), replicas=3)
    assert placement(fits, FOUR_CPUS) == Placement(frozenset({0, 1, 2}), frozenset({3}))
    one_core_each = dataclasses.replace(tiny_cpu_config(), replicas=4)
    assert placement(one_core_each, FOUR_CPUS) == Placement(frozenset({0, 1, 2, 3}), frozenset())
    too_many = dataclasses.replace(tiny_cpu_config(), replicas=5)
    assert placement(too_many, FOUR_CPUS) == Placement(frozenset(), frozenset())


def test_replicas_share_out_the_configs_own_gpus_else_every_gpu() -> None:
    assert gpu_ids(GPU_CONFIG, EIGHT_B200) == ()  # one server: it sees what the config's environment gives it
    dp = dataclasses.replace(GPU_CONFIG, replicas=4)
    assert gpu_ids(dp, EIGHT_B200) == tuple(str(i) for i in range(8))
    assert gpu_ids(dataclasses.replace(dp, env=(("CUDA_VISIBLE_DEVICES", "4,5,6,7"),)), EIGHT_B200) == ("4", "5", "6", "7")


def test_missing_hardware_names_what_the_config_needs_and_what_was_found() -> None:
    b200, cpu = suite("b200"), suite("cpu")
    assert missing_hardware(b200, b200.configs[0], FOUR_CPUS) == (
        "needs 8x B200 GPUs (suite b200.toml); found CPU only: Test CPU, 4 cores"
    )
    assert missing_hardware(b200, b200.configs[0], EIGHT_B200) is None
    assert missing_hardware(b200, b200.configs[0], dataclasses.replace(EIGHT_B200, gpu_count=4)) is not None
    fp8kv = cpu.config("fp8kv")
    assert missing_hardware(cpu, fp8kv, FOUR_CPUS) == (
        "needs a CPU with one of ['avx512f', 'amx_tile'] (config cpu/fp8kv); found Test CPU without"
    )
    assert missing_hardware(cpu, fp8kv, dataclasses.replace(FOUR_CPUS, cpu_flags=frozenset({"amx_tile"}))) is None


def test_a_config_routed_through_nginx_is_missing_it_when_nginx_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = suite("cpu")
    routed = dataclasses.replace(cpu.config("replicas-2"), routing="nginx")

    def unavailable() -> str:
        raise RouterUnavailable("nginx: not found on PATH")

    monkeypatch.setattr(placement_module, "find_nginx", unavailable)
    assert missing_hardware(cpu, routed, FOUR_CPUS) == "config cpu/replicas-2 routes through nginx: nginx: not found on PATH"
    assert missing_hardware(cpu, cpu.config("replicas-2"), FOUR_CPUS) is None  # round-robin needs no nginx


def test_a_family_of_gpus_runs_a_suite_that_names_the_family() -> None:
    hopper = load_suite(Path(__file__).parents[1] / "perf_tests" / "suites" / "hopper.toml")
    base = hopper.configs[0]
    one_h200 = Hardware(kind="h200", gpu_name="NVIDIA H200", gpu_count=1, driver="580", cpu_ids=frozenset(range(16)))
    assert missing_hardware(hopper, base, one_h200) is None
    assert missing_hardware(hopper, base, dataclasses.replace(one_h200, kind="h100", gpu_name="NVIDIA H100 80GB HBM3")) is None
    assert missing_hardware(hopper, base, EIGHT_B200) == (
        "needs 1x HOPPER (H100, H200 or GH200) GPUs (suite hopper.toml); found 8x NVIDIA B200 (driver 580)"
    )
    assert missing_hardware(hopper, base, FOUR_CPUS) is not None
    assert gpu_kind("NVIDIA GH200 480GB") == "gh200" and satisfies("gh200", "hopper") and not satisfies("h200", "b200")
    assert placement(base, one_h200) == Placement(frozenset(), frozenset())  # a generated model on a GPU is not the CPU build

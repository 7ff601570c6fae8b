"""Servers that take turns on one node's GPUs through vLLM's sleep mode (serving/sleep.py), and a
candidate session on GPU configs that measures both sides that way.

The servers are paced stand-ins (tests/standins/paced_vllm.py) that sleep and wake as vLLM does and
refuse requests while asleep, so a repeat measured on a sleeping server fails instead of passing.
vLLM's CPU build has no sleep mode: it is asked, and refuses, for real. A session's question to a
GPU build is answered by tests/standins/gpu_build_vllm, a stand-in for the parser and platform of
the CUDA build this machine does not have.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import huggingface_hub.constants
import psutil
import pytest

from pytest_qwenperf.core.http import http_get
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.serving.sleep import SleepError, Turns, turns_problem
from pytest_qwenperf.suite.config import ServingConfig, load_suite
from pytest_qwenperf.suite.vllm_args import sleep_mode_problem
from tests.test_candidate import GATE, PACED, paced
from tests.test_max_repeats import write_suite

GPU_BUILD = Path(__file__).parent / "standins" / "gpu_build_vllm"

GPU_SUITE = """\
[suite]
name = "gpus"
hardware = "h200"
gpus = 1
model = "embedded:tiny"

[[config]]
id = "tp1"

[[workload]]
name = "w"
kind = "fixed"
prompt = "hello"
output_len = 4
num_prompts = 4
load = { concurrency = 1 }
"""


FAKE_GPU = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from tests import fake_pynvml
sys.modules["pynvml"] = fake_pynvml.module([fake_pynvml.FakeGpu(uuid="GPU-0", name="NVIDIA H200")])
"""


def is_sleeping(url: str) -> bool:
    status, body = http_get(url + "/is_sleeping")
    assert status == 200, body
    return bool(json.loads(body)["is_sleeping"])


@pytest.fixture
def config(tmp_path: Path) -> ServingConfig:
    return load_suite(write_suite(tmp_path)).configs[0]


def pools(tmp_path: Path, turns: Turns | None) -> tuple[ServerPool, ServerPool]:
    launcher = (sys.executable, str(PACED), "--itl-ms", "5")
    made = [ServerPool(PoolSettings(log_dir=tmp_path / side, launcher=launcher, turns=turns)) for side in ("a", "b")]
    return made[0], made[1]


def test_the_server_handed_out_is_awake_and_the_other_asleep_from_the_second_boot_on(tmp_path: Path, config: ServingConfig) -> None:
    turns = Turns()
    first, second = pools(tmp_path, turns)
    try:
        a = first.get(config)
        (a_url,) = a.base_urls
        assert not is_sleeping(a_url)
        b = second.get(config)  # a sleeps before b boots
        (b_url,) = b.base_urls
        assert (is_sleeping(a_url), is_sleeping(b_url)) == (True, False)
        assert first.get(config) is a
        assert (is_sleeping(a_url), is_sleeping(b_url)) == (False, True)
        assert first.get(config) is a  # already awake: no call
        assert second.get(config) is b
        assert (is_sleeping(a_url), is_sleeping(b_url)) == (True, False)
        assert (turns.counts.wakes, turns.counts.sleeps) == (2, 3)
    finally:
        first.close()
        second.close()


def test_a_stopped_server_leaves_the_turns_and_the_next_boot_puts_nothing_stopped_to_sleep(tmp_path: Path, config: ServingConfig) -> None:
    turns = Turns()
    first, second = pools(tmp_path, turns)
    try:
        first.get(config)
        first.release(config.key)
        b = second.get(config)
        (b_url,) = b.base_urls
        assert not is_sleeping(b_url)
        assert turns.counts.sleeps == 0
    finally:
        first.close()
        second.close()


def test_a_server_started_without_sleep_mode_cannot_take_turns_and_says_how_to_start_it(tmp_path: Path, config: ServingConfig) -> None:
    awake_pool, _ = pools(tmp_path, None)  # booted without --enable-sleep-mode: the routes are 404
    try:
        server = awake_pool.get(config)
        turns = Turns()
        turns.join(server)
        with pytest.raises(SleepError, match=r"/sleep\?level=1 answered 404.*start it with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"):
            turns.rest()
    finally:
        awake_pool.close()


def test_vllms_cpu_build_says_it_has_no_sleep_mode() -> None:
    """Asked of the installed CPU build itself: its parser takes the flag, its platform has no sleep mode."""
    problem = sleep_mode_problem(sys.executable)
    assert problem is not None and "has no sleep mode on this machine" in problem, problem


def wrapper_python(tmp_path: Path) -> Path:
    """A Python that finds the GPU build's stand-in before the installed vLLM."""
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(GPU_BUILD))}${{PYTHONPATH:+:$PYTHONPATH}} exec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_gpu_build_with_sleep_mode_and_room_in_ram_can_take_turns(tmp_path: Path, config: ServingConfig) -> None:
    python = str(wrapper_python(tmp_path))
    assert turns_problem([config], [python, python]) is None


@pytest.mark.parametrize("where", ["folder", "hub cache"])
def test_weights_that_cpu_ram_cannot_hold_twice_rule_turns_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The weights are a sparse file as large as this machine's free RAM: their size is what is read,
    in the model's folder or in the snapshot of ``main`` that the Hugging Face cache holds of a hub name."""
    if where == "folder":
        model = str(tmp_path / "model")
        folder = Path(model)
    else:
        model = "org/big-model"
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at import otherwise
        repo = tmp_path / "hub" / "models--org--big-model"
        folder = repo / "snapshots" / "abc123"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("abc123")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with (folder / "model.safetensors").open("wb") as weights:
        weights.truncate(psutil.virtual_memory().available)
    suite = write_suite(tmp_path)
    suite.write_text(suite.read_text().replace('model = "embedded:tiny"', f'model = "{model}"'))
    cfg = load_suite(suite).configs[0]
    python = str(wrapper_python(tmp_path))
    problem = turns_problem([cfg], [python, python])
    assert problem is not None and "config standin/base:" in problem and "GiB of weights each in CPU RAM" in problem, problem
    (folder / "model.safetensors").unlink()
    assert turns_problem([cfg], [python, python]) is None  # no weights there: nothing to hold


# ---------------------------------------------------------------- sessions


def gpu_session(pytester: pytest.Pytester, launcher_ms: float, candidate_ms: float) -> pytest.RunResult:
    """A session on a GPU config (an H200 through the NVML stand-in) with a candidate: the launchers run
    paced stand-ins through a Python whose vLLM is the GPU build's stand-in."""
    # 16 tokens a request: the paced tokens (80 ms) outweigh a request's own overhead, whose noise on a busy
    # runner left an A/A pair of 4-token requests `underpowered` at two repeats a side (CI, 2026-11-29).
    suite = GPU_SUITE.replace("num_prompts = 4", "num_prompts = 16").replace("output_len = 4", "output_len = 16")
    (pytester.path / "gpus.toml").write_text(suite)
    pytester.makeconftest(FAKE_GPU)
    pytester.makepyfile(test_gate=GATE)
    python = shlex.quote(str(wrapper_python(pytester.path)))

    def launcher(itl_ms: float) -> str:
        return paced(itl_ms).replace(shlex.quote(sys.executable), python, 1)

    return pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--qwenperf-suite=gpus.toml",
        f"--qwenperf-launcher={launcher(launcher_ms)}",
        f"--qwenperf-candidate={launcher(candidate_ms)}",
        "--qwenperf-repeats=2",
        "--qwenperf-json=out/results.json",
        f"--qwenperf-log-dir={pytester.path / 'logs'}",
    )


@pytest.mark.parametrize(("candidate_ms", "verdict"), [(5, "pass"), (15, "regression")])
def test_a_candidate_on_a_gpu_config_takes_turns_with_the_launcher_and_is_judged_against_it(
    pytester: pytest.Pytester, candidate_ms: float, verdict: str
) -> None:
    """Every repeat is measured on an awake server (a sleeping stand-in refuses requests, which would make the
    run invalid), the candidate's pace decides the verdict, and the session says what the turns cost."""
    result = gpu_session(pytester, 5, candidate_ms)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, output
    judged = json.loads((pytester.path / "judgements.json").read_text())
    assert judged["output_throughput"] == verdict, judged
    candidate = json.loads((pytester.path / "out" / "results.json").read_text())
    reference = json.loads((pytester.path / "out" / "results.reference.json").read_text())
    assert candidate["boots"] == reference["boots"] == {"gpus/tp1": 1}
    for side in (candidate, reference):  # the session's turns, written with both sides
        assert (side["turns"]["wakes"], side["turns"]["sleeps"]) == (3, 4) and side["turns"]["seconds"] > 0, side["turns"]
    for side in (candidate, reference):
        (run,) = side["runs"]
        assert (run["metrics"]["completed"], run["metrics"]["failed"]) == (16, 0), run["metrics"]
    # The launcher's server boots, then sleeps while the candidate's boots; repeats A B B A wake A (B sleeps),
    # B (A sleeps), none for the second B, A (B sleeps).
    result.stdout.fnmatch_lines(["*took turns on the GPUs through vLLM's sleep mode: 3 wake-up(s) and 4 sleep(s)*"])
    for log in (pytester.path / "logs" / "tp1.log", pytester.path / "logs" / "candidate" / "tp1.log"):
        assert log.exists()


def test_a_gpu_config_with_a_candidate_whose_vllm_cannot_sleep_fails_before_anything_boots(pytester: pytest.Pytester) -> None:
    """The launchers' Python is this one, with vLLM's CPU build: no sleep mode, so no turns; the session
    says why and what to do instead (two sessions and qwenperf compare). The machine is an H200 through
    the NVML stand-in, so the config is selected, not skipped."""
    (pytester.path / "gpus.toml").write_text(GPU_SUITE)
    pytester.makeconftest(FAKE_GPU)
    pytester.makepyfile(test_gate=GATE)
    args = ("-p", "no:cacheprovider", "--qwenperf-suite=gpus.toml", f"--qwenperf-launcher={paced(5)}")
    result = pytester.runpytest_subprocess(*args, f"--qwenperf-candidate={paced(5)}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(
        ["*taking turns on the GPUs through vLLM's sleep mode, which cannot work here: *has no sleep mode on this machine*qwenperf compare (nothing was booted)*"]
    )
    assert not (pytester.path / "logs").exists()
    without = pytester.runpytest_subprocess(*args, "--collect-only")  # the same session without a candidate is collected
    assert without.ret == pytest.ExitCode.OK, without.stdout.str() + without.stderr.str()
    without.stdout.fnmatch_lines(["*test_gate*gpus-tp1/w*"])

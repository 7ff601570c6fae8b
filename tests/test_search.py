"""A search workload end to end without a server: its suite table, the probes' workloads, one
search per repeat whose run is the chosen probe's with the capacity added, what a probe's run
makes of the search, the watch that stops an over-saturated rate probe, and that only the
capacity is gated on such a run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.core.capacity import SEEDED_PROBES, SearchPlan, Slo
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import Loss, Run
from pytest_qwenperf.gate.baseline import baseline_from_run
from pytest_qwenperf.gate.judge import judge_run, losses
from pytest_qwenperf.loadgen.arrivals import ClosedLoop, OpenLoop
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.observe import Load
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.measure.run import Repeat, chained, combine_repeats
from pytest_qwenperf.measure.search import Watch, search_once
from pytest_qwenperf.measure.session_table import session_table
from pytest_qwenperf.suite.config import SuiteWorkload
from pytest_qwenperf.suite.workloads import RandomWorkload
from tests.suite_files import refused, suite_at
from tests.test_baseline import run_of

SUITE = """
[suite]
name = "demo"
hardware = "cpu"
model = "embedded:tiny"

[[config]]
id = "small"

[[config]]
id = "big"

[[workload]]
name = "cap"
kind = "random"
input_len = 8
output_len = 8
num_prompts = 136
warmup = 8
load = { concurrency = 16 }
slo = "ttft:500 tpot:20"
search = { by = "concurrency", lowest = 2, highest = 64 }
capacity_order = ["small", "big"]
capacity_factors = { big = 1.5 }
"""


def load(tmp_path: Path, text: str = SUITE) -> SuiteWorkload:
    (workload,) = suite_at(tmp_path, text).workloads
    return workload


def test_a_search_table_starts_at_the_load_and_holds_the_p99_of_the_slo(tmp_path: Path) -> None:
    workload = load(tmp_path)
    assert workload.search == SearchPlan("concurrency", 16.0, 2.0, 64.0)
    assert workload.capacity_slo() == Slo({"p99_ttft_ms": 500.0, "p99_tpot_ms": 20.0})
    assert workload.capacity_order == (("small", 1.0), ("big", 1.5))
    assert workload.capacity_relation == "above"
    assert load(tmp_path, SUITE + 'capacity_relation = "not-below"\n').capacity_relation == "not-below"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('slo = "ttft:500 tpot:20"\n', ""), r"workload 'cap'.slo: expected an SLO to search against \(a search needs one\), got None$"),
        (('slo = "ttft:500 tpot:20"', 'slo = "ttft:0"'), r"workload 'cap'.slo: expected limits > 0"),
        (('by = "concurrency"', 'by = "rate"'), r"workload 'cap'.load: expected a load of the kind the search varies, \{ rate = R \}"),
        (('by = "concurrency"', 'by = "tokens"'), r"workload 'cap'.search.by: expected"),
        (("lowest = 2", "lowest = 20"), r"workload 'cap'.search: expected lowest <= the load's 16 <= highest, got '20, 64'$"),
        (("highest = 64", "highest = 65"), r"workload 'cap'.search.highest: expected at most 1/2 of the measured requests \(64\)"),
        (('capacity_order = ["small", "big"]', 'capacity_order = ["small", "huge"]'), r"workload 'cap'.capacity_order: expected configs this workload runs on \['big', 'small'\], got 'huge'$"),
        (("capacity_factors = { big = 1.5 }", "capacity_factors = { small = 1.5 }"), r"workload 'cap'.capacity_factors.small: expected a config after the first"),
        (("capacity_factors = { big = 1.5 }", "capacity_factors = { big = 0.5 }"), r"capacity_factors.big: expected a factor >= 1"),
        (('search = { by = "concurrency", lowest = 2, highest = 64 }\n', ""), r"workload 'cap'.capacity_order: expected a search table"),
        (("capacity_factors = { big = 1.5 }", 'capacity_relation = "below"'), r"capacity_relation: expected"),
    ],
)
def test_a_bad_search_names_the_file_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    refused(tmp_path, SUITE.replace(*change, 1), message)


def test_a_probe_measures_two_rounds_of_every_stream(tmp_path: Path) -> None:
    workload = load(tmp_path)
    low, high = workload.at_load(8), workload.at_load(64)
    assert low.arrival == ClosedLoop(8) and high.arrival == ClosedLoop(64)
    assert isinstance(low.workload, RandomWorkload) and isinstance(high.workload, RandomWorkload)
    assert (low.workload.num_prompts, high.workload.num_prompts) == (8 + 64, 8 + 128)  # at least 64, 2 per stream
    ramped = load(tmp_path, SUITE.replace("load = { concurrency = 16 }", "load = { concurrency = 16, ramp_steps = 4 }"))
    assert ramped.at_load(32).arrival == ClosedLoop(32, ramp_steps=4)  # a probe's warm-up ramps as the workload's does


def test_a_rate_probe_measures_the_requests_of_its_span(tmp_path: Path) -> None:
    """A fixed count took eight times as long at an eighth of the rate; a span keeps probes alike."""
    by_rate = SUITE.replace("load = { concurrency = 16 }", "load = { rate = 16 }").replace('by = "concurrency"', 'by = "rate"')
    workload = load(tmp_path, by_rate.replace("num_prompts = 136", "num_prompts = 808"))
    counts = {rate: workload.at_load(rate).workload.num_prompts for rate in (2.0, 8.0, 16.0, 40.0, 100.0)}
    # 8 warm-up, then at least 64, rate x 15 s, at most the workload's 800
    assert counts == {2.0: 8 + 64, 8.0: 8 + 120, 16.0: 8 + 240, 40.0: 8 + 600, 100.0: 808}
    assert workload.at_load(8.0).arrival == OpenLoop(rate=8.0)


class Server:
    """Runs as a stand-in server measures them: p99 TPOT 10 ms × (1 + concurrency / 32), so the
    20 ms target binds at 32, and p99 TTFT ``ttft``; ``failing`` loads lose requests, ``condition``
    marks every run."""

    def __init__(self, failing: float = 1e9, condition: Loss | None = None, ttft: float = 100.0) -> None:
        self.failing, self.condition, self.ttft, self.loads = failing, condition, ttft, []

    def __call__(self, workload: SuiteWorkload, watch: Watch) -> Run:
        assert isinstance(workload.arrival, ClosedLoop)
        c = workload.arrival.concurrency
        self.loads.append(c)
        run = run_of(tpot=10.0 * (1 + c / 32), ttft=self.ttft, output=100.0 * c, failed=5 if c >= self.failing else 0)
        identity = msgspec.structs.replace(run.identity, workload_fingerprint=workload.workload.fingerprint())
        return msgspec.structs.replace(run, identity=identity, conditions=(self.condition,) if self.condition else ())


def test_a_repeat_is_one_search_whose_run_is_the_chosen_probe_with_the_capacity(tmp_path: Path) -> None:
    workload, server = load(tmp_path), Server()
    run = search_once(server, workload)
    (search,) = run.capacity
    assert server.loads[:3] == [16, 32, 64] and [p.load for p in search.probes] == server.loads
    assert search.bound == "found" and search.binding == "p99_tpot_ms" and search.load == pytest.approx(32, rel=0.1)
    chosen = max(p.load for p in search.probes if p.latencies["p99_tpot_ms"] <= 20.0)
    assert run.metrics["output_throughput"] == pytest.approx(100.0 * chosen)  # the highest probe that met the SLO
    assert run.metrics["capacity_at_slo"] == search.load and run.metrics["capacity_output_throughput"] == search.output_throughput
    # the search's workload, not its chosen probe's (which sends as many requests as its load needs)
    assert run.identity.workload_fingerprint == workload.workload.fingerprint() != workload.at_load(chosen).workload.fingerprint()
    assert not losses(run)
    lines = session_table(_report(run))
    assert any(line.startswith("  cpu/base / isl128-osl128: concurrent requests: ") and "p99_tpot_ms binds" in line for line in lines)


def test_a_later_repeat_searches_from_the_bracket_the_one_before_settled(tmp_path: Path) -> None:
    workload = load(tmp_path)
    given: list[Repeat | None] = []
    servers: list[Server] = []

    def repeat(after: Repeat | None) -> Repeat:
        given.append(after)
        servers.append(Server())
        return {1: search_once(servers[-1], workload, None if after is None else after[1].capacity[0])}

    take = chained(repeat)
    first, second = take(), take()
    assert given == [None, first]
    (before,), (again,) = first[1].capacity, second[1].capacity
    low, high = servers[1].loads[:2]
    assert low <= 32 < high and low in servers[0].loads and high in servers[0].loads
    assert len(again.probes) == SEEDED_PROBES < len(before.probes) and servers[1].loads[0] != workload.search.start
    assert again.load == pytest.approx(before.load) and again.bound == "found"


def test_a_probe_that_lost_requests_fails_the_slo_without_making_the_search_invalid(tmp_path: Path) -> None:
    run = search_once(Server(failing=24), load(tmp_path))
    (search,) = run.capacity
    failed = [p for p in search.probes if p.load >= 24]
    assert failed and all(p.stopped == "5 request(s) failed" for p in failed)
    assert search.load is not None and search.load < 24 and not losses(run)


def test_a_search_that_no_load_passes_weighs_as_no_capacity_in_every_repeat(tmp_path: Path) -> None:
    workload = load(tmp_path)
    failed = search_once(Server(ttft=600.0), workload)  # the target is 500 ms
    (search,) = failed.capacity
    assert (search.load, search.bound) == (None, "below-lowest") and min(p.load for p in search.probes) == 2
    assert failed.metrics["capacity_at_slo"] == 0.0 and failed.metrics["capacity_output_throughput"] == 0.0
    assert failed.gated_samples() == {"capacity_at_slo": (0.0,)} and not failed.lost_values()
    # among repeats it is the worst sample, not a gap that leaves the verdict the others
    run = combine_repeats([{1: search_once(Server(), workload)}, {1: failed}, {1: search_once(Server(), workload)}], 1, Method())
    (found, none, again) = run.gated_samples()["capacity_at_slo"]
    assert none == 0.0 and found == again == pytest.approx(32, rel=0.1)
    reference = combine_repeats([{1: search_once(Server(), workload)} for _ in range(3)], 1, Method())
    (judged,) = judge_run(baseline_from_run(reference, source="test"), run)
    assert (judged.metric, judged.verdict) == ("capacity_at_slo", "regression")
    assert any("none: even the lowest load failed the SLO" in line for line in session_table(_report(failed)))


def test_a_search_out_of_probes_before_its_lowest_load_says_so_and_weighs_as_no_capacity(tmp_path: Path) -> None:
    workload = load(tmp_path, SUITE.replace("highest = 64 }", "highest = 64, max_probes = 2 }"))
    failed = search_once(Server(ttft=600.0), workload)
    (search,) = failed.capacity
    assert (search.load, search.bound, [p.load for p in search.probes]) == (None, "below-probed", [16.0, 8.0])
    assert failed.metrics["capacity_at_slo"] == 0.0
    line = "none: every load probed failed the SLO, down to 8, before the probes ran out (2 probes)"
    assert any(line in text for text in session_table(_report(failed))), session_table(_report(failed))


def test_a_condition_of_any_probe_makes_the_search_invalid(tmp_path: Path) -> None:
    contended = Loss(reason="cpu-contention", detail="another process on the server's cores")
    run = search_once(Server(condition=contended), load(tmp_path))
    assert [loss.reason for loss in losses(run)] == ["cpu-contention"]


def test_only_the_capacity_is_gated_on_a_search_run_and_never_elsewhere(tmp_path: Path) -> None:
    searched = search_once(Server(), load(tmp_path))
    assert list(searched.gated_samples()) == ["capacity_at_slo"]
    plain = msgspec.structs.replace(run_of(), metrics={**run_of().metrics, "capacity_at_slo": 12.0})
    assert "capacity_at_slo" not in plain.gated_samples() and "output_throughput" in plain.gated_samples()


def _report(run: Run) -> SessionReport:
    report = SessionReport()
    report.add(run)
    return report


def _watched(
    ends: Callable[[int], float], ttft: Callable[[int], float], n: int = 64, late: Callable[[int], float] = lambda i: 0.0
) -> tuple[Watch, list[bool]]:
    """A watch over an open loop of 10 requests/s (constant: request i due at (i + 1) / 10 s, sent
    ``late(i)`` after that) whose request i gets its first token ``ttft(i)`` after it was sent and
    ends at ``ends(i)``; the records reach it in the order they end, and ``stop`` is asked after each."""
    specs = [RequestSpec(i, 4, prompt=(1, 2, 3)) for i in range(n + 2)]
    watch = Watch()
    watching = watch.start(Load(specs, OpenLoop(rate=10, distribution="constant"), LoadOptions(warmup=2)))
    assert watching is not None and watching.progress is not None and watching.stop is not None
    records = []
    for i in range(n):
        due = (i + 1) / 10
        sent = due + late(i)
        records.append(RequestRecord(index=i + 2, endpoint="e", scheduled_at=due, sent_at=sent, ended_at=ends(i), chunk_times=(sent + ttft(i),)))
    asked = []
    for record in sorted(records, key=lambda r: r.ended_at):
        watching.progress(record)
        asked.append(watching.stop())
    return watch, asked


def test_a_rate_probe_whose_queue_and_ttft_keep_rising_is_stopped() -> None:
    """The server finishes 5 requests/s of the 10 sent: the queue grows, and so does the TTFT."""
    watch, asked = _watched(ends=lambda i: 1.0 + i / 5, ttft=lambda i: 0.05 + i * 0.05)
    assert watch.reason is not None and watch.reason.startswith("over-saturated: TTFT rising")
    assert asked[-1] and not asked[Watch.CHECK_EVERY - 1]  # it looks every few requests, after enough of them
    assert asked.index(True) < len(asked) - 1  # before the probe's end


def test_a_rate_probe_whose_client_falls_behind_the_schedule_is_stopped() -> None:
    """The client sends 8 requests/s of the 10 asked (each a quarter later than due), the server keeps up."""
    watch, asked = _watched(ends=lambda i: (i + 1) / 8 + 0.3, ttft=lambda i: 0.05, late=lambda i: (i + 1) / 40)
    assert watch.reason is not None and watch.reason.startswith("over-saturated: sent 8 requests/s of 10 asked (20% behind)")
    assert asked.index(True) < len(asked) - 1


def test_a_rate_probe_that_keeps_up_runs_to_its_end() -> None:
    watch, asked = _watched(ends=lambda i: (i + 1) / 10 + 0.3, ttft=lambda i: 0.05 + 0.01 * (i % 3))
    assert watch.reason is None and not any(asked)


def test_only_an_open_loop_of_single_requests_is_watched() -> None:
    specs = [RequestSpec(i, 4, prompt=(1, 2, 3)) for i in range(8)]
    assert Watch().start(Load(specs, ClosedLoop(4))) is None


def test_a_probe_measured_again_is_watched_afresh() -> None:
    """A retake of a probe that was stopped starts with no reason and none of the first run's records."""
    watch, _ = _watched(ends=lambda i: 1.0 + i / 5, ttft=lambda i: 0.05 + i * 0.05)
    assert watch.reason is not None
    specs = [RequestSpec(i, 4, prompt=(1, 2, 3)) for i in range(10)]
    watching = watch.start(Load(specs, OpenLoop(rate=10, distribution="constant"), LoadOptions(warmup=2)))
    assert watching is not None and watching.stop is not None
    assert watch.reason is None and not watching.stop()

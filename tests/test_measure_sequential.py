"""Extra repeats while the verdicts cannot decide: a point's repeats, combined and judged at each look's confidence."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from pytest_qwenperf.core.combine import pooled
from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.run_json import RunJsonError, decode_run
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.verdict import Judgement, Later
from pytest_qwenperf.gate.baseline import Baseline, BaselineError, PooledBaseline, baseline_from_run, load_baseline, save_baseline
from pytest_qwenperf.gate.diagnosis import diagnose
from pytest_qwenperf.gate.judge import judge_against_run, judge_run
from pytest_qwenperf.measure import run as run_module
from pytest_qwenperf.measure import sequential
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.run import Repeat, combine_repeats, measure
from pytest_qwenperf.measure.sequential import decide, measure_point
from pytest_qwenperf.serving.server import Server
from tests.test_baseline import run_of, suite

PLAN = SequentialPlan(0.95, 3, 6)


def repeat_at(factor: float, **changes: Any) -> Repeat:
    """One repeat on one replica whose every gated figure is ``factor`` times the baseline's (latencies divided)."""
    return {1: run_of(total=10_000 * factor, output=5_000 * factor, ttft=200 / factor, tpot=20 / factor, **changes)}


def combine(repeats: Sequence[Repeat]) -> Run:
    return combine_repeats(repeats, 1, Method())


BASELINE = baseline_from_run(combine([repeat_at(f) for f in (1.0, 1.01, 0.99)]), source="test")


class Script:
    """A fake "measure one repeat": the scripted repeats in order; asking for one more fails the test."""

    def __init__(self, *repeats: float | Repeat) -> None:
        self.repeats = [r if isinstance(r, dict) else repeat_at(r) for r in repeats]
        self.calls = 0

    def __call__(self) -> Repeat:
        assert self.calls < len(self.repeats), f"asked for repeat {self.calls + 1}, scripted {len(self.repeats)}"
        self.calls += 1
        return self.repeats[self.calls - 1]


def always(baseline: Baseline | None) -> Callable[[Run], Baseline | None]:
    return lambda run: baseline


def verdicts(judgements: Sequence[Judgement]) -> set[str]:
    return {j.verdict for j in judgements}


def samples(run: Run, name: str = "output_throughput") -> tuple[float | None, ...]:
    assert run.samples is not None
    return run.samples[name]


def test_a_point_decided_at_the_first_look_takes_no_extra_repeat() -> None:
    script = Script(1.0, 1.005, 0.995)
    decided = decide(PLAN, script, combine, always(BASELINE))
    assert script.calls == 3 and decided.run.extra_repeats == 0
    assert verdicts(decided.judgements) == {"pass"}
    assert {j.confidence for j in decided.judgements} == {PLAN.confidence_at(3)}
    assert len(samples(decided.run)) == 3


def test_an_early_look_stops_a_point_whose_verdicts_are_all_decided_and_counts_what_it_saved() -> None:
    """Looks from 3 of 5 planned repeats: three repeats a hair apart decide every verdict at the first
    look (judged at its own, higher, confidence); three that cannot decide go on to the planned five."""
    plan = SequentialPlan(0.95, 5, 5, least=3)
    tight = baseline_from_run(combine([repeat_at(f) for f in (1.0, 1.001, 0.999)]), source="test")
    steady = Script(1.0, 1.0005, 0.9995)
    decided = decide(plan, steady, combine, always(tight))
    assert steady.calls == 3 and verdicts(decided.judgements) == {"pass"}
    assert decided.run.saved_repeats == 2 and decided.run.extra_repeats == 0
    assert {j.confidence for j in decided.judgements} == {plan.confidence_at(3)} and plan.confidence_at(3) > 0.99
    unsure = Script(1.0, 1.2, 0.85, 1.0, 1.0)
    decided = decide(plan, unsure, combine, always(tight))
    assert unsure.calls == 5 and decided.run.saved_repeats == 0


@pytest.mark.parametrize(
    ("factors", "first_look", "last"),
    [
        ((0.97, 1.03, 1.0, 1.0, 1.0), "underpowered", "pass"),  # the MDE falls under the 5 % tolerance at the fifth
        ((0.8, 0.7, 0.9, 0.8, 0.8), "noisy", "regression"),  # 20 % slower, confirmed at the fifth
    ],
)
def test_an_undecided_point_takes_repeats_until_a_look_decides(factors: tuple[float, ...], first_look: str, last: str) -> None:
    assert verdicts(judgements_at(factors[:3], PLAN.confidence_at(3))) >= {first_look}
    script = Script(*factors)  # a sixth repeat would fail the test
    decided = decide(PLAN, script, combine, always(BASELINE))
    assert script.calls == 5 and decided.run.extra_repeats == 2
    assert verdicts(decided.judgements) == {last}
    assert {j.confidence for j in decided.judgements} == {PLAN.confidence_at(5)}
    assert samples(decided.run) == tuple(5_000 * f for f in factors)


def judgements_at(factors: Sequence[float], confidence: float) -> tuple[Judgement, ...]:
    return judge_run(BASELINE, combine([repeat_at(f) for f in factors]), confidence=confidence)


def test_a_point_that_stays_undecided_takes_every_repeat_the_plan_allows() -> None:
    """Repeats 5 % apart against a 5 % tolerance: each look, more repeats of that spread could settle
    it, and none does, so the point takes every repeat the plan allows."""
    script = Script(0.95, 1.05, 1.0, 0.95, 1.05, 1.0)
    decided = decide(PLAN, script, combine, always(BASELINE))
    assert script.calls == PLAN.most and decided.run.extra_repeats == PLAN.extra == 3
    assert "underpowered" in verdicts(decided.judgements)
    assert {j.confidence for j in decided.judgements} == {PLAN.confidence_at(6)}


def test_each_look_is_judged_at_the_plans_confidence_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    looks: list[tuple[int, float]] = []

    def spy(baseline: Baseline | None, run: Run, *, confidence: float, later: Later | None = None) -> tuple[Judgement, ...]:
        looks.append((len(samples(run)), confidence))
        return judge_run(baseline, run, confidence=confidence, later=later)

    monkeypatch.setattr(sequential, "judge_run", spy)
    decide(PLAN, Script(0.95, 1.05, 1.0, 0.95, 1.05, 1.0), combine, always(BASELINE))
    assert looks == [(n, PLAN.confidence_at(n)) for n in range(3, 7)]
    assert len({confidence for _, confidence in looks}) == 4  # each look its own


@pytest.mark.parametrize(
    ("baseline", "repeats", "expected"),
    [
        (None, (0.7, 1.3, 1.0), {"no-baseline"}),
        (
            baseline_from_run(combine([repeat_at(1.0, config="ctx-short")]), source="test"),
            (0.7, 1.3, 1.0),
            {"not-comparable"},
        ),
        (BASELINE, (0.7, repeat_at(1.3, failed=2), 1.0), {"invalid"}),
        (BASELINE, (0.7, repeat_at(1.3, bound="client busy 99% of the run (limit 95%)"), 1.0), {"invalid"}),
    ],
    ids=["no baseline", "not comparable", "failed-requests", "client-bound"],
)
def test_no_extra_repeat_without_a_comparable_baseline_or_for_a_run_that_lost_data(
    baseline: Baseline | None, repeats: tuple[float | Repeat, ...], expected: set[str]
) -> None:
    script = Script(*repeats)  # as wide as the undecided point above: only the missing baseline or the loss stops it
    decided = decide(PLAN, script, combine, always(baseline))
    assert script.calls == 3 and decided.run.extra_repeats == 0
    assert verdicts(decided.judgements) == expected


def test_one_metric_without_a_value_stops_the_repeats_though_others_are_undecided() -> None:
    median = repeat_at(1.0)[1]  # the repeat the run is: its metrics are the run's
    script = Script(0.7, {1: msgspec.structs.replace(median, metrics={**median.metrics, "p99_ttft_ms": None})}, 1.3)
    decided = decide(PLAN, script, combine, always(BASELINE))
    assert "underpowered" in verdicts(decided.judgements) and "invalid" in verdicts(decided.judgements)
    assert script.calls == 3 and decided.run.extra_repeats == 0


def test_a_plan_without_extra_repeats_judges_once_at_the_full_confidence() -> None:
    script = Script(0.7, 1.3, 1.0)
    decided = decide(SequentialPlan(0.95, 3, 3), script, combine, always(BASELINE))
    assert script.calls == 3 and decided.run.extra_repeats == 0
    assert "underpowered" in verdicts(decided.judgements)
    assert [j.confidence for j in decided.judgements] == pytest.approx([0.95] * len(decided.judgements))


def history_of(*sessions: Sequence[float]) -> PooledBaseline:
    """A history reference of one run per session, each of the repeats at ``factors``."""
    runs = [combine([repeat_at(f) for f in factors]) for factors in sessions]
    base = baseline_from_run(pooled(runs, runs[-1], "runs of the history"), source="the history store")
    return PooledBaseline(**msgspec.structs.asdict(base), name=f"history: {len(runs)} runs")


def test_no_repeat_is_spent_on_a_change_only_more_history_can_confirm() -> None:
    """20 % slower than a history of one run, and significantly so: noisy, since how far sessions differ
    is unknown with one run. More repeats of this session cannot change that: none is taken."""
    script = Script(0.8, 0.81, 0.79)  # a fourth repeat would fail the test
    decided = decide(PLAN, script, combine, always(history_of((1.0, 1.01, 0.99))))
    assert "noisy" in verdicts(decided.judgements)
    assert script.calls == 3 and decided.run.extra_repeats == 0 and decided.run.needs_sessions


def test_no_repeat_is_spent_where_the_references_sessions_differ_beyond_the_tolerance() -> None:
    """Sessions 15 % apart in a reference of three: the MDE of a new session stays above the tolerance
    however many repeats it takes, so the point is underpowered at once and stays so."""
    reference = history_of((1.0, 1.005, 0.995), (0.85, 0.855, 0.845), (1.15, 1.155, 1.145))
    script = Script(1.0, 1.01, 0.99)
    decided = decide(PLAN, script, combine, always(reference))
    assert "underpowered" in verdicts(decided.judgements) and "noisy" not in verdicts(decided.judgements)
    assert script.calls == 3 and decided.run.needs_sessions


def test_no_repeat_is_spent_where_the_references_own_spread_is_wider_than_the_tolerance() -> None:
    """A history of two runs far apart: its samples spread so widely that the run's repeats, however
    many, leave every MDE above its tolerance, the 25 % of p99 TTFT included (the second session of a
    new machine, where points used to take all their extra repeats for nothing)."""
    reference = history_of((1.0, 1.01, 0.99), (1.8, 1.81, 1.79))
    script = Script(1.34, 1.35, 1.33)
    decided = decide(PLAN, script, combine, always(reference))
    assert verdicts(decided.judgements) >= {"underpowered"}
    assert script.calls == 3 and decided.run.needs_sessions


def test_no_repeat_is_spent_where_one_reference_sessions_repeats_spread_too_widely_to_settle() -> None:
    """The second session on a machine: its reference is the first session's three repeats, spread
    5 %. However many repeats the run adds, Welch's interval keeps the reference's standard error at
    t on its 2 df (4.3 at 95 %, not 1.96), wider than the tolerance: none is taken. Read as if the
    df grew without bound, the same reference seemed settleable, and second sessions took all their
    extra repeats and stayed underpowered (2026-12-02: 12 of 15 extra repeats, 4 of 5 points)."""
    script = Script(1.0, 1.01, 0.99)  # a fourth repeat would fail the test
    decided = decide(PLAN, script, combine, always(history_of((1.0, 1.06, 0.95))))
    assert "underpowered" in verdicts(decided.judgements)
    assert script.calls == 3 and decided.run.extra_repeats == 0 and decided.run.needs_sessions


def test_repeats_are_still_taken_where_they_can_settle_the_verdict_against_a_history() -> None:
    """Against a history of three close sessions, a run whose own repeats spread widely is underpowered
    for its repeats' sake alone: repeats narrow that, so they are taken, and the run does not need sessions."""
    reference = history_of((1.0, 1.005, 0.995), (1.003, 1.008, 0.998), (0.997, 1.002, 0.992))
    script = Script(0.97, 1.03, 1.0, 1.0, 1.0)
    decided = decide(PLAN, script, combine, always(reference))
    assert script.calls > 3 and decided.run.extra_repeats == script.calls - 3
    assert not decided.run.needs_sessions


def test_the_baseline_is_looked_up_once_for_the_first_run() -> None:
    asked: list[Run] = []

    def baseline_of(run: Run) -> Baseline | None:
        asked.append(run)
        return BASELINE

    decide(PLAN, Script(0.7, 1.3, 1.0, 0.7, 1.3, 1.0), combine, baseline_of)
    assert len(asked) == 1 and len(samples(asked[0])) == 3


def test_the_extra_repeats_survive_the_runs_json_and_an_old_run_has_none() -> None:
    decided = decide(PLAN, Script(0.97, 1.03, 1.0, 1.0, 1.0), combine, always(BASELINE))
    data = json.loads(json.dumps(json_safe(msgspec.to_builtins(decided.run))))
    assert data["extra_repeats"] == 2 and decode_run(data) == decided.run
    del data["extra_repeats"]  # a session file written before runs had the field
    assert decode_run(data).extra_repeats == 0
    with pytest.raises(RunJsonError, match="extra_repeats"):
        decode_run({**data, "extra_repeats": -1})


# ------------------------------------------------------------------ measure(): one repeat at a time, then combined


def fake_server(monkeypatch: pytest.MonkeyPatch, runs: dict[int, list[Run]], measured: list[int]) -> Server:
    """A server whose load runs are ``runs`` (per replica count, in order; ``measured`` gets each one's
    replica count), measured without any process."""

    def observed(driver: run_module.Driver, *args: object) -> Run:
        measured.append(driver.route.replicas)
        return runs[driver.route.replicas].pop(0)

    monkeypatch.setattr(run_module.Driver, "_observed", observed)
    monkeypatch.setattr(run_module, "reset_prefix_caches", lambda urls: True)
    urls = ("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    return cast(Server, SimpleNamespace(load_urls=urls, base_urls=urls, check_alive=lambda: None))


def test_measure_is_its_repeats_combined(monkeypatch: pytest.MonkeyPatch) -> None:
    factors = (1.1, 0.9, 1.0)
    server = fake_server(monkeypatch, {1: [repeat_at(f)[1] for f in factors]}, [])
    cpu = suite("cpu")
    run = measure(server, cpu.config("base"), cpu.workloads[0], Method(plan=repeats(3), tolerances={"output_throughput": 0.2}))
    assert run.metrics["output_throughput"] == 5_000.0  # the median repeat
    assert samples(run) == tuple(5_000 * f for f in factors)
    assert run.tolerances == {"output_throughput": 0.2} and run.extra_repeats == 0


def test_a_repeat_runs_every_route_fewest_replicas_first_and_the_run_carries_the_scaling(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = suite("cpu")
    config, workload = cpu.config("replicas-2"), next(w for w in cpu.workloads if w.id == "scaling-isl128-osl128")
    one = [run_of(config="replicas-2", workload=workload.id, total=t) for t in (10_000.0, 10_200.0)]
    two = [run_of(config="replicas-2", workload=workload.id, total=t) for t in (19_000.0, 19_800.0)]
    measured: list[int] = []
    server = fake_server(monkeypatch, {1: one, 2: two}, measured)
    measured_repeats = [run_module.measure_repeat(server, config, workload, Method()) for _ in range(2)]
    assert measured == [1, 2, 1, 2]
    run = combine_repeats(measured_repeats, config.replicas, Method())
    assert run.metrics["total_token_throughput"] == 19_000.0  # the two replicas' run, its median repeat
    assert samples(run, "scaling_efficiency_n2") == pytest.approx((0.95, 19_800 / 20_400))


def test_a_figure_one_repeat_lacks_is_a_null_among_the_samples_not_dropped() -> None:
    blind = repeat_at(1.0)[1]
    blind = msgspec.structs.replace(blind, metrics={**blind.metrics, "p99_ttft_ms": None})
    run = combine([repeat_at(1.0), {1: blind}, repeat_at(0.9)])
    assert run.samples is not None and run.samples["p99_ttft_ms"][1] is None
    assert run.lost_values()["p99_ttft_ms"] == "samples.p99_ttft_ms[1] is null"


def test_a_client_bound_repeat_makes_the_combined_run_so() -> None:
    bound = "client busy 99% of the run (limit 95%)"
    run = combine([repeat_at(1.0), repeat_at(1.1, bound=bound), repeat_at(0.9)])
    assert run.client_bound == bound and run.metrics["output_throughput"] == 5_000.0


def test_measure_point_combines_with_the_configs_replicas_and_the_suites_tolerances(monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(0.97, 1.03, 1.0, 1.0, 1.0)
    monkeypatch.setattr(sequential, "measure_repeat", lambda *args, **kwargs: script())
    cpu = suite("cpu")
    decided = measure_point(
        cast(Server, object()),
        cpu.config("base"),
        cpu.workloads[0],
        Method(plan=PLAN, tolerances={"output_throughput": 0.05}),
        always(BASELINE),
    )
    assert script.calls == 5 and decided.run.extra_repeats == 2
    assert decided.run.tolerances == {"output_throughput": 0.05}


def test_a_pair_one_at_a_time_stops_the_reference_before_the_candidate_boots(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on one GPU node (qwenperf bisect of a GPU config): the reference's block ends, its server
    stopped, before the candidate's begins; the candidate is judged against the reference's run."""
    events: list[str] = []
    runs = {"reference": [repeat_at(1.0), repeat_at(1.01), repeat_at(0.99)], "candidate": [repeat_at(0.5)] * 3}

    def server(name: str) -> Callable[[], contextlib.AbstractContextManager[Server]]:
        @contextlib.contextmanager
        def running() -> Iterator[Server]:
            events.append(f"{name} up")
            yield cast(Server, name)
            events.append(f"{name} down")

        return running

    def repeat(server: object, *args: object) -> Repeat:
        events.append(f"{server} repeat")
        return runs[str(server)].pop()

    monkeypatch.setattr(sequential, "measure_repeat", repeat)
    cpu = suite("cpu")
    pair = sequential.measure_pair(
        server("reference"), server("candidate"), cpu.config("base"), cpu.workloads[0], Method(plan=PLAN), side_by_side=False
    )
    assert events == ["reference up", *["reference repeat"] * 3, "reference down", "candidate up", *["candidate repeat"] * 3, "candidate down"]
    verdicts = {j.metric: j.verdict for j in pair.judgements}
    assert verdicts["output_throughput"] == "regression" and pair.reference.metrics["output_throughput"] == 5_000.0


def test_a_baseline_that_cannot_be_read_is_no_baseline_and_the_decision_says_why() -> None:
    def unreadable(run: Run) -> Baseline | None:
        raise BaselineError("baselines/x.json: metrics.output_throughput.value: expected a number, got 'fast'")

    script = Script(1.0, 1.1, 0.9)
    decided = decide(PLAN, script, combine, unreadable)
    assert script.calls == 3 and decided.run.extra_repeats == 0  # measured, and no extra repeat without a baseline
    assert decided.unreadable == "baselines/x.json: metrics.output_throughput.value: expected a number, got 'fast'"
    assert {j.verdict for j in decided.judgements} == {"no-baseline"}


def test_each_repeats_telemetry_is_a_sample_so_a_diagnosis_weighs_its_spread() -> None:
    def with_kv(factor: float, usage: float) -> Repeat:
        run = repeat_at(factor)[1]
        return {1: msgspec.structs.replace(run, telemetry={"server_gauges": {"kv_cache_usage": {"mean": usage}}})}

    reference = combine([with_kv(1.0, u) for u in (0.50, 0.51, 0.49)])
    run = combine([with_kv(0.7, u) for u in (0.90, 0.91, 0.92)])
    assert run.samples is not None and run.samples["kv_cache_usage"] == (0.90, 0.91, 0.92)
    judgements = judge_against_run(reference, run)
    (kv,) = [cause for cause in diagnose(reference, run, judgements).causes if cause.subject == "kv_cache_usage"]
    assert "3 vs 3 repeats" in kv.text and "one value per side" not in kv.text


def test_a_regression_against_a_stored_baseline_carries_why_from_what_the_baseline_kept(tmp_path: Path) -> None:
    """The baseline file keeps each repeat's telemetry and mean latencies (its ``evidence``), so a
    run judged against it alone, with no reference run at hand, still gets its likely causes."""

    def with_kv(factor: float, usage: float) -> Repeat:
        run = repeat_at(factor)[1]
        means = {"mean_ttft_ms": 100 / factor, "mean_tpot_ms": 10 / factor}
        telemetry = {"server_gauges": {"kv_cache_usage": {"mean": usage}}}
        return {1: msgspec.structs.replace(run, metrics={**run.metrics, **means}, telemetry=telemetry)}

    recorded = baseline_from_run(combine([with_kv(1.0, u) for u in (0.50, 0.51, 0.49)]), source="test")
    stored = load_baseline(save_baseline(tmp_path, recorded))
    assert stored.evidence["kv_cache_usage"] == (0.50, 0.51, 0.49) and stored.evidence["mean_tpot_ms"] == (10.0, 10.0, 10.0)

    decided = decide(PLAN, Script(*(with_kv(0.7, u) for u in (0.90, 0.91, 0.92))), combine, always(stored))
    assert "regression" in verdicts(decided.judgements) and decided.diagnosis is not None
    assert "output_throughput" in decided.diagnosis.changed
    subjects = [cause.subject for cause in decided.diagnosis.causes]
    assert subjects == ["kv_cache_usage", "latency"], decided.diagnosis.lines()
    (kv,) = [cause for cause in decided.diagnosis.causes if cause.subject == "kv_cache_usage"]
    assert "3 vs 3 repeats" in kv.text
    assert "prefill and decode both moved" in decided.diagnosis.causes[1].text  # both latencies were divided by 0.7

    unmoved = decide(PLAN, Script(*(with_kv(1.0, u) for u in (0.50, 0.51, 0.49))), combine, always(stored))
    assert "regression" not in verdicts(unmoved.judgements) and unmoved.diagnosis is None
    published = msgspec.structs.replace(stored, evidence={})  # a baseline that kept nothing: the setup alone
    bare = decide(PLAN, Script(*(with_kv(0.7, u) for u in (0.90, 0.91, 0.92))), combine, always(published))
    assert bare.diagnosis is not None and bare.diagnosis.causes == ()

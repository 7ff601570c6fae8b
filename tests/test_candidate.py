"""A candidate measured beside the launcher's server: repeats interleaved A B B A, both sides
growing while the verdicts cannot decide, the candidate judged against the reference.

The sessions boot stand-in launchers of known pace (tests/standins/paced_vllm.py), so the
difference between the two sides is set by the test; real vLLM takes the same path in
docs/gate-power.md's interleaved runs.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.measure.run import Repeat
from pytest_qwenperf.measure.sequential import decide_interleaved
from tests.test_max_repeats import write_suite
from tests.test_measure_sequential import combine, repeat_at, samples, verdicts

PLAN = SequentialPlan(0.95, 2, 5)
PACED = Path(__file__).parent / "standins" / "paced_vllm.py"


def paced(itl_ms: float) -> str:
    """A launcher whose server streams a token every ``itl_ms``."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(PACED))} --itl-ms {itl_ms}"


class Sides:
    """Fake "measure one repeat" for each side; the order of the calls is logged."""

    def __init__(self, reference: list[float], candidate: list[float]) -> None:
        self.order: list[str] = []
        self._factors = {"A": iter(reference), "B": iter(candidate)}

    def side(self, name: str) -> Callable[[], Repeat]:
        def repeat() -> Repeat:
            self.order.append(name)
            return repeat_at(next(self._factors[name]))

        return repeat


def test_repeats_alternate_a_b_b_a_and_a_decided_point_stops_at_the_first_look() -> None:
    sides = Sides([1.0, 1.004, 0.998, 1.0], [1.002, 0.999, 1.0, 1.0])
    pair = decide_interleaved(PLAN, sides.side("A"), sides.side("B"), combine)
    assert sides.order == ["A", "B", "B", "A"]
    assert verdicts(pair.judgements) == {"pass"}
    assert pair.run.extra_repeats == pair.reference.extra_repeats == 0
    assert samples(pair.reference) == pytest.approx((5_000, 5_020))
    assert samples(pair.run) == pytest.approx((5_010, 4_995))


def test_a_slower_candidate_is_a_regression_against_the_reference() -> None:
    sides = Sides([1.0, 1.01, 0.99], [0.8, 0.81, 0.79])
    pair = decide_interleaved(PLAN, sides.side("A"), sides.side("B"), combine)
    judged = {j.metric: j.verdict for j in pair.judgements}
    assert judged["output_throughput"] == "regression"
    assert {j.confidence for j in pair.judgements} == {PLAN.confidence_at(2)}


def test_while_undecided_both_sides_grow_by_one_repeat_a_look_up_to_the_most() -> None:
    spread = [1.0, 0.9, 1.1, 0.95, 1.05]  # too wide for a 5 % tolerance at any look
    sides = Sides(spread, spread[::-1])
    pair = decide_interleaved(PLAN, sides.side("A"), sides.side("B"), combine)
    assert sides.order == ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]
    assert pair.run.extra_repeats == pair.reference.extra_repeats == 3
    assert len(samples(pair.run)) == len(samples(pair.reference)) == 5
    assert "underpowered" in verdicts(pair.judgements) or "noisy" in verdicts(pair.judgements)
    assert {j.confidence for j in pair.judgements} == {PLAN.confidence_at(5)}


def test_a_reference_that_lost_data_makes_the_point_invalid_and_takes_no_extra_repeat() -> None:
    order: list[str] = []

    def reference() -> Repeat:
        order.append("A")
        return repeat_at(1.0, failed=2)

    def candidate() -> Repeat:
        order.append("B")
        return repeat_at(1.0)

    pair = decide_interleaved(PLAN, reference, candidate, combine)
    assert verdicts(pair.judgements) == {"invalid"}
    assert all("(reference)" in j.reason for j in pair.judgements)
    assert order == ["A", "B", "B", "A"]


# ---------------------------------------------------------------- sessions

GATE = """
import json

def test_gate(qwenperf_judgements, qwenperf_run):
    with open("judgements.json", "w") as out:
        json.dump({j.metric: j.verdict for j in qwenperf_judgements}, out)
"""


def session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    write_suite(pytester.path)
    pytester.makepyfile(test_gate=GATE)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--qwenperf-suite=suite.toml", "--qwenperf-boot-timeout=60", *args)


def test_a_session_judges_a_slower_candidate_against_the_launcher_and_writes_both_sides(pytester: pytest.Pytester) -> None:
    logs = pytester.path / "logs"
    result = session(
        pytester,
        f"--qwenperf-launcher={paced(5)}",
        f"--qwenperf-candidate={paced(15)}",
        "--qwenperf-json=out/results.json",
        f"--qwenperf-log-dir={logs}",
    )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, output
    judged = json.loads((pytester.path / "judgements.json").read_text())
    assert judged["output_throughput"] == "regression", judged
    candidate = json.loads((pytester.path / "out" / "results.json").read_text())
    reference = json.loads((pytester.path / "out" / "results.reference.json").read_text())
    (cand_run,) = candidate["runs"]
    (ref_run,) = reference["runs"]
    assert len(cand_run["samples"]["output_throughput"]) == len(ref_run["samples"]["output_throughput"]) == 2
    assert cand_run["metrics"]["output_throughput"] < 0.6 * ref_run["metrics"]["output_throughput"]  # a third of the pace
    assert candidate["boots"] == reference["boots"] == {"standin/base": 1}
    assert (logs / "base.log").exists() and (logs / "candidate" / "base.log").exists()
    result.stdout.fnmatch_lines(["*qwenperf results: the candidate*", "*qwenperf results: the reference (--qwenperf-launcher)*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--qwenperf-endpoint=http://127.0.0.1:9",), "*--qwenperf-candidate: boots a second server*--qwenperf-endpoint*"),
        (("--qwenperf-update-baselines",), "*--qwenperf-candidate: a session that measures a candidate*not against baselines*"),
    ],
)
def test_a_candidate_with_servers_not_booted_or_with_a_baseline_update_is_a_usage_error(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    result = session(pytester, f"--qwenperf-candidate={paced(5)}", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_the_candidate_comes_from_the_ini_key_too(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nqwenperf_candidate = '\n")
    result = session(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*tox.ini: ini key qwenperf_candidate: expected a command line that a POSIX shell could split, got \"'\": No closing quotation*"])

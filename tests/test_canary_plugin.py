"""The correctness tests through the plugin (pytester sessions of perf_tests/test_correctness.py):
answers recorded with the baselines, judged in later sessions, against a candidate, and a rung held
to its parent's answer.

The stand-in launcher (tests/standins/openai_standin.py) answers the canary with ids that depend
on the prompt alone, each moved by its ``--answer-shift`` options: a launcher option changes what
every config answers (another vLLM, same flags), a config flag what one rung answers. Real vLLM
takes the same path in tests/e2e/test_canary.py.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STANDIN = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'tests' / 'standins' / 'openai_standin.py'))}"

SUITE = """\
[suite]
name = "standin"
hardware = "cpu"
model = "embedded:tiny"

[[config]]
id = "base"
{base}

[[config]]
id = "numerics"
inherits = "base"
canary = {{ match_rate = 0.5 }}
{numerics}

[[workload]]
name = "w"
kind = "fixed"
prompt = "hello world"
output_len = 4
num_prompts = 8
load = {{ concurrency = 2 }}
"""


def session(pytester: pytest.Pytester, *args: str, base: str = "", numerics: str = "", launcher: str = STANDIN) -> pytest.RunResult:
    (pytester.path / "suite.toml").write_text(SUITE.format(base=base, numerics=numerics))
    pytester.makepyfile(test_correctness=(ROOT / "perf_tests" / "test_correctness.py").read_text())
    return pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-rs",
        "--qwenperf-suite=suite.toml",
        "--qwenperf-baselines=baselines",
        "--qwenperf-boot-timeout=60",
        f"--qwenperf-launcher={launcher}",
        *args,
    )


def output(result: pytest.RunResult) -> str:
    return result.stdout.str() + result.stderr.str()


def test_answers_are_recorded_then_judged_and_a_changed_output_fails(pytester: pytest.Pytester) -> None:
    recorded = session(pytester, "--qwenperf-update-baselines", "--qwenperf-json=first.json")
    recorded.assert_outcomes(passed=1, skipped=2)  # nothing stored yet for either config
    recorded.stdout.fnmatch_lines(["*nothing to judge the canary answer against: no stored canary answer for this hardware*canary.json)*"])
    stored = sorted(pytester.path.glob("baselines/*/embedded-tiny/*/canary.json"))
    assert [p.parent.name for p in stored] == ["base", "numerics"], output(recorded)
    assert json.loads(stored[0].read_text())["schema"] == "qwenperf-canary/1"
    answers = json.loads((pytester.path / "first.json").read_text())["canaries"]
    assert sorted(a["identity"]["config"] for a in answers) == ["base", "numerics"]

    again = session(pytester, "--qwenperf-json=second.json")
    again.assert_outcomes(passed=3)

    changed = session(pytester, "--qwenperf-json=changed.json", launcher=f"{STANDIN} --answer-shift 3")
    changed.assert_outcomes(passed=1, failed=2)  # its rungs still agree with each other
    changed.stdout.fnmatch_lines(
        ["*standin/base: changed-output: match rate 0.000 < 1: 0 of 8 prompts give the reference's tokens*first differing prompt 0 'The capital of France is'*"]
    )
    judged = {j["config"]: j for j in json.loads((pytester.path / "changed.json").read_text())["canary_verdicts"]}
    assert judged["standin/base"]["verdict"] == "changed-output" and judged["standin/base"]["found"]["first_mismatch"] == 0

    compare = [sys.executable, "-m", "pytest_qwenperf.cli.main", "compare", "first.json"]
    assert pytester.run(*compare, "second.json", "--fail-on", "changed-output").ret == 0
    flagged = pytester.run(*compare, "changed.json", "--fail-on", "changed-output")
    assert flagged.ret == 1
    flagged.stdout.fnmatch_lines(["*standin/base*0.000*changed-output*", "*verdicts against*2 changed-output*"])


def test_an_answer_of_other_flags_is_not_judged_and_a_bad_stored_file_fails_naming_it(pytester: pytest.Pytester) -> None:
    session(pytester, "--qwenperf-update-baselines").assert_outcomes(passed=1, skipped=2)
    other = session(pytester, base="vllm = { answer-shift = 0 }")  # the same answers, other flags
    other.assert_outcomes(passed=1, skipped=2)  # numerics inherits the flag: both are other setups now
    other.stdout.fnmatch_lines(["*nothing to judge the canary answer against: not comparable (reference vs answer): argv_sha256:*"])
    (stored,) = pytester.path.glob("baselines/*/embedded-tiny/base/canary.json")
    stored.write_text('{"schema": "qwenperf-canary/1", "answer": {}, "history": []}')
    bad = session(pytester)
    bad.assert_outcomes(passed=2, errors=1)  # in the fixture, as an unreadable baseline
    bad.stdout.fnmatch_lines([f"qwenperf: {stored}: answer.identity: expected `object`, got nothing (the field is missing)"])
    assert "During handling" not in output(bad)


def test_a_rung_below_its_floor_against_its_parent_fails_with_both_figures(pytester: pytest.Pytester) -> None:
    result = session(pytester, numerics="vllm = { answer-shift = 1 }")
    result.assert_outcomes(failed=1, skipped=2)
    expected = (
        "*standin/numerics answers the canary unlike standin/base, below its floor (match rate 0.000 < 0.5): match rate 0.000 "
        "(0 of 8 prompts give the same tokens; first different: prompt 0), mean log-prob drift unknown over the common prefixes*"
        "floor: match rate >= 0.5, no drift floor*"
    )
    result.stdout.fnmatch_lines([expected])


def test_a_candidate_is_judged_against_the_launchers_answer(pytester: pytest.Pytester) -> None:
    result = session(pytester, f"--qwenperf-candidate={STANDIN} --answer-shift 2", "--qwenperf-json=out/results.json")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*standin/base: changed-output: match rate 0.000 < 1*"])
    candidate = json.loads((pytester.path / "out" / "results.json").read_text())["canaries"]
    reference = json.loads((pytester.path / "out" / "results.reference.json").read_text())["canaries"]
    assert [len(side) for side in (candidate, reference)] == [2, 2]
    assert {a["fingerprint"] for a in candidate}.isdisjoint(a["fingerprint"] for a in reference)
    same = session(pytester, f"--qwenperf-candidate={STANDIN}")
    same.assert_outcomes(passed=3)

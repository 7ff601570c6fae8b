"""The correctness canary on the real CPU build: two boots of one vLLM and config give the same
answer, a deliberately altered serving path is ``changed-output``, and the canary stays out of the
throughput figures.

Three inner pytest sessions of perf_tests/test_correctness.py on a one-config suite, one boot each:

1. records the answer beside the baselines (``--qwenperf-update-baselines``; nothing stored yet,
   so the check is skipped);
2. a second boot of the same vLLM and config: its answer matches the stored one on every prompt
   (the suite's default floor, match rate 1.0). The session also measures a small load after the
   canary on the same server: the server's own request count over the load is the load's, so the
   canary's requests are in no figure;
3. the same config served by tests/standins/perturbed_vllm.py, which moves every weight matrix by
   noise of one standard deviation (``--dtype float32`` instead of ``bfloat16`` does not change the
   tiny model's greedy tokens: measured match rate 1.0, drift 0.0018, docs/correctness.md): the
   answer differs, the check fails as ``changed-output`` naming the first differing prompt, and
   ``qwenperf compare --fail-on changed-output`` exits 1 on the session files (0 on sessions 1, 2).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from tests.e2e.tiny import inner_session, suite_toml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PERTURBED = ROOT / "tests" / "standins" / "perturbed_vllm.py"

SUITE = suite_toml(
    "canary",
    """
[[config]]
id = "tiny"

[[workload]]
name = "isl32-osl16"
kind = "random"
input_len = 32
output_len = 16
num_prompts = 20
warmup = 4
load = { concurrency = 4 }
""",
    suite="repeats = 1",
)

# Collected after test_correctness.py, on the server the canary was asked of.
AFTER_THE_CANARY = """
def test_the_run_counts_its_own_requests_alone(qwenperf_run, qwenperf_canary, serving_config):
    assert qwenperf_canary(serving_config).outputs  # asked earlier in the session, on this server
    metrics = qwenperf_run.metrics
    assert (metrics["completed"], metrics["failed"]) == (16, 0), metrics
    assert qwenperf_run.token_check.matches is True, qwenperf_run.token_check.detail
    # The server's own count over the load: its 20 requests, warm-up included; with the canary's 8 it would be 28.
    assert sum(qwenperf_run.requests_per_server.values()) == 20, qwenperf_run.requests_per_server
"""


def session(pytester: pytest.Pytester, name: str, *args: str) -> pytest.RunResult:
    return inner_session(pytester, "test_correctness.py", name, *args, "-rs")


def compare(pytester: pytest.Pytester, *files: str) -> pytest.RunResult:
    return pytester.run(sys.executable, "-m", "pytest_qwenperf.cli.main", "compare", *files, "--fail-on", "changed-output", timeout=120)


def test_two_boots_answer_alike_and_an_altered_serving_path_is_a_changed_output(pytester: pytest.Pytester) -> None:
    (pytester.path / "suite.toml").write_text(SUITE)
    pytester.makepyfile(test_correctness=(ROOT / "perf_tests" / "test_correctness.py").read_text())
    pytester.makepyfile(test_run=AFTER_THE_CANARY)

    recorded = session(pytester, "first", "--qwenperf-update-baselines")
    recorded.assert_outcomes(skipped=2)  # no rung inherits another (an empty parameter set); nothing stored yet
    recorded.stdout.fnmatch_lines(["qwenperf: baseline written: *canary.json", "*no stored canary answer*"])

    again = session(pytester, "second", "test_run.py")
    again.assert_outcomes(passed=2, skipped=1)
    second = json.loads((pytester.path / "second.json").read_text())
    assert second["boots"] == {"canary/tiny": 1}

    launcher = f"{shlex.quote(sys.executable)} {shlex.quote(str(PERTURBED))} --into {shlex.quote(str(pytester.path / 'weights'))} --noise 1"
    altered = session(pytester, "altered", f"--qwenperf-launcher={launcher}")
    altered.assert_outcomes(failed=1, skipped=1)
    altered.stdout.fnmatch_lines(["*canary/tiny: changed-output: match rate * < 1: * of 8 prompts give the reference's tokens*first differing prompt *"])

    assert compare(pytester, "first.json", "second.json").ret == 0
    flagged = compare(pytester, "first.json", "altered.json")
    assert flagged.ret == 1
    flagged.stdout.fnmatch_lines(["*canary/tiny*changed-output*", "*verdicts against *: 1 changed-output*"])

"""Correctness: speed counts only for a rung that still gives the model's output.

Each config answers a fixed canary (8 prompts, greedy, 32 tokens, once per session, outside any
measurement). Two checks:

- **against the rung it inherits**, in this session: speculative decoding is lossless by design,
  so a rung that adds it must give its parent's greedy tokens for every prompt; a rung that
  changes numerics (an FP8 KV cache, a quantization) must stay within the floor of its ``canary``
  table (the least match rate, the most mean log-prob drift);
- **against its own answer from another session** (the stored one beside its baselines, or the
  launcher's with ``--qwenperf-candidate``): an answer below the suite's ``[canary]`` floor
  (by default: the same tokens for every prompt) is ``changed-output``. With no stored answer,
  or one of other hardware, model or flags, there is nothing to judge: the test is skipped and
  says why.
"""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.canary import CanaryJudgement, compare
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload


@pytest.mark.qwenperf_select("canary-floor")
def test_rung_answers_like_the_rung_it_inherits(
    vllm_server: Server, qwenperf_canary, qwenperf_suite: Suite, serving_config: ServingConfig, suite_workload: SuiteWorkload
) -> None:
    floor = serving_config.canary_floor
    assert serving_config.inherits is not None and floor is not None
    now = qwenperf_canary(serving_config)
    parent = qwenperf_canary(qwenperf_suite.config(serving_config.inherits))
    found = compare(parent.outputs, now.outputs)
    drift = "unknown" if found.logprob_drift is None else f"{found.logprob_drift:.4g}"
    short = floor.shortfall(found)
    assert short is None, (
        f"{serving_config.key} answers the canary unlike {parent.config_key}, below its floor ({short}): "
        f"match rate {found.match_rate:.3f} ({found.matched} of {found.prompts} prompts give the same tokens; "
        f"first different: prompt {found.first_mismatch}), mean log-prob drift {drift} over the common prefixes "
        f"({found.prefix_rate:.1%} of the parent's tokens); floor: {floor.describe()}"
    )


@pytest.mark.qwenperf_select("canary")
def test_answer_unchanged_since_the_reference(
    vllm_server: Server, qwenperf_canary_judgement: CanaryJudgement, suite_workload: SuiteWorkload
) -> None:
    judged = qwenperf_canary_judgement
    if judged.verdict in ("no-baseline", "not-comparable"):
        pytest.skip(f"nothing to judge the canary answer against: {judged.detail}")
    assert judged.verdict == "pass", f"{judged.config}: {judged.verdict}: {judged.detail}"

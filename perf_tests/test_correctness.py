"""Correctness: speed counts only for a rung that still gives the model's output.

Speculative decoding is lossless by design: a rung that only adds it must give the greedy
tokens of the rung it inherits from, up to the numerical noise that other batch shapes bring.
"""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.canary import compare
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload


@pytest.mark.qwenperf_select("lossless")
def test_speculative_rung_gives_the_greedy_output_of_the_rung_it_inherits(
    vllm_server: Server, qwenperf_canary, qwenperf_suite: Suite, serving_config: ServingConfig, suite_workload: SuiteWorkload
) -> None:
    assert serving_config.inherits is not None
    now = qwenperf_canary(serving_config)
    parent = qwenperf_canary(qwenperf_suite.config(serving_config.inherits))
    found = compare(parent.outputs, now.outputs)
    assert found.match_rate == 1.0, (
        f"{serving_config.key}: {found.matched} of {found.prompts} canary prompts give {parent.config}'s greedy output "
        f"(first different: prompt {found.first_mismatch}; {found.prefix_rate:.1%} of its tokens reproduced)"
    )

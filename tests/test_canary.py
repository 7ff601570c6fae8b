"""The canary's comparison: matches, common prefixes, log-prob drift over what both computed alike."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.core.canary import CanaryOutput, compare, fingerprint
from pytest_qwenperf.measure.canary import CanaryError, _output

ids = st.lists(st.integers(0, 50_000), min_size=1, max_size=24).map(tuple)


def output(token_ids: tuple[int, ...], logprobs: tuple[float, ...] | None = None) -> CanaryOutput:
    return CanaryOutput(token_ids=token_ids, logprobs=logprobs if logprobs is not None else tuple(-0.1 * i for i in range(len(token_ids))))


@given(st.lists(ids, min_size=1, max_size=8))
def test_an_answer_agrees_fully_with_itself(prompts: list[tuple[int, ...]]) -> None:
    answer = [output(p) for p in prompts]
    found = compare(answer, answer)
    assert found.match_rate == found.prefix_rate == 1.0
    assert found.logprob_drift == 0.0 and found.first_mismatch is None
    assert found.reference_tokens == sum(map(len, prompts))


@given(ids, st.data())
def test_after_the_first_different_token_nothing_more_counts(tokens: tuple[int, ...], data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(tokens) - 1))
    changed = (*tokens[:at], tokens[at] + 1, *data.draw(st.lists(st.integers(0, 9), max_size=5)))
    reference, now = output(tokens), output(changed, tuple(-0.1 * i + 0.5 for i in range(len(changed))))
    found = compare([reference], [now])
    assert (found.matched, found.first_mismatch, found.prefix_tokens) == (0, 0, at)
    assert found.logprob_drift == (pytest.approx(0.5) if at else None)  # only the shared prefix is scored


def test_the_match_rate_counts_prompts_and_the_drift_averages_tokens() -> None:
    reference = [output((1, 2, 3), (-1.0, -2.0, -3.0)), output((4, 5), (-1.0, -1.0))]
    now = [output((1, 2, 3), (-1.1, -2.0, -3.3)), output((4, 6), (-1.2, -9.0))]
    found = compare(reference, now)
    assert found.match_rate == 0.5 and found.first_mismatch == 1
    assert found.prefix_rate == pytest.approx(4 / 5)
    assert found.logprob_drift == pytest.approx((0.1 + 0.0 + 0.3 + 0.2) / 4)


def test_without_log_probabilities_the_drift_is_unknown_not_zero() -> None:
    found = compare([output((1, 2), ())], [output((1, 2), ())])
    assert found.match_rate == 1.0 and found.logprob_drift is None


@given(st.lists(ids, min_size=1, max_size=5), st.lists(ids, min_size=1, max_size=5))
def test_fingerprints_are_equal_exactly_when_the_outputs_are(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> None:
    assert (fingerprint([output(p) for p in a]) == fingerprint([output(p) for p in b])) == (a == b)


def test_answers_to_different_prompt_sets_are_refused() -> None:
    with pytest.raises(ValueError, match="different prompts: 2 in the reference, 1 now"):
        compare([output((1,)), output((2,))], [output((1,))])


# ---------------------------------------------------------------- what a server answers

def answer(choice: dict[str, object]) -> bytes:
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [choice], "system_fingerprint": "vllm-0.32.0-d0f9176c"}).encode()


def test_token_ids_and_chosen_log_probabilities_are_read_from_a_vllm_answer() -> None:
    raw = answer({"index": 0, "text": "", "token_ids": [102, 7, 7], "logprobs": {"token_logprobs": [-0.5, -1.25, -2.0], "tokens": ["", "", ""]}})
    assert _output("p", 200, raw) == CanaryOutput(token_ids=(102, 7, 7), logprobs=(-0.5, -1.25, -2.0))


def test_an_answer_without_log_probabilities_keeps_the_ids() -> None:
    assert _output("p", 200, answer({"index": 0, "text": "x", "token_ids": [5], "logprobs": None})) == CanaryOutput(token_ids=(5,))


@pytest.mark.parametrize(
    ("status", "raw", "message"),
    [
        (400, b'{"error": {"message": "unknown field return_token_ids"}}', "canary prompt 'p': HTTP 400"),
        (200, b"<html>gateway</html>", "canary prompt 'p': HTTP 200"),
        (200, answer({"index": 0, "text": "x"}), "the answer has no token_ids"),
    ],
)
def test_a_refused_or_id_less_answer_fails_the_canary_with_what_the_server_said(status: int, raw: bytes, message: str) -> None:
    with pytest.raises(CanaryError, match=re.escape(message)):
        _output("p", status, raw)

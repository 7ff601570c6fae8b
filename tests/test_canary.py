"""The canary's comparison (matches, common prefixes, log-prob drift over what both computed alike),
its floors, and the verdict on an answer against another session's."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.core.canary import (
    CANARY,
    EXACT,
    Canary,
    CanaryComparison,
    CanaryFloor,
    CanaryJudgement,
    CanaryOutput,
    compare,
    definition_digest,
    fingerprint,
    judge_canary,
)
from pytest_qwenperf.core.identity import Context, Identity
from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.measure.canary import MAX_TOKENS, PROMPTS, CanaryError, _output

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


def test_an_answer_without_log_probabilities_keeps_the_ids_and_the_text() -> None:
    found = _output("p", 200, answer({"index": 0, "text": "x", "token_ids": [5], "logprobs": None}))
    assert found == CanaryOutput(token_ids=(5,), text="x")


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


# ---------------------------------------------------------------- floors and verdicts


def make_canary(
    config: str = "base",
    outputs: tuple[tuple[int, ...], ...] = ((1, 2, 3), (4, 5, 6)),
    *,
    logprobs: tuple[float, ...] = (-1.0, -1.0, -1.0),
    hardware: str = "cpu-test-cpu-2c",
    version: str = "0.32.0",
    floor: CanaryFloor = EXACT,
) -> Canary:
    """An answer of ``config`` (suite ``cpu``) to two prompts, as a session keeps it."""
    answers = tuple(CanaryOutput(token_ids=ids, logprobs=logprobs[: len(ids)], text=" ".join(f"t{i}" for i in ids)) for ids in outputs)
    prompts = PROMPTS[: len(outputs)]
    identity = Identity(
        hardware=hardware,
        model="embedded:tiny",
        suite="cpu",
        config=config,
        argv_sha256="a" * 64,
        workload=CANARY,
        workload_fingerprint=definition_digest(prompts, MAX_TOKENS),
    )
    context = Context(vllm_version=version, machine=Machine(cpu_model="Test CPU", cpu_count=2), date="2026-11-26T05:00:00+00:00")
    return Canary(
        identity=identity, context=context, prompts=prompts, max_tokens=MAX_TOKENS, outputs=answers, fingerprint=fingerprint(answers), floor=floor
    )


def _comparison(matched: int, drift: float | None) -> CanaryComparison:
    """Two one-token prompts, ``matched`` of them alike, each log-prob moved by ``drift`` (None: none returned)."""
    logprobs = () if drift is None else (-1.0 - drift,)
    reference = [output((1,), (-1.0,)), output((2,), (-1.0,))]
    return compare(reference, [output((1,), logprobs), output((2 if matched == 2 else 3,), logprobs)])


@pytest.mark.parametrize(
    ("floor", "matched", "drift", "short"),
    [
        (EXACT, 2, 0.5, None),  # the exact floor has no drift floor
        (EXACT, 1, 0.0, "match rate 0.500 < 1"),
        (CanaryFloor(match_rate=0.5), 1, 0.0, None),
        (CanaryFloor(match_rate=0.5, logprob_drift=0.2), 2, 0.25, "drift 0.25 > 0.2"),
        (CanaryFloor(match_rate=0.75, logprob_drift=0.2), 1, 0.25, "match rate 0.500 < 0.75; drift 0.25 > 0.2"),
        (CanaryFloor(match_rate=1.0, logprob_drift=0.2), 2, None, None),  # an unknown drift: the match rate alone decides
    ],
)
def test_a_floor_names_what_falls_short_of_it(floor: CanaryFloor, matched: int, drift: float | None, short: str | None) -> None:
    found = _comparison(matched, drift)
    assert floor.shortfall(found) == short


def test_a_floor_describes_itself() -> None:
    assert EXACT.describe() == "match rate >= 1, no drift floor"
    assert CanaryFloor(match_rate=0.5, logprob_drift=0.2).describe() == "match rate >= 0.5, drift <= 0.2"


def test_the_same_answer_in_another_session_passes() -> None:
    judged = judge_canary(make_canary(version="0.31.0"), make_canary(), EXACT)
    assert (judged.verdict, judged.config) == ("pass", "cpu/base")
    assert judged.detail.startswith("within the floor: 2 of 2 prompts give the reference's tokens (match rate 1.000), mean log-prob drift 0")
    assert judged.row() == ("cpu/base", "1.000", "0", "pass")
    assert CanaryJudgement.HEADER == ("config", "match rate", "drift", "verdict")


def test_a_changed_output_names_both_figures_and_the_first_differing_prompt_with_both_texts() -> None:
    reference = make_canary(outputs=((1, 2, 3), (4, 5, 6)))
    now = make_canary(outputs=((1, 2, 3), (4, 9, 9)), logprobs=(-1.5, -1.5, -1.5))
    judged = judge_canary(reference, now, EXACT)
    assert judged.verdict == "changed-output"
    assert judged.detail == (
        "match rate 0.500 < 1: 1 of 2 prompts give the reference's tokens (match rate 0.500), mean log-prob drift 0.5 "
        f"over the common prefixes; floor: match rate >= 1, no drift floor; first differing prompt 1 {PROMPTS[1]!r}: "
        "reference 't4 t5 t6', now 't4 t9 t9'"
    )
    assert judged.row() == ("cpu/base", "0.500", "0.5", "changed-output")
    assert judge_canary(reference, now, CanaryFloor(match_rate=0.5)).verdict == "pass"


def test_a_drift_beyond_its_floor_is_a_changed_output_with_the_same_tokens() -> None:
    now = make_canary(logprobs=(-1.3, -1.3, -1.3))
    judged = judge_canary(make_canary(), now, CanaryFloor(logprob_drift=0.1))
    assert judged.verdict == "changed-output"
    assert judged.detail.startswith("drift 0.3 > 0.1: 2 of 2 prompts")
    assert judged.detail.endswith("; every prompt gives the same tokens")
    assert judge_canary(make_canary(), now, EXACT).verdict == "pass"


def test_an_answer_of_another_identity_is_not_comparable_never_a_change() -> None:
    judged = judge_canary(make_canary(hardware="h100"), make_canary(outputs=((7, 7, 7), (7, 7, 7))), EXACT)
    assert judged.verdict == "not-comparable" and judged.found is None
    assert judged.detail == "not comparable (reference vs answer): hardware: 'h100' vs 'cpu-test-cpu-2c'"
    assert judged.row() == ("cpu/base", "—", "—", "not-comparable")


def test_without_a_reference_there_is_nothing_to_judge() -> None:
    judged = judge_canary(None, make_canary(), EXACT, absent="no stored canary answer")
    assert (judged.verdict, judged.detail) == ("no-baseline", "no stored canary answer")


def test_the_definition_digest_changes_with_the_prompts_and_the_length() -> None:
    digest = definition_digest(PROMPTS, MAX_TOKENS)
    assert digest != definition_digest(PROMPTS[:-1], MAX_TOKENS) and digest != definition_digest(PROMPTS, MAX_TOKENS + 1)
    assert make_canary().config_key == "cpu/base"

"""Multi-turn conversations: prompts that extend the previous turn token-exactly, their identity and
suite-file parsing, and the client sending each conversation's turns in order, against the stand-in
stream source (tests/stream_source.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.loadgen.arrivals import Arrival, ClosedLoop, OpenLoop, Replay
from pytest_qwenperf.loadgen.assignment import Assignment, LoadOptions
from pytest_qwenperf.loadgen.client import LoadResult, run_load_sync
from pytest_qwenperf.loadgen.request import RequestSpec, Turn
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.loadgen.workers import run_load_in_workers, share_of
from pytest_qwenperf.suite.workloads import ConversationWorkload, TraceWorkload, workload_from_dict
from tests.stream_source import MODEL, StreamSource, stream_source
from tests.suite_files import HEADER, refused, suite_at

SPECIAL = {0, 500, 999}


@pytest.fixture(scope="module")
def words() -> PromptTokenizer:
    """1000 words ``w0``..``w999``; 0 and 500 special, 999 added: no model needed, and the golden
    digest below changes only with the workload's algorithm."""
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["w0", "w500"])
    tokenizer.add_tokens(["w999"])
    return PromptTokenizer(tokenizer)


@pytest.fixture(scope="module")
def source() -> Iterator[StreamSource]:
    with stream_source() as src:
        yield src


def chat(**fields: Any) -> ConversationWorkload:
    shape: dict[str, Any] = {"conversations": 3, "turns": 3, "first_input_len": 12, "turn_input_len": 4, "output_len": 3}
    return ConversationWorkload(**{**shape, **fields})


def turn_of(spec: RequestSpec) -> Turn:
    assert spec.turn is not None
    return spec.turn


def scheduled(specs: Sequence[RequestSpec], **schedule: Any) -> list[RequestSpec]:
    """``specs`` asking the source for ``schedule``; ``schedule['error']`` maps (conversation, turn) to an HTTP error."""
    errors = schedule.pop("errors", {})
    out = []
    for spec in specs:
        x_schedule = {"id": spec.index, **schedule}
        if (turn_of(spec).conversation, turn_of(spec).number) in errors:
            x_schedule["error"] = errors[turn_of(spec).conversation, turn_of(spec).number]
        out.append(dataclasses.replace(spec, sampling=(*spec.sampling, ("x_schedule", x_schedule))))
    return out


def by_conversation(records: Sequence[RequestRecord], specs: Sequence[RequestSpec]) -> dict[int, list[RequestRecord]]:
    """Each conversation's records in turn order (a record's ``index`` is its spec's)."""
    turns: dict[int, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: r.index):
        turns.setdefault(turn_of(specs[record.index]).conversation, []).append(record)
    return turns


def most_at_once(spans: Sequence[tuple[float, float]]) -> int:
    """The most of the ``[start, end)`` spans that overlap at any moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def assert_turns_in_order(load: LoadResult, specs: Sequence[RequestSpec], think_s: float) -> dict[int, list[RequestRecord]]:
    """Each conversation's turns went one after another, each due ``think_s`` after the previous one's
    end and never sent before that."""
    conversations = by_conversation(load.records, specs)
    for turns in conversations.values():
        assert [turn_of(specs[r.index]).number for r in turns] == list(range(len(turns)))
        for previous, turn in pairwise(turns):
            assert turn.scheduled_at == previous.ended_at + think_s
            assert turn.sent_at >= turn.scheduled_at
    return conversations


# --- prompts ---------------------------------------------------------------------------


def test_each_turn_extends_the_previous_prompt_by_a_reply_and_a_user_message(words: PromptTokenizer) -> None:
    workload = chat(conversations=3, turns=4, first_input_len=20, turn_input_len=5, output_len=7, think_time_s=0.5, seed=1)
    specs = workload.build(words)
    assert workload.num_prompts == len(specs) == 12
    assert [s.index for s in specs] == list(range(12))
    assert [s.turn for s in specs] == [Turn(c, k, 0.5 if k else 0.0) for c in range(3) for k in range(4)]
    for c in range(3):
        prompts = [specs[4 * c + k].prompt for k in range(4)]
        assert all(isinstance(p, tuple) for p in prompts)
        assert [len(p) for p in prompts] == [20, 32, 44, 56]
        for previous, prompt in pairwise(prompts):
            assert prompt[: len(previous)] == previous  # the whole previous prompt, token for token
        replies = {prompts[k + 1][len(prompts[k]) : len(prompts[k]) + 7] for k in range(3)}
        assert len(replies) == 3  # each reply stands for another answer
    for spec in specs:
        assert spec.api == "completions" and spec.ignore_eos and spec.max_tokens == 7
        assert isinstance(spec.prompt, tuple) and spec.expected_prompt_tokens == len(spec.prompt)
        assert not set(spec.prompt) & SPECIAL
    assert len({specs[4 * c].prompt for c in range(3)}) == 3  # conversations are their own


def test_prompts_are_the_same_for_the_same_fields_and_seed(words: PromptTokenizer) -> None:
    workload = chat(seed=3)
    assert workload.build(words) == chat(seed=3).build(words)
    assert [s.prompt for s in workload.build(words)] != [s.prompt for s in chat(seed=4).build(words)]
    # conversation c's turn k does not depend on how many conversations or turns there are
    longer = chat(seed=3, conversations=5, turns=4).build(words)
    assert [s.prompt for s in workload.build(words)] == [longer[4 * c + k].prompt for c in range(3) for k in range(3)]
    # nor does a user message on the lengths of the others
    other = chat(seed=3, turn_input_len=6).build(words)
    assert other[0].prompt == workload.build(words)[0].prompt


def test_golden_digest(words: PromptTokenizer) -> None:
    """BLAKE2b draws: the same ids on every machine and Python; a change here changes every baseline."""
    specs = chat(conversations=2, turns=3, think_time_s=0.25, seed=7).build(words)
    payload = [[list(s.prompt), s.max_tokens, turn_of(s).conversation, turn_of(s).number, turn_of(s).think_s] for s in specs]
    assert hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16] == "65a6d5653d3b57b5"


def test_the_id_and_fingerprint_follow_every_field_but_the_name() -> None:
    base = chat()
    assert base.id == "conversation-c3x3-fl12-tl4-osl3"
    assert chat(think_time_s=1.5, seed=2).id == "conversation-c3x3-fl12-tl4-osl3-t1.5-s2"
    assert chat(name="support").id == "support" and chat(name="support").fingerprint() == base.fingerprint()
    variants = [
        chat(conversations=4),
        chat(turns=4),
        chat(first_input_len=13),
        chat(turn_input_len=5),
        chat(output_len=4),
        chat(think_time_s=0.1),
        chat(seed=1),
    ]
    assert len({v.fingerprint() for v in variants} | {base.fingerprint()}) == len(variants) + 1
    assert chat(think_time_s=1).fingerprint() == chat(think_time_s=1.0).fingerprint()


# --- parsing ---------------------------------------------------------------------------

TABLE = {"kind": "conversation", "conversations": 2, "turns": 3, "first_input_len": 64, "turn_input_len": 8, "output_len": 16}


def test_a_conversation_table_builds_the_workload() -> None:
    parsed = workload_from_dict({**TABLE, "think_time_s": 2, "seed": 5, "name": "chat"}, source="s.toml")
    assert parsed == ConversationWorkload(2, 3, 64, 8, 16, think_time_s=2.0, seed=5, name="chat")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({**TABLE, "turns": 0}, r"turns: expected an integer >= 1, got 0$"),
        ({**TABLE, "think_time_s": -1}, r"think_time_s: expected a finite number of seconds >= 0, got -1.0$"),
        ({**TABLE, "think_time_s": float("inf")}, r"think_time_s: expected a finite number of seconds >= 0, got inf$"),
        ({k: v for k, v in TABLE.items() if k != "turn_input_len"}, r"turn_input_len: missing; a 'conversation' workload needs an integer"),
        ({**TABLE, "api": "chat"}, r"api: unknown key for a 'conversation' workload"),
    ],
)
def test_a_bad_conversation_table_names_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"^s\.toml \[\[workload\]\] 1: " + message):
        workload_from_dict(table, source="s.toml [[workload]] 1")


SUITE = HEADER + """
[[workload]]
name = "chat"
kind = "conversation"
conversations = 8
turns = 4
first_input_len = 256
turn_input_len = 32
output_len = 64
think_time_s = 1.5
warmup = 8
load = { concurrency = 4 }
"""


def test_a_suite_runs_conversations_with_whole_ones_as_warmup(tmp_path: Path) -> None:
    (workload,) = suite_at(tmp_path, SUITE).workloads
    assert workload.workload == ConversationWorkload(8, 4, 256, 32, 64, think_time_s=1.5, name="chat")
    assert workload.warmup == 8 and workload.arrival == ClosedLoop(4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("warmup = 8", "warmup = 6"), r"workload 'chat'.warmup: expected whole conversations: a multiple of turns \(4\) requests, got 6$"),
        (("warmup = 8", "warmup = 32"), r"workload 'chat'.warmup: expected a whole number of requests below num_prompts \(32\), got 32$"),
        (("load = { concurrency = 4 }", "load = { replay = true }"), r"workload 'chat'.load.replay: expected a workload of kind 'trace'"),
        (("think_time_s = 1.5", "think_time_s = -2"), r"workload 'chat': think_time_s: expected a finite number of seconds >= 0, got -2.0$"),
    ],
)
def test_a_bad_conversation_in_a_suite_names_the_file_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    refused(tmp_path, SUITE.replace(*change, 1), message)


# --- grouping --------------------------------------------------------------------------


def test_copies_interleaved_request_by_request_stay_separate_conversations(words: PromptTokenizer) -> None:
    """Several replicas run interleaved copies of a workload (``measure.scaling.copies_of``), whose
    conversation numbers repeat: each unit still holds one copy's turns, each extending the last."""
    copies = [chat(seed=seed).build(words) for seed in (0, 1)]
    interleaved = [dataclasses.replace(spec, index=i) for i, spec in enumerate(s for pair in zip(*copies, strict=True) for s in pair)]
    assignment = Assignment.of(["http://x"], MODEL, interleaved, ClosedLoop(2), LoadOptions(warmup=6))
    units = assignment.warmup + assignment.units
    assert len(units) == 6 and len(assignment.warmup) == 2
    for unit in units:
        prompts = [spec.prompt for _, spec in unit]
        assert [turn_of(spec).number for _, spec in unit] == [0, 1, 2]
        assert all(later[: len(earlier)] == earlier for earlier, later in pairwise(prompts))


def test_a_turn_without_its_predecessor_and_a_warmup_that_splits_a_conversation_are_refused(words: PromptTokenizer) -> None:
    specs = chat().build(words)
    with pytest.raises(ValueError, match="request 0: turn 1 of conversation 0 comes without turn 0 before it"):
        Assignment.of(["http://x"], MODEL, specs[1:], ClosedLoop(1), LoadOptions())
    with pytest.raises(ValueError, match="warmup must be whole conversations, 3 or 6 requests here, got 4"):
        Assignment.of(["http://x"], MODEL, specs, ClosedLoop(1), LoadOptions(warmup=4))


def test_workers_get_whole_conversations(words: PromptTokenizer) -> None:
    specs = chat(conversations=5).build(words)
    whole = Assignment.of(["http://x"], MODEL, specs, ClosedLoop(2), LoadOptions(warmup=3))
    shares = [share_of(whole, 2, k) for k in range(2)]
    for share in shares:
        for unit in share.warmup + share.units:
            turns = [turn_of(spec) for _, spec in unit]
            assert [t.number for t in turns] == [0, 1, 2] and len({t.conversation for t in turns}) == 1
    sent = sorted(position for share in shares for unit in share.warmup + share.units for position, _ in unit)
    assert sent == list(range(15))
    assert [share.arrival for share in shares] == [ClosedLoop(1), ClosedLoop(1)]


# --- sending ---------------------------------------------------------------------------


def run(source: StreamSource, specs: Sequence[RequestSpec], arrival: Arrival, **options: Any) -> LoadResult:
    return run_load_sync(source.urls, MODEL, specs, arrival, LoadOptions(**{"timeout_s": 30, **options}))


def test_a_closed_loop_keeps_n_conversations_in_flight_each_turn_after_the_last_and_its_think_time(
    source: StreamSource, words: PromptTokenizer
) -> None:
    think = 0.05
    specs = scheduled(chat(conversations=5, think_time_s=think).build(words), ttft_ms=20, itl_ms=5)
    source.reset()
    load = run(source, specs, ClosedLoop(2))
    assert len(load.records) == 15 and all(r.ok for r in load.records)
    assert all(r.prompt_tokens == r.expected_prompt_tokens for r in load.records)  # the ids reached the server as sent
    conversations = assert_turns_in_order(load, specs, think)
    spans = [(turns[0].sent_at, turns[-1].ended_at) for turns in conversations.values()]
    assert most_at_once(spans) == 2  # two lanes, each a whole conversation at a time
    assert source.stats()["peak_active"] <= 2
    assert load.requested_rate is None  # the server's answers set a conversation's request rate


def test_an_open_loop_starts_conversations_at_its_rate(source: StreamSource, words: PromptTokenizer) -> None:
    think = 0.03
    arrival = OpenLoop(rate=20, distribution="constant")
    specs = scheduled(chat(conversations=4, turns=2, think_time_s=think).build(words), ttft_ms=10)
    load = run(source, specs, arrival)
    assert len(load.records) == 8 and all(r.ok for r in load.records)
    conversations = assert_turns_in_order(load, specs, think)
    firsts = [turns[0].scheduled_at - load.started_at for _, turns in sorted(conversations.items())]
    assert firsts == pytest.approx(arrival.offsets(4), abs=1e-9)
    assert all(r.scheduling_lag >= 0 for r in load.records) and max(r.scheduling_lag for r in load.records) < 0.5


def test_think_time_holds_no_place_under_the_open_loops_cap(source: StreamSource, words: PromptTokenizer) -> None:
    """With one request in flight at most, the second conversation's first turn goes while the first
    conversation thinks (0.5 s), not after its last turn."""
    specs = scheduled(chat(conversations=2, turns=2, think_time_s=0.5).build(words), ttft_ms=10)
    load = run(source, specs, OpenLoop(rate=1000, distribution="constant", max_concurrency=1))
    first, second = (turns for _, turns in sorted(by_conversation(load.records, specs).items()))
    assert all(r.ok for r in load.records)
    assert first[0].ended_at <= second[0].sent_at < first[1].sent_at


def test_a_failed_turn_ends_its_conversation(source: StreamSource, words: PromptTokenizer) -> None:
    error = {"status": 400, "body": {"message": "context too long"}}
    specs = scheduled(chat(conversations=3).build(words), ttft_ms=5, errors={(1, 1): error})
    load = run(source, specs, ClosedLoop(3))
    conversations = by_conversation(load.records, specs)
    assert [len(conversations[c]) for c in range(3)] == [3, 2, 3]  # turn 2 of conversation 1 was never sent
    failed = conversations[1][1]
    assert not failed.ok and "context too long" in (failed.error or "")
    assert sum(not r.ok for r in load.records) == 1


def test_the_warmup_is_whole_conversations_sent_first(source: StreamSource, words: PromptTokenizer) -> None:
    specs = scheduled(chat(conversations=4, turns=2, think_time_s=0.01).build(words), ttft_ms=5)
    load = run(source, specs, ClosedLoop(2), warmup=4)
    warm = [r for r in load.records if r.warmup]
    assert sorted(r.index for r in warm) == [0, 1, 2, 3]
    assert max(r.ended_at for r in warm) <= load.started_at <= min(r.sent_at for r in load.records if not r.warmup)


def test_round_robin_keeps_a_conversation_on_one_endpoint(words: PromptTokenizer) -> None:
    specs = chat(conversations=4).build(words)
    with stream_source(n_ports=2) as src:
        load = run_load_sync(src.urls, MODEL, specs, ClosedLoop(2), LoadOptions(timeout_s=30))
    conversations = by_conversation(load.records, specs)
    assert all(r.ok for r in load.records)
    assert [{r.endpoint for r in conversations[c]} for c in range(4)] == [{src.urls[(3 * c) % 2]} for c in range(4)]


def test_no_turn_is_sent_past_the_duration(source: StreamSource, words: PromptTokenizer) -> None:
    specs = scheduled(chat(conversations=1, turns=6, think_time_s=0.2).build(words), ttft_ms=5)
    load = run(source, specs, ClosedLoop(1), duration_s=0.3)
    assert 1 <= len(load.records) <= 2  # turn 2 is due 0.4 s after the start at the earliest
    assert all(r.sent_at < load.started_at + 0.3 for r in load.records)


def test_workers_send_each_conversations_turns_in_order(source: StreamSource, words: PromptTokenizer) -> None:
    """A conversation split over two workers would send a turn without waiting for the one before."""
    think = 0.05
    specs = scheduled(chat(conversations=4, think_time_s=think).build(words), ttft_ms=20, itl_ms=5)
    load = run_load_in_workers(2, source.urls, MODEL, specs, ClosedLoop(2), LoadOptions(timeout_s=30))
    assert len(load.records) == 12 and all(r.ok for r in load.records)
    assert_turns_in_order(load, specs, think)


# --- traced conversations (Bailian) ----------------------------------------------------


def test_a_traced_conversation_sends_each_turn_after_the_answer_before_it_and_not_before_its_time(
    source: StreamSource, words: PromptTokenizer, tmp_path: Path
) -> None:
    """Turn 2 is traced 60 ms after turn 1, before its 100 ms answer can end: it goes when that
    answer has ended. Turn 3 is traced long after turn 2's end: it goes at its traced time. The
    request of the other conversation goes at its own time, between them."""
    rows = [
        {"chat_id": 10, "parent_chat_id": -1, "turn": 1, "timestamp": 0.0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"chat_id": 20, "parent_chat_id": -1, "turn": 1, "timestamp": 0.03, "input_length": 20, "output_length": 4, "hash_ids": [7, 8]},
        {"chat_id": 11, "parent_chat_id": 10, "turn": 2, "timestamp": 0.06, "input_length": 60, "output_length": 4, "hash_ids": [1, 2, 3, 4]},
        {"chat_id": 12, "parent_chat_id": 11, "turn": 3, "timestamp": 0.8, "input_length": 70, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5]},
    ]
    path = tmp_path / "bailian.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    specs = scheduled(TraceWorkload(str(path)).build(words), ttft_ms=100)
    assert [(turn_of(s).conversation, turn_of(s).number) for s in specs] == [(10, 0), (20, 0), (10, 1), (10, 2)]
    load = run(source, specs, Replay())
    assert len(load.records) == 4 and all(r.ok for r in load.records)
    assert all(r.prompt_tokens == r.expected_prompt_tokens for r in load.records)
    first, second, third = by_conversation(load.records, specs)[10]
    other = by_conversation(load.records, specs)[20][0]
    assert other.scheduled_at == pytest.approx(load.started_at + 0.03, abs=1e-9)
    assert second.scheduled_at == first.ended_at > load.started_at + 0.06  # the answer came after the traced time
    assert third.scheduled_at == pytest.approx(load.started_at + 0.8, abs=1e-9) and third.scheduled_at > second.ended_at
    assert all(r.sent_at >= r.scheduled_at for r in load.records)

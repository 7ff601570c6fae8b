"""Traces: Mooncake JSONL and CSV read with clear errors, send times in milliseconds, prompts of
exactly the traced length whose shared hash ids share exactly their blocks' tokens, the share a
prefix cache could hit, the synthetic trace's shape; the trace workload, its replay in a suite
file, and the trace the CPU suite ships."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import shlex
import statistics
from pathlib import Path

import pytest

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.loadgen.arrivals import Replay
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.suite.tiny_model import ensure_tiny_model
from pytest_qwenperf.suite.trace_files import BAILIAN_BLOCK_TOKENS, read_trace, write_jsonl
from pytest_qwenperf.suite.traces import (
    BLOCK_TOKENS,
    SyntheticShape,
    Trace,
    TraceEntry,
    TraceError,
    TraceShape,
    prompt_ids,
    send_offsets,
    synthetic_trace,
)
from pytest_qwenperf.suite.workloads import TraceWorkload
from tests.suite_files import HEADER, refused, suite_at

ROOT = Path(__file__).resolve().parent.parent


def mooncake(path: Path, *rows: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_mooncake_trace_is_read_with_milliseconds_and_512_token_blocks(tmp_path: Path) -> None:
    path = mooncake(
        tmp_path / "trace.jsonl",
        {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": list(range(14))},
        {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [*range(12), 46, 47, 48]},
    )
    first, second = read_trace(path).entries
    assert first == TraceEntry(27482.0, 6955, 52, tuple(range(14)))
    assert second.hash_ids[:12] == first.hash_ids[:12]
    assert send_offsets([first, second]) == pytest.approx([0.0, 3.053])  # milliseconds, from the first request


def test_a_csv_trace_has_lengths_and_times(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,input_len,output_len\n0,100,10\n250.5,2000,20\n\n")
    assert read_trace(path) == Trace((TraceEntry(0.0, 100, 10), TraceEntry(250.5, 2000, 20)))



def bailian_row(chat_id: int, parent: int, turn: int, at_s: float, length: int, ids: list[int]) -> dict[str, object]:
    return {"chat_id": chat_id, "parent_chat_id": parent, "timestamp": at_s, "input_length": length, "output_length": 8,
            "type": "text", "turn": turn, "hash_ids": ids}  # fmt: skip


def test_a_bailian_trace_is_read_with_seconds_16_token_blocks_and_its_conversations(tmp_path: Path) -> None:
    path = mooncake(
        tmp_path / "bailian.jsonl",
        bailian_row(159, -1, 1, 61.114, 40, [1, 2, 3]),
        bailian_row(160, 77, 3, 61.5, 30, [9, 10]),  # its parent (turn 2) is before the file's start: it opens one
        bailian_row(161, 159, 2, 62.0, 70, [1, 2, 3, 4, 5]),
        bailian_row(162, 161, 3, 63.25, 90, [1, 2, 3, 4, 5, 6]),
    )
    trace = read_trace(path)
    assert trace.block_tokens == BAILIAN_BLOCK_TOKENS == 16
    assert trace.entries[0] == TraceEntry(61114.0, 40, 8, (1, 2, 3), 159)
    assert [e.session for e in trace.entries] == [159, 160, 159, 159]
    assert [e.timestamp_ms for e in trace.entries] == [61114.0, 61500.0, 62000.0, 63250.0]
    assert TraceShape.of(trace).lines()[-1] == "turns per conversation: p50 2, p90 3, p99 3, max 3"
    window = trace.window(0.3, 1.0)  # 160, then turn 2 of 159, which now opens what is left of it
    out = tmp_path / "window.jsonl"
    write_jsonl(window, out)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(w["chat_id"], w["parent_chat_id"], w["turn"]) for w in written] == [(0, -1, 1), (1, -1, 1)]
    assert read_trace(out).entries == tuple(dataclasses.replace(e, session=n) for n, e in enumerate(window.entries))
    with pytest.raises(TraceError, match=r"a trace of \d-token blocks cannot be written: Mooncake's are 512, Bailian's 16"):
        write_jsonl(trace.fitted(48, "scale"), tmp_path / "fitted.jsonl")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([bailian_row(1, -1, 1, 0, 10, []), bailian_row(1, -1, 1, 1, 10, [])], r"line 2: chat_id: expected each request's own id, got 1 a second time"),
        ([bailian_row(1, -1, 2, 0, 10, []), bailian_row(2, 1, 2, 1, 10, [])], r"line 2: turn: expected turns in order, got 2 after turn 2 of its conversation"),
        ([bailian_row(1, -1, 1, 0, 10, []), {"timestamp": 1, "input_length": 10, "output_length": 1}], r"line 2: chat_id: expected a whole number >= 0, got nothing"),
        ([bailian_row(1, -2, 1, 0, 10, [])], r"line 1: parent_chat_id: expected the chat_id of the turn before, or -1, got -2"),
        ([bailian_row(1, -1, 1, 0, 0, [])], r"line 1: input_length: expected a whole number of tokens >= 1, got 0"),
    ],
)
def test_a_bailian_trace_that_cannot_be_replayed_names_the_line_and_field(tmp_path: Path, rows: list[dict[str, object]], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(mooncake(tmp_path / "b.jsonl", *rows))


def test_a_trace_is_read_again_once_it_changes_and_not_before(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,input_len,output_len\n0,100,10\n")
    first = read_trace(path)
    assert read_trace(path) is first  # unchanged: parsed once
    path.write_text("timestamp,input_len,output_len\n0,300,30\n")  # the same size, a later time
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert read_trace(path) == Trace((TraceEntry(0.0, 300, 30),))
    path.unlink()
    with pytest.raises(TraceError, match=r"trace\.csv: cannot read the trace"):
        read_trace(path)

@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 1}\nnot json\n', r"t\.jsonl: line 2: expected one JSON object per line"),
        ("t.jsonl", '{"timestamp": -1, "input_length": 10, "output_length": 1}\n', r"line 1: timestamp: expected milliseconds from the trace's start \(a number >= 0\), got -1"),
        ("t.jsonl", '{"timestamp": 0, "output_length": 1}\n', r"line 1: input_length: expected a whole number of tokens >= 1, got nothing \(the field is missing\)"),
        ("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}\n', r"line 1: hash_ids\[1\]: expected an integer, got 'x'"),
        ("t.jsonl", '[1, 2]\n', r"line 1: \(top level\): expected `object`, got \[1, 2\]"),
        ("t.jsonl", '{"timestamp": 5, "input_length": 1, "output_length": 1}\n{"timestamp": 4, "input_length": 1, "output_length": 1}\n', r"request 2: timestamp: expected requests in the order sent, got 4.0 after 5.0"),
        ("t.jsonl", "\n", r"t\.jsonl: the trace has no requests"),
        ("t.csv", "time,in,out\n0,1,1\n", r"t\.csv: line 1: expected the header timestamp,input_len,output_len"),
        ("t.csv", "timestamp,input_len,output_len\n0,1\n", r"t\.csv: line 2: expected 3 fields"),
        ("t.csv", "timestamp,input_len,output_len\n0,ten,1\n", r"line 2: input_len: expected a whole number of tokens >= 1, got 'ten'"),
        ("t.txt", "", r"t\.txt: expected a \.jsonl \(Mooncake or Bailian\) or \.csv"),
    ],
)
def test_a_trace_that_cannot_be_replayed_names_the_file_line_and_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def block(hash_id: int) -> list[int]:
    return [hash_id * 10_000 + i for i in range(BLOCK_TOKENS)]


def tail(index: int, n: int) -> list[int]:
    return [-(index * 10_000 + i) for i in range(n)]


def test_prompts_have_exactly_the_traced_length_and_share_exactly_their_shared_blocks() -> None:
    cut = TraceEntry(0, 700, 1, (1, 2))  # two blocks, the second cut to 188 tokens
    longer = TraceEntry(0, 1_300, 1, (1, 2, 3))  # shares two blocks, the third of its own
    short = TraceEntry(0, 600, 1, (9,))  # one block, 88 tokens of its own after it
    plain = TraceEntry(0, 40, 1)  # a CSV request: no blocks at all
    prompts = [prompt_ids(entry, i, block, tail) for i, entry in enumerate((cut, longer, short, plain))]
    assert [len(p) for p in prompts] == [700, 1_300, 600, 40]
    assert prompts[1][:700] == prompts[0]  # the cut request is a prefix of the longer one: both open with blocks 1 and 2
    assert prompts[1][:1_024] == tuple(block(1) + block(2)) and prompts[1][1_024:] == tuple(block(3)[:276])
    assert prompts[2][:512] == tuple(block(9)) and prompts[2][512:] == tuple(tail(2, 88))
    assert prompts[3] == tuple(tail(3, 40))


def test_the_cacheable_share_counts_tokens_of_blocks_sent_before() -> None:
    entries = [TraceEntry(0, 1_024, 1, (1, 2)), TraceEntry(1, 700, 1, (1, 3)), TraceEntry(2, 600, 1, (1, 2))]
    # second: block 1 seen (512 of 700); third: blocks 1 and 2 seen (512 + 88 of 600)
    assert Trace(tuple(entries)).cacheable_share() == pytest.approx((512 + 600) / (1_024 + 700 + 600))
    assert Trace((TraceEntry(0, 10, 1),)).cacheable_share() == 0.0


def test_the_synthetic_trace_is_bursty_long_tailed_shares_prefixes_and_reads_back(tmp_path: Path) -> None:
    shape = SyntheticShape(requests=400, seed=3)
    entries = synthetic_trace(shape)
    assert entries == synthetic_trace(shape)  # the same everywhere
    assert entries != synthetic_trace(SyntheticShape(requests=400, seed=4))
    times = [e.timestamp_ms for e in entries]
    assert times[0] == 0.0 and times == sorted(times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.stdev(gaps) / statistics.fmean(gaps) > 1.3  # burstier than Poisson (CV 1)
    assert 0.8 * 400 / shape.rate <= times[-1] / 1000 <= 1.2 * 400 / shape.rate
    inputs = sorted(e.input_length for e in entries)
    assert inputs[int(0.99 * len(inputs))] > 4 * statistics.median(inputs)  # a long tail
    assert all(len(e.hash_ids) == math.ceil(e.input_length / BLOCK_TOKENS) for e in entries)
    assert {e.hash_ids[0] for e in entries} == set(range(shape.prefixes))  # each opens with a shared prefix
    assert 0.1 < Trace(tuple(entries)).cacheable_share() < 0.9
    path = tmp_path / "synthetic.jsonl"
    write_jsonl(Trace(entries), path)
    assert read_trace(path) == Trace(entries)
    with pytest.raises(TraceError, match="a file is already there; not overwritten"):
        write_jsonl(Trace(entries), path)


# --------------------------------------------------------------------------- #
# The trace workload, its replay in a suite file, and the shipped trace
# --------------------------------------------------------------------------- #

SUITE = HEADER + """
[[workload]]
name = "replayed"
kind = "trace"
path = "traces/t.jsonl"
warmup = 1
load = { replay = true, time_scale = 0.5 }
"""


@pytest.fixture(scope="module")
def tiny() -> PromptTokenizer:
    return PromptTokenizer.load(ensure_tiny_model())


def test_a_trace_workload_builds_traced_lengths_times_and_shared_blocks(tmp_path: Path, tiny: PromptTokenizer) -> None:
    path = mooncake(
        tmp_path / "t.jsonl",
        {"timestamp": 1000, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1250, "input_length": 600, "output_length": 3, "hash_ids": [1, 3]},
        {"timestamp": 1250, "input_length": 40, "output_length": 2},
    )
    first, second, third = TraceWorkload(str(path)).build(tiny)
    assert [len(s.prompt) for s in (first, second, third)] == [700, 600, 40]
    assert [s.expected_prompt_tokens for s in (first, second, third)] == [700, 600, 40]
    assert [s.max_tokens for s in (first, second, third)] == [5, 3, 2]
    assert [s.at for s in (first, second, third)] == pytest.approx([0.0, 0.25, 0.25])  # milliseconds, from the first
    assert first.prompt[:BLOCK_TOKENS] == second.prompt[:BLOCK_TOKENS]  # hash id 1
    assert first.prompt[BLOCK_TOKENS:600] != second.prompt[BLOCK_TOKENS:600]  # hash ids 2 and 3
    assert set(first.prompt) <= set(range(tiny.vocab_size)) - set(tiny.special_ids)
    assert TraceWorkload(str(path), seed=1).build(tiny)[0].prompt != first.prompt
    assert TraceWorkload(str(path), num_prompts=2).build(tiny) == (first, second)
    with pytest.raises(ValueError, match=r"t\.jsonl: num_prompts: expected at most the trace's 3 requests, got 4"):
        TraceWorkload(str(path), num_prompts=4).build(tiny)


def test_a_trace_workloads_fingerprint_is_its_content_not_its_path(tmp_path: Path) -> None:
    row = {"timestamp": 0, "input_length": 10, "output_length": 1}
    here, there = mooncake(tmp_path / "a.jsonl", row), mooncake(tmp_path / "b.jsonl", row)
    assert TraceWorkload(str(here)).fingerprint() == TraceWorkload(str(there)).fingerprint()
    changed = mooncake(tmp_path / "c.jsonl", {**row, "output_length": 2})
    assert TraceWorkload(str(changed)).fingerprint() != TraceWorkload(str(here)).fingerprint()


def test_a_suite_replays_a_trace_beside_it_at_a_scaled_time(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    mooncake(tmp_path / "traces" / "t.jsonl", {"timestamp": 0, "input_length": 10, "output_length": 1})
    (workload,) = suite_at(tmp_path, SUITE).workloads
    assert workload.arrival == Replay(time_scale=0.5)
    assert isinstance(workload.workload, TraceWorkload)
    assert workload.workload.path == str(tmp_path / "traces" / "t.jsonl")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("replay = true, time_scale = 0.5", "replay = false"), r"workload 'replayed'.load.replay: expected true \(replay the trace at its recorded times\), got False$"),
        (("time_scale = 0.5", "time_scale = -1"), r"workload 'replayed'.load.time_scale: expected a finite number > 0 \(0.5 replays twice as fast\), got -1$"),
        (("time_scale = 0.5", "rate = 2"), r"workload 'replayed'.load.replay: unknown key for an open loop \(rate = R\)"),
        (("time_scale = 0.5", "speed = 2"), r"workload 'replayed'.load.speed: unknown key for a replay \(replay = true\); expected only \['replay', 'time_scale', 'max_lag_ms'\]$"),
        (('kind = "trace"\npath = "traces/t.jsonl"', 'kind = "random"\ninput_len = 4\noutput_len = 2\nnum_prompts = 4'), r"workload 'replayed'.load.replay: expected a workload of kind 'trace' \(only a trace has send times to replay\), got 'random'$"),
    ],
)
def test_a_bad_replay_names_the_file_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    refused(tmp_path, SUITE.replace(*change, 1), message)


def test_the_shipped_cpu_trace_is_what_the_command_in_the_suite_writes(tmp_path: Path) -> None:
    """The command in cpu.toml's comment, run again, writes the shipped trace byte for byte."""
    suite = (ROOT / "perf_tests" / "suites" / "cpu.toml").read_text()
    command = re.search(r"#   (qwenperf trace .*?\\\n#\s+.*?)\n", suite)
    assert command is not None, "cpu.toml names the command that wrote its trace"
    argv = shlex.split(command.group(1).replace("\\\n#", " "))
    shipped = ROOT / argv[2]
    assert main(["trace", str(tmp_path / "again.jsonl"), *argv[3:]]) == 0
    assert (tmp_path / "again.jsonl").read_bytes() == shipped.read_bytes()


def test_the_trace_command_refuses_an_existing_file_and_bad_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "t.jsonl"
    target.write_text("mine\n")
    assert main(["trace", str(target)]) == 2
    assert main(["trace", str(tmp_path / "u.jsonl"), "--max-input", "10"]) == 2
    err = capsys.readouterr().err
    assert f"{target}: a file is already there; not overwritten" in err
    assert "max_input, max_output: expected at least their medians (1024, 64), got 10, 512" in err
    assert target.read_text() == "mine\n" and not (tmp_path / "u.jsonl").exists()

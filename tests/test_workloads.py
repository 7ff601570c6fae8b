"""Workloads and the prompt tokenizer: exact lengths, vLLM's range semantics, determinism, parsing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.suite.tiny_model import ensure_tiny_model
from pytest_qwenperf.suite.workloads import (
    FixedWorkload,
    JsonlWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
    length_range,
    workload_from_dict,
)

DATA = Path(__file__).parent / "data"
SHAREGPT = DATA / "sharegpt_small.jsonl"
PROMPTS = DATA / "prompts_small.jsonl"

# The fixtures are session-scoped so that hypothesis can use them.
SETTINGS = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="session")
def tiny() -> PromptTokenizer:
    return PromptTokenizer.load(ensure_tiny_model())


@pytest.fixture(scope="session")
def words() -> PromptTokenizer:
    """1000 words ``w0``..``w999``; 0 and 500 special, 999 added but not special.

    Independent of the tiny model, so the golden digest below only changes with the
    workload algorithm.
    """
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["w0", "w500"])
    tokenizer.add_tokens(["w999"])
    return PromptTokenizer(tokenizer)


def digest(specs: tuple[RequestSpec, ...]) -> str:
    payload = [[list(s.prompt), s.max_tokens] for s in specs]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #


def test_tokenizer_from_folder(tiny: PromptTokenizer) -> None:
    assert tiny.vocab_size == 512
    assert tiny.special_ids == {0, 1, 2}
    ids = tiny.encode("hello world")
    assert ids and not set(ids) & tiny.special_ids
    assert tiny.decode(ids) == "hello world"
    assert tiny.encode("<|im_start|>") == [1]  # special tokens are recognised, never added
    assert tiny.decode([1, *ids]) == "<|im_start|>hello world"  # and kept when decoding


def test_added_tokens_count_as_special(words: PromptTokenizer) -> None:
    assert words.special_ids == {0, 500, 999}


def test_tokenizer_from_hf_cache(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--qwenperf-tests--tiny" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_bytes((ensure_tiny_model() / "tokenizer.json").read_bytes())
    (tmp_path / "models--qwenperf-tests--tiny" / "refs").mkdir()
    (tmp_path / "models--qwenperf-tests--tiny" / "refs" / "main").write_text("0123abcd")
    tok = PromptTokenizer.load("qwenperf-tests/tiny", cache_dir=tmp_path)
    assert tok.vocab_size == 512 and tok.source == "qwenperf-tests/tiny"


@pytest.mark.parametrize("model", ["qwenperf-tests/no-such-model", "./no/such/folder/at/all"])
def test_missing_hf_model_is_a_clear_error(model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as err:
        PromptTokenizer.load(model, cache_dir=tmp_path)
    message = str(err.value)
    assert repr(model) in message and "tokenizer.json" in message and str(tmp_path) in message


def test_folder_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        PromptTokenizer.load(tmp_path)


# --------------------------------------------------------------------------- #
# Random: vLLM's range semantics, exact lengths, determinism
# --------------------------------------------------------------------------- #

# (len, ratio) -> range, as printed by vLLM 0.32's get_sampling_params
# ("Sampling input_len from [...]") for a tokenizer adding no special tokens.
VLLM_RANGES = [
    (1024, 0.0, (1024, 1024)),
    (1024, 0.8, (204, 1844)),
    (512, 0.8, (102, 922)),
    (100, 0.1, (90, 111)),  # float artefact: ceil(110.00000000000001)
    (10, 0.5, (5, 15)),
    (3, 0.5, (1, 5)),
    (1000, 0.999, (1, 1999)),
]


@pytest.mark.parametrize(("mean", "ratio", "expected"), VLLM_RANGES)
def test_length_range_is_vllms(mean: int, ratio: float, expected: tuple[int, int]) -> None:
    assert length_range(mean, ratio) == expected


def test_draws_cover_the_whole_inclusive_range(tiny: PromptTokenizer) -> None:
    specs = RandomWorkload(10, 3, 400, range_ratio=0.5, seed=7).build(tiny)
    assert {len(s.prompt) for s in specs} == set(range(5, 16))
    # vLLM raises the output floor to 1 (floor(3 * 0.5) == 1 anyway) and ceil(4.5) == 5.
    assert {s.max_tokens for s in specs} == set(range(1, 6))


def test_output_floor_is_one_as_in_vllm(tiny: PromptTokenizer) -> None:
    assert {s.max_tokens for s in RandomWorkload(50, 1, 100, range_ratio=0.9).build(tiny)} == {1, 2}


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5])
def test_range_ratio_outside_vllms_bounds(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"range_ratio: expected a number in \[0, 1\)"):
        RandomWorkload(100, 10, 1, range_ratio=ratio)


def test_input_range_reaching_zero_is_rejected_as_in_vllm() -> None:
    with pytest.raises(ValueError, match="input_len: expected an input length that stays >= 1"):
        RandomWorkload(3, 10, 1, range_ratio=0.9)


@SETTINGS
@given(
    input_len=st.integers(1, 300),
    output_len=st.integers(1, 300),
    ratio=st.floats(0.0, 0.95),
    num_prompts=st.integers(1, 4),
    seed=st.integers(0, 2**64),
)
def test_random_prompts_have_exact_lengths_and_no_special_ids(
    words: PromptTokenizer, input_len: int, output_len: int, ratio: float, num_prompts: int, seed: int
) -> None:
    in_low, in_high = length_range(input_len, ratio)
    assume(in_low >= 1)
    out_low, out_high = length_range(output_len, ratio)
    specs = RandomWorkload(input_len, output_len, num_prompts, range_ratio=ratio, seed=seed).build(words)
    assert [s.index for s in specs] == list(range(num_prompts))
    for spec in specs:
        assert isinstance(spec.prompt, tuple)
        assert len(spec.prompt) == spec.expected_prompt_tokens
        assert in_low <= len(spec.prompt) <= in_high
        assert max(out_low, 1) <= spec.max_tokens <= max(out_high, 1)
        assert spec.ignore_eos and spec.api == "completions"
        assert all(0 <= t < words.vocab_size and t not in words.special_ids for t in spec.prompt)


def test_random_is_deterministic_per_seed(tiny: PromptTokenizer) -> None:
    workload = RandomWorkload(200, 20, 5, range_ratio=0.5, seed=3)
    assert workload.build(tiny) == RandomWorkload(200, 20, 5, range_ratio=0.5, seed=3).build(tiny)
    other = RandomWorkload(200, 20, 5, range_ratio=0.5, seed=4).build(tiny)
    assert all(a.prompt != b.prompt for a, b in zip(workload.build(tiny), other, strict=True))
    assert len({s.prompt for s in workload.build(tiny)}) == 5  # requests differ from each other


def test_request_i_does_not_depend_on_num_prompts(tiny: PromptTokenizer) -> None:
    assert RandomWorkload(64, 8, 3, range_ratio=0.5).build(tiny) == RandomWorkload(64, 8, 10, range_ratio=0.5).build(tiny)[:3]


def test_random_golden_digest(words: PromptTokenizer) -> None:
    """Same seed, same prompts on every machine and version; a new algorithm must bump ALGORITHM_VERSION."""
    specs = RandomWorkload(64, 16, 8, range_ratio=0.5, seed=1234).build(words)
    assert specs[0].prompt[:8] == (609, 980, 806, 774, 122, 705, 337, 360)
    assert [len(s.prompt) for s in specs] == [52, 71, 88, 94, 80, 52, 89, 64]
    assert [s.max_tokens for s in specs] == [17, 9, 20, 22, 17, 21, 16, 23]
    assert digest(specs) == "b287e0e6711f2ce0c4a9c0722fb021b562d61d3cebcadaa7844c5336587dd8c4"


def test_random_chat_sends_the_decoded_ids_as_one_user_message(words: PromptTokenizer) -> None:
    completions = RandomWorkload(16, 4, 2, seed=5).build(words)
    chat = RandomWorkload(16, 4, 2, seed=5, api="chat").build(words)
    for ids_spec, chat_spec in zip(completions, chat, strict=True):
        assert isinstance(ids_spec.prompt, tuple)
        assert chat_spec.api == "chat" and chat_spec.expected_prompt_tokens is None
        assert chat_spec.messages == (("user", words.decode(ids_spec.prompt)),)


def test_random_needs_a_tokenizer() -> None:
    with pytest.raises(ValueError, match=r"random-isl8-osl8.*needs the model's tokenizer"):
        RandomWorkload(8, 8, 1).build()


# --------------------------------------------------------------------------- #
# Shared prefix
# --------------------------------------------------------------------------- #


@SETTINGS
@given(
    num_prefixes=st.integers(1, 5),
    per_prefix=st.integers(1, 5),
    prefix_len=st.integers(1, 40),
    suffix_len=st.integers(1, 40),
    seed=st.integers(0, 1000),
)
def test_shared_prefix_structure(
    tiny: PromptTokenizer, num_prefixes: int, per_prefix: int, prefix_len: int, suffix_len: int, seed: int
) -> None:
    workload = SharedPrefixWorkload(num_prefixes, per_prefix, prefix_len, suffix_len, output_len=9, seed=seed)
    specs = workload.build(tiny)
    assert len(specs) == workload.num_prompts == num_prefixes * per_prefix
    for spec in specs:
        assert len(spec.prompt) == spec.expected_prompt_tokens == prefix_len + suffix_len
        assert spec.max_tokens == 9 and not set(spec.prompt) & tiny.special_ids
    for i, a in enumerate(specs):
        for b in specs[i + 1 :]:
            same_prefix = (a.index - b.index) % num_prefixes == 0  # round robin over prefixes
            if same_prefix:
                assert a.prompt[:prefix_len] == b.prompt[:prefix_len]
                assert a.prompt[prefix_len] != b.prompt[prefix_len]
            else:
                assert a.prompt[0] != b.prompt[0]


def test_shared_prefix_order_interleaves_prefixes(tiny: PromptTokenizer) -> None:
    specs = SharedPrefixWorkload(3, 2, 4, 2, 5).build(tiny)
    firsts = [s.prompt[:4] for s in specs]
    assert firsts[:3] == firsts[3:] and len(set(firsts[:3])) == 3


def test_shared_prefix_first_tokens_are_distinct(tiny: PromptTokenizer) -> None:
    # 100 uniform draws from 509 ids would collide ~10 times; the workload must not.
    specs = SharedPrefixWorkload(100, 100, 2, 2, 1).build(tiny)
    assert len({s.prompt[0] for s in specs}) == 100
    assert all(len({s.prompt[2] for s in specs[p::100]}) == 100 for p in range(100))


def test_shared_prefix_needs_distinct_first_tokens(tiny: PromptTokenizer) -> None:
    with pytest.raises(ValueError, match="at most 509 prefixes"):
        SharedPrefixWorkload(510, 1, 4, 4, 4).build(tiny)


# --------------------------------------------------------------------------- #
# Fixed
# --------------------------------------------------------------------------- #


def test_fixed(tiny: PromptTokenizer) -> None:
    specs = FixedWorkload("hello world", 5, 3).build(tiny)
    assert [s.prompt for s in specs] == ["hello world"] * 3
    assert {s.expected_prompt_tokens for s in specs} == {len(tiny.encode("hello world"))}
    assert FixedWorkload("hello world", 5, 1).build()[0].expected_prompt_tokens is None
    chat = FixedWorkload("hello world", 5, 1, api="chat").build(tiny)[0]
    assert chat.messages == (("user", "hello world"),) and chat.expected_prompt_tokens is None


# --------------------------------------------------------------------------- #
# JSONL
# --------------------------------------------------------------------------- #


def test_jsonl_plain_prompts(tiny: PromptTokenizer) -> None:
    with pytest.raises(ValueError, match=r"prompts_small\.jsonl:2: no output length"):
        JsonlWorkload(str(PROMPTS)).build(tiny)
    specs = JsonlWorkload(str(PROMPTS), output_len=7).build(tiny)
    assert [s.prompt for s in specs] == ["Write one sentence about latency.", "Write one sentence about throughput."]
    assert [s.max_tokens for s in specs] == [7, 7]  # the workload's output_len wins, as vLLM's --sharegpt-output-len
    assert specs[1].expected_prompt_tokens == len(tiny.encode("Write one sentence about throughput."))


def test_jsonl_sharegpt_and_messages(tiny: PromptTokenizer) -> None:
    specs = JsonlWorkload(str(SHAREGPT)).build(tiny)
    assert [s.prompt for s in specs] == ["What is the capital of France?", "Name a prime number.", "Say hello to the world."]
    replies = ["The capital of France is Paris.", "Seven.", "Hello world, this is the model answering the question."]
    assert [s.max_tokens for s in specs] == [len(tiny.encode(r)) for r in replies]
    chat = JsonlWorkload(str(SHAREGPT), api="chat").build(tiny)
    assert chat[1].messages == (("user", "Name a prime number."),)


def test_jsonl_cycles_and_truncates(tiny: PromptTokenizer) -> None:
    prompts = [s.prompt for s in JsonlWorkload(str(SHAREGPT), num_prompts=7).build(tiny)]
    assert prompts == [prompts[0], prompts[1], prompts[2]] * 2 + [prompts[0]] and len(set(prompts)) == 3
    assert len(JsonlWorkload(str(SHAREGPT), num_prompts=2).build(tiny)) == 2


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", 'expected a JSON object with "prompt", "conversations" or "messages", got \\[1, 2\\]'),
    ('{"text": "hi"}', "got keys \\['text'\\]"),
    ('{"prompt": ""}', "prompt: expected a non-empty string"),
    ('{"prompt": "hi", "output_len": "5"}', "output_len: expected an integer >= 1, got '5'"),
    ('{"prompt": "hi", "output_len": true}', "output_len: expected an integer >= 1, got True"),
    ('{"conversations": "hi"}', "conversations: expected a list of turns"),
    ('{"conversations": [{"from": "human"}]}', "conversations\\[0\\]: expected an object with string 'from' and 'value'"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "messages: expected a user turn"),
    ('{"messages": [{"role": "user", "content": ""}]}', "messages\\[0\\]: the first user turn is empty"),
    ('{"conversations": [{"from": "human", "value": "hi"}]}', "no output length"),
    ('{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]}', "reply is empty"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_jsonl_bad_line_names_file_and_line(tiny: PromptTokenizer, tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine", "output_len": 3}\n\n' + line + "\n")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}:3: .*{message}"):
        JsonlWorkload(str(path)).build(tiny)


def test_jsonl_without_prompts(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no prompts"):
        JsonlWorkload(str(tmp_path / "empty.jsonl")).build()


def test_jsonl_fingerprint_follows_content_not_path(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    copy = tmp_path / "a" / SHAREGPT.name
    copy.write_bytes(SHAREGPT.read_bytes())
    assert JsonlWorkload(str(copy)).fingerprint() == JsonlWorkload(str(SHAREGPT)).fingerprint()
    copy.write_bytes(SHAREGPT.read_bytes() + b"\n")
    assert JsonlWorkload(str(copy)).fingerprint() != JsonlWorkload(str(SHAREGPT)).fingerprint()


# --------------------------------------------------------------------------- #
# Identity: ids, fingerprints, hashing
# --------------------------------------------------------------------------- #


def test_default_ids() -> None:
    assert RandomWorkload(1024, 512, 10).id == "random-isl1024-osl512"
    assert RandomWorkload(1024, 512, 10, range_ratio=0.8).id == "random-isl1024-osl512-r0.8-s0"
    assert RandomWorkload(1024, 512, 10, seed=3, api="chat").id == "random-isl1024-osl512-s3-chat"
    assert SharedPrefixWorkload(4, 8, 1024, 64, 32).id == "shared-prefix-p4x8-pl1024-sl64-osl32"
    assert FixedWorkload("hi", 5, 2).id.startswith("fixed-") and FixedWorkload("ho", 5, 2).id != FixedWorkload("hi", 5, 2).id
    assert JsonlWorkload("x/sharegpt.jsonl", output_len=64, api="chat").id == "jsonl-sharegpt-osl64-chat"
    assert RandomWorkload(8, 8, 1, name="smoke").id == "smoke"


def test_fingerprint() -> None:
    base = RandomWorkload(1024, 512, 10, range_ratio=0.5)
    assert base.fingerprint() == "b3d5589ab09384cc"  # the scheme itself must not drift
    assert RandomWorkload(1024, 512, 10, range_ratio=0.5, name="other").fingerprint() == base.fingerprint()
    variants = [
        RandomWorkload(1025, 512, 10, range_ratio=0.5),
        RandomWorkload(1024, 511, 10, range_ratio=0.5),
        RandomWorkload(1024, 512, 11, range_ratio=0.5),
        RandomWorkload(1024, 512, 10, range_ratio=0.6),
        RandomWorkload(1024, 512, 10, range_ratio=0.5, seed=1),
        RandomWorkload(1024, 512, 10, range_ratio=0.5, api="chat"),
    ]
    assert len({v.fingerprint() for v in variants} | {base.fingerprint()}) == len(variants) + 1
    assert RandomWorkload(8, 8, 1, range_ratio=0).fingerprint() == RandomWorkload(8, 8, 1, range_ratio=0.0).fingerprint()
    assert FixedWorkload("hi", 8, 1).fingerprint() != FixedWorkload("ho", 8, 1).fingerprint()


def test_workloads_are_frozen_and_hashable() -> None:
    workload = SharedPrefixWorkload(2, 2, 8, 8, 8)
    assert len({workload, SharedPrefixWorkload(2, 2, 8, 8, 8), FixedWorkload("x", 1, 1)}) == 2
    for field in dataclasses.fields(workload):
        with pytest.raises(AttributeError):
            setattr(workload, field.name, 1)


# --------------------------------------------------------------------------- #
# Suite-file parsing
# --------------------------------------------------------------------------- #


def test_workload_from_dict_builds_every_kind() -> None:
    src = "suite.toml [[workload]] 0"
    assert workload_from_dict(
        {"kind": "random", "input_len": 128, "output_len": 32, "num_prompts": 4, "range_ratio": 0, "name": "r"}, source=src
    ) == RandomWorkload(128, 32, 4, name="r")
    assert workload_from_dict(
        {"kind": "shared-prefix", "num_prefixes": 2, "prompts_per_prefix": 3, "prefix_len": 64, "suffix_len": 8, "output_len": 4},
        source=src,
    ) == SharedPrefixWorkload(2, 3, 64, 8, 4)
    assert workload_from_dict(
        {"kind": "fixed", "prompt": "hi", "output_len": 4, "num_prompts": 2, "api": "chat"}, source=src
    ) == FixedWorkload("hi", 4, 2, api="chat")
    assert workload_from_dict({"kind": "jsonl", "path": "a.jsonl"}, source=src) == JsonlWorkload("a.jsonl")


RANDOM = {"kind": "random", "input_len": 8, "output_len": 8, "num_prompts": 1}
BAD_TABLES = [
    ({"kind": "poisson"}, r"kind: expected one of \['conversation', 'fixed', 'jsonl', 'random', 'shared-prefix', 'trace'\], got 'poisson'"),
    ({"input_len": 1}, "kind: expected one of"),
    ({**RANDOM, "input-len": 8}, "input-len: unknown key for a 'random' workload"),
    ({**RANDOM, "input_len": "8"}, "input_len: expected an integer, got '8'"),
    ({**RANDOM, "input_len": 8.0}, "input_len: expected an integer, got 8.0"),
    ({**RANDOM, "input_len": True}, "input_len: expected an integer, got True"),
    ({**RANDOM, "range_ratio": "0.5"}, "range_ratio: expected a number, got '0.5'"),
    ({**RANDOM, "api": "embeddings"}, "api: expected one of 'completions', 'chat', got 'embeddings'"),
    ({"kind": "random", "input_len": 8, "output_len": 8}, "num_prompts: missing; a 'random' workload needs an integer"),
    ({**RANDOM, "num_prompts": 0}, "num_prompts: expected an integer >= 1, got 0"),
    ({**RANDOM, "range_ratio": 1}, r"range_ratio: expected a number in \[0, 1\)"),
    ({"kind": "jsonl", "path": "a.jsonl", "output_len": "all"}, "output_len: expected an integer, got 'all'"),
    ({"kind": "fixed", "prompt": "", "output_len": 1, "num_prompts": 1}, "prompt: expected a non-empty string"),
]


@pytest.mark.parametrize(("table", "message"), BAD_TABLES)
def test_workload_from_dict_errors(table: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=r"^suite\.toml \[\[workload\]\] 3: " + message):
        workload_from_dict(table, source="suite.toml [[workload]] 3")


# --------------------------------------------------------------------------- #
# Request bodies
# --------------------------------------------------------------------------- #


def test_body_round_trip(tiny: PromptTokenizer) -> None:
    one_of_each = [
        RandomWorkload(32, 8, 1, range_ratio=0.5),
        SharedPrefixWorkload(1, 1, 16, 16, 8),
        FixedWorkload("hello", 8, 1),
        JsonlWorkload(str(SHAREGPT), num_prompts=1),
        RandomWorkload(32, 8, 1, api="chat"),
    ]
    for workload in one_of_each:
        spec = workload.build(tiny)[0]
        body = json.loads(json.dumps(spec.body("qwenperf-tiny")))
        assert body["model"] == "qwenperf-tiny" and body["stream"] is True
        assert body["max_tokens"] == spec.max_tokens and body["ignore_eos"] is True
        if spec.api == "chat":
            assert spec.path == "/v1/chat/completions"
            assert [(m["role"], m["content"]) for m in body["messages"]] == list(spec.messages)
        elif isinstance(spec.prompt, tuple):
            assert body["prompt"] == list(spec.prompt) and len(body["prompt"]) == spec.expected_prompt_tokens
        else:
            assert body["prompt"] == spec.prompt and spec.path == "/v1/completions"

"""Workloads: what to send, as frozen data, turned into :class:`RequestSpec` tuples by ``build``.

A workload is identified by ``id`` (human readable, used to key results; ``name``
overrides it) and by ``fingerprint()`` (a digest of everything that decides the
requests, used to check that a baseline and a candidate ran the same thing).

Random token ids come from BLAKE2b in counter mode (see :func:`_uint64_stream`), not
from numpy or ``random``: the same seed must give the same prompts on every machine,
Python and numpy version, or comparisons across upgrades would compare different work.

Kept as one module though over 400 lines: each kind is a small frozen class with ``build``
and ``fingerprint``, and the kinds share the token stream and the prompt assembly.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import itertools
import json
import math
import struct
import typing
from collections.abc import Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.run import TraceReplay
from pytest_qwenperf.loadgen.request import Api, RequestSpec, Turn
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.suite import trace_files, traces

#: Part of every fingerprint: bump when the requests built for the same fields change.
ALGORITHM_VERSION = 1


class Workload(abc.ABC):
    """Base of every workload kind; subclasses are frozen dataclasses."""

    kind: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # what makes asdict, fields and replace take any kind
    name: str

    if typing.TYPE_CHECKING:  # a field of each kind but shared-prefix, where it is computed

        @property
        def num_prompts(self) -> int | None: ...

    @property
    def id(self) -> str:
        return self.name or self._default_id()

    def fingerprint(self) -> str:
        """Short sha256 of the canonical JSON of the fields that decide the requests.

        ``name`` is left out: renaming a workload does not change what it sends.
        """
        payload = {"kind": self.kind, "algorithm": ALGORITHM_VERSION, **self._identity()}
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @abc.abstractmethod
    def build(self, tokenizer: PromptTokenizer | None = None) -> tuple[RequestSpec, ...]:
        """The requests, in sending order, indexed from 0."""

    @abc.abstractmethod
    def _default_id(self) -> str: ...

    def _identity(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        del fields["name"]
        return fields

    def _tokenizer(self, tokenizer: PromptTokenizer | None) -> PromptTokenizer:
        if tokenizer is None:
            raise ValueError(f"workload {self.id!r} needs the model's tokenizer to build its prompts")
        return tokenizer


@dataclass(frozen=True)
class RandomWorkload(Workload):
    """Random token-id prompts, like ``vllm bench serve --dataset-name random``.

    Each request's input and output lengths are drawn uniformly from
    :func:`length_range`, so ``range_ratio`` has vLLM's ``--random-range-ratio``
    meaning. The prompt is exactly that many ids, none of them a special/added token;
    ids are sent as ids, so no decode/re-encode round trip can change the length.
    With ``api="chat"`` the ids are decoded into one user message and the exact
    length is lost (the server re-tokenizes and applies the chat template).
    """

    kind: ClassVar[str] = "random"
    input_len: int
    output_len: int
    num_prompts: int
    range_ratio: float = 0.0
    seed: int = 0
    api: Api = "completions"
    _: KW_ONLY
    name: str = ""

    def __post_init__(self) -> None:
        # 0 and 0.0 are equal but not the same JSON: keep fingerprints independent of that.
        object.__setattr__(self, "range_ratio", float(self.range_ratio))
        _check_positive(self, "input_len", "output_len", "num_prompts")
        _check(0.0 <= self.range_ratio < 1.0, "range_ratio", "a number in [0, 1) (as vLLM)", self.range_ratio)
        low, _ = length_range(self.input_len, self.range_ratio)
        _check(low >= 1, "input_len", f"an input length that stays >= 1 with range_ratio {self.range_ratio}", self.input_len)
        _check_api(self.api)

    def _default_id(self) -> str:
        parts = [f"random-isl{self.input_len}-osl{self.output_len}"]
        if self.range_ratio:
            parts.append(f"r{self.range_ratio:g}")
        if self.range_ratio or self.seed:
            parts.append(f"s{self.seed}")
        return _with_api("-".join(parts), self.api)

    def build(self, tokenizer: PromptTokenizer | None = None) -> tuple[RequestSpec, ...]:
        tok = self._tokenizer(tokenizer)
        allowed = _allowed_ids(tok)
        in_low, in_high = length_range(self.input_len, self.range_ratio)
        out_low, out_high = length_range(self.output_len, self.range_ratio)
        out_low, out_high = max(out_low, 1), max(out_high, 1)  # as vLLM: never 0 output tokens
        specs = []
        for i in range(self.num_prompts):
            draws = _uint64_stream(self.seed, "random", i)
            input_len = in_low + _below(next(draws), in_high - in_low + 1)
            output_len = out_low + _below(next(draws), out_high - out_low + 1)
            ids = tuple(allowed[_below(next(draws), len(allowed))] for _ in range(input_len))
            specs.append(_spec(i, output_len, self.api, ids, tok))
        return tuple(specs)


@dataclass(frozen=True)
class SharedPrefixWorkload(Workload):
    """``num_prefixes`` random prefixes, each followed by ``prompts_per_prefix`` random suffixes.

    For prefix-cache tests. Requests go round-robin over the prefixes (p0s0, p1s0, ...,
    p0s1, p1s1, ...) so consecutive requests never share a prefix. The first token of
    every prefix is distinct, and so is the first suffix token within each prefix: two
    requests share exactly ``prefix_len`` leading ids when they share a prefix, and
    none otherwise.
    """

    kind: ClassVar[str] = "shared-prefix"
    num_prefixes: int
    prompts_per_prefix: int
    prefix_len: int
    suffix_len: int
    output_len: int
    seed: int = 0
    _: KW_ONLY
    name: str = ""

    def __post_init__(self) -> None:
        _check_positive(self, "num_prefixes", "prompts_per_prefix", "prefix_len", "suffix_len", "output_len")

    @property
    def num_prompts(self) -> int:
        return self.num_prefixes * self.prompts_per_prefix

    def _default_id(self) -> str:
        base = (
            f"shared-prefix-p{self.num_prefixes}x{self.prompts_per_prefix}"
            f"-pl{self.prefix_len}-sl{self.suffix_len}-osl{self.output_len}"
        )
        return f"{base}-s{self.seed}" if self.seed else base

    def build(self, tokenizer: PromptTokenizer | None = None) -> tuple[RequestSpec, ...]:
        tok = self._tokenizer(tokenizer)
        allowed = _allowed_ids(tok)
        if max(self.num_prefixes, self.prompts_per_prefix) > len(allowed):
            raise ValueError(
                f"workload {self.id!r}: at most {len(allowed)} prefixes and prompts per prefix "
                "with this tokenizer (their first tokens must be distinct)"
            )
        prefixes = _distinct_start_sequences(allowed, self.num_prefixes, self.prefix_len, self.seed, "prefix")
        suffixes = [
            _distinct_start_sequences(allowed, self.prompts_per_prefix, self.suffix_len, self.seed, "suffix", p)
            for p in range(self.num_prefixes)
        ]
        specs = []
        for index, (s, p) in enumerate(itertools.product(range(self.prompts_per_prefix), range(self.num_prefixes))):
            specs.append(_spec(index, self.output_len, "completions", prefixes[p] + suffixes[p][s], tok))
        return tuple(specs)


@dataclass(frozen=True)
class FixedWorkload(Workload):
    """One text prompt, sent ``num_prompts`` times."""

    kind: ClassVar[str] = "fixed"
    prompt: str
    output_len: int
    num_prompts: int
    api: Api = "completions"
    _: KW_ONLY
    name: str = ""

    def __post_init__(self) -> None:
        _check(bool(self.prompt), "prompt", "a non-empty string", self.prompt)
        _check_positive(self, "output_len", "num_prompts")
        _check_api(self.api)

    def _default_id(self) -> str:
        digest = hashlib.blake2b(self.prompt.encode(), digest_size=4).hexdigest()
        return _with_api(f"fixed-{digest}-osl{self.output_len}", self.api)

    def build(self, tokenizer: PromptTokenizer | None = None) -> tuple[RequestSpec, ...]:
        return tuple(_spec(i, self.output_len, self.api, self.prompt, tokenizer) for i in range(self.num_prompts))


@dataclass(frozen=True)
class JsonlWorkload(Workload):
    """Prompts from a JSONL file, in file order, cycling when ``num_prompts`` exceeds the lines.

    Each non-blank line is either ``{"prompt": "...", "output_len": N}`` (``output_len``
    optional) or a conversation: ShareGPT ``{"conversations": [{"from": "human",
    "value": ...}, {"from": "gpt", "value": ...}, ...]}`` or ``{"messages": [{"role":
    "user", "content": ...}, ...]}``. A conversation contributes its first user turn
    as the prompt (other turns are ignored, as in vLLM's ShareGPT dataset) and, unless
    an output length is given, the token count of the first assistant reply after it
    as the output length. ``output_len`` on the workload overrides every line's.
    Unlike vLLM, lines are neither shuffled nor filtered by length.
    """

    kind: ClassVar[str] = "jsonl"
    path: str
    num_prompts: int | None = None
    output_len: int | None = None
    api: Api = "completions"
    _: KW_ONLY
    name: str = ""

    def __post_init__(self) -> None:
        _check(bool(self.path), "path", "a non-empty path", self.path)
        _check_positive(self, *(f for f in ("num_prompts", "output_len") if getattr(self, f) is not None))
        _check_api(self.api)

    def _default_id(self) -> str:
        base = f"jsonl-{Path(self.path).stem}"
        return _with_api(f"{base}-osl{self.output_len}" if self.output_len else base, self.api)

    def _identity(self) -> dict[str, Any]:
        # The content, not the path: the same file elsewhere is the same workload.
        fields = super()._identity()
        fields["path"] = hashlib.sha256(Path(self.path).read_bytes()).hexdigest()
        return fields

    def build(self, tokenizer: PromptTokenizer | None = None) -> tuple[RequestSpec, ...]:
        entries = []
        for lineno, line in enumerate(Path(self.path).read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                entries.append(self._entry(line, f"{self.path}:{lineno}", tokenizer))
        if not entries:
            raise ValueError(f"{self.path}: no prompts (every line is blank)")
        count = len(entries) if self.num_prompts is None else self.num_prompts
        return tuple(
            _spec(i, output_len, self.api, prompt, tokenizer)
            for i, (prompt, output_len) in enumerate(itertools.islice(itertools.cycle(entries), count))
        )

    def _entry(self, line: str, where: str, tokenizer: PromptTokenizer | None) -> tuple[str, int]:
        """(prompt, output length) of one line; ``where`` is ``file:line`` for errors."""
        expected = 'a JSON object with "prompt", "conversations" or "messages"'
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: expected {expected}; not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected {expected}, got {_short(obj)}")
        if "prompt" in obj:
            prompt, line_output_len, reply = obj["prompt"], obj.get("output_len"), None
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"{where}: prompt: expected a non-empty string, got {_short(prompt)}")
            if line_output_len is not None and not (_is_int(line_output_len) and line_output_len >= 1):
                raise ValueError(f"{where}: output_len: expected an integer >= 1, got {_short(line_output_len)}")
        elif "conversations" in obj or "messages" in obj:
            prompt, reply = _conversation(obj, where)
            line_output_len = None
        else:
            raise ValueError(f"{where}: expected {expected}, got keys {sorted(obj)}")
        output_len = self.output_len or line_output_len
        if output_len is None:
            if reply is None:
                raise ValueError(f"{where}: no output length: give output_len on the line or on the workload")
            if tokenizer is None:
                raise ValueError(f"{where}: a tokenizer is needed to count the reply's tokens (or set output_len)")
            output_len = len(tokenizer.encode(reply))
            if output_len < 1:
                raise ValueError(f"{where}: the assistant reply is empty, so it gives no output length")
        return prompt, output_len


@dataclass(frozen=True)
class TraceWorkload(Workload):
    """A recorded trace (:mod:`~pytest_qwenperf.suite.trace_files`: Mooncake or Bailian JSONL, or CSV), each request
    with exactly its traced input and output lengths and its traced send time (``RequestSpec.at``,
    which a ``Replay`` load keeps).

    Each hash id's block is drawn from ``seed`` and the id alone, so requests that share
    leading hash ids share exactly those tokens and the prefix cache sees what production saw;
    what the blocks do not cover is drawn for that request alone. ``start_s`` and ``span_s`` cut a
    window of the trace (seconds from its first request), then ``num_prompts`` replays the first
    that many requests of it (a trace is not cycled: its times would not mean anything twice).
    ``fit`` (``scale`` or ``cap``) makes every request fit ``fit_context`` tokens
    (:meth:`~pytest_qwenperf.suite.traces.Trace.fitted`), keeping the send times and the blocks shared.
    Token ids are sent as ids, so only the completions API keeps the lengths exact. A trace's
    conversations (Bailian's) are sent as conversations: each turn once the turn before it has been
    answered, and not before its traced time (a :class:`Turn` of no think time; its prompt is the
    traced one, which holds the conversation so far in its blocks).
    """

    kind: ClassVar[str] = "trace"
    path: str
    num_prompts: int | None = None
    seed: int = 0
    start_s: float = 0.0
    span_s: float | None = None
    fit: str | None = None
    fit_context: int | None = None
    _: KW_ONLY
    name: str = ""

    def __post_init__(self) -> None:
        _check(bool(self.path), "path", "a non-empty path to a .jsonl (Mooncake or Bailian) or .csv trace", self.path)
        if self.num_prompts is not None:
            _check_positive(self, "num_prompts")
        object.__setattr__(self, "start_s", float(self.start_s))  # 0 and 0.0: one fingerprint
        _check(math.isfinite(self.start_s) and self.start_s >= 0, "start_s", "a finite number of seconds >= 0", self.start_s)
        if self.span_s is not None:
            object.__setattr__(self, "span_s", float(self.span_s))
            _check(math.isfinite(self.span_s) and self.span_s > 0, "span_s", "a finite number of seconds > 0", self.span_s)
        _check(self.fit in (None, *traces.FITS), "fit", f"one of {', '.join(traces.FITS)}", self.fit)
        if self.fit_context is not None:
            _check_positive(self, "fit_context")
        _check((self.fit is None) == (self.fit_context is None), "fit_context", "a context in tokens with fit, and only with fit", self.fit_context)

    def _default_id(self) -> str:
        parts = [f"trace-{Path(self.path).stem}"]
        if self.start_s or self.span_s is not None:
            parts.append(f"from{self.start_s:g}s" + ("" if self.span_s is None else f"-for{self.span_s:g}s"))
        if self.num_prompts:
            parts.append(f"n{self.num_prompts}")
        if self.fit:
            parts.append(f"{self.fit}{self.fit_context}")
        return "-".join(parts)

    def _identity(self) -> dict[str, Any]:
        # The content, not the path: the same trace elsewhere is the same workload. Window and fit
        # only where set, so a trace replayed whole keeps the fingerprint it had before they existed.
        fields = super()._identity()
        fields["path"] = hashlib.sha256(Path(self.path).read_bytes()).hexdigest()
        unset = {"start_s": 0.0, "span_s": None, "fit": None, "fit_context": None}
        return {key: value for key, value in fields.items() if key not in unset or value != unset[key]}

    def traced(self) -> traces.Trace:
        """The window of the trace this workload replays, as traced (before any fit)."""
        found = trace_files.read_trace(Path(self.path))
        try:
            found = found.window(self.start_s, self.span_s)
        except traces.TraceError as exc:
            raise ValueError(f"{self.path}: start_s, span_s: {exc}") from None
        if self.num_prompts is not None and self.num_prompts > len(found.entries):
            whose = "the window's" if self.start_s or self.span_s is not None else "the trace's"
            raise ValueError(f"{self.path}: num_prompts: expected at most {whose} {len(found.entries)} requests, got {self.num_prompts}")
        return dataclasses.replace(found, entries=found.entries[: self.num_prompts])

    def trace(self) -> traces.Trace:
        """What this workload replays: :meth:`traced`, fitted where ``fit`` says so."""
        found = self.traced()
        if self.fit is None or self.fit_context is None:
            return found
        try:
            return found.fitted(self.fit_context, self.fit)
        except traces.TraceError as exc:
            raise ValueError(f"{self.path}: {exc}") from None

    def build(self, tokenizer: PromptTokenizer | None = None) -> tuple[RequestSpec, ...]:
        tok = self._tokenizer(tokenizer)
        allowed = _allowed_ids(tok)
        blocks: dict[int, tuple[int, ...]] = {}
        trace = self.trace()

        def block(hash_id: int) -> tuple[int, ...]:
            if hash_id not in blocks:
                draws = _uint64_stream(self.seed, "block", hash_id)
                blocks[hash_id] = tuple(allowed[_below(next(draws), len(allowed))] for _ in range(trace.block_tokens))
            return blocks[hash_id]

        def tail(index: int, n: int) -> tuple[int, ...]:
            draws = _uint64_stream(self.seed, "tail", index)
            return tuple(allowed[_below(next(draws), len(allowed))] for _ in range(n))

        turns: dict[int, int] = {}  # conversation -> turns built

        def turn(entry: traces.TraceEntry) -> Turn | None:
            if entry.session is None:
                return None
            number = turns[entry.session] = turns.get(entry.session, -1) + 1
            return Turn(entry.session, number)

        entries = trace.entries
        return tuple(
            dataclasses.replace(
                _spec(i, entry.output_length, "completions", traces.prompt_ids(entry, i, block, tail), tok), at=at, turn=turn(entry)
            )
            for i, (entry, at) in enumerate(zip(entries, traces.send_offsets(entries), strict=True))
        )


def trace_replay(workload: TraceWorkload, time_scale: float | None, kv_block: int | None) -> TraceReplay:
    """What a replay of ``workload`` is held against (``time_scale`` None: sent by a loop): the
    cacheable share of what it sends in the server's cache blocks of ``kv_block`` tokens (None: not
    known, every shared token), and where it was fitted, the share as traced and how."""
    sent, block = workload.trace(), kv_block or 1
    traced = workload.traced().cacheable_share(block) if sent.fit else None
    return TraceReplay(
        cacheable_share=sent.cacheable_share(block), time_scale=time_scale, kv_block=kv_block, fit=sent.fit or None,
        traced_cacheable_share=traced,
    )  # fmt: skip


@dataclass(frozen=True)
class ConversationWorkload(Workload):
    """``conversations`` chats of ``turns`` turns each, whose prompts grow as a chat's context does.

    Turn 0's prompt is ``first_input_len`` random ids (a system prompt and the first question);
    turn k's is turn k-1's whole prompt, then ``output_len`` ids standing for the reply to it, then
    ``turn_input_len`` ids of the next user message. Each prompt extends the previous one exactly,
    so the server's prefix cache can hit every earlier turn's prompt. It cannot hit the stand-in
    reply: the server generated other tokens for it (the real reply's ids would have to come back
    from the server), so each turn after the first recomputes ``output_len`` tokens a real chat
    would find cached, and ``output_len + turn_input_len`` of its prompt are uncached.

    Requests come conversation by conversation, turns in order (each a :class:`Turn`): the client
    sends a turn once the previous one has finished, ``think_time_s`` after its end, and no later
    turn of a conversation whose turn failed. Token ids are sent as ids (completions), so every
    prompt has exactly ``first_input_len + k (output_len + turn_input_len)`` tokens.
    """

    kind: ClassVar[str] = "conversation"
    conversations: int
    turns: int
    first_input_len: int
    turn_input_len: int
    output_len: int
    think_time_s: float = 0.0
    seed: int = 0
    _: KW_ONLY
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "think_time_s", float(self.think_time_s))  # 1 and 1.0: one fingerprint
        _check_positive(self, "conversations", "turns", "first_input_len", "turn_input_len", "output_len")
        ok = math.isfinite(self.think_time_s) and self.think_time_s >= 0
        _check(ok, "think_time_s", "a finite number of seconds >= 0", self.think_time_s)

    @property
    def num_prompts(self) -> int:
        return self.conversations * self.turns

    def _default_id(self) -> str:
        shape = f"c{self.conversations}x{self.turns}-fl{self.first_input_len}-tl{self.turn_input_len}-osl{self.output_len}"
        parts = [f"conversation-{shape}"]
        if self.think_time_s:
            parts.append(f"t{self.think_time_s:g}")
        if self.seed:
            parts.append(f"s{self.seed}")
        return "-".join(parts)

    def build(self, tokenizer: PromptTokenizer | None = None) -> tuple[RequestSpec, ...]:
        tok = self._tokenizer(tokenizer)
        allowed = _allowed_ids(tok)

        def ids(conversation: int, part: str, turn: int, n: int) -> tuple[int, ...]:
            draws = _uint64_stream(self.seed, "conversation", conversation, part, turn)
            return tuple(allowed[_below(next(draws), len(allowed))] for _ in range(n))

        specs: list[RequestSpec] = []
        for c in range(self.conversations):
            prompt = ids(c, "user", 0, self.first_input_len)
            for k in range(self.turns):
                if k:
                    prompt += ids(c, "reply", k - 1, self.output_len) + ids(c, "user", k, self.turn_input_len)
                turn = Turn(c, k, self.think_time_s if k else 0.0)
                specs.append(dataclasses.replace(_spec(len(specs), self.output_len, "completions", prompt, tok), turn=turn))
        return tuple(specs)


#: Suite files name kinds with these strings.
KINDS: dict[str, type[Workload]] = {
    cls.kind: cls
    for cls in (RandomWorkload, SharedPrefixWorkload, FixedWorkload, JsonlWorkload, TraceWorkload, ConversationWorkload)
}


def workload_from_dict(data: Mapping[str, Any], *, source: str) -> Workload:
    """A workload from a suite-file table: ``kind`` plus the dataclass fields (underscores).

    Errors are ValueErrors reading ``{source}: {key}: expected ..., got ...``.
    """
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"{source}: kind: expected one of {sorted(KINDS)}, got {kind!r}")
    table = schema.convert({k: v for k, v in data.items() if k != "kind"}, _TABLES[kind], lambda m: _table_error(m, kind, source))
    try:
        return KINDS[kind](**msgspec.structs.asdict(table))
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _table_shape(cls: type[Workload]) -> type[msgspec.Struct]:
    """The suite-file table of a kind (less ``kind``): its dataclass's fields, typed by their hints."""
    hints = typing.get_type_hints(cls)
    fields = [
        (f.name, hints[f.name]) if f.default is dataclasses.MISSING else (f.name, hints[f.name], f.default)
        for f in dataclasses.fields(cls)
    ]
    return msgspec.defstruct(f"{cls.__name__}Table", fields, bases=(schema.Shape,), kw_only=True)


_TABLES = {kind: _table_shape(cls) for kind, cls in KINDS.items()}


def _table_error(mismatch: schema.Mismatch, kind: str, source: str) -> ValueError:
    if mismatch.unknown_key:
        return ValueError(f"{source}: {mismatch.field}: unknown key for a {kind!r} workload; expected {mismatch.expected}")
    if mismatch.missing:
        return ValueError(f"{source}: {mismatch.field}: missing; a {kind!r} workload needs {mismatch.expected} here")
    return ValueError(f"{source}: {mismatch.text()}")


def length_range(mean: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive ``[low, high]`` for a length, exactly as vLLM's ``get_sampling_params``.

    That is ``floor(mean * (1 - r))`` and ``ceil(mean * (1 + r))`` on floats, float
    artefacts included (``length_range(100, 0.1) == (90, 111)``), so that the same
    arguments give the same range here and in ``vllm bench serve``.
    """
    return math.floor(mean * (1 - range_ratio)), math.ceil(mean * (1 + range_ratio))


# --------------------------------------------------------------------------- #
# Random draws
# --------------------------------------------------------------------------- #


def _uint64_stream(seed: int, *path: str | int) -> Iterator[int]:
    """Endless 64-bit integers determined by ``(seed, *path)`` alone.

    BLAKE2b (RFC 7693) over ``sha256(json([seed, *path])) || counter``: fully specified,
    so identical on every platform and Python version (unlike ``random``, whose only
    cross-version promise covers ``random()``, and numpy, whose Generator streams may
    change between releases). One stream per request also means request ``i`` does not
    depend on ``num_prompts``.
    """
    key = hashlib.sha256(json.dumps([seed, *path]).encode()).digest()
    for counter in itertools.count():
        block = hashlib.blake2b(key + counter.to_bytes(8, "little"), digest_size=64).digest()
        yield from struct.unpack("<8Q", block)


def _below(x: int, n: int) -> int:
    """Map a uniform 64-bit ``x`` to ``[0, n)`` by multiply-shift (bias below n / 2**64)."""
    return (x * n) >> 64


def _allowed_ids(tokenizer: PromptTokenizer) -> list[int]:
    return [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_ids]


def _distinct_start_sequences(
    allowed: list[int], count: int, length: int, seed: int, *path: str | int
) -> list[tuple[int, ...]]:
    """``count`` random sequences of ``length`` ids whose first ids are pairwise distinct."""
    sequences: list[tuple[int, ...]] = []
    firsts: set[int] = set()
    for k in range(count):
        draws = _uint64_stream(seed, *path, k)
        first = allowed[_below(next(draws), len(allowed))]
        while first in firsts:  # terminates: count <= len(allowed) was checked
            first = allowed[_below(next(draws), len(allowed))]
        firsts.add(first)
        rest = (allowed[_below(next(draws), len(allowed))] for _ in range(length - 1))
        sequences.append((first, *rest))
    return sequences


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def _spec(
    index: int, output_len: int, api: Api, prompt: tuple[int, ...] | str, tokenizer: PromptTokenizer | None
) -> RequestSpec:
    """A request for ``prompt`` (ids or text) on ``api``; chat gets one user message."""
    if api == "chat":
        if isinstance(prompt, str):
            text = prompt
        else:
            assert tokenizer is not None, "token-id prompts are drawn with a tokenizer"
            text = tokenizer.decode(prompt)
        return RequestSpec(index=index, max_tokens=output_len, api="chat", messages=(("user", text),))
    if isinstance(prompt, tuple):
        expected: int | None = len(prompt)
    else:
        expected = len(tokenizer.encode(prompt)) if tokenizer is not None else None
    return RequestSpec(index=index, max_tokens=output_len, prompt=prompt, expected_prompt_tokens=expected)


def _conversation(obj: dict[str, Any], where: str) -> tuple[str, str | None]:
    """(first user turn, first assistant reply after it or None) of a ShareGPT/messages line."""
    key, role_key, text_key = ("conversations", "from", "value") if "conversations" in obj else ("messages", "role", "content")
    turns = obj[key]
    if not isinstance(turns, list):
        raise ValueError(f"{where}: {key}: expected a list of turns, got {_short(turns)}")
    prompt: str | None = None
    for n, turn in enumerate(turns):
        if not (isinstance(turn, dict) and isinstance(turn.get(role_key), str) and isinstance(turn.get(text_key), str)):
            raise ValueError(
                f"{where}: {key}[{n}]: expected an object with string {role_key!r} and {text_key!r}, got {_short(turn)}"
            )
        role, text = turn[role_key], turn[text_key]
        if prompt is None and role in ("human", "user"):
            if not text:
                raise ValueError(f"{where}: {key}[{n}]: the first user turn is empty")
            prompt = text
        elif prompt is not None and role in ("gpt", "assistant"):
            return prompt, text
    if prompt is None:
        raise ValueError(f"{where}: {key}: expected a user turn ({role_key} 'human' or 'user'), found none")
    return prompt, None


def _check(ok: bool, field: str, expected: str, got: object) -> None:
    if not ok:
        raise ValueError(f"{field}: expected {expected}, got {got!r}")


def _check_positive(workload: Workload, *fields: str) -> None:
    for field in fields:
        value = getattr(workload, field)
        _check(value >= 1, field, "an integer >= 1", value)


def _check_api(api: str) -> None:
    _check(api in typing.get_args(Api), "api", f"one of {typing.get_args(Api)}", api)


def _with_api(base: str, api: Api) -> str:
    return f"{base}-chat" if api == "chat" else base


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

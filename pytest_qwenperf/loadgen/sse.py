"""Reading vLLM's streamed answers: token counts and timings out of its server-sent events,
without decoding their JSON where it can (the client's CPU per chunk is the instrument's error),
and the server's message out of an error's body."""

from __future__ import annotations

import json
from time import perf_counter
from typing import Any

_COMPLETION_TOKENS = b'"completion_tokens":'
_USAGE = b'"usage"'
_TEXT_KEYS = (b'"text":"', b'"content":"')


def _carries_text(event: bytes) -> bool:
    """Whether a chunk has a non-empty ``text`` (completions) or ``content`` (chat) string, read
    without decoding the JSON. A quote inside a JSON string is escaped, so ``"text":"`` can
    only be that key; the byte after it is the closing quote exactly when the text is empty."""
    for marker in _TEXT_KEYS:
        at = event.find(marker)
        if at >= 0:
            return event[at + len(marker) : at + len(marker) + 1] not in (b'"', b"")
    return False


class StreamParser:
    """Token accounting for one SSE response, fed its body bytes as they arrive.

    Every read is split into events (``data: ...\\n\\n``), all timed at the read. A
    chunk's token count is the step in its cumulative ``usage.completion_tokens`` when the
    server sends continuous usage (known from the first chunk with both usage and
    choices); otherwise each chunk whose choice has output counts as one, and the final
    usage chunk (no choices) only gives the totals. Chunks that carry no tokens (chat's
    role chunk, the final usage chunk) are not kept.

    Fast path without continuous usage: a chunk with no usage whose ``text`` (or chat
    ``content``) is a non-empty string carries one token (:func:`_carries_text`); anything
    else (empty text, reasoning or tool-call deltas, errors, the usage chunk) is decoded.
    Fast path, once usage is known to be continuous: the count is read without decoding
    the JSON. ``"completion_tokens":`` can only occur in valid JSON as that key, unless
    its quote is escaped (preceded by a backslash): inside a string every quote is
    ``\\"``, and a string *ending* right before ``completion_tokens`` would leave bare
    text. vLLM sends the key once, in ``usage``, after the choices; so the last
    occurrence, not after a backslash and followed by digits and ``}``, is the cumulative
    count. Anything else (the first usage, no usage, an error event, a backslash, other
    layouts) goes through ``json.loads``, which costs ten times more.
    """

    __slots__ = ("_continuous", "_rest", "_seen", "_usage", "error", "times", "tokens")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.error: str | None = None
        self._seen = 0  # completion tokens attributed to chunks so far
        self._continuous = False  # a chunk with choices carried usage: every chunk does
        self._usage = b""  # the last event that carried usage
        self._rest = b""  # an incomplete event, waiting for the rest of its bytes

    def feed(self, data: bytes, now: float) -> None:
        if self._rest:
            data = self._rest + data
        events = data.split(b"\n\n")
        self._rest = events.pop()
        tokens = self.tokens
        before, seen = len(tokens), self._seen
        for event in events:
            head, key, tail = event.rpartition(_COMPLETION_TOKENS)
            if key and self._continuous and head[-1:] != b"\\" and (digits := tail.partition(b"}")[0]).isdigit():
                n = int(digits) - seen
                if n > 0:
                    seen += n
                    tokens.append(n)
                self._usage = event
            elif not key and not self._continuous and _USAGE not in event and _carries_text(event):
                seen += 1
                tokens.append(1)
            else:
                self._seen = seen
                self._slow(event)
                seen = self._seen
        self._seen = seen
        self.times += [now] * (len(tokens) - before)

    def _slow(self, event: bytes) -> None:
        if not event.startswith(b"data:"):  # SSE comments (": ping") and other fields
            return
        payload = event[5:].strip()
        if payload == b"[DONE]":
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            self.error = error_message(chunk)
            return
        usage, choices = chunk.get("usage"), chunk.get("choices")
        if usage:
            self._usage = event
            self._continuous = self._continuous or bool(choices)
        if usage and self._continuous:
            n = (usage.get("completion_tokens") or 0) - self._seen
        elif choices and _has_output(choices[0]):
            n = 1
        else:
            return
        if n > 0:
            self._seen += n
            self.tokens.append(n)

    def seen(self) -> tuple[int, int]:
        """``(prompt_tokens, completion_tokens)`` of the chunks read so far, of a stream cut before its
        end: the prompt from the last usage read (0: none yet), the completion tokens counted."""
        prompt = self._last_usage().get("prompt_tokens") or 0 if self._usage else 0
        return prompt, self._seen if self._continuous else sum(self.tokens)

    def _last_usage(self) -> dict[str, Any]:
        """The ``usage`` of the last event that carried one (there must be one)."""
        usage: dict[str, Any] = json.loads(self._usage[self._usage.find(b"{") :])["usage"]
        return usage

    def finish(self) -> tuple[int, int]:
        """``(prompt_tokens, completion_tokens)`` from the last usage; sets ``error`` if there was none."""
        if self._rest.strip():  # a last event without its blank line: complete at the end of the stream
            self.feed(b"\n\n", perf_counter())
        if not self._usage:
            self.error = self.error or "stream ended without usage"
            return 0, 0
        usage = self._last_usage()
        return usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0


def _has_output(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice carries generated output (completions text or a chat delta)."""
    if choice.get("text"):
        return True
    delta = choice.get("delta") or {}
    return any(delta.get(key) for key in ("content", "reasoning", "reasoning_content", "tool_calls"))


def error_message(body: Any) -> str:
    """The server's message from vLLM's ``{"error": {"message"}}``, ``{"message"}`` or FastAPI's ``{"detail"}``."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, str):
            return inner
        if isinstance(inner, dict):
            for key in ("message", "detail"):
                if key in inner:
                    value = inner[key]
                    return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(body)


def http_error(status: int | None, body: bytes) -> str:
    try:
        return error_message(json.loads(body))
    except ValueError:
        return body.decode(errors="replace").strip() or f"HTTP {status}"

"""One request to send, as data: what workloads produce and the client consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["completions", "chat"]


@dataclass(frozen=True)
class Turn:
    """Where a request stands in a conversation: its ``number`` (0 opens it) in ``conversation``.

    The client sends turn ``number + 1`` of a conversation only once turn ``number`` has finished,
    ``think_s`` after its end (a user reading the reply and typing the next message), and sends no
    later turn after one that failed: its prompt would extend a reply that never came.
    """

    conversation: int
    number: int
    think_s: float = 0.0


@dataclass(frozen=True)
class RequestSpec:
    """A request, independent of endpoint and model so the same workload runs anywhere.

    Completions prompts are token ids when exact input length matters (a list of ids
    is a valid ``prompt`` for vLLM's ``/v1/completions``), text otherwise. Chat
    requests carry ``messages`` as (role, content) pairs.
    """

    index: int
    max_tokens: int
    api: Api = "completions"
    prompt: tuple[int, ...] | str = ""
    messages: tuple[tuple[str, str], ...] = ()
    ignore_eos: bool = True
    expected_prompt_tokens: int | None = None  # known when the prompt is token ids
    sampling: tuple[tuple[str, Any], ...] = (("temperature", 0.0),)
    at: float | None = None  # a traced request's send time, seconds from the trace's start (``Replay`` sends it then)
    turn: Turn | None = None  # a turn of a conversation; None: a request on its own

    def body(self, model: str, *, continuous_usage: bool = False) -> dict[str, Any]:
        """The JSON body for ``model``, always streamed with usage included."""
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": continuous_usage},
            **dict(self.sampling),
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.api == "chat":
            body["messages"] = [{"role": role, "content": content} for role, content in self.messages]
        else:
            body["prompt"] = list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt
        return body

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

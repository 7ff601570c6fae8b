"""One request to send, as data: what workloads produce and the client consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["completions", "chat"]


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

"""What the load generator observed, per request: the one data type between loadgen and metrics.

Times are ``time.perf_counter()`` seconds of the process that measured them; a run's
records are only ever compared with each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it.

    ``chunk_times[i]`` is when the i-th streamed chunk that carried output tokens
    arrived and ``chunk_tokens[i]`` how many tokens it carried (several under
    speculative decoding or ``--stream-interval``). Token totals come from the
    server's ``usage``, never from counting chunks.
    """

    index: int  # position in the workload's request sequence
    endpoint: str
    scheduled_at: float  # when the arrival process wanted it sent (== sent_at in closed loop)
    sent_at: float
    ended_at: float
    chunk_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    prompt_tokens: int = 0  # usage.prompt_tokens
    completion_tokens: int = 0  # usage.completion_tokens
    expected_output_tokens: int | None = None  # max_tokens when ignore_eos: anything less is truncated
    expected_prompt_tokens: int | None = None  # the ids sent when the prompt is token ids: usage must say as many
    status: int | None = None  # HTTP status; None when no response arrived
    error: str | None = None
    warmup: bool = False
    # sent after its window closed and cut once the window was measured (core.window), or in flight
    # when its run was stopped (loadgen.requester.Stop): not a failure
    cut: bool = False

    @property
    def first_token_at(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def ok(self) -> bool:
        """Delivered in full: HTTP 200, no error, usage reported and not truncated."""
        return (
            self.error is None
            and self.status == 200
            and self.completion_tokens > 0
            and (self.expected_output_tokens is None or self.completion_tokens == self.expected_output_tokens)
        )

    @property
    def scheduling_lag(self) -> float:
        """How late the client sent the request compared with its schedule (client-bound signal)."""
        return self.sent_at - self.scheduled_at

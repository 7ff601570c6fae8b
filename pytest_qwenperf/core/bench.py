"""The result of ``qwenperf bench``: one typed record, which the command writes and ``qwenperf
compare`` and the history store read back (schema :data:`~pytest_qwenperf.core.formats.BENCH_SCHEMA`).

Identity (what was measured) and context (where, which versions) come first, then the metrics
under ``vllm bench serve``'s names and the blocks a session's run has (server counters, the token
check, the client, telemetry, the conditions that make it invalid); ``requests`` only with
``--detailed``. Reading is lenient where older files lack a block (its default); writing fills all.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.formats import BENCH_SCHEMA
from pytest_qwenperf.core.identity import Text
from pytest_qwenperf.core.profile import OperatorProfile
from pytest_qwenperf.core.run import ClientLoad, Loss, Number, ServerCounters, TokenCheck, TraceReplay, WorkerClock


class BenchIdentity(msgspec.Struct, frozen=True, kw_only=True):
    model: Text
    workload: Text
    workload_fingerprint: Text
    arrival: Text  # the arrival as the load generator names it: ClosedLoop(concurrency=8)
    warmup: int = 0
    endpoints: tuple[str, ...] = ()


class BenchContext(msgspec.Struct, frozen=True, kw_only=True):
    vllm_version: str | None = None
    qwenperf_version: str | None = None
    servers: tuple[dict[str, Any], ...] = ()  # ``ServerInfo.as_dict()`` per endpoint
    client_cpus: tuple[tuple[int, ...], ...] = ()  # per client process
    workers: int = 1
    worker_clocks: tuple[WorkerClock, ...] = ()  # client workers on a Ray cluster's nodes, with their clocks against the driver's
    started: str | None = None  # ISO 8601, UTC
    host: str | None = None
    environment: Environment | None = None


class BenchServer(msgspec.Struct, frozen=True, kw_only=True):
    deltas: dict[str, float | None] = msgspec.field(default_factory=dict)

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        return ServerCounters.of(self.deltas).prefix_cache_hit_rate


class FailureReason(msgspec.Struct, frozen=True, kw_only=True):
    """Measured requests that failed the same way."""

    kind: str  # "HTTP 500", or the exception's type when no response came ("ConnectionRefusedError")
    message: str  # the server's own message, or the exception's, on one line and trimmed
    count: int


class BenchFailures(msgspec.Struct, frozen=True, kw_only=True):
    fraction: float | None = None  # of the measured requests; None when none was measured
    max_fraction: float = 0.0  # what --max-failed-fraction allowed
    reasons: tuple[FailureReason, ...] = ()


class BenchRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One measured request (``--detailed``); times in seconds from the measured phase's start."""

    index: int
    endpoint: str
    start: float
    end: float
    ttft_ms: float | None
    itl_ms: tuple[float, ...]
    input_tokens: int | None
    output_tokens: int | None
    status: int | None
    error: str | None
    ok: bool


class BenchResult(msgspec.Struct, frozen=True, kw_only=True):
    schema: str = BENCH_SCHEMA
    identity: BenchIdentity
    context: BenchContext
    metrics: dict[str, Number]
    steady_state: dict[str, Number] | None = None
    server: BenchServer = msgspec.field(default_factory=BenchServer)
    token_check: TokenCheck
    failures: BenchFailures = msgspec.field(default_factory=BenchFailures)
    client: ClientLoad
    telemetry: dict[str, Any] | None = None
    conditions: tuple[Loss, ...] = ()
    requests: tuple[BenchRequest, ...] | None = None
    profile: OperatorProfile | None = None  # ``--profile``: operators by self time in one more, unmeasured run
    trace: TraceReplay | None = None  # a trace's replay: what it is held against

    @property
    def failed_requests(self) -> int:
        return int(self.metrics.get("failed") or 0)

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        return self.server.prefix_cache_hit_rate

    def as_json(self) -> dict[str, Any]:
        """The file's document: every block, ``requests`` only when the result has them."""
        document: dict[str, Any] = msgspec.to_builtins(self)
        if self.requests is None:
            del document["requests"]
        return document

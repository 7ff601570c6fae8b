"""The bench record of a load run against running servers: what ``qwenperf bench`` writes
(:class:`~pytest_qwenperf.core.bench.BenchResult`), built from what it planned and what it saw."""

from __future__ import annotations

import importlib.metadata
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from pytest_qwenperf.core.bench import (
    BenchContext,
    BenchFailures,
    BenchIdentity,
    BenchRequest,
    BenchResult,
    BenchServer,
    FailureReason,
)
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import ClientLoad, TokenCheck, TraceReplay
from pytest_qwenperf.core.summary import GoodputSLO, inter_token_latencies
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.core.window import windowed_fingerprint
from pytest_qwenperf.loadgen.arrivals import Arrival, Replay
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.measure.observe import ClientSetup, Observation
from pytest_qwenperf.measure.validity import conditions
from pytest_qwenperf.serving.server import ServerInfo
from pytest_qwenperf.suite.workloads import TraceWorkload, Workload, trace_replay

_MESSAGE_CHARS = 160  # a failure message is cut to this many characters


@dataclass(frozen=True)
class BenchPlan:
    """Everything a run needs, resolved and checked."""

    servers: tuple[ServerInfo, ...]
    workload: Workload
    requests: tuple[RequestSpec, ...]
    arrival: Arrival
    options: LoadOptions
    slo: GoodputSLO | None
    client: ClientSetup  # where the load generator runs: its cores, its processes, a Ray cluster


def failure_reasons(records: Iterable[RequestRecord]) -> tuple[FailureReason, ...]:
    """The measured requests that failed, grouped by how (status or exception, and message), most frequent first."""
    counts = Counter(_failure(record) for record in records if not record.warmup and not record.ok)
    return tuple(FailureReason(kind=kind, message=message, count=count) for (kind, message), count in counts.most_common())


def _failure(record: RequestRecord) -> tuple[str, str]:
    if record.status is None:  # no response: the client wrote "ExceptionType: message"
        kind, _, message = (record.error or "no response").partition(": ")
    elif record.error is not None:
        kind, message = f"HTTP {record.status}", record.error
    elif record.expected_output_tokens is None:
        kind, message = f"HTTP {record.status}", "no output tokens in usage"
    else:
        kind, message = f"HTTP {record.status}", f"{record.completion_tokens} of {record.expected_output_tokens} output tokens"
    message = " ".join(message.split())
    return kind, message if len(message) <= _MESSAGE_CHARS else message[: _MESSAGE_CHARS - 3] + "..."


def bench_result(plan: BenchPlan, seen: Observation, *, detailed: bool, max_failed_fraction: float = 0.0) -> BenchResult:
    """Identity (what was measured), context (where, which versions), then the metrics under vLLM's key names."""
    values = seen.summary.values()
    measured = int(values["completed"]) + int(values["failed"])
    origin = seen.load.started_at
    return BenchResult(
        identity=BenchIdentity(
            model=plan.servers[0].model,
            workload=plan.workload.id,
            workload_fingerprint=windowed_fingerprint(plan.workload.fingerprint(), plan.options.window),
            arrival=repr(plan.arrival),
            warmup=plan.options.warmup,
            endpoints=tuple(s.base_url for s in plan.servers),
        ),
        context=BenchContext(
            vllm_version=plan.servers[0].version,
            qwenperf_version=importlib.metadata.version("pytest-qwenperf"),
            servers=tuple(s.as_dict() for s in plan.servers),
            client_cpus=seen.load.client_cpus,
            workers=plan.client.workers,
            worker_clocks=seen.load.clocks,
            started=seen.started,
            host=os.uname().nodename,
            environment=plan.servers[0].environment,
        ),
        metrics=dict(values),
        steady_state=dict(seen.steady.values()) if seen.steady else None,
        server=BenchServer(deltas=dict(seen.server_deltas)),
        token_check=TokenCheck(matches=seen.tokens.matches, detail=seen.tokens.describe()),
        failures=BenchFailures(
            fraction=int(values["failed"]) / measured if measured else None,
            max_fraction=max_failed_fraction,
            reasons=failure_reasons(seen.load.records),
        ),
        client=ClientLoad(bound=seen.client_bound, cpu_busy=seen.client_cpu_busy),
        telemetry=seen.telemetry.as_json(),
        conditions=conditions(seen.telemetry, ValidityLimits()) + seen.record_losses(),
        requests=tuple(_request(r, origin) for r in seen.load.records if not r.warmup) if detailed else None,
        trace=_trace(plan),
    )


def _trace(plan: BenchPlan) -> TraceReplay | None:
    """What a trace's replay is held against, as in a suite's run; None for the other workloads."""
    if not isinstance(plan.workload, TraceWorkload):
        return None
    return trace_replay(plan.workload, plan.arrival.time_scale if isinstance(plan.arrival, Replay) else None, plan.servers[0].kv_block)


def _request(record: RequestRecord, origin: float) -> BenchRequest:
    first = record.first_token_at
    return BenchRequest(
        index=record.index,
        endpoint=record.endpoint,
        start=record.sent_at - origin,
        end=record.ended_at - origin,
        ttft_ms=(first - record.sent_at) * 1000 if first is not None else None,
        itl_ms=tuple(gap * 1000 for gap in inter_token_latencies(record)),
        input_tokens=record.prompt_tokens,
        output_tokens=record.completion_tokens,
        status=record.status,
        error=record.error,
        ok=record.ok,
    )

"""How many client cores a load needs: the client's CPU per request and per streamed chunk, as
measured (``benchmarks/client_capacity.py``), times the load's requests and chunks per second.

The figure to size by is the *paced* one: a real server sends each chunk of a stream in its own
read, so every chunk costs its own read and parse (12.7 µs here), where chunks arriving
back to back cost a tenth of it. A client core is given at most :data:`BUSY_CAP` of its time:
past it, the event loop's latency to a chunk grows and the times it records drift from the
server's (``benchmarks/README.md``, "Client cores per target").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BUSY_CAP = 0.5
"""The most of a core one client worker is planned to use."""


@dataclass(frozen=True)
class ClientCost:
    """CPU seconds the client spends per request (its body, headers, first chunk and record) and per
    streamed chunk read on its own, and where that was measured."""

    per_request_s: float = 144e-6
    per_chunk_s: float = 12.7e-6
    measured: str = "benchmarks/README.md, 'Client cores per target': paced chunks, one 2-vCPU AMD EPYC core, 2026-11-27"


@dataclass(frozen=True)
class Need:
    """A load's rates and the client cores they take at a :class:`ClientCost`."""

    requests_per_s: float
    chunks_per_s: float
    busy_cores: float  # CPU-seconds per second
    workers: int  # client worker processes, one a core, each at most BUSY_CAP busy
    cost: ClientCost

    def nodes(self, cores_per_node: int) -> int:
        """Client machines of ``cores_per_node`` cores that hold :attr:`workers` (one worker a core)."""
        return math.ceil(self.workers / cores_per_node)

    def lines(self, cores_per_node: int | None = None) -> list[str]:
        """The plan in words: what it rests on, the busy cores, the workers and, given their size, the machines."""
        cost = self.cost
        found = [
            f"load: {self.requests_per_s:,.1f} requests/s, {self.chunks_per_s:,.0f} streamed chunks/s",
            f"client CPU: {cost.per_request_s * 1e6:.0f} µs a request + {cost.per_chunk_s * 1e6:.1f} µs a chunk ({cost.measured})",
            f"busy client cores: {self.busy_cores:.2f}",
            f"client workers: {self.workers} (one a core, each at most {BUSY_CAP:.0%} busy)",
        ]
        if cores_per_node is not None:
            found.append(f"client machines of {cores_per_node} cores: {self.nodes(cores_per_node)}")
        return found


def need(requests_per_s: float, output_tokens: float, tokens_per_chunk: float = 1.0, cost: ClientCost = ClientCost()) -> Need:
    """The client a load of ``requests_per_s`` needs, each request streaming ``output_tokens`` tokens
    (a mean) ``tokens_per_chunk`` at a time (above 1 under speculative decoding)."""
    if requests_per_s < 0 or output_tokens < 0:
        raise ValueError(f"a load has a rate and output lengths >= 0, got {requests_per_s} requests/s of {output_tokens} tokens")
    if tokens_per_chunk < 1:
        raise ValueError(f"tokens_per_chunk: expected at least 1, got {tokens_per_chunk}")
    chunks = requests_per_s * math.ceil(output_tokens / tokens_per_chunk)
    busy = requests_per_s * cost.per_request_s + chunks * cost.per_chunk_s
    return Need(requests_per_s, chunks, busy, max(1, math.ceil(busy / BUSY_CAP)), cost)

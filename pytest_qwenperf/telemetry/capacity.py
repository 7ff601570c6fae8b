"""KV-cache capacity as a vLLM server reports it while booting.

How many tokens fit in the KV cache bounds the batch the scheduler can run, so a release
that leaves less room for the cache (bigger activations, a new default for
``--gpu-memory-utilization``) can cost throughput without any kernel getting slower. The
capacity is only logged, in one of these forms::

    (EngineCore_DP0 pid=4242) INFO ... GPU KV cache size: 1,234,567 tokens, Maximum concurrency for 4,096 tokens per request: 301.41x
    (EngineCore pid=4242) INFO ... CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x
    INFO ... GPU KV cache size: 1,234,567 tokens          (older releases: two lines)
    INFO ... Maximum concurrency for 4,096 tokens per request: 301.41x

Every data-parallel engine logs its own pool; those are summed. A process that logs more
than once (older releases logged once per worker) counts once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_SIZE = re.compile(r"KV cache size: (?P<tokens>[\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for (?P<context>[\d,]+) tokens per request: (?P<times>[\d.]+)x")
_PROCESS = re.compile(r"^\((?P<process>[^)]*pid=\d+)\)")


@dataclass(frozen=True)
class KvCapacity:
    """Tokens the KV cache holds, and how many requests of ``context_len`` tokens fit at once."""

    tokens: int
    max_concurrency: float | None
    context_len: int | None  # the max-model-len the concurrency is stated for
    engines: int = 1

    def as_json(self) -> dict[str, object]:
        return {
            "tokens": self.tokens,
            "max_concurrency": self.max_concurrency,
            "context_len": self.context_len,
            "engines": self.engines,
        }


def combine_capacities(parts: Iterable[KvCapacity]) -> KvCapacity | None:
    """Capacity of several engines or replicas together; None when there is none."""
    parts = list(parts)
    if not parts:
        return None
    concurrency = [p.max_concurrency for p in parts]
    return KvCapacity(
        tokens=sum(p.tokens for p in parts),
        max_concurrency=None if None in concurrency else sum(c for c in concurrency if c is not None),
        context_len=parts[0].context_len,
        engines=sum(p.engines for p in parts),
    )


def parse_kv_capacity(lines: Iterable[str]) -> KvCapacity | None:
    """The capacity a boot log states, summed over the engine processes that state one."""
    tokens: dict[str, int] = {}
    concurrency: dict[str, tuple[int, float]] = {}
    for line in lines:
        size, times = _SIZE.search(line), _CONCURRENCY.search(line)
        if not size and not times:
            continue
        process = _PROCESS.match(line)
        key = process.group("process") if process else ""
        if size:
            tokens[key] = _int(size.group("tokens"))
        if times:
            concurrency[key] = (_int(times.group("context")), float(times.group("times")))
    return combine_capacities(
        KvCapacity(
            tokens=count,
            max_concurrency=concurrency[key][1] if key in concurrency else None,
            context_len=concurrency[key][0] if key in concurrency else None,
        )
        for key, count in tokens.items()
    )


def read_kv_capacity(log_path: Path) -> KvCapacity | None:
    """:func:`parse_kv_capacity` of a log file; None when it cannot be read."""
    try:
        with open(log_path, errors="replace") as log:
            return parse_kv_capacity(log)
    except OSError:
        return None


def _int(text: str) -> int:
    return int(text.replace(",", ""))

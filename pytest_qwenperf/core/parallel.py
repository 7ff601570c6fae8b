"""How many GPUs one vLLM server uses, read from its argv: tensor × pipeline × (internal) data
parallel size. The placement of replicas (``serving.replicas``), the per-device figures of the
Pareto view (``gate.pareto``) and the llm-d report's accelerator block (``gate.llmd_report``) read
it, so it lives here, below them all."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pytest_qwenperf.core.formats import show

_PARALLEL = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
}

MISSING_VALUE = "nothing (the flag is last)"


def gpus_per_server(argv: Sequence[str]) -> int:
    """TP × PP × DP from a vLLM argv (:func:`parallel_sizes`)."""
    return math.prod(parallel_sizes(argv).values())


def parallel_sizes(argv: Sequence[str]) -> dict[str, int]:
    """``tp``, ``pp`` and ``dp`` sizes from a vLLM argv (``--flag N`` or ``--flag=N``, ``_`` or ``-``
    in long flags; 1 where absent); ValueError naming the flag and its value when one is not a whole
    number >= 1."""
    sizes = dict.fromkeys(("tp", "pp", "dp"), 1)
    for i, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        flag = _spelled(flag)
        if flag not in _PARALLEL:
            continue
        if not equals:
            value = argv[i + 1] if i + 1 < len(argv) else MISSING_VALUE
        if not (value.isascii() and value.isdigit() and int(value) >= 1):
            got = value if value is MISSING_VALUE else show(value)
            raise ValueError(f"{flag}: expected a whole number of 1 or more, got {got}")
        sizes[_PARALLEL[flag]] = int(value)
    return sizes


_EXPERT = {"--enable-expert-parallel": True, "-ep": True, "--no-enable-expert-parallel": False}


def expert_parallel(argv: Sequence[str]) -> bool:
    """Whether a vLLM argv turns expert parallelism on (``--enable-expert-parallel``/``-ep``, the last
    of them and ``--no-enable-expert-parallel`` winning); vLLM then spreads the experts over TP × DP."""
    found = [_EXPERT[flag] for flag in map(_spelled, argv) if flag in _EXPERT]
    return found[-1] if found else False


def _spelled(flag: str) -> str:
    """A flag as vLLM's parser knows it: ``_`` in a long flag read as ``-``."""
    return flag.replace("_", "-") if flag.startswith("--") else flag

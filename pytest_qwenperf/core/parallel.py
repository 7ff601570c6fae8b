"""How many GPUs one vLLM server uses, read from its argv: tensor × pipeline × (internal) data
parallel size. Both the placement of replicas (``serving.replicas``) and the per-device figures
of the Pareto view (``gate.pareto``) read it, so it lives here, below both."""

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
    """TP × PP × DP from a vLLM argv (``--flag N`` or ``--flag=N``, ``_`` or ``-`` in long flags; 1
    where absent); ValueError naming the flag and its value when one is not a whole number >= 1."""
    sizes = dict.fromkeys(("tp", "pp", "dp"), 1)
    for i, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        flag = flag if not flag.startswith("--") else flag.replace("_", "-")
        if flag not in _PARALLEL:
            continue
        if not equals:
            value = argv[i + 1] if i + 1 < len(argv) else MISSING_VALUE
        if not (value.isascii() and value.isdigit() and int(value) >= 1):
            got = value if value is MISSING_VALUE else show(value)
            raise ValueError(f"{flag}: expected a whole number of 1 or more, got {got}")
        sizes[_PARALLEL[flag]] = int(value)
    return math.prod(sizes.values())

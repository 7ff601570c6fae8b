"""What a load run did over time, kept in its run for the report's charts: every quantity on one
time axis (seconds from the run's first send, warm-up included) in equal bins, with the
steady-state window the run's figures were cut to. Built from a run's records and samples by
:func:`pytest_qwenperf.measure.timeline.timeline`; this module is only its shape, so that the gate
reads a run without importing what builds it.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

MAX_BINS = 240
MIN_BIN_S = 0.25
SIGNIFICANT = 4
"""Digits a value keeps: a chart needs no more, and the run's JSON stays small."""

SERIES: Mapping[str, str] = {
    "output_tok_s": "output tok/s",
    "in_flight": "client requests in flight",
    "running": "requests running (server)",
    "waiting": "requests waiting (server)",
    "kv_cache_usage": "KV-cache usage (fraction)",
    "gpu_utilization": "GPU utilization (fraction, mean of GPUs)",
    "sm_activity": "SM activity (fraction, mean of GPUs)",
    "power_w": "power per GPU (W)",
    "server_cpu_cores": "server CPU (cores busy)",
}
"""Every quantity a timeline may hold -> what it is, in its unit."""


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """A run over time: bin ``i`` covers seconds ``[i * bin_s, (i + 1) * bin_s)`` from the first send."""

    bin_s: float
    window: tuple[float, float] | None  # the steady state, seconds from the first send; None: the run had none
    series: dict[str, tuple[float | None, ...]]  # a name of SERIES -> its value per bin

    def times(self) -> tuple[float, ...]:
        """Each bin's middle, in seconds from the first send."""
        bins = max((len(values) for values in self.series.values()), default=0)
        return tuple((i + 0.5) * self.bin_s for i in range(bins))

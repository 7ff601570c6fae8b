"""When requests are sent: a closed loop (fixed concurrency) or an open loop (an arrival process).

A run sends the workload's requests in order and stops at the end of the workload or,
when ``duration_s`` is given to the client, once that much time has passed (requests in
flight then complete and count). Warm-up requests always go as a closed loop first, see
:func:`warmup_concurrency`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Distribution = Literal["poisson", "constant", "gamma"]


@dataclass(frozen=True)
class ClosedLoop:
    """Keep ``concurrency`` requests in flight: each finished request is replaced at once.

    Records have ``scheduled_at == sent_at``: a closed loop has no schedule to fall behind.
    """

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")


@dataclass(frozen=True)
class OpenLoop:
    """Send at ``rate`` requests/s regardless of completions, like ``vllm bench serve``.

    Inter-arrival times are gamma distributed with shape ``burstiness`` and mean ``1/rate``
    (``poisson`` is burstiness 1, ``constant`` is exactly ``1/rate``). ``max_concurrency``
    caps requests in flight; a request held back by it is sent late, which its record
    shows as scheduling lag.
    """

    rate: float
    distribution: Distribution = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.distribution not in ("poisson", "constant", "gamma"):
            raise ValueError(f"unknown distribution {self.distribution!r}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be positive, got {self.burstiness}")
        if self.distribution != "gamma" and self.burstiness != 1.0:
            raise ValueError("burstiness applies to distribution='gamma' only")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")

    def offsets(self, n: int) -> list[float]:
        """Send times of ``n`` requests, in seconds from the start; the same for the same arguments.

        As in ``vllm bench serve``, the random gaps are rescaled so the last request goes
        at exactly ``n / rate``: throughput then does not depend on the seed's luck.
        """
        if n == 0:
            return []
        if self.distribution == "constant":
            return [(i + 1) / self.rate for i in range(n)]
        rng = np.random.default_rng(self.seed)
        times = np.cumsum(rng.gamma(shape=self.burstiness, scale=1.0 / (self.rate * self.burstiness), size=n))
        return (times * (n / self.rate / times[-1])).tolist()


Arrival = ClosedLoop | OpenLoop


def warmup_concurrency(arrival: Arrival, warmup: int) -> int:
    """Concurrency of the warm-up phase: the closed loop's own, else the open loop's cap.

    An uncapped open loop warms up with all ``warmup`` requests at once, which opens as
    many connections as the measured phase is likely to need.
    """
    if isinstance(arrival, ClosedLoop):
        return arrival.concurrency
    return arrival.max_concurrency or max(warmup, 1)

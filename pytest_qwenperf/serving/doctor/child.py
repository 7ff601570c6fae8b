"""``python -m pytest_qwenperf.serving.doctor.child SECONDS``: the doctor's CUDA child.

It holds memory on every GPU it sees (so that NVML has a process of ours to list), runs bf16
matrix products of 8192 x 8192 on all of them for SECONDS, then keeps the memory until it is
stopped. It says where it is on stdout, one line each: ``ready`` (memory held, the load
starts), ``done`` (the load ended), or ``unavailable: <why>`` (no torch, or torch without
CUDA), after which it exits. On an H200 (driver 580.159.04) the products ran at 662 TFLOP/s:
utilization 99.95 %, SM activity 96.4 %, tensor activity 93.6 %, 691 W of the 700 W limit.
"""

from __future__ import annotations

import sys
import time
from typing import Any

SIZE = 8192
PRODUCTS_PER_SYNC = 10
"""Products queued on each GPU between synchronisations (~17 ms of work on an H200): the GPUs never
wait for Python, and a stop is never more than that far away."""
HOLD_S = 3600.0
"""After the load: how long the memory is held at most (the doctor stops the child long before)."""


def main(argv: list[str]) -> int:
    seconds = float(argv[0])
    try:
        import torch
    except ImportError:
        print("unavailable: torch is not installed", flush=True)
        return 0
    if not torch.cuda.is_available():
        print(f"unavailable: torch {torch.__version__} sees no CUDA device", flush=True)
        return 0
    operands = []
    for index in range(torch.cuda.device_count()):
        a, b = (torch.randn(SIZE, SIZE, dtype=torch.bfloat16, device=f"cuda:{index}") for _ in range(2))
        operands.append((a, b, torch.empty_like(a)))
    _synchronize(torch)
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(PRODUCTS_PER_SYNC):
            for a, b, product in operands:
                torch.mm(a, b, out=product)
        _synchronize(torch)
    print("done", flush=True)
    time.sleep(HOLD_S)
    return 0


def _synchronize(torch: Any) -> None:
    for index in range(torch.cuda.device_count()):
        torch.cuda.synchronize(index)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

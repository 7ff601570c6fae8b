"""When a run's conditions were wrong: the limits past which its numbers are no verdict on vLLM.

A run measures vLLM only if the device it ran on was the device it claims: a GPU held back
by a thermal, power-cap or hardware slowdown, a GPU that logged an XID or an uncorrected ECC
error, a GPU another process held memory on, or CPU cores another busy process (or the
hypervisor, as steal time) took from the server, make a slower run a fact about the machine.
Such a run is judged ``invalid: <reason>``, never ``pass`` or ``regression``.

The limits are shares of the run's steady-state window, set per suite (``[suite.validity]``)
because what is normal differs: a shared VM reports some steal time, a GPU some brief
slowdowns. A GPU at its own (default) power limit is not held back by it, however often it
reports ``sw_power_cap``. An XID, an uncorrected ECC error or another
process's memory on the config's GPU has no share: once is enough.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from pytest_qwenperf.core.schema import Shape

Share = Annotated[float, msgspec.Meta(ge=0, le=1, description="a fraction in [0, 1]")]

POWER_CAP = "sw_power_cap"
CLOCK_EVENTS = (POWER_CAP, "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
"""The clock-event reasons that hold a GPU below the clocks it would run at (NVML's names):
power caps, thermal and hardware slowdowns. Idle, application-clock, sync-boost and display
settings are not a machine fault. The power cap is one only on a GPU whose power limit was
lowered below its default: at its own limit a GPU under full load reports it all the time
(an H200 at 700 W: every sample of a matrix-product load, benchmarks/README.md)."""

CONTENDED_CORES = 0.25
"""An interval counts as contended when other processes kept this many of the server's cores busy
while the cores had no more than this left idle: they took time the server could have used. A
busy process sharing one core takes about half of it; daemons take a few percent; on cores with
room to spare (a GPU server's API processes on a host of many cores) others slow nothing."""


RETAKEN = frozenset({"cpu-contention", "cpu-steal"})
"""Conditions the machine's other load causes, neither the server nor the device: a load run that
had only these is measured again (``ValidityLimits.retakes`` times at most), since a later one may find the
machine quiet. A runner's cron job, a log shipper or a neighbour's VM spoiling a few seconds of one
load run of many (19 % of one run's steady state in 1 of 6, on a fresh CI runner) then costs a
load run, not a night's verdict. How many times: ``ValidityLimits.retakes``. A GPU's slowdowns and errors are the device's: no retake hides them."""


class ValidityLimits(Shape, frozen=True, kw_only=True):
    """The most of a run's steady-state window each condition may cover before the run is invalid."""

    # Samples of any GPU held back by a CLOCK_EVENTS reason (the power cap only below the default
    # limit). A real H200 read 0 % under 15 s of full load and at idle (benchmarks/README.md, "GPU path,
    # measured"); 10 % leaves room for brief slowdowns that reading did not show.
    clock_event_share: Share = 0.10
    contended_share: Share = 0.10  # intervals in which other processes took CONTENDED_CORES of the server's full cores
    steal_share: Share = 0.10  # the server's cores' time the hypervisor gave to someone else
    retakes: Annotated[int, msgspec.Meta(ge=0, le=10)] = 2  # times a load run spoiled only by the machine's other load (RETAKEN) is measured again

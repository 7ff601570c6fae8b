"""What a doctor run checks: one frozen value, built by the CLI (or a test) and passed whole."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.suite.config import Suite

CUDA_CHILD = (sys.executable, "-m", "pytest_qwenperf.serving.doctor.child")
"""The process that holds memory and runs the load on every GPU (:mod:`.child`); the load's seconds are appended."""


@dataclass(frozen=True)
class DoctorOptions:
    """``suite``: the suite the machine is to run (None: the checks that need none);
    ``load_seconds``: the short load on every GPU (0: none, only the PID visibility);
    ``child``: the argv of the CUDA child (tests give a plain-Python one that speaks its protocol)."""

    suite: Suite | None = None
    load_seconds: float = 15.0
    child: tuple[str, ...] = CUDA_CHILD

    @property
    def limits(self) -> ValidityLimits:
        """The suite's validity limits, which the doctor's figures are held to (the defaults without a suite)."""
        return self.suite.validity if self.suite else ValidityLimits()

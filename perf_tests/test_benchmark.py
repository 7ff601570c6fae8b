"""Every load run as a pytest-benchmark entry, so ``--benchmark-autosave``, ``--benchmark-compare``
and ``pytest-benchmark compare`` track it across vLLM versions (seconds per million tokens):
one round per repeat of the run, so its statistics are the run-to-run spread. Its terminal table
names that unit in each group's heading (``cpu/base: seconds per million total tokens (lower is
better)``) and keeps the figures in seconds: ``pytest_qwenperf.plugin.benchmark`` says why."""

from __future__ import annotations

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.plugin.benchmark import record_run


def test_recorded_for_pytest_benchmark(qwenperf_run: Run, benchmark) -> None:
    record_run(benchmark, qwenperf_run)

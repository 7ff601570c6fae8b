"""A point's live progress on pytest's terminal (:class:`~pytest_qwenperf.measure.progress.Meter`'s lines).

In a terminal the status is one line redrawn in place (``\\r``) and ended before pytest reports
the test or another point starts, its last state kept (usually the point's last repeat, done). In
a log (no terminal: CI) it is a plain line at most every ``--qwenperf-progress`` seconds, and one
per finished repeat. ``-q`` leaves the finished repeats' lines alone in a log; ``-qq`` and
``--qwenperf-progress=off`` (ini ``qwenperf_progress``) show nothing. The lines are written past
pytest's output capture: a point is measured while a test's output is captured.

A server's boot shows the same way (:class:`~pytest_qwenperf.measure.progress.BootMeter`, the pool's
:class:`~pytest_qwenperf.serving.boot_progress.BootProgress`): ``qwenperf booting cpu/base (1 m 20 s,
waiting for /health)``, with the server log's last line once the boot is slow (:data:`~pytest_qwenperf.measure.progress.SLOW_BOOT_S`),
and ``qwenperf booted cpu/base in 43 s`` when it is ready, the one line ``-q`` leaves in a log.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import pytest

from pytest_qwenperf.core.options import ProgressSetting
from pytest_qwenperf.measure.progress import BootMeter, Meter, PointProgress

LIVE_EVERY_S = 0.5
"""How often a terminal's status line is redrawn at most: often enough to look live, rarely enough
to cost the measuring thread nothing."""


class Capture(Protocol):
    """pytest's capture manager (the plugin ``capturemanager``), as far as the lines need it."""

    def global_and_fixture_disabled(self) -> AbstractContextManager[None]: ...


class Terminal:
    """pytest's terminal as progress lines use it: a ``live`` status redrawn in place, else plain lines."""

    def __init__(self, reporter: pytest.TerminalReporter, capture: Capture | None, live: bool) -> None:
        self._reporter, self._capture, self.live = reporter, capture, live
        self._drawn = False

    def show(self, text: str) -> None:
        with self._uncaptured():
            if not self.live:
                self._reporter.write_line(text)
                return
            if not self._drawn:
                self._reporter.ensure_newline()  # pytest's partial line (a file's results) stays as it is
                self._drawn = True
            width = self._reporter.config.get_terminal_writer().fullwidth
            self._reporter.rewrite(text[: width - 1], erase=True)

    def end(self) -> None:
        """End a live status line where it stands, so that what pytest writes next starts a line of its own.

        Not erased: a line erased with ``\\r`` leaves pytest's writer counting the width of what
        it held, and the test's progress (``[ 50%]``) then lands past the edge."""
        if self._drawn:
            with self._uncaptured():
                self._reporter.write("\n", flush=True)
            self._drawn = False

    def _uncaptured(self) -> AbstractContextManager[None]:
        return self._capture.global_and_fixture_disabled() if self._capture is not None else nullcontext()


TERMINAL_KEY = pytest.StashKey[Terminal]()


def _terminal(config: pytest.Config, setting: ProgressSetting) -> tuple[Terminal, float | None] | None:
    """pytest's terminal as progress lines use it, and the seconds between two status lines (None:
    finished repeats and boots alone); None when nothing is to be shown (switched off, ``-qq``, no
    terminal reporter)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not setting.on or config.get_verbosity() <= -2 or reporter is None:
        return None
    if TERMINAL_KEY not in config.stash:
        config.stash[TERMINAL_KEY] = Terminal(reporter, config.pluginmanager.get_plugin("capturemanager"), bool(reporter.isatty))
    terminal = config.stash[TERMINAL_KEY]
    return terminal, LIVE_EVERY_S if terminal.live else None if config.get_verbosity() < 0 else setting.every_s


def point_progress(config: pytest.Config, setting: ProgressSetting, point: str) -> PointProgress | None:
    """The progress of measuring ``point`` (``config / workload``) on pytest's terminal; None when
    nothing is to be shown (switched off, ``-qq``, no terminal reporter)."""
    found = _terminal(config, setting)
    if found is None:
        return None
    terminal, every_s = found
    terminal.end()  # the line of a point measured before, in the same test
    return Meter(point, terminal.show, every_s)


def boot_progress(config: pytest.Config, setting: ProgressSetting, side: str = "") -> BootMeter | None:
    """The boots of a pool's servers on pytest's terminal (``side``: the pool's name in the lines,
    "" for the launcher's); None when nothing is to be shown."""
    found = _terminal(config, setting)
    if found is None:
        return None
    terminal, every_s = found
    return BootMeter(terminal.show, every_s, side, terminal.end)


def end_live_line(config: pytest.Config) -> None:
    """End a live status line (before pytest reports a test's phase: ``pytest_runtest_makereport``)."""
    terminal = config.stash.get(TERMINAL_KEY, None)
    if terminal is not None:
        terminal.end()

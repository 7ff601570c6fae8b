"""The hooks a ``conftest.py`` or a plugin implements to extend a qwenperf session without forking it.

Each is a pytest hook (``def pytest_qwenperf_…`` in a conftest, or ``config.pluginmanager.register``),
called with keyword arguments, any of which an implementation may leave out. docs/hooks.md shows
each in use; ``tests/hooks_plugin.py`` implements all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_qwenperf.core.run import Run
    from pytest_qwenperf.core.verdict import Judgement
    from pytest_qwenperf.gate.diagnosis import Cause
    from pytest_qwenperf.measure.session_table import Column
    from pytest_qwenperf.suite.config import ServingConfig

hookspec = pytest.hookspec


@hookspec
def pytest_qwenperf_server_args(config: pytest.Config, serving: ServingConfig, args: list[str], env: dict[str, str]) -> None:
    """Called once per serving config of the session's suites, before anything is collected or booted.

    ``args`` are the config's vLLM flags (they follow the model on a server's command line), ``env``
    the variables its servers get on top of this process's environment; change either in place.
    The session then boots, records and judges the config as changed: an added flag is in its
    runs' argv like the suite's own, so a stored baseline recorded without it says so.
    """


@hookspec
def pytest_qwenperf_run_measured(config: pytest.Config, run: Run) -> None:
    """Called with each point's run as the session keeps it: measured, with every repeat it took
    (a sequential plan decides how many on its verdicts), before the point's tests read it."""


@hookspec
def pytest_qwenperf_point_judged(config: pytest.Config, run: Run, judgements: tuple[Judgement, ...]) -> None:
    """Called with each point's verdicts against its reference (a stored baseline, the history or a
    launcher's side); ``judgements`` is empty where there was nothing to judge against."""


@hookspec
def pytest_qwenperf_causes(config: pytest.Config, run: Run, judgements: tuple[Judgement, ...]) -> list[Cause] | None:
    """More likely causes of a regression, called for each point the plugin diagnosed (a regression,
    or a changed canary answer, against a reference that kept its evidence). The causes every
    implementation returns (``kind="plugin"``) are listed after the plugin's own: in the failure
    message, the session's JSON and its HTML report. Return None or ``[]`` for none."""


@hookspec
def pytest_qwenperf_session_columns(config: pytest.Config) -> list[Column] | None:
    """Columns to add to the session table (the terminal's "qwenperf results"), after the plugin's own."""


@hookspec
def pytest_qwenperf_session_json(config: pytest.Config, data: dict[str, object]) -> None:
    """Called with each results file's JSON (``--qwenperf-json``, and a candidate session's
    reference file) just before it is written; add keys or change it in place. ``qwenperf compare``
    and ``report`` read back the keys the plugin wrote, as this hook left them."""

"""The session's plan: what the selected points will cost, worked out once the tests are collected and
before anything boots (``suite.cost``, the model ``qwenperf plan --suite`` prints), said on the
terminal at the start and set beside what the session took at its end."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_qwenperf.core.tables import format_duration
from pytest_qwenperf.gate.history_store import HistoryError, is_url
from pytest_qwenperf.plugin.settings import REPORT_KEY, SETTINGS_KEY, SUITES_KEY, TURNS_KEY, QwenperfSettings, repeat_plan
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.pool import ServerPool
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload
from pytest_qwenperf.suite.cost import SessionPlan, minutes, planned

STARTED_KEY = pytest.StashKey[float]()
"""When the plan was made (``time.monotonic``): what the session took is counted from there."""


def plan_session(config: pytest.Config, items: Sequence[pytest.Item]) -> tuple[SessionPlan, ...]:
    """One plan per suite of the points the ``items`` will measure (skipped ones left out), at the
    repeats in force; kept in the session's report for its end. A history store that cannot be read
    plans without it (the session says why when it judges against it)."""
    settings = config.stash[SETTINGS_KEY]
    suites = {suite.name: suite for suite in config.stash[SUITES_KEY]}
    chosen: dict[str, dict[tuple[str, str], tuple[ServingConfig, SuiteWorkload]]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec else {}
        cfg, workload = params.get("serving_config"), params.get("suite_workload")
        if isinstance(cfg, ServingConfig) and isinstance(workload, SuiteWorkload) and item.get_closest_marker("skip") is None:
            chosen.setdefault(cfg.suite, {})[(cfg.id, workload.id)] = (cfg, workload)
    plans = []
    candidate = settings.candidate is not None
    # the servers' machine, whose pace a suite may state: this one, unless they run elsewhere
    machine = None if settings.endpoints or settings.endpoint_sets else detect().id
    for name, points in chosen.items():
        suite = _as_run(suites[name], settings)
        try:
            plans.append(planned(suite, tuple(points.values()), _history(settings), candidate=candidate, machine=machine))
        except HistoryError:
            plans.append(planned(suite, tuple(points.values()), None, candidate=candidate, machine=machine))
    config.stash[REPORT_KEY].plans = tuple(plans)
    config.stash[STARTED_KEY] = time.monotonic()
    return tuple(plans)


def _as_run(suite: Suite, settings: QwenperfSettings) -> Suite:
    """``suite`` with the repeats in force, and no boot where the servers run already (endpoints)."""
    repeats = repeat_plan(settings, suite)
    suite = dataclasses.replace(suite, repeats=repeats.first, max_repeats=repeats.most)
    return dataclasses.replace(suite, boot_s=0.0) if settings.endpoints or settings.endpoint_sets else suite


def _history(settings: QwenperfSettings) -> str | None:
    """The session's history store where it exists already (a plan reads it, never makes it)."""
    where = settings.history.where if settings.history is not None else None
    return where if where is not None and (is_url(where) or Path(where).is_file()) else None


def start_lines(plans: Sequence[SessionPlan]) -> list[str]:
    """What the session says before its first boot, a line per suite."""
    return [f"qwenperf {found.suite}: {found.line()} ({len(found.points)} point(s), {len(found.boots)} boot(s))" for found in plans]


def end_lines(config: pytest.Config, pools: Sequence[ServerPool]) -> list[str]:
    """What the session took against its plan: in all, its points' measuring and its boots."""
    report = config.stash.get(REPORT_KEY, None)
    started = config.stash.get(STARTED_KEY, None)
    if report is None or started is None or not report.plans:
        return []
    took = time.monotonic() - started
    planned_s = sum(found.planned_s for found in report.plans)
    measured = sum(run.elapsed_s or 0.0 for run in report.runs)
    points = sum(point.planned_s or 0.0 for found in report.plans for point in found.points)
    booted = sum(pool.booting_s for pool in pools)
    boots = sum(found.boots_s for found in report.plans)
    lines = [
        f"qwenperf: took {minutes(took)} against a plan of {minutes(planned_s)} ({took / planned_s:.0%}): "
        f"measuring {format_duration(measured)} of {format_duration(points)} planned, booting {format_duration(booted)} of {format_duration(boots)} planned"
        if planned_s
        else f"qwenperf: took {minutes(took)}"
    ]
    turns = config.stash.get(TURNS_KEY, None)
    if turns is not None:
        c = turns.counts
        lines.append(
            f"qwenperf: the launcher's and the candidate's servers took turns on the GPUs through vLLM's sleep mode: "
            f"{c.wakes} wake-up(s) and {c.sleeps} sleep(s) in {format_duration(c.seconds)}, inside the measuring"
        )
    return lines

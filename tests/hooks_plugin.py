"""A plugin that implements every hook of ``pytest_qwenperf.plugin.hookspec``, as a team's conftest
would, for tests/test_hookspec.py: each hook leaves a trace of what it saw in the session's JSON,
the table or the server it changed.

Loaded with ``-p tests.hooks_plugin``; ``HOOKS_LOG`` names a file where it appends one JSON line
per call."""

from __future__ import annotations

import json
import os

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.diagnosis import Cause
from pytest_qwenperf.measure.session_table import Column
from pytest_qwenperf.suite.config import ServingConfig

FLAG = "--hooked-by-plugin"
TTFT_MS = "150"  # the stand-in's delay to the first token, through its environment (default 20 ms)


def _log(hook: str, **seen: object) -> None:
    with open(os.environ["HOOKS_LOG"], "a") as out:
        out.write(json.dumps({"hook": hook, **seen}) + "\n")


def pytest_qwenperf_server_args(serving: ServingConfig, args: list[str], env: dict[str, str]) -> None:
    _log("server_args", config=serving.key, args=list(args))
    args.append(FLAG)
    env["PACED_TTFT_MS"] = TTFT_MS


def pytest_qwenperf_run_measured(run: Run) -> None:
    _log("run_measured", point=f"{run.config_key}/{run.identity.workload}", repeats=len((run.samples or {}).get("output_throughput", ())))


def pytest_qwenperf_point_judged(run: Run, judgements: tuple[Judgement, ...]) -> None:
    _log("point_judged", point=f"{run.config_key}/{run.identity.workload}", verdicts={j.metric: j.verdict for j in judgements})


def pytest_qwenperf_causes(run: Run, judgements: tuple[Judgement, ...]) -> list[Cause]:
    regressed = sorted(j.metric for j in judgements if j.verdict == "regression")
    return [Cause(kind="plugin", subject="team-dashboard", text=f"the team's dashboard saw {', '.join(regressed)} drop", figures=())]


def pytest_qwenperf_session_columns(config: pytest.Config) -> list[Column]:
    return [Column("TTFT p50", lambda run: f"{run.metrics['median_ttft_ms']:.0f}ms", width=9)]


def pytest_qwenperf_session_json(data: dict[str, object]) -> None:
    data["team"] = {"runs_seen": len(data["runs"])}  # type: ignore[arg-type]

"""A session's runs recorded as the baselines: all or nothing on failed tests, published figures replaced only by name."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_qwenperf.gate.baseline import load_baseline, write_baseline
from pytest_qwenperf.gate.update import BaselineOutcome, BaselineUpdate, update_baselines
from tests.test_baseline import run_of

SOURCE = "pytest --qwenperf-update-baselines"


def _published(root: Path) -> Path:
    """The base/isl128-osl128 baseline, marked as holding published figures."""
    path = write_baseline(root, run_of(), git_commit="c", replace_published=True)
    data = json.loads(path.read_text())
    data["provenance"] = {"kind": "published", "source": "https://example.com/figures"}
    path.write_text(json.dumps(data))
    return path


def test_nothing_is_written_when_a_test_failed(tmp_path: Path) -> None:
    update = update_baselines(tmp_path, [run_of()], failed_tests=2, replace_published=(), source=SOURCE)
    assert update == BaselineUpdate(2)
    assert list(tmp_path.iterdir()) == []


def test_each_run_is_written_and_a_refused_one_does_not_stop_the_others(tmp_path: Path) -> None:
    runs = [run_of(failed=3), run_of(config="ctx-short")]
    update = update_baselines(tmp_path, runs, failed_tests=0, replace_published=(), source=SOURCE)
    refused, written = update.outcomes
    assert refused.config_key == "cpu/base" and not refused.path.exists() and not refused.published_kept
    assert refused.refused is not None and refused.refused.startswith(f"{refused.path}: not updated: ")
    assert written == BaselineOutcome("cpu/ctx-short", written.path)
    assert load_baseline(written.path).provenance.source == SOURCE


def _update(root: Path, *named: str) -> BaselineOutcome:
    update = update_baselines(root, [run_of(total=20_000.0)], failed_tests=0, replace_published=named, source=SOURCE)
    (outcome,) = update.outcomes
    return outcome


def test_published_figures_are_kept_unless_the_config_or_the_file_is_named(tmp_path: Path) -> None:
    path = _published(tmp_path)
    before = path.read_bytes()
    for kept in (_update(tmp_path), _update(tmp_path, "cpu/other")):
        assert kept.published_kept and kept.path == path and "holds published figures" in str(kept.refused)
    assert path.read_bytes() == before
    for named in ("cpu/base", str(path)):
        path = _published(tmp_path)
        assert _update(tmp_path, named) == BaselineOutcome("cpu/base", path)
        assert load_baseline(path).provenance.kind == "measured"

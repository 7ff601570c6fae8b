"""``qwenperf baseline promote`` and ``list`` as a user runs them (the installed command, a real
SQLite store, baseline files on disk), and the stale name a stored baseline gets beside its verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.gate.baseline import BaselineError, load_baseline, save_baseline, stored_baselines, write_baseline
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.gate.judge import judge_run, render_judgements
from tests.test_history_cli import qwenperf
from tests.test_history_store import night


def filled(tmp_path: Path, levels: list[float], version: str = "0.32.0") -> Path:
    store = tmp_path / "history.sqlite"
    with HistoryStore.open(store) as history:
        history.append([night(day, level, version=version) for day, level in enumerate(levels, start=1)], source="test")
    return store


def test_promote_writes_the_latest_stable_level_with_its_provenance(tmp_path: Path) -> None:
    store = filled(tmp_path, [5_000.0] * 8 + [4_200.0] * 6)  # a confirmed step at night 9: the level since is promoted
    root = tmp_path / "baselines"
    done = qwenperf("baseline", "promote", store, "--config", "cpu/base", "--baselines", root)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = root.glob("*/*/*/*.json")
    assert f"promoted cpu/base / isl128-osl128 on {path.parts[-4]} to {path}" in done.stdout
    stored = load_baseline(path)
    metric = stored.metrics["output_throughput"]
    assert metric.sessions == (3,) * 6 and metric.value == pytest.approx(4_200.0, rel=0.01)
    assert stored.provenance.kind == "measured"
    assert stored.provenance.source.startswith("qwenperf baseline promote: history: 6 runs since a change point, 2026-11-09 → 14")
    assert f"(from {store})" in stored.provenance.source

    again = qwenperf("baseline", "promote", store, "--config", "base", "--last", "3", "--baselines", root)
    assert again.returncode == 0, again.stdout + again.stderr
    replaced = load_baseline(path)
    assert replaced.metrics["output_throughput"].sessions == (3, 3, 3) and len(replaced.history) == 1  # the previous kept

    listed = qwenperf("baseline", "list", "--baselines", root, "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)["baselines"]
    assert (
        entry["sessions"] == 3
        and entry["vllm_version"] == "0.32.0"
        and entry["provenance"].startswith("measured: qwenperf baseline promote")
    )
    assert entry["age_days"] >= 0
    table = qwenperf("baseline", "list", "--baselines", root)
    assert table.stdout.splitlines()[0].split() == ["baseline", "age", "vLLM", "hardware", "sessions", "provenance"]


def test_promote_keeps_published_figures_and_refuses_another_identity(tmp_path: Path) -> None:
    store = filled(tmp_path, [5_000.0] * 4)
    root = tmp_path / "baselines"
    run = night(1, 5_000.0)
    path = write_baseline(root, run)
    published = load_baseline(path)
    save_baseline(
        root, msgspec.structs.replace(published, provenance=msgspec.structs.replace(published.provenance, kind="published"))
    )
    before = path.read_bytes()
    kept = qwenperf("baseline", "promote", store, "--config", "base", "--baselines", root)
    assert (
        kept.returncode == 1
        and "not promoted: cpu/base / isl128-osl128" in kept.stdout
        and "holds published figures" in kept.stdout
    )
    assert path.read_bytes() == before
    replaced = qwenperf("baseline", "promote", store, "--config", "base", "--baselines", root, "--replace-published")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert load_baseline(path).provenance.kind == "measured"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("baseline", "promote", "{tmp}/absent.sqlite", "--config", "base"), "absent.sqlite: no history store there"),
        (("baseline", "promote", "{store}"), "baseline promote: expected STORE and --config ID"),
        (("baseline", "promote", "{store}", "--config", "bsae"), "no series in {store} match --config bsae"),
        (("baseline", "promote", "{store}", "--config", "base", "--last", "0"), "expected a whole number of runs >= 1, got 0"),
        (("baseline", "list", "--baselines", "{tmp}/nowhere"), "nowhere: no baselines folder there"),
        (("baseline", "list", "{store}"), "unexpected argument"),
    ],
)
def test_bad_command_lines_exit_2_with_one_line_and_write_nothing(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    store = filled(tmp_path, [5_000.0] * 3)
    given = [a.format(tmp=tmp_path, store=store) for a in args]
    done = qwenperf(*given, *([] if "--baselines" in given else ["--baselines", str(tmp_path / "b")]))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message.format(store=store) in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "absent.sqlite").exists()


def test_a_stored_baseline_from_another_release_line_or_too_old_is_named_stale_beside_its_verdicts(tmp_path: Path) -> None:
    old = night(1, 5_000.0, version="0.31.0")
    path = write_baseline(tmp_path, old)
    stored = load_baseline(path)
    now = msgspec.structs.replace(night(20, 5_000.0, version="0.32.1"), baseline_max_age_days=90)
    judged = judge_run(stored, now)
    assert {j.reference for j in judged} == {"stored baseline (stale: recorded with vLLM 0.31, this run has 0.32)"}
    assert render_judgements(judged).splitlines()[0] == "vs stored baseline (stale: recorded with vLLM 0.31, this run has 0.32)"
    same_line = msgspec.structs.replace(now, context=msgspec.structs.replace(now.context, vllm_version="0.31.4"))
    assert {j.reference for j in judge_run(stored, same_line)} == {"stored baseline"}
    later = msgspec.structs.replace(
        same_line, context=msgspec.structs.replace(same_line.context, started="2027-03-01T02:00:00+00:00")
    )
    (reference,) = {j.reference for j in judge_run(stored, later)}
    assert reference == "stored baseline (stale: recorded 2026-11-01, 120 days before this run (the suite allows 90))"


def test_every_shipped_baseline_still_loads() -> None:
    root = Path(__file__).parents[1] / "baselines"
    found = stored_baselines(root)
    files = sorted(p for p in root.glob("*/*/*/*.json") if p.name != "canary.json")  # stored canary answers are not baselines
    assert [path for path, _ in found] == files and len(files) >= 3
    assert [str(path) for path, entry in found if isinstance(entry, BaselineError)] == []
    listed = qwenperf("baseline", "list", "--baselines", root)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 2 + len(found), listed.stdout + listed.stderr

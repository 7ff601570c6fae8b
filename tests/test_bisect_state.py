"""A bisection's state file (its steps kept for the same question only) and its answer: the steps
as a terminal or markdown table, each step's verdicts, and the plot."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_qwenperf.history.bisect import Bisection, Step, bisect
from pytest_qwenperf.history.bisect_report import answer, plot, render
from pytest_qwenperf.history.bisect_state import SCHEMA, Question, StateError, load, save

VERSIONS = ("0.29.0", "0.30.0", "0.31.0", "0.32.0")
QUESTION = Question(VERSIONS, "cpu-1", "chat", "ab" * 32, 3, 9, True)

STEPS = {
    "0.32.0": Step(
        "0.32.0",
        True,
        "output_throughput 95.3 → 83.1 tok/s (-12.8%): regression",
        table="| metric | verdict |\n| output_throughput | regression 0.32.0 |",
        metric="output_throughput",
        good=95.3,
        now=83.1,
        ratio=0.872,
        tolerance=0.05,
        repeats=3,
    ),
    "0.30.0": Step(
        "0.30.0",
        False,
        "output_throughput 95.1 → 94.9 tok/s (-0.2%): no change",
        table="| metric | verdict |\n| output_throughput | no change 0.30.0 |",
        metric="output_throughput",
        good=95.1,
        now=94.9,
        ratio=0.998,
        tolerance=0.05,
        repeats=5,
    ),
    "0.31.0": Step("0.31.0", True, "did not boot: regression", repeats=0),  # the defaults: no figures, no table
}


def found_bisection() -> Bisection:
    return bisect(VERSIONS, STEPS.__getitem__)


def no_regression() -> Bisection:
    steady = replace(STEPS["0.30.0"], version="0.32.0", table="| metric | verdict |\n| output_throughput | no change 0.32.0 |")
    return bisect(VERSIONS, {"0.32.0": steady}.__getitem__)


# --- the state file


@pytest.mark.parametrize("given", [STEPS, list(STEPS.values())], ids=["mapping", "sequence"])
def test_saved_steps_load_back_whole(tmp_path: Path, given: Mapping[str, Step] | list[Step]) -> None:
    path = tmp_path / "state" / "bisect.json"
    save(path, QUESTION, given)
    loaded = load(path, QUESTION)
    assert loaded == STEPS
    assert [type(v) for v in loaded.values()] == [Step] * 3
    assert json.loads(path.read_text())["schema"] == SCHEMA


def test_saving_again_replaces_the_steps(tmp_path: Path) -> None:
    path = tmp_path / "bisect.json"
    save(path, QUESTION, [STEPS["0.32.0"]])
    save(path, QUESTION, STEPS)
    assert load(path, QUESTION) == STEPS
    save(path, QUESTION, [])
    assert load(path, QUESTION) == {}


def test_no_file_is_no_steps(tmp_path: Path) -> None:
    assert load(tmp_path / "none.json", QUESTION) == {}


@pytest.mark.parametrize(
    ("other", "differs"),
    [
        (replace(QUESTION, config="cpu-2"), "config"),
        (replace(QUESTION, versions=VERSIONS[1:]), "versions"),
        (replace(QUESTION, suite_sha256="cd" * 32, repeats=5), "suite_sha256, repeats"),
        (replace(QUESTION, side_by_side=False), "side_by_side"),
    ],
)
def test_the_steps_of_another_question_are_refused(tmp_path: Path, other: Question, differs: str) -> None:
    path = tmp_path / "bisect.json"
    save(path, QUESTION, STEPS)
    with pytest.raises(StateError, match=re.escape(f"{path}: holds the steps of another bisection (it differs in {differs});")) as info:  # fmt: skip
        load(path, other)
    assert "pass another --state" in str(info.value)


@pytest.mark.parametrize("text", ["", "{ not json", '{"schema": "qwenperf-bisect/1", "question": {'])
def test_a_corrupt_file_is_refused_by_path(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bisect.json"
    path.write_text(text)
    with pytest.raises(StateError, match=re.escape(f"{path}: not a bisection state file ({SCHEMA})")):
        load(path, QUESTION)


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"schema": "qwenperf-baseline/1", "runs": []}))
    with pytest.raises(StateError, match=re.escape(f"{path}: not a bisection state file")):
        load(path, QUESTION)


def test_a_file_of_another_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bisect.json"
    save(path, QUESTION, STEPS)
    path.write_text(path.read_text().replace(SCHEMA, "qwenperf-bisect/2"))
    with pytest.raises(StateError, match=re.escape(f"{path}: schema 'qwenperf-bisect/2', expected '{SCHEMA}'")):
        load(path, QUESTION)


# --- the answer


def test_the_answer_names_the_first_bad_and_last_good_release_or_none() -> None:
    assert answer(found_bisection()) == "first bad: 0.31.0 (last good: 0.30.0)"
    assert answer(no_regression()) == "no regression: 0.32.0 did not regress against 0.29.0"


def test_the_terminal_report_lists_the_steps_in_order_then_the_answer_then_each_steps_verdicts() -> None:
    text = render(found_bisection(), "Bisect cpu-1 / chat")
    lines = text.splitlines()
    assert lines[0] == "Bisect cpu-1 / chat"
    assert "4 versions: 0.29.0 → 0.30.0 → 0.31.0 → 0.32.0; good and now: output_throughput (tok/s)" in lines
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["step", "version"])
    rows = [line.split() for line in lines[header + 2 : header + 5]]
    assert [row[:2] for row in rows] == [["1", "0.32.0"], ["2", "0.30.0"], ["3", "0.31.0"]]
    assert rows[0][2:8] == ["95.3", "83.1", "0.872", "3", "yes", "output_throughput"]
    assert rows[2][2:7] == ["—", "—", "—", "0", "yes"]
    at_answer = lines.index("first bad: 0.31.0 (last good: 0.30.0)")
    assert at_answer > header + 4
    first = lines.index("step 1: 0.32.0 against 0.29.0")
    second = lines.index("step 2: 0.30.0 against 0.29.0")
    assert at_answer < first < second
    assert lines[first + 1 : first + 3] == STEPS["0.32.0"].table.splitlines()
    assert lines[second + 1 : second + 3] == STEPS["0.30.0"].table.splitlines()
    assert "step 3: 0.31.0 against 0.29.0" not in text  # a step without a table has no section
    assert "**" not in text and "<details>" not in text


def test_the_markdown_report_folds_each_steps_verdicts() -> None:
    text = render(found_bisection(), "Bisect cpu-1 / chat", markdown=True)
    lines = text.splitlines()
    assert lines[0] == "### Bisect cpu-1 / chat"
    header = lines.index("| step | version | good | now | ratio | repeats | regressed | verdict |")
    assert lines[header + 2].startswith("| 1 | 0.32.0 | 95.3 | 83.1 | 0.872 | 3 | yes | output_throughput")
    assert lines[header + 3].startswith("| 2 | 0.30.0 |")
    assert lines[header + 4].startswith("| 3 | 0.31.0 |")
    assert "**first bad: 0.31.0 (last good: 0.30.0)**" in lines
    folded = "\n".join(["<details><summary>step 1: 0.32.0 against 0.29.0</summary>", "", STEPS["0.32.0"].table, "", "</details>"])
    assert folded in text
    assert text.count("<details>") == 2
    assert text.index("**first bad") < text.index("<details>")


@pytest.mark.parametrize("markdown", [False, True])
def test_a_bisection_without_a_regression_says_so(markdown: bool) -> None:
    text = render(no_regression(), "Bisect", markdown=markdown)
    said = "no regression: 0.32.0 did not regress against 0.29.0"
    assert (f"**{said}**" if markdown else said) in text.splitlines()
    assert "first bad" not in text
    assert "step 1: 0.32.0 against 0.29.0" in text
    assert "no change 0.32.0" in text
    assert "step 2" not in text


@pytest.mark.parametrize("found", [found_bisection(), no_regression()], ids=["found", "none"])
def test_the_plot_is_a_png(tmp_path: Path, found: Bisection) -> None:
    path = tmp_path / "bisect.png"
    plot(found, "Bisect cpu-1 / chat", path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert path.stat().st_size > 1000

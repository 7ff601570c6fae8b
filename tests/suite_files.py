"""Suite files the tests write: a one-config header to put workloads under, and the check that a
bad one fails naming the file first."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_qwenperf.suite.config import Suite, SuiteError, load_suite

HEADER = """
[suite]
name = "demo"
hardware = "cpu"
model = "embedded:tiny"

[[config]]
id = "base"
"""


def suite_at(folder: Path, text: str) -> Suite:
    """The suite of ``text`` written as ``folder/suite.toml``."""
    (folder / "suite.toml").write_text(text)
    return load_suite(folder / "suite.toml")


def refused(folder: Path, text: str, message: str) -> None:
    """``text`` as ``folder/suite.toml`` fails to load with an error matching ``message``, naming the file first."""
    with pytest.raises(SuiteError, match=message) as excinfo:
        suite_at(folder, text)
    assert str(excinfo.value).startswith(f"{folder / 'suite.toml'}: ")

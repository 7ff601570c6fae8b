"""The options table (pytest_qwenperf/option_table.py): each option declared once, registered
alike in the plugin and in the commands that share it, documented by a page written from it,
and no page naming an option that does not exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pytest_qwenperf.cli.reference import command_parsers, reference
from pytest_qwenperf.option_table import BY_NAME, OPTIONS, PLUGIN, Option

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_option_has_a_name_of_its_own_help_and_at_most_one_ini_key() -> None:
    assert len(BY_NAME) == len(OPTIONS)
    assert [option.name for option in OPTIONS if len(option.help) < 20] == []
    keys = [option.ini_key for option in OPTIONS if option.ini_key]
    assert len(set(keys)) == len(keys) and all(key.startswith("qwenperf_") for key in keys)


def test_the_plugin_registers_every_option_and_ini_key_of_the_table(pytestconfig: pytest.Config) -> None:
    group = pytestconfig._parser.getgroup("qwenperf")
    registered = {name for option in group.options for name in option.names()}
    assert registered == {option.plugin_flag for option in OPTIONS}
    inis = {name for name in pytestconfig._parser._inidict if name.startswith("qwenperf_")}
    assert {option.ini_key for option in OPTIONS if option.ini_key} <= inis


@pytest.mark.parametrize("option", [option for option in OPTIONS if option.commands], ids=lambda option: option.name)
def test_a_command_that_shares_an_option_registers_the_tables(option: Option) -> None:
    parsers = command_parsers()
    for command in option.commands:
        (action,) = (a for a in parsers[command]._actions if f"--{option.name}" in a.option_strings)
        assert action.help == option.help_in(command)
        assert action.type is option.type
        assert (option.action == "append") == isinstance(action, argparse._AppendAction)


def test_an_option_is_not_registered_for_a_command_it_does_not_declare() -> None:
    with pytest.raises(ValueError, match="option 'html' is not declared for 'bench'"):
        BY_NAME["html"].add(argparse.ArgumentParser().add_argument, "bench")


def test_the_reference_page_is_the_one_the_table_writes() -> None:
    page = (ROOT / "docs" / "reference.md").read_text()
    assert page == reference(), "docs/reference.md is stale: python -m pytest_qwenperf.cli.reference > docs/reference.md"
    assert all(f"`{option.plugin_flag}" in page for option in OPTIONS)
    assert f"| {BY_NAME['endpoint'].help_in(PLUGIN)} |" in page


def unknown(text: str) -> set[str]:
    """The ``--qwenperf-…`` flags and the ini keys set in a config block (``qwenperf_x = …``) that ``text``
    names and the plugin does not have."""
    flags = set(re.findall(r"--qwenperf-[a-z][a-z-]*[a-z]", text)) - {option.plugin_flag for option in OPTIONS}
    keys = set(re.findall(r"^(qwenperf_[a-z_]+)\s*=", text, flags=re.MULTILINE)) - {option.ini_key for option in OPTIONS}
    return flags | keys


def test_no_page_names_an_option_or_ini_key_the_plugin_does_not_have() -> None:
    found = {str(page.relative_to(ROOT)): sorted(unknown(page.read_text())) for page in PAGES}
    assert {page: names for page, names in found.items() if names} == {}


def test_a_misspelt_option_or_ini_key_on_a_page_is_found() -> None:
    text = "pytest --qwenperf-repeat 3 --qwenperf-max-repeats 4\n\n```ini\nqwenperf_histroy = x.sqlite\nqwenperf_history = y\n```"
    assert unknown(text) == {"--qwenperf-repeat", "qwenperf_histroy"}

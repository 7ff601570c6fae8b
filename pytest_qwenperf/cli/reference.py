"""``python -m pytest_qwenperf.cli.reference > docs/reference.md``: the docs' reference page of every
option and ini key, from the options table (:mod:`pytest_qwenperf.option_table`) and each command's
own parser, so that what the page says is what the code registers."""

from __future__ import annotations

import argparse
import os
import sys

from pytest_qwenperf.cli.main import build_parser
from pytest_qwenperf.option_table import OPTIONS, PLUGIN

WIDTH = "100"
"""argparse wraps help to the terminal's width ($COLUMNS): the page is written at a fixed one."""


def reference() -> str:
    """The page: the plugin's options and ini keys from the table, then each command's help."""
    lines = [
        "# Reference: options and ini keys",
        "",
        "Written by `python -m pytest_qwenperf.cli.reference > docs/reference.md` from the options table",
        "(`pytest_qwenperf/option_table.py`) and the commands' parsers; `tests/test_option_table.py` fails",
        "when the page and the code differ.",
        "",
        "## The pytest plugin",
        "",
        "Each option of `pytest` (`--qwenperf-…`) has an ini key where a default makes sense",
        "(`[tool.pytest.ini_options]` in `pyproject.toml`, or `pytest.ini`); the command line wins over the key.",
        "An option a `qwenperf` command shares is the same option there, spelled without `qwenperf-`.",
        "",
        "| option | ini key | also in | what it does |",
        "|---|---|---|---|",
    ]
    for option in OPTIONS:
        metavar = f" {option.metavar}" if option.metavar else ""
        ini = f"`{option.ini_key}`" if option.ini_key else "—"
        shared = ", ".join(f"`qwenperf {command} --{option.name}`" for command in option.commands) or "—"
        text = option.help_in(PLUGIN).replace("|", r"\|")  # a table cell
        lines.append(f"| `{option.plugin_flag}{metavar}` | {ini} | {shared} | {text} |")
    lines += ["", "## The `qwenperf` commands", ""]
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        for name, parser in command_parsers().items():
            lines += [f"### `qwenperf {name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(lines).rstrip() + "\n"


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each ``qwenperf`` command's parser, by name."""
    parser = build_parser()
    (commands,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return dict(commands.choices)


if __name__ == "__main__":
    sys.stdout.write(reference())

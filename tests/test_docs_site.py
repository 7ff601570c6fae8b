"""The docs site (mkdocs.yml, docs/): it builds with --strict, every page is in its navigation, a built
page loads nothing from the network, and every ``qwenperf`` command a page shows parses with the
command's own parser, where the page does not mark it as needing a GPU or a cluster (``# needs: …``
on the block's first line)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_qwenperf.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.DOTALL)
EXTERNAL = re.compile(r"<(?:script|img|iframe)[^>]+src=\"(?:https?:)?//|<link[^>]+rel=\"(?:stylesheet|preload|icon)\"[^>]+href=\"(?:https?:)?//|@import url\(\"?(?:https?:)?//")


def test_the_site_builds_strict_and_loads_nothing_from_the_network(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        check=False, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    built = [path for path in site.rglob("*") if path.suffix in (".html", ".css")]
    assert len([path for path in built if path.suffix == ".html"]) >= len(list((ROOT / "docs").rglob("*.md")))
    loading = {str(path.relative_to(site)): EXTERNAL.findall(path.read_text()) for path in built}
    assert {path: found for path, found in loading.items() if found} == {}


def test_the_external_asset_check_sees_a_cdn_script() -> None:
    assert EXTERNAL.findall('<script src="https://unpkg.com/iframe-worker/shim"></script>')
    assert not EXTERNAL.findall('<a href="https://squidfunk.github.io/mkdocs-material/">Material</a>')


def _nav_pages(nav: list[object]) -> set[str]:
    found: set[str] = set()
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            found |= _nav_pages(value) if isinstance(value, list) else {str(value)}
    return found


def test_every_page_is_in_the_navigation() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert pages == _nav_pages(nav)


def commands(text: str) -> list[list[str]]:
    """The ``qwenperf`` command lines of the blocks of ``text`` not marked ``# needs: …``, split as a
    shell would (continuations joined; a redirect, a pipe or a comment ends one; a glob stands for two files)."""
    found = []
    for block in BLOCK.findall(text):
        if block.lstrip().startswith("# needs:"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for i, word in enumerate(words):
                if Path(word).name == "qwenperf":
                    argv = words[i + 1 :]
                    ends = [j for j, w in enumerate(argv) if w in ("|", ">", ">>", "&&", ";", "2>&1")]
                    argv = argv[: ends[0]] if ends else argv
                    found.append([expanded for w in argv for expanded in ([w, w] if "*" in w else [w])])  # a glob: files
                    break
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_command_a_page_shows_parses(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in commands(page.read_text()):
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.relative_to(ROOT)}: qwenperf {shlex.join(argv)}: {capsys.readouterr().err.strip()}")


def test_a_command_with_a_removed_flag_is_found() -> None:
    text = "```bash\nqwenperf compare a.json b.json --fail-on regresion   # a typo\n```\n```bash\n# needs: GPU\nqwenperf doctor --nope\n```"
    (argv,) = commands(text)
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)

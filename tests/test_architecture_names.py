"""docs/architecture.md names the code it describes; every dotted name it cites must exist."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import pytest_qwenperf

PAGE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
PACKAGES = frozenset(module.name for module in pkgutil.iter_modules(pytest_qwenperf.__path__))
CITED = re.compile(r"`(?:pytest_qwenperf\.)?([a-z_]+(?:\.[A-Za-z_]+)+)`")


def cited(text: str) -> list[str]:
    """The dotted names in backticks whose first part is one of the package's own subpackages or modules."""
    return sorted({name for name in CITED.findall(text) if name.split(".")[0] in PACKAGES})


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` (below ``pytest_qwenperf``) is a module, or an attribute path inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(["pytest_qwenperf", *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_dotted_name_the_architecture_page_cites_exists() -> None:
    names = cited(PAGE.read_text())
    assert len(names) > 40, f"the page cites {len(names)} names: is the pattern still finding them?"
    missing = [name for name in names if not resolves(name)]
    assert not missing, f"{PAGE.name} cites names the package does not have: {missing}"


@pytest.mark.parametrize(
    ("dotted", "exists"),
    [("measure.run.Driver.run", True), ("serving.sleep.Turns", True), ("measure.run._measure_once", False), ("core.nowhere", False)],
)
def test_a_name_resolves_only_where_the_code_has_it(dotted: str, exists: bool) -> None:
    assert resolves(dotted) is exists

"""The page written as one HTML file: the Jinja2 template with its stylesheet, its script, the
charts' specs and the Vega runtime inlined, so it opens with no server and no network.

The runtime comes from ``vl-convert-python`` (the Vega project's own converter, which bundles
Vega, Vega-Lite and vega-embed as one script for exactly this); it is read once per process.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from pytest_qwenperf.core.files import folder_lock, keep_aside, write_atomically
from pytest_qwenperf.gate.compare import RunSet
from pytest_qwenperf.history.report import Series
from pytest_qwenperf.report.page import Page, page_of

TEMPLATE = "report.html.j2"


class ReportUnavailable(RuntimeError):
    """What the report needs is not installed; the message says how to install it."""


def render(page: Page) -> str:
    """The page as one HTML document."""
    try:
        import jinja2
    except ImportError as exc:
        raise ReportUnavailable("the HTML report needs Jinja2: pip install 'pytest-qwenperf[report]'") from exc
    folder = resources.files("pytest_qwenperf.report") / "templates"
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = environment.from_string(folder.joinpath(TEMPLATE).read_text(encoding="utf-8"))
    return template.render(
        page=page,
        specs=_script_json(page.charts),
        style=folder.joinpath("report.css").read_text(encoding="utf-8"),
        script=_inline_script(folder.joinpath("report.js").read_text(encoding="utf-8")),
        runtime=vega_runtime(),
    )


def write_report(sets: Sequence[RunSet], path: Path, title: str = "", history: Sequence[Series] = ()) -> Path | None:
    """Write the report of ``sets`` (the first the reference of the others, ``history`` the series of a
    history store) to ``path``, atomically; an existing file is kept under a name of its own, which
    is returned (as the session JSON's is)."""
    text = render(page_of(sets, title, history))
    path.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(path.parent):
        kept = keep_aside(path) if path.exists() else None
        write_atomically(path, text)
    return kept


@functools.cache
def vega_runtime() -> str:
    """Vega, Vega-Lite and vega-embed as one script that sets ``window.vegaEmbed``."""
    try:
        import vl_convert
    except ImportError as exc:
        raise ReportUnavailable("the HTML report's charts need vl-convert-python: pip install 'pytest-qwenperf[report]'") from exc
    return _inline_script(vl_convert.javascript_bundle("window.vegaEmbed = vegaEmbed;"))


def _inline_script(text: str) -> str:
    """``text`` safe inside a ``<script>`` element: nothing in it can close the element."""
    return text.replace("</script", "<\\/script")


def _script_json(value: object) -> str:
    """``value`` as JSON that is safe inside a ``<script type="application/json">`` element."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")

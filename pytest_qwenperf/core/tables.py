"""Text and markdown tables, as every report of this package prints them."""

from __future__ import annotations

import re
from collections.abc import Sequence


def _numeric(cell: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,.]+%?|—|", cell))


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool = False) -> list[str]:
    """Lines of a table: aligned text or GitHub markdown; columns of numbers align right, others left."""
    right = [bool(rows) and all(_numeric(row[i]) for row in rows) for i in range(len(header))]
    if markdown:
        escaped = [[cell.replace("|", "\\|") for cell in row] for row in (header, *rows)]
        rule = "|" + "|".join("---:" if r else ":---" for r in right) + "|"
        return ["| " + " | ".join(escaped[0]) + " |", rule] + ["| " + " | ".join(row) + " |" for row in escaped[1:]]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(row, widths, right, strict=True)]
        return "  ".join(cells).rstrip()

    return [line(header), "-" * (sum(widths) + 2 * (len(widths) - 1)), *(line(row) for row in rows)]


def format_duration(seconds: float) -> str:
    """``42 s``, ``2 m 05 s``, ``1 h 07 m``: a time as a status line or a table shows it, no longer than it needs."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} m {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} m"

"""The operator profiles of a comparison's group, shown: each file's top operators by self time, side by
side, and the operators whose share moved most against the reference's (:mod:`pytest_qwenperf.core.profile`).

A profile is one extra, unmeasured repeat, so it is shown and never judged: it says where the time
went, not whether the run was slower. Shares, not times, are compared: the profiled repeats of two
files ran the same requests, but on another vLLM the repeat may take longer as a whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import msgspec

from pytest_qwenperf.core.profile import OperatorProfile, OperatorTable, share_changes
from pytest_qwenperf.core.tables import format_table

SHOWN = 5
"""Operators per file, and share changes per later file, that a table shows."""


def render_profiles(profiles: Sequence[OperatorProfile | None], labels: Sequence[str], markdown: bool) -> list[str]:
    """The host table (and the device table, where a profile has one) of the files with a profile,
    then, per later file, its largest share changes against the first file's; no lines without profiles."""
    shown = [(label, profile) for label, profile in zip(labels, profiles, strict=True) if profile is not None]
    if not shown:
        return []
    lines: list[str] = []
    for side, what, of in (("cpu", "host operators by self time", "host self time"), ("gpu", "device kernels by time", "device time")):
        tables = [(label, table) for label, profile in shown if (table := _side(profile, side)) is not None]
        if not tables:
            continue
        title = f"{what} in the profiled repeat (one extra, not measured), as shares of all {of}"
        lines += ["", f"**{title}**", ""] if markdown else ["", title]
        lines += _top(tables, markdown)
        reference = _side(profiles[0], side) if profiles[0] is not None else None
        if reference is None:
            continue
        for label, table in tables[1:]:
            moved = share_changes(reference, table, SHOWN)
            if moved:
                text = "; ".join(f"{c.name} {100 * c.change:+.1f} pt ({_share(c.reference)} → {_share(c.now)})" for c in moved)
                lines.append(f"{'- ' if markdown else ''}largest share changes in {label} against {labels[0]}: {text}")
    return lines


def profiles_json(profiles: Sequence[OperatorProfile | None], labels: Sequence[str]) -> dict[str, object]:
    """``profiles``: per file, null or its profile (``traces``, ``cpu`` and ``gpu`` tables of ``total_us``
    and ``operators``, each ``name``, ``self_us``, ``share``, ``count``; ``stop_s``) with its ``file``
    label; ``profile_changes``: per later file, null or the host operators whose share moved most against
    the first file's (``name``; ``reference`` and ``now``, shares, null where a table does not list it;
    ``change``, counting an unlisted share as 0)."""
    reference = profiles[0].cpu if profiles and profiles[0] is not None else None
    changes = [
        None if reference is None or profile is None else [dataclasses.asdict(c) | {"change": c.change} for c in share_changes(reference, profile.cpu, SHOWN)]
        for profile in profiles[1:]
    ]
    return {
        "profiles": [None if p is None else {"file": label} | msgspec.to_builtins(p) for label, p in zip(labels, profiles, strict=True)],
        "profile_changes": changes,
    }


def _side(profile: OperatorProfile, side: str) -> OperatorTable | None:
    return profile.cpu if side == "cpu" else profile.gpu


def _top(tables: Sequence[tuple[str, OperatorTable]], markdown: bool) -> list[str]:
    header = ["#"]
    for label, _ in tables:
        header += [label, "share"]
    rows = []
    for rank in range(max(min(SHOWN, len(table.operators)) for _, table in tables)):
        row = [str(rank + 1)]
        for _, table in tables:
            op = table.operators[rank] if rank < len(table.operators) else None
            row += ["", ""] if op is None else [op.name, _share(op.share)]
        rows.append(row)
    return format_table(header, rows, markdown=markdown)


def _share(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:.1f}%"

"""A bisection's answer: the steps as a table (terminal or markdown) with each step's verdicts, and a plot."""

from __future__ import annotations

from pathlib import Path

from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.tables import format_table
from pytest_qwenperf.core.verdict import format_value
from pytest_qwenperf.history.bisect import Bisection, Step

HEADER = ("step", "version", "good", "now", "ratio", "repeats", "regressed", "verdict")


def _row(number: int, step: Step) -> tuple[str, ...]:
    ratio = f"{step.ratio:.3f}" if step.ratio is not None else "—"
    return (str(number), step.version, format_value(step.good), format_value(step.now), ratio, str(step.repeats),
            "yes" if step.regressed else "no", step.summary)  # fmt: skip


def answer(found: Bisection) -> str:
    """One line: the first bad release and the last good one, or that none regressed."""
    if found.first_bad is None:
        return f"no regression: {found.versions[-1]} did not regress against {found.versions[0]}"
    return f"first bad: {found.first_bad} (last good: {found.last_good})"


def render(found: Bisection, title: str, *, markdown: bool = False) -> str:
    """The steps in the order they were taken, the answer, then each step's verdict table."""
    shown = next((s.metric for s in found.steps if s.metric), "")
    unit = f" ({metric(shown).unit})" if shown else ""
    lines = [f"### {title}" if markdown else title, ""]
    lines += [f"{len(found.versions)} versions: {' → '.join(found.versions)}; good and now: {shown}{unit}", ""]
    lines += format_table(HEADER, [_row(i, s) for i, s in enumerate(found.steps, 1)], markdown=markdown)
    lines += ["", f"**{answer(found)}**" if markdown else answer(found)]
    slow = [str(i) for i, step in enumerate(found.steps, 1) if step.good_slow]
    if slow:
        warning = f"the good release {found.versions[0]} was itself slower than its reference at step(s) {', '.join(slow)}: this machine may not show what the reference saw"
        lines += ["", f"**{warning}**" if markdown else warning]
    for i, step in enumerate(found.steps, 1):
        if not step.table:
            continue
        heading = f"step {i}: {step.version} against {found.versions[0]}"
        table = f"{step.table}\n{step.good_check}" if step.good_check else step.table
        if markdown:
            lines += ["", f"<details><summary>{heading}</summary>", "", table, "", "</details>"]
        else:
            lines += ["", heading, table]
    return "\n".join(lines)


def plot(found: Bisection, title: str, path: Path) -> None:
    """Each measured version's ratio to the good release (red: regressed; the good release at 1),
    the tolerance's line, and the first bad release marked. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = {v: i for i, v in enumerate(found.versions)}
    steps = [s for s in found.steps if s.ratio is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(found.versions)), 3.6))
    ax.axhline(1.0, color="grey", linewidth=1)
    tolerances = {s.tolerance for s in steps if s.tolerance}
    for tolerance in tolerances:
        worse = 1 - tolerance if metric(steps[0].metric).direction == "higher" else 1 + tolerance
        ax.axhline(worse, color="grey", linestyle=":", linewidth=1)
    for number, step in enumerate(found.steps, 1):
        if step.ratio is None:
            continue
        x = order[step.version]
        ax.scatter([x], [step.ratio], color="red" if step.regressed else "green", zorder=3)
        ax.annotate(f"step {number}", (x, step.ratio), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.scatter([0], [1.0], color="grey", marker="s", zorder=3)  # the good release: every step's reference
    ax.annotate("good", (0, 1.0), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if found.first_bad is not None:
        ax.axvline(order[found.first_bad] - 0.5, color="red", linestyle="--")
    ax.set_xticks(range(len(found.versions)), found.versions, rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.5, len(found.versions) - 0.5)
    shown = steps[0].metric if steps else ""
    ax.set_ylabel(f"{shown}: version / good" if shown else "version / good")
    ax.set_title(f"{title}\n{answer(found)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

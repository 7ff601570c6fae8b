"""``qwenperf compare``: runs across vLLM versions or config changes, judged against the first file.

Imports only the gate (and, with ``--baselines``, the history's reference), so comparing two files
on a laptop loads no server, load-generator or telemetry code."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from pytest_qwenperf.gate import compare, compare_output, pareto
from pytest_qwenperf.gate.judge import render_judgements
from pytest_qwenperf.option_table import BY_NAME

HELP = "compare runs across vLLM versions (or config changes), with verdicts against the first file"
DESCRIPTION = (
    "Tables per config x workload: one column per file or directory (session JSON from --qwenperf-json, "
    "pytest-benchmark JSON, qwenperf bench --json, vllm bench serve --save-result; a directory's *.json files are "
    "repeats of one column), deltas and verdicts against REFERENCE, each with its minimum detectable effect (MDE). "
    "A run that lost data (failed requests, token "
    "totals that disagree with the server, client-bound, a metric without a value) is 'invalid: <why>', a "
    "config x workload that REFERENCE has and a FILE lacks is 'missing'; bench results whose setups differ "
    "(model, dataset, lengths, load, sampling: vllm bench serve saves no dataset or temperature, so record them "
    "with --metadata dataset_name=NAME temperature=T) are 'not-comparable'. Session JSON's canary answers are judged "
    "per config against REFERENCE's: 'changed-output' below the floor of its suite's [canary] table. Exit 1 on a "
    "--fail-on verdict, exit 2 for an unreadable input. With --baselines, each FILE's runs are judged instead against "
    "their own references, as a session judges them: the stored baseline, else the history store's recent valid runs."
)
ERRORS: tuple[type[Exception], ...] = ()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reference", type=Path, metavar="REFERENCE", help="the file or directory the others are judged against")
    parser.add_argument("files", nargs="*", type=Path, metavar="FILE", help="a results file, or a directory of them (repeats)")
    references = parser.add_argument_group("judged against stored references")
    BY_NAME["baselines"].add(references.add_argument, "compare")
    BY_NAME["history"].add(references.add_argument, "compare")
    parser.add_argument(
        "--fail-on",
        action="append",
        choices=compare.FAILABLE,
        metavar="VERDICT",
        help=f"exit 1 when any metric gets this verdict (repeatable; one of {', '.join(compare.FAILABLE)}); "
        f"given at all, {' and '.join(compare.LOST_DATA)} fail too unless --allow-ed",
    )
    parser.add_argument(
        "--allow",
        action="append",
        choices=compare.LOST_DATA,
        metavar="VERDICT",
        help=f"do not fail on this verdict that --fail-on fails on by default (repeatable; {' or '.join(compare.LOST_DATA)})",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="GitHub-flavoured markdown (for $GITHUB_STEP_SUMMARY)")
    output.add_argument("--json", action="store_true", help=f"machine-readable output (schema {compare_output.SCHEMA})")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also write total tok/s per rung and file as a PNG")
    parser.add_argument(
        "--pareto",
        type=Path,
        metavar="PNG",
        help="also write one chart per rung of output tok/s per device (GPUs: TP x PP x DP x replicas; CPU build: server "
        "cores) against output tok/s per user (1000 / mean TPOT), every repeat of every run a point, each file's points "
        "joined along its Pareto frontier; with --json, the points under 'pareto'",
    )
    parser.add_argument("--metric", action="append", metavar="NAME", help="only these metrics (repeatable)")


def run(args: argparse.Namespace) -> int:
    """``--fail-on`` fails on the verdicts it names and on :data:`compare.LOST_DATA` unless ``--allow``-ed."""
    allowed, named = set(args.allow or ()), set(args.fail_on or ())
    if allowed & named:
        both = ", ".join(sorted(allowed & named))
        print(f"qwenperf: --allow {both} contradicts --fail-on {both}: give one of them", file=sys.stderr)
        return 2
    if args.baselines is None and not args.files:
        print("qwenperf: compare needs a REFERENCE and at least one FILE, or --baselines to judge FILEs against their own", file=sys.stderr)
        return 2
    if args.history is not None and args.baselines is None:
        print("qwenperf: --history is read with --baselines: give the baselines folder too", file=sys.stderr)
        return 2
    if args.baselines is not None:
        return _against_references(args, failing_on=named | (set(compare.LOST_DATA) - allowed) if named else set())
    try:
        sets = [compare.load_runs(p) for p in (args.reference, *args.files)]
        comparison = compare.compare(sets, args.metric or ())
        points = pareto.points_of(sets, comparison.labels) if args.pareto else None
        if args.plot:
            compare_output.plot_throughput(comparison, args.plot)
        if points is not None:
            compare_output.plot_pareto(points, args.pareto)
    except compare.CompareError as exc:
        print(f"qwenperf: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(compare_output.as_json(comparison, points), indent=2))
    else:
        print(compare_output.render(comparison, markdown=args.markdown))
    failing_on = named | (set(compare.LOST_DATA) - allowed) if named else set()
    failing = {verdict: n for verdict, n in sorted(comparison.verdicts().items()) if verdict in failing_on}
    if failing:
        print("qwenperf: failing on " + ", ".join(f"{n} {verdict}" for verdict, n in failing.items()), file=sys.stderr)
        return 1
    return 0


def _against_references(args: argparse.Namespace, failing_on: set[str]) -> int:
    """``--baselines``: every point of every FILE (REFERENCE included) against its own reference."""
    from pytest_qwenperf.gate.baseline import BaselineError
    from pytest_qwenperf.history.reference import References, judged_files

    if args.plot or args.pareto:
        print("qwenperf: --plot and --pareto draw files side by side; with --baselines there is no column to draw", file=sys.stderr)
        return 2
    try:
        sets = [compare.load_runs(p) for p in (args.reference, *args.files)]
        found = judged_files(sets, References(args.baselines, args.history))
    except (compare.CompareError, BaselineError) as exc:
        print(f"qwenperf: {exc}", file=sys.stderr)
        return 2
    wanted = set(args.metric or ())
    shown = [(point, [j for j in point.judgements if not wanted or j.metric in wanted]) for point in found]
    if args.json:
        points = [
            {"file": str(point.path), "suite": point.key[0], "config": point.key[1], "workload": point.key[2],
             "reference": point.reference or None, "judgements": [compare_output.judgement_json(j) for j in judgements]}
            for point, judgements in shown
        ]  # fmt: skip
        print(json.dumps({"schema": compare_output.REFERENCES_SCHEMA, "points": points}, indent=2))
    else:
        for point, judgements in shown:
            title = f"{point.path}: {point.key[1]} x {point.key[2]}"
            print(f"## {title}\n" if args.markdown else title)
            print(render_judgements(judgements, markdown=args.markdown) if judgements else "no gated metric", end="\n\n")
    counts = Counter(j.verdict for _, judgements in shown for j in judgements)
    failing = {verdict: n for verdict, n in sorted(counts.items()) if verdict in failing_on}
    if failing:
        print("qwenperf: failing on " + ", ".join(f"{n} {verdict}" for verdict, n in failing.items()), file=sys.stderr)
        return 1
    return 0

"""Compare runs across files (vLLM versions, or config changes): one table per config × workload.

Inputs (read by :mod:`~pytest_qwenperf.gate.sources`) are session JSON (``--qwenperf-json``),
pytest-benchmark JSON carrying qwenperf runs, ``qwenperf bench --json`` results and ``vllm
bench serve --save-result`` results. Each file, or directory of such files, is a column,
labelled by the vLLM version its runs report. The first column is the reference: every
later column's runs are judged against it with the same verdicts as a stored baseline
(:func:`~pytest_qwenperf.core.verdict.judge_against_run`), so a different argv or workload is
"not comparable", never a regression, and a run that lost data on either side (failed
requests, token totals that disagree with the server, a client-bound run, a metric without
a value) is "invalid" with the reason. A config × workload the reference has and a later
file lacks is "missing" in that file's column, one verdict per row, so it counts in the
summary like any other. :data:`LOST_DATA` are the verdicts ``--fail-on`` fails on whatever
else it names. Every judged cell shows its minimum detectable effect where the spread gives
one (``pass (MDE 3.2%)``): the smallest change the repeats could have told from none.

Bench results have no config × workload: a column's bench results are one setup, in one
table of their own, and a pair whose setups differ (model, dataset, lengths, load, sampling;
:func:`~pytest_qwenperf.gate.setups.differences`) is "not comparable" naming the fields.
A column holding a single suite run and one holding a single bench setup share a table,
so that their pair says why it is not comparable instead of "missing".

Rows: the metrics whose :attr:`~pytest_qwenperf.core.metrics.MetricInfo.row` says so,
when a run has them: total and output tok/s, p99 TTFT and TPOT first, then prefix-cache
hit rate, speculative acceptance, multi-node scaling efficiency (``metrics``) and device
utilization from the run's ``telemetry`` block (shown, not judged: utilization explains
a throughput change, it is not a goal). Only the rows shown are judged.

Runs of the same config × workload that appear more than once in one column (one file, or
the files of one directory) are pooled (their samples joined), so rounds recorded separately
still give a spread; the pool has every repeat's failed requests, token mismatch and
client-bound reason, and a metric that one repeat lacks has no value in the pool. Repeats must
be of one setup: runs that differ are an error naming the files and the field. **A file is one
session** (its runs of a key are that session's repeats) and a directory's files are sessions, in
any column: where the two columns' sessions together show how far sessions differ (3 reference
files against one, 2 against 2, 3 against 3:
:func:`~pytest_qwenperf.core.verdict.sessions_known`), a verdict tests sessions against sessions
(:func:`~pytest_qwenperf.core.verdict.judge`); with fewer, it knows only where a run's history
told it (:attr:`~pytest_qwenperf.core.run.Run.runner_noise`), and the output counts the verdicts
that rest on one session's repeats alone.

Canary answers (session JSON's ``canaries``) follow the tables: per config, each later file's
answer against the reference's (:func:`~pytest_qwenperf.core.canary.judge_canary`, within the
floor the reference's answer carries: its suite's ``[canary]`` table), with its match rate,
drift and verdict, ``changed-output`` among them. A file without any answers (an older one, a
session that ran no correctness test) is not judged on them; one that has answers but none for a
config the reference answered is ``missing`` there. Where a column holds differing answers of
one config, the one that agrees least with the reference is shown.

Where a group's verdicts in a later file include a regression, or its config's canary answer there
changed, the group carries that file's likely causes (:attr:`Group.diagnoses`, from
:func:`~pytest_qwenperf.gate.diagnosis.diagnose` on the two runs): what differs in their setup and
what moved beyond its noise, ranked.

A group also carries each file's operator profile, where its run has one (``--qwenperf-profile``,
``qwenperf bench --profile``): shown, never judged.

:mod:`pytest_qwenperf.gate.compare_output` shows a comparison: a table, markdown, JSON or a plot.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import msgspec

from pytest_qwenperf.core.canary import Canary, CanaryJudgement, judge_canary
from pytest_qwenperf.core.combine import pooled
from pytest_qwenperf.core.metrics import METRICS, gate_order, metric
from pytest_qwenperf.core.profile import OperatorProfile
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.verdict import Judgement, Verdict
from pytest_qwenperf.gate import sources
from pytest_qwenperf.gate.diagnosis import Diagnosis, diagnose
from pytest_qwenperf.gate.judge import judge_against_run, judge_run
from pytest_qwenperf.gate.setups import BENCH_KEY, Result, RunKey, Setup, SourceError, differences

_FIRST = tuple(name for name, info in METRICS.items() if info.row == "first")
_NOT_JUDGED = tuple(info for info in METRICS.values() if info.row != "none" and not info.gated)
"""Rows shown, not judged: device utilization."""
FAILABLE: tuple[Verdict, ...] = tuple(v for v in get_args(Verdict) if v != "pass")
LOST_DATA: tuple[Verdict, ...] = ("missing", "invalid")
"""Verdicts ``--fail-on`` fails on whatever it names (unless ``--allow``-ed): a run that lost data never passes."""

_APART = "(another setup)"
"""The workload fingerprint of a run judged as not comparable with its reference (no digest looks like it)."""


class CompareError(ValueError):
    """An input cannot be compared (unreadable file, unknown metric, no plotting library); exit status 2."""


@dataclass(frozen=True)
class RunSet:
    """The runs of one column (a file or a directory), by config × workload; the setup of its bench results."""

    path: Path
    label: str
    runs: Mapping[RunKey, Run]
    setups: Mapping[RunKey, Setup] = dataclasses.field(default_factory=dict)
    canaries: Mapping[str, tuple[Canary, ...]] = dataclasses.field(default_factory=dict)  # by config key, distinct answers
    results: tuple[Result, ...] = ()  # every run as read, unpooled, with its file (the Pareto view's points)
    verdicts: Mapping[RunKey, tuple[Judgement, ...]] = dataclasses.field(default_factory=dict)  # as its one session decided them
    diagnoses: Mapping[RunKey, Diagnosis] = dataclasses.field(default_factory=dict)  # why a run regressed, as its session decided
    canary_verdicts: Mapping[str, CanaryJudgement] = dataclasses.field(default_factory=dict)  # by config key, as its one session judged


# ------------------------------------------------------------------ reading


def _pooled(path: Path, key: RunKey, results: list[Result]) -> Run:
    """Several runs of one key in one column as one run whose samples are all of theirs."""
    runs = [result.run for result in results]
    distinct = [(run, result) for i, (run, result) in enumerate(zip(runs, results, strict=True)) if run not in runs[:i]]
    first, origin = distinct[0]
    if len(distinct) == 1:
        return first
    for other, where in distinct[1:]:
        if origin.setup is not None and where.setup is not None:
            differences = origin.setup.differences(where.setup)
            subject = f"{origin.file.name} and {where.file.name}"
        else:
            differences = first.identity.baseline().differences(other.identity.baseline())
            files = f" in {origin.file.name} and {where.file.name}" if origin.file != where.file else ""
            subject = f"runs of {'/'.join(key[:2])} on {key[2]}{files}"
        if differences:
            raise CompareError(f"{path}: {subject}: expected repeats of one setup, but they differ (" + "; ".join(differences) + ")")
    by_file: dict[Path, list[Run]] = {}
    for run, where in distinct:
        by_file.setdefault(where.file, []).append(run)
    sessions = [_repeats(runs) for runs in by_file.values()]
    return sessions[0] if len(sessions) == 1 else pooled(sessions, first, "runs pooled")


def _repeats(runs: list[Run]) -> Run:
    """The runs of one key in one file as one session's repeats."""
    return runs[0] if len(runs) == 1 else msgspec.structs.replace(pooled(runs, runs[0], "runs pooled"), sessions=None)


def load_runs(path: Path) -> RunSet:
    """Read one column, a results file or a directory of them; :class:`CompareError` names the file, the field and what was expected."""
    try:
        read = sources.read(Path(path))
    except SourceError as exc:
        raise CompareError(str(exc)) from None
    results = read.runs
    by_key: dict[RunKey, list[Result]] = {}
    for result in results:
        by_key.setdefault(result.key, []).append(result)
    answers: dict[str, list[Canary]] = {}
    for answer in read.canaries:
        same = answers.setdefault(answer.config_key, [])
        if not any((a.identity, a.fingerprint) == (answer.identity, answer.fingerprint) for a in same):
            same.append(answer)
    versions = {result.run.context.vllm_version for result in results if result.run.context.vllm_version}
    versions |= {answer.context.vllm_version for answer in read.canaries if answer.context.vllm_version}
    label = ", ".join(sorted(versions)) or Path(path).name
    setups = {key: found[0].setup for key, found in by_key.items() if found[0].setup is not None}
    runs = {key: _pooled(Path(path), key, found) for key, found in by_key.items()}
    canaries = {key: tuple(found) for key, found in answers.items()}
    # A run pooled from several sessions has no one session's verdicts.
    decided = Counter(verdicts.key for verdicts in read.verdicts)
    ones = [v for v in read.verdicts if decided[v.key] == 1 and len(by_key.get(v.key, ())) == 1]
    verdicts = {v.key: v.judgements for v in ones}
    diagnoses = {v.key: v.diagnosis for v in ones if v.diagnosis is not None}
    judged = Counter(j.config for j in read.canary_verdicts)
    canary_verdicts = {j.config: j for j in read.canary_verdicts if judged[j.config] == 1}
    return RunSet(Path(path), label, runs, setups, canaries, results, verdicts, diagnoses, canary_verdicts)


# ------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class Row:
    metric: str
    unit: str
    values: tuple[float | None, ...]  # one per file
    judgements: tuple[Judgement | None, ...]  # one per file after the first; None: not judged


@dataclass(frozen=True)
class Group:
    key: RunKey
    hardware: str
    rows: tuple[Row, ...]
    throughput: tuple[float | None, ...]  # total tok/s per file, for the plot whatever the rows
    setups: tuple[Setup | None, ...] = ()  # per file, where bench results are in the group
    diagnoses: tuple[Diagnosis | None, ...] = ()  # per file after the first: why it changed; None: no regression or changed output
    profiles: tuple[OperatorProfile | None, ...] = ()  # per file: its run's operator profile (``--qwenperf-profile``); None: none

    @property
    def title(self) -> str:
        """``suite/config · workload (hardware)``; a bench group's first setup."""
        if self.key == BENCH_KEY:
            return next(setup for setup in self.setups if setup is not None).describe()
        suite, config, workload = self.key
        return f"{suite}/{config} · {workload} ({self.hardware})"


@dataclass(frozen=True)
class CanaryRow:
    """One config's canary answers, judged in each later file against the reference's."""

    config: str  # the config's key
    judgements: tuple[CanaryJudgement | None, ...]  # one per file after the first; None: the file has no answers


@dataclass(frozen=True)
class Comparison:
    labels: tuple[str, ...]
    groups: tuple[Group, ...]
    paths: tuple[Path, ...]  # one per label
    canaries: tuple[CanaryRow, ...] = ()

    def judgements(self) -> list[tuple[Group, str, Judgement]]:
        """(group, file label, judgement) for every judged cell."""
        return [
            (group, label, judgement)
            for group in self.groups
            for row in group.rows
            for label, judgement in zip(self.labels[1:], row.judgements, strict=True)
            if judgement is not None
        ]

    def verdicts(self) -> Counter[Verdict]:
        """Every judged cell's verdict, the canary answers' included."""
        answers = [j.verdict for row in self.canaries for j in row.judgements if j is not None]
        return Counter([judgement.verdict for _, _, judgement in self.judgements()] + answers)


def _utilization(run: Run) -> dict[str, float]:
    """The rows of :data:`_NOT_JUDGED` a run has; a missing or null entry is a sampler that did not run."""
    values = {info.name: run.value(info.name) for info in _NOT_JUDGED}
    return {name: value for name, value in values.items() if value is not None}


def _values(run: Run) -> dict[str, float]:
    """Every metric this comparison can show, as one number (samples at their centre)."""
    gated = {name: centre(samples) for name, samples in run.gated_samples().items()}
    return {**gated, **_utilization(run)}


def _shown(name: str) -> bool:
    return metric(name).row != "none"


def _judged(
    reference: Run | None, run: Run | None, setups: tuple[Setup | None, Setup | None], path: Path, key: RunKey
) -> dict[str, Judgement]:
    """``run``'s judgements against ``reference``. A pair whose setups differ is judged as runs of
    different identities (the setups decide: a bench result's run identity does not hold them all),
    and its "not comparable" says which fields differ."""
    if run is None:
        return {} if reference is None else _missing(reference, path, key)
    if reference is None:
        return {j.metric: j for j in judge_run(None, run)}
    apart = differences(*setups)
    if apart:
        run = msgspec.structs.replace(run, identity=msgspec.structs.replace(run.identity, workload_fingerprint=_APART))
    judgements = judge_against_run(reference, run)
    if apart:
        detail = "not comparable (reference vs run): " + "; ".join(apart)
        judgements = tuple(dataclasses.replace(j, detail=detail) if j.verdict == "not-comparable" else j for j in judgements)
    return {j.metric: j for j in judgements}


def _missing(reference: Run, path: Path, key: RunKey) -> dict[str, Judgement]:
    """A "missing" verdict for every gated metric the reference measured (for every one it names,
    when it has no value at all), so the absence counts."""
    gated = reference.gated_samples()
    what = "bench result" if key == BENCH_KEY else f"run of {key[0]}/{key[1]} on {key[2]}"
    detail = f"{path.name} has no {what}; the reference has one"
    judgements = {}
    for name in gate_order(gated or reference.lost_values()):
        spec = metric(name)
        assert spec.tolerance is not None  # runs only carry gated metrics
        samples = gated.get(name)
        base = centre(samples) if samples else None
        tolerance = (reference.tolerances or {}).get(name, spec.tolerance)
        judgements[name] = Judgement(name, spec.unit, spec.direction, base, None, None, tolerance, "missing", detail)
    return judgements


def compare(sets: Sequence[RunSet], metrics: Sequence[str] = ()) -> Comparison:
    """Tables of ``metrics`` (default: the standard rows) per config × workload, judged against ``sets[0]``."""
    sets = _aligned(sets)
    keys = list(dict.fromkeys(key for run_set in sets for key in run_set.runs))
    canaries = _canary_rows(sets)
    groups = []
    for key in keys:
        runs = [run_set.runs.get(key) for run_set in sets]
        setups = tuple(run_set.setups.get(key) for run_set in sets)
        values = [_values(run) if run is not None else {} for run in runs]
        judged = [
            _judged(runs[0], run, (setups[0], setup), run_set.path, key)
            for run, setup, run_set in zip(runs[1:], setups[1:], sets[1:], strict=True)
        ]
        present = list(dict.fromkeys([name for v in values for name in v] + [name for j in judged for name in j]))
        names = [m for m in metrics if m in present] if metrics else [m for m in _order(present) if _shown(m)]
        rows = tuple(
            Row(
                name,
                metric(name).unit,
                tuple(v.get(name) for v in values),
                tuple(j.get(name) for j in judged),
            )
            for name in names
        )
        first = next(run for run in runs if run is not None)
        throughput = tuple(v.get("total_token_throughput") for v in values)
        diagnoses = _diagnoses(key, runs, rows, canaries)
        profiles = tuple(run.profile if run is not None else None for run in runs)
        groups.append(Group(key, first.identity.hardware, rows, throughput, setups if any(setups) else (), diagnoses, profiles))
    shown = {row.metric for group in groups for row in group.rows}
    missing = [m for m in metrics if m not in shown]
    if missing:
        present = sorted({name for run_set in sets for run in run_set.runs.values() for name in _values(run)})
        raise CompareError(f"--metric {', '.join(missing)}: no input has it; metrics present: {', '.join(present)}")
    return Comparison(_unique_labels(sets), tuple(groups), tuple(s.path for s in sets), canaries)


def _diagnoses(key: RunKey, runs: Sequence[Run | None], rows: Sequence[Row], canaries: Sequence[CanaryRow]) -> tuple[Diagnosis | None, ...]:
    """Per file after the first, why its run of ``key`` changed (:func:`~pytest_qwenperf.gate.diagnosis.diagnose`)
    where the group's verdicts in it include a regression or its config's canary answer changed; None elsewhere."""
    config = f"{key[0]}/{key[1]}"
    answers = next((row.judgements for row in canaries if key != BENCH_KEY and row.config == config), (None,) * (len(runs) - 1))
    found = []
    for i, run in enumerate(runs[1:]):
        judgements = [j for row in rows if (j := row.judgements[i]) is not None]
        diagnosis = diagnose(runs[0], run, judgements, answers[i]) if runs[0] is not None and run is not None else None
        found.append(diagnosis if diagnosis is not None and diagnosis.changed else None)
    return tuple(found)


def _canary_rows(sets: Sequence[RunSet]) -> tuple[CanaryRow, ...]:
    reference = sets[0]
    configs = list(dict.fromkeys(key for run_set in sets for key in run_set.canaries))
    rows = [CanaryRow(config, tuple(_canary_judgement(reference, run_set, config) for run_set in sets[1:])) for config in configs]
    return tuple(row for row in rows if any(row.judgements))


def _canary_judgement(reference: RunSet, run_set: RunSet, config: str) -> CanaryJudgement | None:
    """The answer of ``config`` in ``run_set`` against the reference's first; the least agreeing of
    several. None when ``run_set`` has no answers at all, or neither it nor the reference has one of ``config``."""
    first = reference.canaries.get(config, (None,))[0]
    answers = run_set.canaries.get(config)
    if not run_set.canaries:
        return None
    if answers is None:
        if first is None:
            return None
        return CanaryJudgement(
            config=config, verdict="missing", detail=f"{run_set.path.name} has no canary answer of {config}; the reference has one", floor=first.floor
        )
    floor = first.floor if first is not None else answers[0].floor
    absent = f"{reference.path.name} has no canary answer of {config}"
    judged = [judge_canary(first, answer, floor, absent=absent) for answer in answers]
    return min(judged, key=lambda j: (j.verdict == "pass", j.found.match_rate if j.found else 1.0))


def _aligned(sets: Sequence[RunSet]) -> Sequence[RunSet]:
    """``sets`` with the single run of a later column under the key of the reference's single run,
    where one of the two is a bench result: one table whose verdict says why they do not compare."""
    if len(sets[0].runs) != 1:
        return sets
    (key,) = sets[0].runs
    aligned = [sets[0]]
    for run_set in sets[1:]:
        if len(run_set.runs) == 1 and key not in run_set.runs and BENCH_KEY in (key, *run_set.runs):
            ((own, run),) = run_set.runs.items()
            setups = {key: run_set.setups[own]} if own in run_set.setups else {}
            aligned.append(dataclasses.replace(run_set, runs={key: run}, setups=setups))
        else:
            aligned.append(run_set)
    return aligned


def _order(names: Sequence[str]) -> list[str]:
    """The first rows first, then the others in the order they were met."""
    return [m for m in _FIRST if m in names] + [m for m in names if m not in _FIRST]


def _unique_labels(sets: Sequence[RunSet]) -> tuple[str, ...]:
    counts = Counter(s.label for s in sets)
    return tuple(s.label if counts[s.label] == 1 else f"{s.label} ({s.path.name})" for s in sets)

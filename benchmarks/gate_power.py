"""How often does the perf gate catch a real slowdown on the embedded CPU default, and how often does it cry wolf?

One vLLM CPU server of the cpu suite's ``base`` config (the embedded tiny model, pinned as
the suite pins it: the server on every CPU but the last, the client on the last) runs for
the whole measurement. Its whole process tree sits in a cgroup of the ``cpu`` controller
(v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, or v2 ``cpu.max``), and the slowdowns are
made by the kernel: a CFS bandwidth quota below what the server uses. Arms:

- ``A`` and ``A2``: no quota. ``A2`` is a second ``A``, so that A/A pairs show the false-alarm rate;
- ``B5``, ``B10``, ``B20`` (``B<percent>``): a quota of ``(1 - s) * busy * period`` for a target
  slowdown ``s``, where ``busy`` is the server tree's cores busy under load, read from two
  unthrottled calibration repeats first (the larger of their ``server_cpu_busy``: other work
  on the server's cores only ever lowers it).

The target is not taken for granted: the analysis reports the slowdown each arm achieved
(the pooled ratio of its output throughput to the interleaved ``A`` repeats').

The measurement is ``--blocks`` blocks of ``--rounds`` rounds; each round runs one repeat
of every arm, in an order from a Williams design (every arm in every position, and after
every other arm, equally often over a cycle), so that position and carry-over effects
cancel. One repeat is one load run of the workload exactly as the suite measures it
(:func:`~pytest_qwenperf.measure.run.measure` with one repeat: the prefix cache reset, the
warm-up requests, the suite's concurrency and placement). Each repeat records the gated
metrics, ``server_cpu_busy``, and ``tokens_per_server_cpu_s`` over the whole repeat: the
tokens the server generated during the load run (its ``vllm:generation_tokens`` counter,
warm-up included) over the CPU seconds its process tree used meanwhile (psutil), the
registry's figure of the same name (which the suite takes over the steady-state window),
one a CPU quota should leave unchanged. The raw results go to a JSON file, rewritten after every round, so an
interrupted run keeps what it measured.

``--analyse FILE`` forms, per block, the A/A pair (``A`` vs ``A2``) and the A/B pairs
(``A`` vs each ``B``), each side the block's first ``--repeats`` rounds, and judges each
pair with the gate's own rule (:func:`~pytest_qwenperf.core.verdict.judge`, ``A`` as the
baseline). It prints, per metric and arm: the pooled change, how many pairs were judged a
regression (A/A: false alarms; A/B: detections), the verdicts, and the minimum detectable
effect's spread where the judgement carries one; then ``A``'s spread within blocks and
between them.

The CFS period is 10 ms by default, not the kernel's 100 ms: a throttled stretch is then
shorter than an engine step (about 23 ms here: 32 sequences at ~1,400 output tok/s), so the quota reads as a slower
CPU rather than as pauses. (A two-round check of each gave B10 slowdowns of 9-12 % at 10 ms
and 6-20 % at 100 ms: not told apart by this machine's noise.)

    python -m benchmarks.gate_power --blocks 20 --rounds 3
    python -m benchmarks.gate_power --analyse benchmarks/results/gate_power-<date>.json --tolerance 0.05

Needs root (or a delegated, writable cgroup) and the CPU build of vLLM. On the 2-core
machine a repeat takes about 25-35 s (1,200-1,500 output tok/s), so a block of five arms
and three rounds about 8 minutes, and the default 20 blocks about 2.5-3 hours.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import numpy as np
import psutil

from benchmarks.cpu_cgroup import CgroupError, CpuCgroup
from benchmarks.early_stop import follow
from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.core.metrics import Direction, metric
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.verdict import DEFAULT_CONFIDENCE, Hearing, Judgement, Side, judge
from pytest_qwenperf.gate.judge import losses
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.run import measure
from pytest_qwenperf.serving import proctree
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import placement
from pytest_qwenperf.serving.pool import server_spec
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER, ManagedServer
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload, load_suite

HERE = Path(__file__).resolve().parent
DEFAULT_SUITE = HERE.parent / "perf_tests" / "suites" / "cpu.toml"
SCHEMA = "qwenperf-gate-power/1"
DEFAULT_ARMS = "A,A2,B5,B10,B20"
COMPANION = "tokens_per_server_cpu_s"
METRICS = (
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "server_cpu_busy",
    COMPANION,
)
"""What each repeat records and the analysis judges, in this order."""


# ------------------------------------------------------------------ arms and their order


@dataclass(frozen=True)
class Arm:
    """``A``, ``A2``, ...: no quota; ``B<percent>``: a quota for that target slowdown."""

    name: str
    slowdown: float  # the target, a fraction; 0 for the unthrottled arms


_ARM = re.compile(r"A\d*|B(?P<percent>\d+(?:\.\d+)?)")


def parse_arms(text: str) -> tuple[Arm, ...]:
    """``"A,A2,B10"`` → arms; ``A`` (the reference every pair is judged against) must be one of them."""
    arms = []
    for name in (part.strip() for part in text.split(",")):
        match = _ARM.fullmatch(name)
        if match is None:
            raise ValueError(f"arm {name!r}: expected A, A<n> (unthrottled) or B<percent> (a target slowdown, e.g. B10)")
        slowdown = float(match["percent"]) / 100 if match["percent"] else 0.0
        if match["percent"] and not 0 < slowdown < 1:
            raise ValueError(f"arm {name!r}: a slowdown between 0 and 100 percent, exclusive")
        arms.append(Arm(name, slowdown))
    names = [arm.name for arm in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arms {names}: each at most once")
    if "A" not in names:
        raise ValueError(f"arms {names}: A, the reference, must be one of them")
    return tuple(arms)


def williams_rows(n: int) -> tuple[tuple[int, ...], ...]:
    """A Williams design for ``n`` treatments: rows in which every treatment takes every position,
    and follows every other treatment, equally often (``n`` rows, ``2n`` when ``n`` is odd)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    rows = [tuple((t + shift) % n for t in first) for shift in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return tuple(rows)


def arm_order(arms: Sequence[Arm], index: int) -> tuple[Arm, ...]:
    """The arms in the order round ``index`` (counted over all blocks) runs them."""
    rows = williams_rows(len(arms))
    return tuple(arms[i] for i in rows[index % len(rows)])


CALIBRATION_AGREEMENT = 0.9
"""Calibration repeats whose cores busy differ by more than this ratio are reported: other work shared the server's cores."""

MIN_QUOTA_US = 1000
"""The kernel refuses a CFS quota under 1 ms."""


def quota_us(slowdown: float, busy_cores: float, period_us: int) -> int | None:
    """The CFS quota per period that leaves the server ``(1 - slowdown)`` of the cores it used; None: no quota."""
    if slowdown == 0:
        return None
    if not 0 < slowdown < 1:
        raise ValueError(f"slowdown must be a fraction in [0, 1), got {slowdown}")
    if not busy_cores > 0:
        raise ValueError(f"the server's cores busy must be positive, got {busy_cores}")
    quota = round((1 - slowdown) * busy_cores * period_us)
    if quota < MIN_QUOTA_US:
        raise ValueError(f"quota {quota} µs for a {slowdown:.0%} slowdown is under the kernel's minimum {MIN_QUOTA_US} µs; use a longer --period-us")
    return quota


# ------------------------------------------------------------------ measuring


def tree_cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs``, with their waited-for children's (so a worker that
    exits between two readings still counts, through its parent)."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


@dataclass(frozen=True)
class Bench:
    """What every repeat runs against."""

    server: ManagedServer
    cgroup: CpuCgroup
    suite: Suite
    config: ServingConfig
    workload: SuiteWorkload
    client_cpus: frozenset[int]

    def tree(self) -> set[psutil.Process]:
        assert self.server.pid is not None
        return proctree.tree_of(self.server.pid, self.server.tag)


def one_repeat(bench: Bench, arm: Arm, quota: int | None) -> dict[str, Any]:
    """One load run of the workload with ``quota`` on the server's cgroup, as a JSON record."""
    before_tree = bench.tree()  # looked up again each time: vLLM starts its workers as it goes
    processes = bench.cgroup.adopt(before_tree)
    bench.cgroup.set_quota(quota)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    throttled, cpu_s, wall = bench.cgroup.throttling(), tree_cpu_seconds(before_tree), time.perf_counter()
    run = measure(bench.server, bench.config, bench.workload, Method.of(bench.suite, repeats(1), ClientSetup(cpus=bench.client_cpus)))
    wall = time.perf_counter() - wall
    cpu_s = tree_cpu_seconds(bench.tree() | before_tree) - cpu_s
    throttled = bench.cgroup.throttling().since(throttled)
    generated = run.server.deltas.get("generation_tokens")
    return {
        "arm": arm.name,
        "quota_us": quota,
        "started": started,
        "wall_s": wall,
        "metrics": repeat_metrics(run, generated, cpu_s),
        "server_cpu_s": cpu_s,
        "generated_tokens": generated,
        "throttling": {"periods": throttled.periods, "throttled_periods": throttled.throttled_periods, "throttled_s": throttled.throttled_s},
        "processes": processes,
        "invalid": [loss.reason for loss in losses(run)],
        "loadavg": list(os.getloadavg()),
    }


def repeat_metrics(run: Run, generated_tokens: float | None, server_cpu_s: float) -> dict[str, float | None]:
    """The figures of :data:`METRICS` from one repeat."""
    values = {name: run.value(name) for name in METRICS if name != COMPANION}
    values[COMPANION] = generated_tokens / server_cpu_s if generated_tokens and server_cpu_s > 0 else None
    return values


def busy_cores(calibration: Sequence[Mapping[str, Any]]) -> float:
    """The server's cores busy under load: the largest of the repeats' ``server_cpu_busy`` (its
    steady window), else of their CPU seconds per wall second over the whole repeat. The largest,
    because other work on the server's cores only ever lowers it."""
    busy = [r["metrics"]["server_cpu_busy"] for r in calibration if r["metrics"]["server_cpu_busy"]]
    if not busy:
        busy = [r["server_cpu_s"] / r["wall_s"] for r in calibration if r["wall_s"] > 0]
    if not busy:
        raise ValueError("calibration: no repeat measured the server's CPU")
    return float(max(busy))


@contextmanager
def sigterm_as_interrupt() -> Iterator[list[signal.Signals]]:
    """SIGTERM takes Ctrl-C's path (as ``qwenperf`` does), so the server and the cgroup are cleaned up;
    the list names the signal once one came."""
    received: list[signal.Signals] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        received.append(signal.SIGTERM)
        on_sigint = signal.getsignal(signal.SIGINT)
        if not callable(on_sigint):
            raise KeyboardInterrupt
        on_sigint(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def default_out() -> Path:
    return HERE / "results" / f"gate_power-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%SZ}.json"


def run_measurement(args: argparse.Namespace) -> int:
    arms = parse_arms(args.arms)
    suite = load_suite(args.suite)
    config = suite.config(args.config)
    workload = next((w for w in suite.workloads if w.id == args.workload), None)
    if workload is None or not workload.runs_on(config.id):
        raise SystemExit(f"{args.suite}: workload {args.workload!r} does not run on config {config.id!r}")
    hardware = detect()
    placed = placement(config, hardware)
    out: Path = args.out or default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "command": shlex.join(["python", "-m", "benchmarks.gate_power", *sys.argv[1:]]),
        "started": _now(),
        "finished": None,
        "interrupted": None,
        "machine": {
            "cpu_model": hardware.cpu_model,
            "nproc": os.cpu_count(),
            "cpus": sorted(hardware.cpu_ids),
            "hardware_id": hardware.id,
            "kernel": platform.release(),
            "python": platform.python_version(),
            "vllm_version": None,
            "loadavg_start": list(os.getloadavg()),
        },
        "suite": str(args.suite),
        "config": config.id,
        "vllm_args": list(config.vllm_args),
        "workload": workload.id,
        "placement": {"server_cpus": sorted(placed.server_cpus), "client_cpus": sorted(placed.client_cpus)},
        "arms": [{"name": arm.name, "slowdown": arm.slowdown} for arm in arms],
        "blocks_planned": args.blocks,
        "rounds": args.rounds,
        "cgroup": None,
        "calibration": {"repeats": [], "busy_cores": None, "quotas_us": None},
        "blocks": [],
    }
    print(f"results: {out}", file=sys.stderr)
    with sigterm_as_interrupt() as received:
        try:
            with CpuCgroup.create(args.period_us) as cgroup, tempfile.TemporaryDirectory() as logs:
                results["cgroup"] = {"path": str(cgroup.path), "version": cgroup.version, "period_us": cgroup.period_us}
                spec = server_spec(config, launcher=DEFAULT_LAUNCHER, boot_timeout_s=600, cpus=placed.server_cpus)
                with ManagedServer(spec, Path(logs)) as server:
                    results["machine"]["vllm_version"] = server.info[0].version
                    bench = Bench(server, cgroup, suite, config, workload, placed.client_cpus)
                    _measure_arms(bench, arms, args, results, out)
        except KeyboardInterrupt:
            signum = received[0] if received else signal.SIGINT
            results["interrupted"] = signum.name
            write_atomically(out, json.dumps(results, indent=1))
            print(f"interrupted by {signum.name}; what was measured is in {out}", file=sys.stderr)
            return 128 + signum
    results["finished"] = _now()
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    write_atomically(out, json.dumps(results, indent=1))
    print(f"done: {out}\nanalyse with: python -m benchmarks.gate_power --analyse {out}", file=sys.stderr)
    return 0


def _measure_arms(bench: Bench, arms: Sequence[Arm], args: argparse.Namespace, results: dict[str, Any], out: Path) -> None:
    calibration = results["calibration"]
    for n in range(args.calibration):
        calibration["repeats"].append(one_repeat(bench, Arm("A", 0.0), None))
        _report(f"calibration {n + 1}", calibration["repeats"][-1])
    busy = busy_cores(calibration["repeats"])
    quotas = {arm.name: quota_us(arm.slowdown, busy, args.period_us) for arm in arms}
    calibration |= {"busy_cores": busy, "quotas_us": quotas}
    write_atomically(out, json.dumps(results, indent=1))
    print(f"server cores busy under load: {busy:.3f}; quotas per {args.period_us} µs: {quotas}", file=sys.stderr)
    seen = [r["metrics"]["server_cpu_busy"] or 0.0 for r in calibration["repeats"]]
    if min(seen) < CALIBRATION_AGREEMENT * busy:
        print(f"WARNING: the calibration repeats' cores busy differ ({', '.join(f'{b:.2f}' for b in seen)}): is the machine quiet?", file=sys.stderr)
    for b in range(args.blocks):
        block: dict[str, Any] = {"index": b, "rounds": []}
        results["blocks"].append(block)
        block_started = time.perf_counter()
        for r in range(args.rounds):
            order = arm_order(arms, b * args.rounds + r)
            round_: dict[str, Any] = {"index": r, "order": [arm.name for arm in order], "repeats": {}}
            block["rounds"].append(round_)
            for arm in order:
                round_["repeats"][arm.name] = one_repeat(bench, arm, quotas[arm.name])
                _report(f"block {b + 1}/{args.blocks} round {r + 1}/{args.rounds} {arm.name}", round_["repeats"][arm.name])
            write_atomically(out, json.dumps(results, indent=1))
        block["wall_s"] = time.perf_counter() - block_started
        print(f"block {b + 1}: {block['wall_s']:.0f} s", file=sys.stderr)
    bench.cgroup.set_quota(None)


def _report(what: str, repeat: Mapping[str, Any]) -> None:
    m = repeat["metrics"]
    companion = f"{m[COMPANION]:,.0f}" if m[COMPANION] else "—"
    busy = f"{m['server_cpu_busy']:.2f}" if m["server_cpu_busy"] is not None else "—"
    invalid = f", INVALID: {', '.join(repeat['invalid'])}" if repeat["invalid"] else ""
    print(
        f"{what}: {m['output_throughput']:,.0f} output tok/s, {companion} tok per server CPU-s, server busy {busy}, "
        f"throttled {repeat['throttling']['throttled_s']:.1f} s, wall {repeat['wall_s']:.1f} s{invalid}",
        file=sys.stderr,
    )


# ------------------------------------------------------------------ analysis


def metric_facts(name: str) -> tuple[Direction, str]:
    """Which way is better, and the unit: the registry's."""
    info = metric(name)
    return info.direction, info.unit


def _side(block: Mapping[str, Any], arm: str, name: str, rounds: int) -> list[float]:
    """``arm``'s valid values of ``name`` over the block's first ``rounds`` rounds."""
    values = []
    for round_ in block["rounds"][:rounds]:
        repeat = round_["repeats"].get(arm)
        if repeat is not None and not repeat["invalid"] and repeat["metrics"].get(name) is not None:
            values.append(float(repeat["metrics"][name]))
    return values


def _complete_rounds(block: Mapping[str, Any], arms: Sequence[str]) -> int:
    """Rounds from the block's start in which every arm ran."""
    n = 0
    for round_ in block["rounds"]:
        if not all(arm in round_["repeats"] for arm in arms):
            break
        n += 1
    return n


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return {"median": float(median), "p10": float(p10), "p90": float(p90), "n": len(values)}


def _cv(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) >= 2 and statistics.fmean(values) else None


APART = "A2 (next group)"
"""The pseudo-arm of A/A pairs minutes apart: ``A`` of one group of blocks against ``A2`` of the next,
so the drift between them is not cancelled by interleaving (a baseline recorded earlier)."""


def _grouped(blocks: Sequence[Mapping[str, Any]], pool: int) -> list[list[Mapping[str, Any]]]:
    """Consecutive groups of ``pool`` blocks (an incomplete last group is dropped): a side is a group's repeats."""
    return [list(blocks[i : i + pool]) for i in range(0, len(blocks) - pool + 1, pool)]


def merged(files: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Mapping[str, Any]:
    """One results file of several measured with the same arms (their blocks one after the other);
    the first file's other fields, and every file's command."""
    first = files[0]
    arms = [arm["name"] for arm in first["arms"]]
    for name, other in zip(names[1:], files[1:], strict=True):
        if [arm["name"] for arm in other["arms"]] != arms:
            raise ValueError(f"{name}: expected the arms of {names[0]} ({', '.join(arms)}), got {', '.join(a['name'] for a in other['arms'])}")
        if other["rounds"] != first["rounds"]:
            raise ValueError(f"{name}: expected {first['rounds']} rounds a block as in {names[0]}, got {other['rounds']}")
    if len(files) == 1:
        return first
    return {**first, "command": [f.get("command") for f in files], "blocks": [block for f in files for block in f["blocks"]]}


def _looked(
    name: str, a_side: Sequence[float], b_side: Sequence[float], *, tolerance: float, least: int | None
) -> tuple[Judgement, int]:
    """A pair's verdict and the repeats of ``b_side`` it took: with ``least``, judged from that many on
    at each early look's confidence and stopped once decided, as ``measure.sequential.decide`` does
    with a suite's ``min_repeats`` (the planned look: all of ``b_side``)."""
    direction, unit = metric_facts(name)
    plan = SequentialPlan(DEFAULT_CONFIDENCE, len(b_side), len(b_side), least if least and least < len(b_side) else None)

    def judged(n: int, confidence: float) -> Judgement:
        sides = Side(tuple(a_side)), Side(tuple(b_side[:n]))
        return judge(Hearing(name, *sides, direction=direction, tolerance=tolerance, unit=unit, confidence=confidence))

    return follow(plan, judged)


def analyse(
    results: Mapping[str, Any], *, tolerance: float = 0.05, repeats: int | None = None, pool: int = 1, least: int | None = None
) -> dict[str, Any]:
    """Per metric and arm: the pooled change against ``A``, the pairs' verdicts and MDEs; ``A``'s spreads.

    A pair's side is the first ``repeats`` rounds of ``pool`` consecutive blocks (``pool`` > 1
    shows what more repeats per side buy). Besides the arms, :data:`APART` pairs ``A`` of
    each group with ``A2`` of the next, when the file has an ``A2``. With ``least``, each pair
    is judged with early looks from that many of the B side's repeats (in the order measured),
    and the pairs stopped early and the repeats they saved are counted.
    """
    arms = [arm["name"] for arm in results["arms"]]
    rounds = repeats or results["rounds"]
    complete = [block for block in results["blocks"] if _complete_rounds(block, arms) >= rounds]
    groups = _grouped(complete, pool)
    blocks = [block for group in groups for block in group]
    excluded = sum(
        1 for block in blocks for round_ in block["rounds"][:rounds] for repeat in round_["repeats"].values() if repeat["invalid"]
    )
    analysis: dict[str, Any] = {
        "file_command": results.get("command"),
        "tolerance": tolerance,
        "confidence": DEFAULT_CONFIDENCE,
        "repeats_per_side": rounds * pool,
        "pool": pool,
        "least": least,
        "blocks": len(blocks),
        "blocks_in_file": len(results["blocks"]),
        "invalid_repeats_left_out": excluded,
        "targets": {arm["name"]: arm["slowdown"] for arm in results["arms"]} | ({APART: 0.0} if "A2" in arms else {}),
        "metrics": {},
    }
    for name in METRICS:
        direction, unit = metric_facts(name)

        def side(group: Sequence[Mapping[str, Any]], arm: str) -> list[float]:
            return [value for block in group for value in _side(block, arm, name, rounds)]  # noqa: B023

        a_sides = [side(group, "A") for group in groups]
        per_arm: dict[str, Any] = {}
        pairings = [(arm, [(a, side(group, arm)) for a, group in zip(a_sides, groups, strict=True)]) for arm in arms if arm != "A"]
        if "A2" in arms:
            pairings.append((APART, [(a, side(group, "A2")) for a, group in zip(a_sides, groups[1:], strict=False)]))
        for arm, pairs in pairings:
            judgements: list[Judgement] = []
            pooled_a, pooled_b = [], []
            saved = []
            for a_side, b_side in pairs:
                if not a_side or not b_side:
                    continue
                pooled_a += a_side
                pooled_b += b_side
                judgement, taken = _looked(name, a_side, b_side, tolerance=tolerance, least=least)
                judgements.append(judgement)
                saved.append(len(b_side) - taken)
            mdes = [mde for j in judgements if (mde := getattr(j, "mde", None)) is not None]
            verdicts = Counter(j.verdict for j in judgements)
            per_arm[arm] = {
                "pooled_ratio": centre(pooled_b) / centre(pooled_a) if pooled_a and pooled_b and centre(pooled_a) else None,
                "pairs": len(judgements),
                "regressions": verdicts["regression"],
                "verdicts": dict(verdicts),
                "mde": _spread(mdes),
                "stopped_early": sum(1 for n in saved if n),
                "repeats_saved": sum(saved),
            }
        within = [cv for a in a_sides if (cv := _cv(a)) is not None]
        means = [statistics.fmean(a) for a in a_sides if a]
        analysis["metrics"][name] = {
            "unit": unit,
            "direction": direction,
            "arms": per_arm,
            "a_within_block_cv": _spread(within),
            "a_between_block_cv": _cv(means),
        }
    return analysis


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def print_analysis(analysis: Mapping[str, Any], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    k, n = analysis["repeats_per_side"], analysis["blocks"]
    print(
        f"{n} blocks (of {analysis['blocks_in_file']} in the file) in groups of {analysis['pool']}, {k} repeat(s) per side, tolerance {analysis['tolerance']:.0%}, "
        f"confidence {analysis['confidence']:.0%}; invalid repeats left out: {analysis['invalid_repeats_left_out']}",
        file=out,
    )
    throughput = analysis["metrics"]["output_throughput"]["arms"]
    achieved = [
        f"{arm} {_pct(1 - facts['pooled_ratio']) if facts['pooled_ratio'] else '—'} (target {analysis['targets'][arm]:.0%})"
        for arm, facts in throughput.items()
    ]
    print(f"achieved slowdown of output_throughput (pooled, against the interleaved A): {', '.join(achieved)}\n", file=out)
    early = analysis.get("least") is not None
    print(
        "| metric | arm | target slowdown | pooled change vs A | judged regression | verdicts | MDE median (p10–p90) |"
        + (" stopped early (repeats saved) |" if early else ""),
        file=out,
    )
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if early else ""), file=out)
    for name, facts in analysis["metrics"].items():
        label = f"{name} ({facts['unit']})"
        for arm, row in facts["arms"].items():
            change = _pct(row["pooled_ratio"] - 1, signed=True) if row["pooled_ratio"] else "—"
            rate = f"{row['regressions']} of {row['pairs']}" + (f" ({row['regressions'] / row['pairs']:.0%})" if row["pairs"] else "")
            verdicts = ", ".join(f"{v} {c}" for v, c in sorted(row["verdicts"].items(), key=lambda item: -item[1]))
            mde = row["mde"]
            mde_text = f"{_pct(mde['median'])} ({_pct(mde['p10'])}–{_pct(mde['p90'])})" if mde else "—"
            stopped = f" {row['stopped_early']} ({row['repeats_saved']}) |" if early else ""
            print(
                f"| {label} | {arm} | {analysis['targets'][arm]:.0%} | {change} | {rate} | {verdicts} | {mde_text} |{stopped}",
                file=out,
            )
    print("\n| metric | A within-block CV, median (p10–p90) over blocks | A between-block CV of block means |", file=out)
    print("| --- | --- | --- |", file=out)
    for name, facts in analysis["metrics"].items():
        w = facts["a_within_block_cv"]
        within = f"{_pct(w['median'])} ({_pct(w['p10'])}–{_pct(w['p90'])})" if w else "—"
        print(f"| {name} | {within} | {_pct(facts['a_between_block_cv'])} |", file=out)


# ------------------------------------------------------------------ command line


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"at least {low}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE, help="suite file (default: the cpu suite)")
    parser.add_argument("--config", default="base", help="config of the suite (default %(default)s)")
    parser.add_argument("--workload", default="isl128-osl128", help="workload of the suite (default %(default)s)")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help="A, A<n> (unthrottled), B<percent> (default %(default)s)")
    parser.add_argument("--blocks", type=_at_least(1), default=20, help="blocks (default %(default)s)")
    parser.add_argument("--rounds", type=_at_least(1), default=3, help="rounds per block, one repeat of each arm each (default %(default)s)")
    parser.add_argument("--calibration", type=_at_least(1), default=2, help="unthrottled repeats that measure the server's cores busy (default %(default)s)")
    parser.add_argument("--period-us", type=_at_least(MIN_QUOTA_US), default=10_000, help="CFS period in µs (default %(default)s)")
    parser.add_argument("--out", type=Path, help="results file (default benchmarks/results/gate_power-<UTC date-time>.json)")
    parser.add_argument(
        "--analyse", type=Path, nargs="+", metavar="FILE", help="analyse results files instead of measuring (their blocks in order)"
    )
    parser.add_argument("--tolerance", type=float, default=0.05, help="--analyse: the gate's tolerance for every metric (default %(default)s)")
    parser.add_argument("--repeats", type=_at_least(1), help="--analyse: repeats per side, the block's first rounds (default: all)")
    parser.add_argument("--pool", type=_at_least(1), default=1, help="--analyse: consecutive blocks per side (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="--analyse: print the analysis as JSON")
    parser.add_argument(
        "--least", type=_at_least(2), help="--analyse: early looks from this many repeats of the B side (a suite's min_repeats)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.analyse is not None:
        try:
            results = merged([json.loads(path.read_text()) for path in args.analyse], [str(path) for path in args.analyse])
        except ValueError as exc:
            raise SystemExit(f"--analyse: {exc}") from None
        analysis = analyse(results, tolerance=args.tolerance, repeats=args.repeats, pool=args.pool, least=args.least)
        if args.json:
            print(json.dumps(analysis, indent=2))
        else:
            print_analysis(analysis)
        return 0
    try:
        parse_arms(args.arms)
    except ValueError as exc:
        raise SystemExit(f"--arms: {exc}") from None
    try:
        return run_measurement(args)
    except CgroupError as exc:
        raise SystemExit(f"gate_power: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())

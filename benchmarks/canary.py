"""The correctness canary's figures on the CPU default: how far rungs that change numerics or add
speculative decoding answer like the rung they inherit, and how far two boots of one rung agree.

Each session boots, one at a time, the cpu suite's ``ctx-short`` (the parent), ``fp8kv`` (FP8 KV
cache), ``ngram-spec`` (n-gram speculative decoding) and ``ctx-short`` with ``--dtype float32``
(a change of numerics the suite does not have), asks each the canary once
(:func:`pytest_qwenperf.measure.canary.canary_of`) and stops it. Per session it reports each
rung's match rate, common-prefix rate and mean log-prob drift against that session's
``ctx-short``, and, across sessions, each rung's answer against its first session's. The raw
answers, boot and canary times go to a JSON file, rewritten after every session; a file that
exists is continued up to ``--sessions``.

    python -m benchmarks.canary --sessions 3 --out benchmarks/results/canary-<date>.json
    python -m benchmarks.canary --analyse benchmarks/results/canary-<date>.json

Needs the CPU build of vLLM (``fp8kv``: a CPU with AVX-512 or AMX). A session takes about
3 minutes on the 2-vCPU machine (four boots of 35-50 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from pytest_qwenperf.core.canary import Canary, compare
from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.measure.canary import canary_of
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import placement
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.suite.config import ServingConfig, load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "perf_tests" / "suites" / "cpu.toml"
SCHEMA = "qwenperf-canary-figures/1"
PARENT = "ctx-short"
FLOAT32 = "ctx-short-float32"


def rungs() -> tuple[ServingConfig, ...]:
    suite = load_suite(SUITE)
    parent = suite.config(PARENT)
    float32 = dataclasses.replace(parent, id=FLOAT32, vllm_args=(*parent.vllm_args, "--dtype", "float32"), description="--dtype float32")
    return (parent, suite.config("fp8kv"), suite.config("ngram-spec"), float32)


def session(configs: Sequence[ServingConfig], log_dir: Path) -> dict[str, Any]:
    """One answer per rung, each from a fresh boot."""
    pool = ServerPool(PoolSettings(log_dir=log_dir))
    answers: dict[str, Any] = {}
    try:
        for cfg in configs:
            started = time.monotonic()
            server = pool.get(cfg, placement(cfg, detect()).server_cpus)
            booted = time.monotonic()
            canary = canary_of(server, cfg, suite="cpu")
            answers[cfg.id] = {"boot_s": booted - started, "canary_s": time.monotonic() - booted, "canary": msgspec.to_builtins(canary)}
            pool.release(cfg.key)
            print(f"  {cfg.id}: boot {booted - started:.1f} s, canary {answers[cfg.id]['canary_s']:.2f} s", flush=True)
    finally:
        pool.close()
    return answers


def _figures(reference: Canary, answer: Canary) -> str:
    found = compare(reference.outputs, answer.outputs)
    drift = "—" if found.logprob_drift is None else f"{found.logprob_drift:.4f}"
    return f"match {found.match_rate:.3f} ({found.matched}/{found.prompts}), prefix {found.prefix_rate:.3f}, drift {drift}"


def analyse(sessions: Sequence[Mapping[str, Any]]) -> list[str]:
    answers = [{rung: msgspec.convert(a["canary"], Canary) for rung, a in s["answers"].items()} for s in sessions]
    lines = [f"against {PARENT} of the same session:"]
    for rung in (r for r in answers[0] if r != PARENT):
        for n, found in enumerate(answers):
            lines.append(f"  {rung} session {n + 1}: {_figures(found[PARENT], found[rung])}")
    lines.append("against the same rung's first session (another boot):")
    for rung in answers[0]:
        for n, found in enumerate(answers[1:], start=2):
            lines.append(f"  {rung} session {n}: {_figures(answers[0][rung], found[rung])}")
    times = [a["canary_s"] for s in sessions for a in s["answers"].values()]
    lines.append(f"canary time per config: {min(times):.2f}-{max(times):.2f} s (median {sorted(times)[len(times) // 2]:.2f} s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--analyse", type=Path, metavar="JSON", help="report on a results file instead of measuring")
    args = parser.parse_args(argv)
    if args.analyse:
        print("\n".join(analyse(json.loads(args.analyse.read_text())["sessions"])))
        return 0
    if args.out is None:
        parser.error("--out is needed to measure")
    document: dict[str, Any] = {"schema": SCHEMA, "machine": msgspec.to_builtins(detect().machine()), "sessions": []}
    if args.out.exists():
        document = json.loads(args.out.read_text())
    configs = rungs()
    with tempfile.TemporaryDirectory(prefix="qwenperf-canary-") as logs:
        for n in range(len(document["sessions"]), args.sessions):
            print(f"session {n + 1} of {args.sessions}", flush=True)
            document["sessions"].append({"answers": session(configs, Path(logs) / str(n))})
            write_atomically(args.out, json.dumps(document, indent=1))
    print("\n".join(analyse(document["sessions"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

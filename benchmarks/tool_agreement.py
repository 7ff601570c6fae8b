"""Does ``qwenperf bench`` read the same output throughput as GuideLLM and AIPerf, and what do
``qwenperf compare`` read from their files?

The setup of ``agreement.py`` (one CPU vLLM server on the tiny model, prefix caching off, pinned to
the first CPU; each tool in turn pinned to the last CPU; vLLM's random prompts, seed 0, 128 tokens
in and 128 out with ``ignore_eos``, 32 in flight, 256 measured requests after 32 warm-up requests,
greedy sampling, the completions endpoint), with GuideLLM (``guidellm run``, a scenario file: its
backend's ``extras`` carry ``temperature: 0``) and AIPerf (``aiperf profile``, the prompts as its
``single_turn`` file, ``--use-server-token-count``) in the rotation: the order turns around every
round. Each figure is the tool's own result file read by ``qwenperf compare``'s reader
(``pytest_qwenperf.gate.sources``), so what is compared is what a user's ``compare`` sees.

The tools are installed apart from this project, each in its own virtual environment:

    python3 -m venv /opt/guidellm && /opt/guidellm/bin/pip install guidellm==0.8.1
    python3 -m venv /opt/aiperf && /opt/aiperf/bin/pip install aiperf==0.13.0
    python -m benchmarks.tool_agreement --guidellm /opt/guidellm/bin/guidellm --aiperf /opt/aiperf/bin/aiperf \\
        --rounds 4 --out tool-agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.agreement import WORKLOAD, _run, ours, tiny_server, vllm_prompts
from benchmarks.commands import turns
from pytest_qwenperf.gate.sources import read_results
from pytest_qwenperf.suite.embedded import TINY_MODEL_NAME, resolve_model


def guidellm(tool: Path, url: str, client_cpu: int, folder: Path, prompts: Path) -> Path:
    """``guidellm run`` of the workload on ``prompts``; its report's path."""
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    data = folder / "guidellm-prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["prompt"], "output_tokens_count": r["output_len"]}) + "\n" for r in rows))
    out = folder / "benchmarks.json"
    scenario = {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": url,
                "model": TINY_MODEL_NAME,
                "request_format": "/v1/completions",
                "extras": {"body": {"temperature": 0}},
            },
            "profile": {"kind": "concurrent", "streams": [WORKLOAD["concurrency"]], "warmup": {"value": WORKLOAD["warmup"], "mode": "requests"}},
            "constraints": [{"kind": "max_requests", "count": WORKLOAD["num_prompts"] + WORKLOAD["warmup"]}],
            "tokenizer": {"kind": "huggingface_auto", "model": str(resolve_model("embedded:tiny"))},
            "data": [{"kind": "json_file", "path": str(data)}],
            "metrics": {"kind": "generative", "sample_size": 8},
            "outputs": [{"kind": "json", "path": str(out)}],
        }
    }
    (folder / "scenario.json").write_text(json.dumps(scenario))
    _run(["taskset", "-c", str(client_cpu), str(tool), "run", "-c", str(folder / "scenario.json"), "--disable-console-interactive"])
    return out


def aiperf(tool: Path, url: str, client_cpu: int, folder: Path, prompts: Path) -> Path:
    """``aiperf profile`` of the workload on ``prompts``; its export's path."""
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    data = folder / "aiperf-prompts.jsonl"
    data.write_text("".join(json.dumps({"text": r["prompt"], "output_length": r["output_len"]}) + "\n" for r in rows))
    argv = [str(tool), "profile", "--model", TINY_MODEL_NAME, "--url", url, "--endpoint-type", "completions", "--streaming"]
    argv += ["--tokenizer", str(resolve_model("embedded:tiny")), "--input-file", str(data), "--custom-dataset-type", "single_turn"]
    argv += ["--concurrency", str(WORKLOAD["concurrency"]), "--request-count", str(WORKLOAD["num_prompts"])]
    argv += ["--warmup-request-count", str(WORKLOAD["warmup"]), "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0"]
    argv += ["--use-server-token-count", "--output-artifact-dir", str(folder / "aiperf"), "--ui-type", "none"]
    _run(["taskset", "-c", str(client_cpu), *argv, "--no-server-metrics", "--no-gpu-telemetry"])
    return folder / "aiperf" / "profile_export_aiperf.json"


def read(path: Path) -> dict[str, float]:
    """What ``qwenperf compare`` reads of a result file: output tok/s, completed and failed requests."""
    run = read_results(path)[0].run
    return {name: float(run.metrics[name]) for name in ("output_throughput", "completed", "failed") if run.metrics.get(name) is not None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guidellm", type=Path, required=True, help="the guidellm command of its own environment")
    parser.add_argument("--aiperf", type=Path, required=True, help="the aiperf command of its own environment")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpu = frozenset(cpus[:-1]), cpus[-1]
    figures: dict[str, list[dict[str, float]]] = {"qwenperf bench": [], "guidellm": [], "aiperf": []}
    with tempfile.TemporaryDirectory() as tmp, tiny_server(server_cpus, Path(tmp)) as server:
        info = server.info[0]
        prompts = vllm_prompts(Path(tmp) / "vllm-random-prompts.jsonl")
        tools: dict[str, Callable[[Path], Path]] = {
            "qwenperf bench": lambda folder: _ours(server.base_url, client_cpu, folder, prompts),
            "guidellm": lambda folder: guidellm(args.guidellm, server.base_url, client_cpu, folder, prompts),
            "aiperf": lambda folder: aiperf(args.aiperf, server.base_url, client_cpu, folder, prompts),
        }
        for n in range(args.rounds):
            for tool in turns(list(tools), n):
                folder = Path(tmp) / f"{tool.split()[0]}-{n}"
                folder.mkdir()
                figures[tool].append(read(tools[tool](folder)))
            print(f"round {n + 1}: " + ", ".join(f"{t} {f[-1]['output_throughput']:,.0f}" for t, f in figures.items()), file=sys.stderr)
    medians = {tool: statistics.median(f["output_throughput"] for f in runs) for tool, runs in figures.items()}
    print(f"vLLM {info.version}, server on CPU {','.join(map(str, sorted(server_cpus)))}, clients on CPU {client_cpu}\n")
    print("| tool | output tok/s per run (completed / failed) | median | ours / theirs |")
    print("| --- | --- | --- | --- |")
    for tool, runs in figures.items():
        per_run = " / ".join(f"{f['output_throughput']:,.0f} ({f['completed']:.0f}/{f.get('failed', 0):.0f})" for f in runs)
        print(f"| `{tool}` | {per_run} | {medians[tool]:,.0f} | {medians['qwenperf bench'] / medians[tool]:.3f} |")
    if args.out:
        args.out.write_text(json.dumps({"vllm_version": info.version, "workload": WORKLOAD, "figures": figures, "medians": medians}, indent=2) + "\n")
    return 0


def _ours(url: str, client_cpu: int, folder: Path, prompts: Path) -> Path:
    out = folder / "qwenperf-bench.json"
    ours(url, client_cpu, out, prompts)
    return out


if __name__ == "__main__":
    sys.exit(main())

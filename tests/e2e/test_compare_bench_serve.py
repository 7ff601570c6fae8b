"""``qwenperf compare`` on what ``vllm bench serve --save-result`` really saves (CPU build, tiny model).

One server with prefix caching off (a repeat of the same prompts must not hit the cache),
``vllm bench serve`` run greedy (``--temperature 0``, recorded with ``--metadata``, as the
result saves no sampling) twice per side, interleaved so that a drift of the machine falls
on both sides, and once without ``--temperature``. Each side is a directory of results, its
repeats. The greedy sides get a real verdict; the greedy side against the default-sampling
run is not comparable, naming the sampling. The benchmark runs are one interpreter running
``benchmarks/vllm_bench_serve.py`` once per command line: importing vLLM's benchmark costs
about 20 s on two cores, the runs a few seconds each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import tiny_cpu_config
from tests.e2e.tiny import EAGER

NO_PREFIX_CACHE = tiny_cpu_config("e2e-bench-serve", ("--no-enable-prefix-caching", *EAGER))
pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("serving_config", [NO_PREFIX_CACHE], ids=[NO_PREFIX_CACHE.id])]

ROOT = Path(__file__).resolve().parents[2]
RUN_EACH = """
import json, runpy, sys
for argv in json.loads(sys.argv[1]):
    sys.argv = ["benchmarks/vllm_bench_serve.py", *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
JUDGED = ("pass", "underpowered", "noisy", "improvement", "regression")


def bench_serve(server: Server, runs: list[tuple[Path, tuple[str, ...]]]) -> None:
    """``vllm bench serve --save-result`` once per (result file, sampling options), in order."""
    info = server.info[0]
    workload = ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32", "--num-prompts", "48"]
    common = ["--base-url", server.base_url, "--model", info.model, "--tokenizer", str(info.root), *workload]
    common += ["--ignore-eos", "--max-concurrency", "8", "--disable-tqdm", "--save-result"]
    argvs = [[*common, "--result-dir", str(path.parent), "--result-filename", path.name, *sampling] for path, sampling in runs]
    done = subprocess.run(
        [sys.executable, "-c", RUN_EACH, json.dumps(argvs)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for path, _ in runs:
        assert path.is_file(), done.stdout[-3000:]


def qwenperf_compare(*args: str | Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "compare", *(str(a) for a in args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def verdict_of(table: str, metric: str) -> str:
    """The verdict cell of ``metric``'s row in a two-column table (the words after the Δ column)."""
    row = next(line for line in table.splitlines() if line.startswith(f"{metric} ")).split()
    return row[5]


def test_bench_serve_results_compare_when_greedy_on_both_sides_and_not_against_default_sampling(
    vllm_server: Server, tmp_path: Path
) -> None:
    greedy = ("--temperature", "0", "--metadata", "dataset_name=random", "temperature=0")
    default = ("--metadata", "dataset_name=random")  # as most saved results: no --temperature, so the server's sampling
    before, after, other = tmp_path / "before", tmp_path / "after", tmp_path / "default"
    runs = [(tmp_path / "warmup" / "0.json", greedy)]  # the first run after a boot is slower: left out
    runs += [(before / "1.json", greedy), (after / "1.json", greedy), (before / "2.json", greedy), (after / "2.json", greedy)]
    bench_serve(vllm_server, [*runs, (other / "1.json", default)])

    saved = json.loads((before / "1.json").read_text())
    assert (saved["temperature"], saved["dataset_name"], saved["max_concurrency"], saved["completed"]) == ("0", "random", 8, 48)
    assert "p99_ttft_ms" in saved and "p99_tpot_ms" in saved  # --metric-percentiles defaults to 99

    judged = qwenperf_compare(before, after, "--fail-on", "not-comparable")  # which fails on missing and invalid too
    assert judged.returncode == 0, judged.stdout + judged.stderr
    lines = judged.stdout.splitlines()
    assert lines[0].startswith("qwenperf-tiny · random, 48 prompts · ") and lines[0].endswith(" · greedy (vllm bench serve)")
    assert lines[1].split() == ["metric", "before", "after", "Δ", "verdict"]
    assert verdict_of(judged.stdout, "output_throughput") in JUDGED, judged.stdout
    as_json = json.loads(qwenperf_compare(before, after, "--json").stdout)
    rows = {row["metric"]: row for row in as_json["groups"][0]["rows"]}
    (cell,) = rows["output_throughput"]["judgements"]
    assert cell["verdict"] in JUDGED and cell["mde"] is not None and len(cell["detail"]) > 0  # two repeats a side: a spread

    apart = qwenperf_compare(before, other, "--fail-on", "regression")
    assert apart.returncode == 0, apart.stdout + apart.stderr
    assert verdict_of(apart.stdout, "output_throughput") == "not-comparable", apart.stdout
    assert "not comparable (reference vs run): sampling: 'greedy' vs unknown (vllm bench serve saves no temperature" in apart.stdout

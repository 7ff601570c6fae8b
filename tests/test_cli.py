"""The installed ``qwenperf`` console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QWENPERF = str(Path(sys.executable).parent / "qwenperf")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QWENPERF, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120, check=False)


def test_tiny_model_into_a_folder_is_byte_identical_twice(tmp_path: Path) -> None:
    for name in ("a", "b"):
        done = run_cli("tiny-model", str(tmp_path / name))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(tmp_path / name)
    files_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= set(files_a)
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_tiny_model_without_a_folder_uses_the_cache(tmp_path: Path) -> None:
    first = run_cli("tiny-model", env={"QWENPERF_CACHE": str(tmp_path)})
    assert first.returncode == 0, first.stderr
    folder = Path(first.stdout.strip())
    assert folder.parent == tmp_path and (folder / "config.json").is_file()
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    again = run_cli("tiny-model", env={"QWENPERF_CACHE": str(tmp_path)})
    assert Path(again.stdout.strip()) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime, "the cached model must be reused"


def test_unknown_command_is_a_usage_error() -> None:
    done = run_cli("no-such-command")
    assert done.returncode == 2
    assert "invalid choice: 'no-such-command'" in done.stderr


SUITES = Path(__file__).parents[1] / "perf_tests" / "suites"


def test_show_json_prints_the_five_b200_rungs_with_their_flags() -> None:
    import json

    done = run_cli("show", str(SUITES / "b200.toml"), "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert [c["id"] for c in shown["configs"]] == ["tp8", "dp8", "dp8-ctx4k", "dp8-ctx4k-fp8kv", "dp8-ctx4k-fp8kv-mtp1"]
    last = shown["configs"][-1]["argv"]
    assert last[last.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":1}'
    assert "--disable-log-stats" not in " ".join(" ".join(c["argv"]) for c in shown["configs"])


def test_lint_fails_naming_suite_rung_flag_and_hint(tmp_path: Path) -> None:
    suite = tmp_path / "old.toml"
    suite.write_text(
        (SUITES / "cpu.toml").read_text().replace(
            'vllm = { max-model-len = 2048 }', 'vllm = { max-model-len = 2048, speculative-model = "x", max-num-seqz = 4 }'
        )
    )
    done = run_cli("lint", str(suite), str(SUITES / "cpu.toml"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"FAIL {suite}: config 'base': unrecognized arguments: --speculative-model --max-num-seqz 4" in done.stdout
    assert "hint: --speculative-model: speculative decoding is configured with --speculative-config" in done.stdout
    assert f"ok   {SUITES / 'cpu.toml'}: base (vLLM 0.32.0)" in done.stdout


def test_lint_refuses_disable_log_stats(tmp_path: Path) -> None:
    suite = tmp_path / "stats.toml"
    suite.write_text((SUITES / "cpu.toml").read_text().replace("max-num-seqs = 128", "max-num-seqs = 128\ndisable-log-stats = true"))
    done = run_cli("lint", str(suite))
    assert done.returncode == 1
    assert "--disable-log-stats is not allowed: it turns off every stat logger" in done.stdout


def test_bench_unreachable_endpoint_fails_before_running() -> None:
    done = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--progress", "off")
    assert done.returncode == 2
    assert "endpoint http://127.0.0.1:9 is not ready: ConnectionRefusedError" in done.stderr


def test_bench_bad_option_values_fail_at_parsing() -> None:
    for args, message in (
        (("--dataset-name", "sharegpt"), "invalid choice: 'sharegpt'"),
        (("--num-prompts", "0"), "expected a whole number >= 1, got '0'"),
        (("--request-rate", "-2"), "expected a positive number of requests per second"),
        (("--endpoint", "localhost:8000"), "expected a URL like http://10.0.0.5:8000"),
    ):
        done = run_cli("bench", "--endpoint", "http://127.0.0.1:9", *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_bench_refuses_client_cpus_with_ray_before_reaching_anything() -> None:
    done = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--ray", "127.0.0.1:1", "--client-cpus", "1", "--progress", "off")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--client-cpus pins a client on this machine; with --ray the workers run on the cluster's nodes" in done.stderr


def test_bench_with_a_history_store_that_cannot_be_opened_fails_before_it_measures(tmp_path: Path) -> None:
    store = tmp_path / "no" / "such" / "h.sqlite"
    done = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--progress", "off", "--history", str(store))
    assert done.returncode == 2
    assert f"qwenperf: {store}: cannot open the history store" in done.stderr


def test_lint_checks_the_one_gpu_suite_without_generating_its_model(tmp_path: Path) -> None:
    """Checking flags reads them; it does not write the 1.6 GB embedded:gpu model (nor any file)."""
    done = run_cli("lint", str(SUITES / "hopper.toml"), env={"QWENPERF_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok   ") == 4
    assert not (tmp_path / "cache").exists()


def test_bench_output_len_overrides_each_jsonl_lines_and_otherwise_leaves_them(tmp_path: Path) -> None:
    import argparse

    from pytest_qwenperf.cli import bench, bench_plan

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a b c", "output_len": 7}\n{"prompt": "d e", "output_len": 9}\n')
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    base = ["--endpoint", "http://127.0.0.1:9", "--dataset-name", "jsonl", "--dataset-path", str(prompts), "--num-prompts", "2"]
    given = bench_plan.workload(parser.parse_args([*base, "--output-len", "5"]), ()).build(None)
    assert [spec.max_tokens for spec in given] == [5, 5]
    own = bench_plan.workload(parser.parse_args(base), ()).build(None)
    assert [spec.max_tokens for spec in own] == [7, 9]
    random = bench_plan.workload(parser.parse_args(["--endpoint", "http://127.0.0.1:9", "--num-prompts", "2"]), ())
    assert random.output_len == bench_plan.DEFAULT_OUTPUT_LEN == 128

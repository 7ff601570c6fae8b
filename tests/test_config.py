"""Suite files: loading, inheritance, rendering to argv, and errors that name file, key and expectation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.core.canary import EXACT, CanaryFloor
from pytest_qwenperf.suite.config import SuiteError, load_suite, render_flags

LADDER = """
[suite]
name = "demo"
hardware = "cpu"
model = "embedded:tiny"
env = { A = "1" }
vllm = { dtype = "bfloat16", max-num-seqs = 64 }

[[config]]
id = "base"
vllm = { max-model-len = 2048, enable-prefix-caching = false }

[[config]]
id = "short"
inherits = "base"
description = "shorter context"
vllm = { max-model-len = 512 }
env = { B = "2" }

[[config]]
id = "spec"
inherits = "short"
vllm = { speculative-config = { method = "ngram", num_speculative_tokens = 3 } }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path


def test_ladder_inherits_one_change_per_rung(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, LADDER))
    assert [c.id for c in suite.configs] == ["base", "short", "spec"]
    base, short, spec = suite.configs
    assert base.vllm_args == ("--dtype", "bfloat16", "--max-num-seqs", "64", "--max-model-len", "2048", "--no-enable-prefix-caching")
    assert short.vllm_args == ("--dtype", "bfloat16", "--max-num-seqs", "64", "--max-model-len", "512", "--no-enable-prefix-caching")
    assert spec.vllm_args[-2:] == ("--speculative-config", '{"method":"ngram","num_speculative_tokens":3}')
    assert dict(short.env) == {"A": "1", "B": "2"} and dict(spec.env) == {"A": "1", "B": "2"}
    assert short.inherits == "base" and short.description == "shorter context"
    assert base.served_model_name == "qwenperf-tiny"
    assert suite.config("spec") is spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("[suite]", "[suit]"), r"suit: unknown key; expected one of \['canary', 'config', 'suite', 'workload'\]$"),
        ((LADDER[: LADDER.index("[[config]]")], ""), r"suite: expected a table, got None$"),
        (('name = "demo"', "name = \"\""), r"suite.name: expected a non-empty string, got ''$"),
        (('name = "demo"', 'name = "demo"\ngpus = -1'), r"suite.gpus: expected a whole number of GPUs per node, got -1$"),
        (('name = "demo"', 'name = "demo"\nrepeats = 0'), r"suite.repeats: expected a whole number of load runs >= 1, got 0$"),
        (('name = "demo"', 'name = "demo"\nladder_tolerance = 1'), r"suite.ladder_tolerance: expected a fraction between 0 and 1, got 1$"),
        (('name = "demo"', 'name = "demo"\ntolerances = { p99_ttft_ms = true }'), r"suite.tolerances.p99_ttft_ms: expected a fraction between 0 and 1, got True$"),
        (('name = "demo"', "name = 3"), r"suite.name: expected a non-empty string, got 3"),
        (('inherits = "base"', 'inherits = "later"'), r"config 'short'.inherits: expected the id of an earlier config, got 'later'"),
        (("max-model-len = 512", "max_model_len = 512"), r"config 'short'.vllm.max_model_len: expected a flag name as vLLM spells it"),
        (('env = { B = "2" }', "env = { B = 2 }"), r"config 'short'.env.B: expected a string \(the variable's value\), got 2$"),
        (('env = { B = "2" }', 'env = "B=2"'), r"config 'short'.env: expected a table of strings \(environment variables\), got 'B=2'$"),
        (('description = "shorter context"', "description = 3"), r"config 'short'.description: expected a string, got 3$"),
        (('description = "shorter context"', 'cpu_flags_any = "avx512f"'), r"config 'short'.cpu_flags_any: expected an array of strings, got 'avx512f'$"),
        (('id = "base"', 'id = "base"\nimproves = true'), r"config 'base'.improves: expected improves only on a rung that inherits from another, got True$"),
        (("max-model-len = 512", "max-model-len = 1979-05-27"), r"config 'short'.vllm.max-model-len: expected a string, number, boolean, table or array, got datetime.date\(1979, 5, 27\)$"),
        (('id = "spec"', 'id = "base"'), r"config 'base': id used twice"),
        (('description = "shorter context"', 'descripton = "x"'), r"config 'short'.descripton: unknown key; expected one of \[.*'description', 'env'.*\]$"),
        ((LADDER, "config = [1]\n" + LADDER[: LADDER.index("[[config]]")]), r"config\[0\]: expected a \[\[config\]\] table, got 1$"),
        (('name = "demo"', 'name = "demo"\ntolerances = { p99_ttft = 0.3 }'), r"suite.tolerances.p99_ttft: expected a gated metric, one of \[.*'tokens_per_joule', 'tokens_per_server_cpu_s', 'capacity_at_slo'\] or scaling_efficiency_n<N>, got 'p99_ttft'$"),
        (('name = "demo"', 'name = "demo"\ntolerances = { completed = 0.3 }'), r"suite.tolerances.completed: expected a gated metric"),
        (('id = "base"', 'id = "base"\ncanary = { match_rate = 0.5 }'), r"config 'base'.canary: expected a canary floor only on a rung that inherits from another, got \{'match_rate': 0.5, 'logprob_drift': None\}$"),
        (('description = "shorter context"', "canary = { match_rate = 1.5 }"), r"config 'short'.canary.match_rate: expected a fraction between 0 and 1 \(the least share of prompts\), got 1.5$"),
        (('description = "shorter context"', "canary = { logprob_drift = -0.1 }"), r"config 'short'.canary.logprob_drift: expected a number >= 0 \(the most mean \|difference\| of log-probabilities\), got -0.1$"),
        (('description = "shorter context"', "canary = { match = 0.5 }"), r"config 'short'.canary.match: unknown key; expected one of \['logprob_drift', 'match_rate'\]$"),
        (('description = "shorter context"', "canary = 0.5"), r"config 'short'.canary: expected a table such as \{ match_rate = 0.5, logprob_drift = 0.2 \}, got 0.5$"),
        (('model = "', 'model = "embedded:huge" #'), r"suite.model: expected a Hugging Face id, a folder or one of embedded:tiny, embedded:gpu, got 'embedded:huge'$"),
        ((LADDER, LADDER + "[canary]\nmatch_rate = -1\n"), r"canary.match_rate: expected a fraction between 0 and 1 \(the least share of prompts\), got -1$"),
    ],
)
def test_bad_suite_names_file_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write(tmp_path, LADDER.replace(*change, 1))
    with pytest.raises(SuiteError, match=message) as excinfo:
        load_suite(path)
    assert str(excinfo.value).startswith(str(path))


def test_canary_floors_against_the_parent_and_across_sessions(tmp_path: Path) -> None:
    """A rung's canary table is its own (not inherited); a speculative rung without one must give its
    parent's tokens; the [canary] table holds every config to another session's answer."""
    text = LADDER.replace('description = "shorter context"', 'canary = { match_rate = 0.5, logprob_drift = 0.2 }')
    suite = load_suite(write(tmp_path, text))
    base, short, spec = suite.configs
    assert short.canary == short.canary_floor == CanaryFloor(match_rate=0.5, logprob_drift=0.2)
    assert spec.canary is None and spec.canary_floor == EXACT  # inherits short, which has a table: not handed down
    assert base.canary_floor is None
    assert suite.canary_floor == EXACT
    across = load_suite(write(tmp_path, text + "[canary]\nmatch_rate = 0.875\nlogprob_drift = 0.01\n"))
    assert across.canary_floor == CanaryFloor(match_rate=0.875, logprob_drift=0.01)
    without = load_suite(write(tmp_path, LADDER))
    assert [c.canary_floor for c in without.configs] == [None, None, EXACT]


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="cannot read the suite file: No such file or directory"):
        load_suite(tmp_path / "missing.toml")
    with pytest.raises(SuiteError, match="not valid TOML"):
        load_suite(write(tmp_path, "[suite\n"))


def test_unknown_config_id_lists_the_known_ones(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, LADDER))
    with pytest.raises(SuiteError, match=r"no config 'nope'; configs are \['base', 'short', 'spec'\]"):
        suite.config("nope")


flag_names = st.from_regex(r"[a-z][a-z0-9]{0,8}(-[a-z0-9]{1,8}){0,2}", fullmatch=True)
flag_values = st.one_of(st.booleans(), st.integers(), st.text(min_size=1, max_size=8), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3))


@given(st.dictionaries(flag_names, flag_values, max_size=6))
def test_flags_render_in_order_one_option_each(flags: dict) -> None:
    argv = iter(render_flags(flags))
    for name, value in flags.items():
        if isinstance(value, bool):
            assert next(argv) == (f"--{name}" if value else f"--no-{name}")
        else:
            assert next(argv) == f"--{name}"
            assert next(argv) == (json.dumps(value, separators=(",", ":"), sort_keys=True) if isinstance(value, dict) else str(value))
    assert next(argv, None) is None


WORKLOADS = """
[[workload]]
name = "chat"
kind = "random"
input_len = 64
output_len = 16
num_prompts = 40
warmup = 8
load = { concurrency = 4 }
configs = ["short", "spec"]
slo = "ttft:500 tpot:50"
floors = { output_throughput = { short = 100.0, "*" = 50.0 } }

[[workload]]
kind = "shared-prefix"
num_prefixes = 2
prompts_per_prefix = 4
prefix_len = 32
suffix_len = 8
output_len = 4
load = { rate = 5.0, distribution = "constant" }
"""


def test_workloads_carry_arrival_warmup_selection_slo_and_floors(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, LADDER + WORKLOADS))
    chat, shared = suite.workloads
    assert chat.id == "chat" and chat.warmup == 8 and chat.arrival.concurrency == 4
    assert chat.runs_on("short") and not chat.runs_on("base")
    assert chat.slo is not None and chat.slo.limits() == {"ttft": 500.0, "tpot": 50.0}
    assert chat.floor("output_throughput", "short") == 100.0
    assert chat.floor("output_throughput", "spec") == 50.0
    assert chat.floor("request_throughput", "short") is None
    assert shared.runs_on("base") and shared.arrival.rate == 5.0 and shared.workload.num_prompts == 8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("load = { concurrency = 4 }", ""), r"workload 'chat'.load: expected a table such as"),
        (("load = { concurrency = 4 }", "load = { concurrency = 0 }"), r"workload 'chat'.load.concurrency: expected a whole number of requests in flight >= 1, got 0$"),
        (("load = { concurrency = 4 }", "load = { rate = 1, bursty = 2 }"), r"workload 'chat'.load.bursty: unknown key for an open loop \(rate = R\); expected only \['rate', 'distribution', 'burstiness', 'seed', 'max_concurrency', 'ramp', 'ramp_steps'\]$"),
        (("warmup = 8", "warmup = 40"), r"workload 'chat'.warmup: expected a whole number of requests below num_prompts \(40\)"),
        (("warmup = 8", "warmup = -1"), r"workload 'chat'.warmup: expected a whole number of requests >= 0, below num_prompts, got -1$"),
        (("warmup = 8", "warmpu = 8"), r"workload 'chat': warmpu: unknown key for a 'random' workload; expected one of \[.*'num_prompts'.*\]$"),
        (('configs = ["short", "spec"]', 'configs = ["nope"]'), r"workload 'chat'.configs: expected ids of configs of this suite"),
        (('slo = "ttft:500 tpot:50"', 'slo = "ttft=500"'), r"workload 'chat'.slo: .*has no ':'"),
        (('floors = { output_throughput = { short = 100.0, "*" = 50.0 } }', 'floors = { output_throughput = 5 }'), r"floors.output_throughput: expected a table of config id"),
        (("input_len = 64", 'input_len = "64"'), r"workload 'chat'.*input_len"),
        (('name = "chat"', 'name = "Canary"'), r"workload 'Canary'.name: expected a name other than 'canary', which names the file of a config's canary answer, got 'Canary'$"),
    ],
)
def test_bad_workload_names_file_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write(tmp_path, LADDER + WORKLOADS.replace(*change, 1))
    with pytest.raises(SuiteError, match=message) as excinfo:
        load_suite(path)
    assert str(excinfo.value).startswith(str(path))


@pytest.mark.parametrize("name", ["cpu", "b200", "h200", "hopper"])
def test_shipped_suites_load(name: str) -> None:
    suite = load_suite(Path(__file__).parents[1] / "perf_tests" / "suites" / f"{name}.toml")
    assert suite.hardware == name and suite.workloads
    assert all(c.suite == name for c in suite.configs)


def test_b200_ladder_is_the_write_ups() -> None:
    suite = load_suite(Path(__file__).parents[1] / "perf_tests" / "suites" / "b200.toml")
    assert [c.id for c in suite.configs] == ["tp8", "dp8", "dp8-ctx4k", "dp8-ctx4k-fp8kv", "dp8-ctx4k-fp8kv-mtp1"]
    last = suite.configs[-1].vllm_args
    assert "--language-model-only" in last and last[last.index("--data-parallel-size") + 1] == "8"
    assert last[last.index("--max-model-len") + 1] == "4096" and last[last.index("--kv-cache-dtype") + 1] == "fp8"
    assert last[last.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":1}'
    assert suite.config("tp8").vllm_args[suite.config("tp8").vllm_args.index("--max-model-len") + 1] == "131072"
    assert suite.model == "Qwen/Qwen3.5-27B-FP8" and suite.gpus == 8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("concurrency = 4", "concurrency = 8.5"), r"workload 'chat'.load.concurrency: expected a whole number of requests in flight >= 1, got 8.5$"),
        (("concurrency = 4", "concurrency = true"), r"workload 'chat'.load.concurrency: expected a whole number of requests in flight >= 1, got True$"),
        (("concurrency = 4", "concurrency = 4, rate = 2"), r"workload 'chat'.load.rate: unknown key for a closed loop \(concurrency = N\); expected only \['concurrency', 'ramp_steps'\]$"),
        (("rate = 5.0", "rate = inf"), r"workload\[1\].load.rate: expected a finite number of requests per second > 0, got inf$"),
        (("rate = 5.0", "rate = nan"), r"workload\[1\].load.rate: expected a finite number of requests per second > 0, got nan$"),
        (("rate = 5.0", 'rate = "5"'), r"workload\[1\].load.rate: expected a finite number of requests per second > 0, got '5'$"),
        (('distribution = "constant"', 'distribution = "uniform"'), r"workload\[1\].load.distribution: expected one of \['poisson', 'constant', 'gamma'\], got 'uniform'$"),
        (('distribution = "constant"', "max_concurrency = 2.5"), r"workload\[1\].load.max_concurrency: expected a whole number of requests in flight >= 1, got 2.5$"),
        (('distribution = "constant"', "max_concurrency = true"), r"workload\[1\].load.max_concurrency: expected a whole number of requests in flight >= 1, got True$"),
        (('distribution = "constant"', "seed = -1"), r"workload\[1\].load.seed: expected a whole number >= 0, got -1$"),
        (('distribution = "constant"', "burstiness = 2.0"), r"workload\[1\].load.burstiness: expected 1 unless distribution is 'gamma', got 2.0$"),
        (("output_throughput = {", "output_throughput_typo = {"), r"workload 'chat'.floors.output_throughput_typo: expected a metric with a floor, one of \[.*'server_cpu_busy'.*\] or scaling_efficiency_n<N>, got 'output_throughput_typo'$"),
        (("output_throughput = {", "p99_ttft_ms = {"), r"workload 'chat'.floors.p99_ttft_ms: expected a metric with a floor"),
        (("short = 100.0", "shrot = 100.0"), r"workload 'chat'.floors.output_throughput.shrot: expected a config this workload runs on \['short', 'spec'\] or \"\*\", got 'shrot'$"),
        (("short = 100.0", "base = 100.0"), r"workload 'chat'.floors.output_throughput.base: expected a config this workload runs on"),
        (("short = 100.0", "short = inf"), r"workload 'chat'.floors.output_throughput.short: expected a finite number \(the minimum\), got inf$"),
        (("short = 100.0", 'short = "100"'), r"workload 'chat'.floors.output_throughput.short: expected a finite number \(the minimum\), got '100'$"),
        (('name = "chat"', 'name = ".."'), r"workload\[0\].name: expected an id of letters, digits.*got '\.\.'$"),
    ],
)
def test_bad_load_and_floors_name_the_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write(tmp_path, LADDER + WORKLOADS.replace(*change, 1))
    with pytest.raises(SuiteError, match=message) as excinfo:
        load_suite(path)
    assert str(excinfo.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('id = "spec"', 'id = ".."'), r"config\[2\].id: expected an id of letters, digits, '.', '_' and '-'.*got '\.\.'$"),
        (('id = "spec"', 'id = "a/b"'), r"config\[2\].id: expected an id of .*got 'a/b'$"),
        (('id = "spec"', 'id = "-x"'), r"config\[2\].id: expected an id of .*got '-x'$"),
        (('id = "spec"', 'id = "Short"'), r"config: ids 'short' and 'Short' map to the same baseline file name 'Short'; expected ids that differ"),
    ],
)
def test_config_ids_are_distinct_safe_file_names(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write(tmp_path, LADDER.replace(*change, 1))
    with pytest.raises(SuiteError, match=message):
        load_suite(path)


def test_a_suite_that_is_not_utf8_names_the_byte_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "suite.toml"
    path.write_bytes(LADDER.encode().replace(b"shorter", b"sh\xf6rter"))
    offset = LADDER.encode().index(b"shorter") + 2
    with pytest.raises(SuiteError, match=rf"^{path}: not UTF-8 text \(byte 0xf6 at offset {offset}\); expected a TOML suite file"):
        load_suite(path)
    path.write_bytes(b"\xef\xbb\xbf" + LADDER.encode())  # a byte-order mark, as Windows editors write
    assert [c.id for c in load_suite(path).configs] == ["base", "short", "spec"]


def test_the_one_gpu_suite_serves_the_generated_gpu_model_unpinned() -> None:
    hopper = load_suite(Path(__file__).parents[1] / "perf_tests" / "suites" / "hopper.toml")
    assert (hopper.gpus, hopper.model) == (1, "embedded:gpu")
    assert {c.served_model_name for c in hopper.configs} == {"qwenperf-gpu"}
    assert hopper.validity.clock_event_share == 0.10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('id = "base"', 'id = "base"\nexpected = {}'), r"config 'base'.expected: expected a table such as \{ total_token_throughput = 22300.0 \} \(or output_throughput\), got \{\}$"),
        (('id = "base"', 'id = "base"\nexpected = { total = 1.0 }'), r"config 'base'.expected.total: unknown key; expected one of \['output_throughput', 'total_token_throughput'\]$"),
        (('id = "base"', 'id = "base"\nexpected = { output_throughput = 0 }'), r"config 'base'.expected.output_throughput: expected tokens per second > 0, got 0$"),
        (('id = "base"', 'id = "base"\nexpected = { total_token_throughput = inf }'), r"config 'base'.expected.total_token_throughput: expected a finite number of tokens per second > 0, got inf$"),
        (('id = "base"', 'id = "base"\nexpected = 500'), r"config 'base'.expected: expected a table such as \{ total_token_throughput = 22300.0 \}"),
        (('name = "demo"', 'name = "demo"\nboot_s = 0'), r"suite.boot_s: expected a number of seconds > 0, at most a day \(one server's boot\), got 0$"),
        (('name = "demo"', 'name = "demo"\nboot_s = inf'), r"suite.boot_s: expected a number of seconds > 0, at most a day"),
    ],
)
def test_a_bad_expected_throughput_or_boot_names_file_and_field(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write(tmp_path, LADDER.replace(*change, 1))
    with pytest.raises(SuiteError, match=message) as excinfo:
        load_suite(path)
    assert str(excinfo.value).startswith(str(path))


def test_an_expected_throughput_is_each_rungs_own(tmp_path: Path) -> None:
    """A rung's ``expected`` table is not handed down: a child runs another server."""
    text = LADDER.replace('id = "base"', 'id = "base"\nexpected = { total_token_throughput = 22300.0 }', 1)
    suite = load_suite(write(tmp_path, text.replace('name = "demo"', 'name = "demo"\nboot_s = 240', 1)))
    base, short, _ = suite.configs
    assert base.expected is not None and (base.expected.total_token_throughput, base.expected.output_throughput) == (22300.0, None)
    assert short.expected is None and suite.boot_s == 240.0
    assert load_suite(write(tmp_path, LADDER)).boot_s is None

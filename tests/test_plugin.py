"""The pytest layer, driven through inner pytest sessions (pytester) with real server processes.

The stand-in launcher keeps these fast; the same fixtures boot real vLLM in tests/e2e.
"""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path

import pytest

from tests.processes import alive, end_inner_session, wait_for_tree

STANDIN = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).parent / 'standins' / 'openai_standin.py'))}"

CONFIGS = """
from pytest_qwenperf.suite.config import ServingConfig
A = ServingConfig(id="cfg-a", model="model-a")
B = ServingConfig(id="cfg-b", model="model-b")
BROKEN = ServingConfig(id="broken", model="m", vllm_args=("--exit-during-boot", "3"))
"""

RECORDER = """
from configs import A, B, BROKEN

def record(name, server):
    with open("events.txt", "a") as out:
        out.write(f"{name} {server.spec.name} {server.pid}\\n")
"""


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        f"--qwenperf-launcher={STANDIN}", "--qwenperf-boot-timeout=30", "-p", "no:cacheprovider", *args
    )


def events(pytester: pytest.Pytester) -> list[tuple[str, str, int]]:
    lines = (pytester.path / "events.txt").read_text().split("\n")
    return [(name, cfg, int(pid)) for name, cfg, pid in (line.split() for line in lines if line)]


def test_config_boots_once_across_modules(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(configs=CONFIGS, recorder=RECORDER)
    for module in ("test_one", "test_two"):
        pytester.makepyfile(
            **{
                module: f"""
import pytest
from recorder import A, record
pytestmark = pytest.mark.parametrize("serving_config", [A], ids=[A.id])
def test_first(vllm_server): record("{module}.first", vllm_server)
def test_second(vllm_server): record("{module}.second", vllm_server)
"""
            }
        )
    result = run_inner(pytester, f"--qwenperf-log-dir={pytester.path / 'logs'}")
    result.assert_outcomes(passed=4)
    assert len({pid for _, _, pid in events(pytester)}) == 1
    assert [p.name for p in (pytester.path / "logs").iterdir()] == ["cfg-a.log"]


def test_tests_are_grouped_by_config_and_each_server_stops_after_its_last_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(configs=CONFIGS, recorder=RECORDER, processes=(Path(__file__).parent / "processes.py").read_text())
    pytester.makepyfile(
        test_mixed="""
import pytest
from processes import alive
from recorder import A, B, record
@pytest.mark.parametrize("serving_config", [A, B, A], ids=["a1", "b", "a2"])
def test_one(vllm_server, request): record(request.node.name, vllm_server)
def test_no_server(): pass
@pytest.mark.parametrize("serving_config", [B], ids=["b"])
def test_two(vllm_server, request):
    record(request.node.name, vllm_server)
    a_pid = next(int(line.split()[2]) for line in open("events.txt") if " cfg-a " in line)
    assert not alive(a_pid), "cfg-a's server should have stopped after its last test"
"""
    )
    result = run_inner(pytester, "-v")
    result.assert_outcomes(passed=5)
    seen = events(pytester)
    assert [cfg for _, cfg, _ in seen] == ["cfg-a", "cfg-a", "cfg-b", "cfg-b"]
    assert len({pid for _, _, pid in seen}) == 2


def test_failed_boot_errors_the_tests_that_need_it_and_no_others(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(configs=CONFIGS, recorder=RECORDER)
    pytester.makepyfile(
        test_boot="""
import pytest
from recorder import A, BROKEN
@pytest.mark.parametrize("serving_config", [BROKEN, A, BROKEN], ids=["broken1", "ok", "broken2"])
def test_it(vllm_server): pass
"""
    )
    result = run_inner(pytester, f"--qwenperf-log-dir={pytester.path / 'logs'}")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*server 'broken' exited with code 3 after * s while booting: ValueError: stand-in asked to fail during boot*",
            "*config 'broken' failed to boot earlier in this session*",
        ]
    )
    assert sorted(p.name for p in (pytester.path / "logs").iterdir()) == ["broken.log", "cfg-a.log"]


def test_unparametrized_server_use_is_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(vllm_server): pass")
    result = run_inner(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no serving config was chosen: parametrize 'serving_config'*"])


def test_leftover_process_fails_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_leak="""
import sys
from pytest_qwenperf.serving import proctree
def test_leak(tmp_path):
    proctree.spawn_tree([sys.executable, "-c", "import time; time.sleep(60)"],
                        log_path=tmp_path / "log", env={}, tag=proctree.new_tag())
"""
    )
    result = run_inner(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*processes were still running after teardown (killed)*", "*time.sleep(60)*"])


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--qwenperf-boot-timeout", "-5", "expected a positive number of seconds, got '-5'"),
        ("--qwenperf-endpoint", "localhost:8000", "expected a URL like http://10.0.0.5:8000"),
        ("--qwenperf-endpoint", "http://h:8000/v1", "without /v1"),
        ("--qwenperf-launcher", "", "expected a command such as 'vllm serve'"),
        ("--qwenperf-client-workers", "0", "expected a whole number >= 1, got '0'"),
        ("--qwenperf-endpoints-file", "missing.toml", "missing.toml: cannot read the endpoints file"),
    ],
)
def test_bad_option_values_fail_at_parsing(pytester: pytest.Pytester, option: str, value: str, expected: str) -> None:
    result = pytester.runpytest_subprocess(f"{option}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}*{expected}*"])


def test_bad_ini_value_names_the_file_and_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nqwenperf_boot_timeout = soon\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*tox.ini: ini key qwenperf_boot_timeout: expected a number of seconds, got 'soon'*"])


def test_sigterm_to_the_session_stops_its_servers(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(configs=CONFIGS)
    ready = tmp_path / "ready"
    pytester.makepyfile(
        test_hold=f"""
import time, pytest
from configs import A
@pytest.mark.parametrize("serving_config", [A], ids=[A.id])
def test_hold(vllm_server):
    open({str(ready)!r}, "w").write("up")
    time.sleep(120)
"""
    )
    with open(tmp_path / "inner.out", "w") as out:
        inner = pytester.popen(
            [sys.executable, "-m", "pytest", f"--qwenperf-launcher={STANDIN}", "-p", "no:cacheprovider"],
            stdout=out,
            stderr=out,
        )
    try:
        tree = wait_for_tree(inner, ready, timeout=60)
        inner.send_signal(signal.SIGTERM)
        assert inner.wait(timeout=60) == pytest.ExitCode.INTERRUPTED
    finally:
        end_inner_session(inner)
    assert not [p for p in tree if alive(p)]


SUITES = Path(__file__).parents[1] / "perf_tests" / "suites"


def test_gpu_suite_on_a_cpu_machine_is_all_skipped_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf="def test_point(suite_workload, serving_config): pass")
    result = pytester.runpytest_subprocess(f"--qwenperf-suite={SUITES / 'b200.toml'}", "-m", "b200", "-rs")
    assert result.ret == pytest.ExitCode.OK
    outcomes = result.parseoutcomes()
    assert outcomes["skipped"] == 16 and "passed" not in outcomes  # 5 rungs x 2 + 3 rungs x 2 workloads
    result.stdout.fnmatch_lines(["*needs 8x B200 GPUs (suite b200.toml); found CPU only*"])


def test_pairs_are_parametrized_grouped_in_ladder_order_and_marked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a="""
import pytest
@pytest.mark.qwenperf_select("ladder")
def test_ladder(suite_workload, serving_config): pass
""",
        test_b="def test_point(suite_workload, serving_config): pass",
    )
    result = pytester.runpytest_subprocess(f"--qwenperf-suite={SUITES / 'cpu.toml'}", "-m", "cpu", "--collect-only", "-q")
    ids = [line.split("[", 1)[1].rstrip("]") for line in result.stdout.lines if "::" in line]
    configs = [i.split("/")[0] for i in ids]
    ladder = ["cpu-base", "cpu-ctx-short", "cpu-fp8kv", "cpu-ngram-spec", "cpu-prefix-cache", "cpu-seqs-32", "cpu-replicas-2"]
    assert configs == sorted(configs, key=ladder.index)
    assert "cpu-ctx-short/isl128-osl128" in ids and "cpu-prefix-cache/shared-prefix-pl1536" in ids
    assert [i for i in result.stdout.lines if "test_ladder" in i] == ["test_a.py::test_ladder[cpu-ngram-spec/isl128-osl128]"]


def test_the_nightly_run_leaves_out_what_a_weekly_config_or_workload_measures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a="""
import pytest
@pytest.mark.qwenperf_select("ladder")
def test_ladder(suite_workload, serving_config): pass
def test_point(suite_workload, serving_config): pass
"""
    )
    every = pytester.runpytest_subprocess(f"--qwenperf-suite={SUITES / 'b200.toml'}", "-m", "b200", "--collect-only", "-q")
    nightly = pytester.runpytest_subprocess(f"--qwenperf-suite={SUITES / 'b200.toml'}", "-m", "b200 and not weekly", "--collect-only", "-q")
    tests = [[line for line in result.stdout.lines if "::" in line] for result in (every, nightly)]
    assert len(tests[0]) > len(tests[1]) > 0
    assert "test_a.py::test_ladder[b200-dp8-ctx4k-fp8kv-mtp1/isl1024-osl512]" in tests[1]
    assert not any(rung in line for line in tests[1] for rung in ("b200-tp8/", "b200-dp8/", "b200-dp8-ctx4k/", "isl256-osl2048"))
    assert "test_a.py::test_ladder[b200-dp8-ctx4k-fp8kv/isl1024-osl512]" in tests[0]
    assert "test_a.py::test_ladder[b200-dp8-ctx4k-fp8kv/isl1024-osl512]" not in tests[1]  # it boots dp8-ctx4k


def test_the_cpu_nightly_leaves_out_the_capacity_searches_and_the_rung_only_they_judge(pytester: pytest.Pytester) -> None:
    """README's command 1 (``-m "cpu and not weekly"``) measures every point of the CPU suite but its
    two capacity searches and seqs-32 (whose cap binds only in a search), which ``-m cpu`` adds."""
    pytester.makepyfile(test_a="def test_point(suite_workload, serving_config): pass")
    runs = [
        pytester.runpytest_subprocess(f"--qwenperf-suite={SUITES / 'cpu.toml'}", "-m", marks, "--collect-only", "-q")
        for marks in ("cpu", "cpu and not weekly")
    ]
    every, nightly = ({line.split("[", 1)[1].rstrip("]") for line in run.stdout.lines if "::" in line} for run in runs)
    assert every - nightly == {
        "cpu-seqs-32/isl128-osl128",
        "cpu-seqs-32/capacity-isl64-osl128",
        "cpu-ctx-short/capacity-isl64-osl128",
        "cpu-ctx-short/capacity-tpot-isl64-osl128",
        "cpu-ngram-spec/capacity-tpot-isl64-osl128",
    }
    assert nightly < every and "cpu-ngram-spec/isl128-osl128" in nightly and "cpu-ctx-short/isl128-osl128" in nightly


def test_unknown_selector_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x='import pytest\n@pytest.mark.qwenperf_select("fastest")\ndef test_x(suite_workload): pass')
    result = pytester.runpytest_subprocess(f"--qwenperf-suite={SUITES / 'cpu.toml'}")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    result.stdout.fnmatch_lines(["*qwenperf_select('fastest'): expected one of*"])


def test_bad_suite_file_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    bad = pytester.path / "bad.toml"
    bad.write_text('[suite]\nname = "x"\nhardware = "cpu"\nmodel = "m"\n[[config]]\nid = "a"\nvllm = { max_model_len = 5 }\n')
    pytester.makepyfile(test_x="def test_x(suite_workload): pass")
    result = pytester.runpytest_subprocess(f"--qwenperf-suite={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{bad}: config 'a'.vllm.max_model_len: expected a flag name as vLLM spells it*"])

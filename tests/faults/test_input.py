"""Bad input gets one clear message, never a traceback: files, suite fields, endpoints, servers, interpreters.

Each case drives the real command line (``qwenperf`` as a subprocess) or the plugin in an
inner pytest session, and checks that the user sees one message naming the file (or the
option), the field and what was expected, and no Python internals (a traceback, a
``TypeError`` about keyword arguments, a codec's error text).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.suite.config import load_suite
from tests.stream_source import stream_source

REPO = Path(__file__).resolve().parents[2]
QWENPERF = str(Path(sys.executable).parent / "qwenperf")
SUITES = REPO / "perf_tests" / "suites"
INTERNALS = ("Traceback", "__init__()", "codec can't decode", "Error: ", "keyword argument")

SUITE = """\
[suite]
name = "standin"
hardware = "cpu"
model = "embedded:tiny"
repeats = 1

[[config]]
id = "base"

[[config]]
id = "seqs-32"
inherits = "base"
vllm = { max-num-seqs = 32 }

[[workload]]
name = "w"
kind = "fixed"
prompt = "hello world"
output_len = 4
num_prompts = 8
load = { concurrency = 2 }
floors = { output_throughput = { "*" = 1.0 } }
"""


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QWENPERF, *args], capture_output=True, text=True, timeout=300, cwd=cwd, check=False)


def inner(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """An inner pytest session in ``cwd``, as a user starts it."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={cwd / 'basetemp'}", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def one_message(text: str, *parts: str) -> None:
    """``text`` says every part on one line, and shows no Python internals."""
    assert any(all(part in line for part in parts) for line in text.splitlines()), text
    for internal in INTERNALS:
        assert internal not in text, text


SUITE_HEAD = b'[suite]\nname = "x"\n'
SETS_HEAD = b"[[set]]\nreplicas = 1\n"


def binary_file(path: Path, head: bytes = SUITE_HEAD) -> Path:
    """``head``, then bytes that are not UTF-8 (at offset ``len(head)``)."""
    path.write_bytes(head + b"\xff\xfe\n")
    return path


# ---------------------------------------------------------------- files that are not text


@pytest.mark.parametrize(
    ("command", "status"), [(("show",), 2), (("lint",), 1), (("render-k8s", "--config", "base"), 2)], ids=["show", "lint", "render-k8s"]
)
def test_a_binary_suite_file_is_one_message(tmp_path: Path, command: tuple[str, ...], status: int) -> None:
    suite = binary_file(tmp_path / "suite.toml")
    done = cli(command[0], str(suite), *command[1:])
    assert done.returncode == status, done.stdout + done.stderr
    one_message(done.stdout + done.stderr, f"{suite}: not UTF-8 text (byte 0xff at offset {len(SUITE_HEAD)}); expected a TOML suite file")


def test_compare_of_a_binary_file_is_one_message(tmp_path: Path) -> None:
    """A regression guard: compare already said this in one line before this change."""
    run = binary_file(tmp_path / "run.json", head=b"{")
    done = cli("compare", str(run), str(run))
    assert done.returncode == 2
    assert f"qwenperf: {run}:" in done.stderr and "Traceback" not in done.stderr


def test_a_binary_suite_file_is_a_usage_error_of_the_plugin(tmp_path: Path) -> None:
    suite = binary_file(tmp_path / "suite.toml")
    done = inner(tmp_path, f"--qwenperf-suite={suite}")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    one_message(done.stderr, f"ERROR: {suite}: not UTF-8 text (byte 0xff at offset {len(SUITE_HEAD)}); expected a TOML suite file")


def test_a_binary_endpoints_file_fails_at_argument_parsing(tmp_path: Path) -> None:
    endpoints = binary_file(tmp_path / "endpoints.toml", head=SETS_HEAD)
    done = inner(tmp_path, f"--qwenperf-endpoints-file={endpoints}")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    one_message(
        done.stderr,
        f"argument --qwenperf-endpoints-file: {endpoints}: not UTF-8 text (byte 0xff at offset {len(SETS_HEAD)}); "
        "expected a TOML file of [[set]] tables",
    )


def test_a_broken_baseline_found_during_a_session_fails_its_test_in_one_line(tmp_path: Path) -> None:
    """The run goes on against a stand-in server; the gate test that needs the baseline fails naming the file."""
    (tmp_path / "suite.toml").write_text(SUITE)
    (tmp_path / "test_gate.py").write_text("def test_gate(qwenperf_judgements):\n    assert qwenperf_judgements is not None\n")
    baselines = tmp_path / "baselines"
    baseline = load_suite(tmp_path / "suite.toml").identity("base", "w", hardware=detect().id).path(baselines)
    baseline.parent.mkdir(parents=True)
    head = b'{"schema": "qwenperf-baseline/1", "identity": "'
    baseline.write_bytes(head + b'\xe9t\xe9"}')  # Latin-1, not UTF-8
    with stream_source(model="qwenperf-tiny") as source:
        done = inner(
            tmp_path, "--qwenperf-suite=suite.toml", f"--qwenperf-endpoint={source.urls[0]}", f"--qwenperf-baselines={baselines}", "-k", "base/w"
        )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    one_message(
        done.stdout, f"qwenperf: {baseline}: not UTF-8 text (byte 0xe9 at offset {len(head)}); expected a qwenperf-baseline/1 JSON document"
    )
    assert "INTERNALERROR" not in done.stdout + done.stderr and "During handling" not in done.stdout


# ---------------------------------------------------------------- suite fields


BAD_SUITES = {  # a change to SUITE -> what the message must say after the file name
    "concurrency 8.5": (
        ("concurrency = 2", "concurrency = 8.5"),
        "workload 'w'.load.concurrency: expected a whole number of requests in flight >= 1, got 8.5",
    ),
    "concurrency true": (
        ("concurrency = 2", "concurrency = true"),
        "workload 'w'.load.concurrency: expected a whole number of requests in flight >= 1, got True",
    ),
    "rate inf": (("concurrency = 2", "rate = inf"), "workload 'w'.load.rate: expected a finite number of requests per second > 0, got inf"),
    "max_concurrency 0": (
        ("concurrency = 2", "rate = 4, max_concurrency = 0"),
        "workload 'w'.load.max_concurrency: expected a whole number of requests in flight >= 1, got 0",
    ),
    "unknown load key": (
        ("concurrency = 2", "rate = 4, burstyness = 2"),
        "workload 'w'.load.burstyness: unknown key for an open loop (rate = R); expected only ['rate', 'distribution', 'burstiness', 'seed', 'max_concurrency', 'ramp', 'ramp_steps']",
    ),
    "floor of an unknown metric": (
        ("output_throughput = {", "output_tokens_per_s = {"),
        "workload 'w'.floors.output_tokens_per_s: expected a metric with a floor, one of [",
    ),
    "floor of an unknown config": (
        ('"*" = 1.0', "seqs32 = 1.0"),
        "workload 'w'.floors.output_throughput.seqs32: expected a config this workload runs on ['base', 'seqs-32'] or \"*\", got 'seqs32'",
    ),
    "config id ..": (('id = "seqs-32"', 'id = ".."'), "config[1].id: expected an id of letters, digits, '.', '_' and '-'"),
    "config id with a slash": (
        ('id = "seqs-32"', 'id = "base/32"'),
        (
            "config[1].id: expected an id of letters, digits, '.', '_' and '-', beginning and ending with a letter or digit "
            "(it names baseline files), got 'base/32'"
        ),
    ),
    "config ids naming one file": (
        ('id = "seqs-32"', 'id = "Base"'),
        "config: ids 'base' and 'Base' map to the same baseline file name 'Base'; expected ids that differ in more than letter case",
    ),
}


@pytest.mark.parametrize("case", BAD_SUITES)
def test_a_bad_suite_field_is_one_message(tmp_path: Path, case: str) -> None:
    change, expected = BAD_SUITES[case]
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.replace(*change, 1))
    done = cli("show", str(suite))
    assert done.returncode == 2, done.stdout + done.stderr
    one_message(done.stderr, f"qwenperf: {suite}: {expected}")


# ---------------------------------------------------------------- endpoints


def test_https_is_refused_at_argument_parsing_with_what_to_do() -> None:
    done = cli("bench", "--endpoint", "https://vllm.example.com:8443", "--progress", "off")
    assert done.returncode == 2
    one_message(
        done.stderr,
        "error: argument --endpoint: expected an http:// URL, got 'https://vllm.example.com:8443': the load generator speaks plain HTTP",
        "kubectl port-forward",
    )
    assert "not ready" not in done.stderr  # refused before any probe


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://perf:s3cret@127.0.0.1:9", "http://perf:***@127.0.0.1:9"),
        ("http://perf:s3cret@[::1", "http://perf:***@[::1"),  # urlsplit raises: argparse would echo the raw value
        ("http://perf:s3cret@127.0.0.1:port", "http://perf:***@127.0.0.1:port"),
    ],
)
def test_a_password_in_an_endpoint_url_is_never_echoed(tmp_path: Path, url: str, shown: str) -> None:
    done = cli("bench", "--endpoint", url, "--progress", "off")
    assert done.returncode == 2 and "s3cret" not in done.stdout + done.stderr
    one_message(done.stderr, "argument --endpoint: expected", f"got {shown!r}")
    done = inner(tmp_path, f"--qwenperf-endpoint={url}")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and "s3cret" not in done.stdout + done.stderr
    one_message(done.stderr, "argument --qwenperf-endpoint: expected", f"got {shown!r}")
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nqwenperf_endpoints =\n    {url}\n")
    done = inner(tmp_path)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and "s3cret" not in done.stdout + done.stderr
    one_message(done.stderr, "pytest.ini: ini key qwenperf_endpoints: expected", f"got {shown!r}")
    (tmp_path / "pytest.ini").unlink()
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text(f"[[set]]\nreplicas = 1\nurls = [{json.dumps(url)}]\n")
    done = inner(tmp_path, f"--qwenperf-endpoints-file={endpoints}")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and "s3cret" not in done.stdout + done.stderr
    one_message(done.stderr, f"{endpoints}: set[0].urls[0]: expected", f"got {shown!r}")


# ---------------------------------------------------------------- servers that answer garbage


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        (b"\xff\xfe\x00\x01binary", "/metrics answered 200 but is not UTF-8 text (byte 0xff at offset 0)"),
        (b"<html><body>502 Bad Gateway</body></html>", "/metrics answered 200 but is not Prometheus text (invalid metric name"),
    ],
    ids=["binary", "html"],
)
def test_a_server_answering_garbage_for_version_and_metrics_is_measured_and_says_so(tmp_path: Path, metrics: bytes, why: str) -> None:
    out = tmp_path / "result.json"
    answers = {"/version": b"<html>oops</html>", "/metrics": metrics}
    with stream_source(answers=answers) as source:
        url = source.urls[0]
        args = ("--dataset-name", "fixed", "--prompt", "hello world", "--num-prompts", "8", "--output-len", "4")
        done = cli("bench", "--endpoint", url, *args, "--progress", "off", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Successful requests                                  8" in done.stdout
    version_why = "/version answered 200 with '<html>oops</html>'; expected JSON such as {\"version\": \"0.18.0\"}"
    one_message(done.stdout + done.stderr, f"UNREADABLE version of {url}: {version_why}")
    one_message(done.stdout + done.stderr, f"UNREADABLE metrics of {url}: {why}")
    result = json.loads(out.read_text())
    server = result["context"]["servers"][0]
    assert server["version"] is None and server["cache_config"] == {}
    assert server["unreadable"]["version"] == version_why and server["unreadable"]["metrics"].startswith(why)
    assert result["token_check"]["matches"] is None  # no counters to cross-check, as with no /metrics at all
    assert result["telemetry"]["server_gauges"]["sampler"]["last_error"].startswith("MetricsUnreadable: not ")


# ---------------------------------------------------------------- lint --python


def test_lint_with_a_missing_interpreter_is_one_line() -> None:
    done = cli("lint", str(SUITES / "cpu.toml"), "--python", "/nonexistent/python3")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "qwenperf lint: --python /nonexistent/python3: No such file or directory; expected a Python interpreter with vLLM installed"
    ]


def test_lint_with_an_interpreter_without_vllm_is_one_line() -> None:
    python = Path(sys.base_prefix) / "bin" / "python3"  # the venv's base Python: no vLLM there
    if subprocess.run([python, "-c", "import vllm"], capture_output=True, check=False).returncode == 0:
        pytest.skip(f"{python} has vLLM installed")
    done = cli("lint", str(SUITES / "cpu.toml"), "--python", str(python))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"qwenperf lint: --python {python}: cannot import vLLM (No module named 'vllm'); expected a Python interpreter with vLLM installed"
    ]


# ---------------------------------------------------------------- render-k8s


def test_render_k8s_refuses_a_bad_namespace_at_argument_parsing() -> None:
    done = cli("render-k8s", str(SUITES / "b200.toml"), "--config", "dp8", "--namespace", "Perf_Team")
    assert done.returncode == 2 and done.stdout == ""
    one_message(done.stderr, "argument --namespace: expected a Kubernetes namespace (at most 63 lowercase letters", "got 'Perf_Team'")


@pytest.mark.parametrize(
    ("ids", "render", "expected"),
    [
        (("dp8.fp8", "dp8-fp8"), "dp8-fp8", "config 'dp8-fp8': its Kubernetes object name 'qwenperf-gpu-dp8-fp8' is also config 'dp8.fp8'"),
        (("x" * 60,), "x" * 60, f"config '{'x' * 60}': the Kubernetes object name 'qwenperf-gpu-{'x' * 60}' has 73 characters; expected at most 63"),
    ],
    ids=["two-configs-one-name", "too-long"],
)
def test_render_k8s_never_maps_two_configs_to_one_object_nor_cuts_a_name(
    tmp_path: Path, ids: tuple[str, ...], render: str, expected: str
) -> None:
    suite = tmp_path / "suite.toml"
    configs = "".join(f'[[config]]\nid = "{config_id}"\n' for config_id in ids)
    suite.write_text(f'[suite]\nname = "gpu"\nhardware = "b200"\nmodel = "Qwen/Qwen3-8B"\n{configs}')
    done = cli("render-k8s", str(suite), "--config", render)
    assert done.returncode == 2 and done.stdout == ""
    one_message(done.stderr, f"qwenperf: {suite}: {expected}")

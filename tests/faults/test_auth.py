"""Servers run with vLLM's ``--api-key``: every request carries the key, and no written line does.

The servers here are real processes on real sockets: the lifecycle stand-in (which checks
the key on the paths vLLM 0.32 guards, from ``VLLM_API_KEY`` or ``--api-key``) and a small
streaming server in a thread that records every request's ``Authorization`` header. The
run against real vLLM is ``tests/e2e/test_auth.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import psutil
import pytest
import yaml

from pytest_qwenperf.core.apikey import (
    ApiKey,
    ApiKeyError,
    key_from_environment,
    redact_argv,
    resolve_api_key,
)
from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.http import http_get
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.core.summary import RunSummary
from pytest_qwenperf.gate.baseline import write_baseline
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.client import run_load_sync
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.workers import run_load_in_workers
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.run import build_run
from pytest_qwenperf.serving.hardware import Hardware
from pytest_qwenperf.serving.process import PortInUseError, free_port
from pytest_qwenperf.serving.server import (
    ExternalServer,
    ManagedServer,
    ServerAuthError,
    ServerInfo,
    ServerSpec,
    probe_ready,
)
from pytest_qwenperf.suite.config import SuiteError, load_suite
from tests.test_baseline import observation
from tests.test_k8s import assert_valid

ROOT = Path(__file__).resolve().parents[2]
STANDIN = (sys.executable, str(ROOT / "tests" / "standins" / "openai_standin.py"))
B200 = ROOT / "perf_tests" / "suites" / "b200.toml"
CPU = ROOT / "perf_tests" / "suites" / "cpu.toml"
MODEL = "auth-model"


def new_key() -> str:
    return f"qpk-{secrets.token_urlsafe(18)}"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_qwenperf.cli.main", *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any API key, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "OPENAI_API_KEY")}
    return env | extra


# ------------------------------------------------------------------ redaction, sources


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["--api-key", "K1"], ["--api-key", "***"]),
        (["--api-key=K1"], ["--api-key=***"]),
        (["--api-key", "K1", "K2", "--port", "8000"], ["--api-key", "***", "***", "--port", "8000"]),  # vLLM takes several
        (["--api_key", "K1", "m"], ["--api_key", "***", "***"]),  # a value after the keys is taken as a key too: nargs="+"
        (["--api-ke", "K1"], ["--api-ke", "***"]),  # vLLM's parser accepts unambiguous abbreviations
        (["--api-key=K1", "model"], ["--api-key=***", "model"]),
        (["--api-server-count", "2", "--model", "K1"], ["--api-server-count", "2", "--model", "K1"]),  # not the key option
    ],
)
def test_redact_argv_hides_every_key(argv: list[str], shown: list[str]) -> None:
    assert redact_argv(argv) == shown


def test_key_sources_in_order_of_precedence() -> None:
    both = {"VLLM_API_KEY": "from-vllm", "OPENAI_API_KEY": "from-openai"}
    assert resolve_api_key("from-option", both) == ApiKey("from-option", "--api-key")
    assert resolve_api_key(None, both) == ApiKey("from-vllm", "VLLM_API_KEY")
    assert resolve_api_key(None, {"OPENAI_API_KEY": "from-openai", "VLLM_API_KEY": ""}) == ApiKey("from-openai", "OPENAI_API_KEY")
    assert resolve_api_key(None, {}) is None
    assert key_from_environment(both | {"CI_KEY": "named"}, "CI_KEY") == ApiKey("named", "CI_KEY")  # a named variable wins
    with pytest.raises(ApiKeyError, match="environment variable CI_KEY is not set or empty"):
        key_from_environment(both, "CI_KEY")


def test_a_key_never_shows_in_its_repr_or_its_errors() -> None:
    key = new_key()
    assert key not in repr(ApiKey(key, "VLLM_API_KEY")) and key not in repr(LoadOptions(api_key=ApiKey(key, "VLLM_API_KEY")))
    with pytest.raises(ApiKeyError) as bad:
        ApiKey(f"{key}\r\nX-Injected: 1", "VLLM_API_KEY")  # would end the header line and add one
    assert "VLLM_API_KEY" in str(bad.value) and key not in str(bad.value)


# ---------------------------------------------------------- a server that wants the key


class _Recorder(ThreadingHTTPServer):
    """vLLM's key check (only under /v1) in front of a minimal streaming completions server;
    ``seen`` holds (method, path, Authorization header) of every request."""

    daemon_threads = True

    def __init__(self, key: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.key = key
        self.seen: list[tuple[str, str, str | None]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, fmt: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _allowed(self) -> bool:
        auth = self.headers.get("Authorization")
        self.server.seen.append((self.command, self.path, auth))
        if self.path.startswith("/v1") and auth != f"Bearer {self.server.key}":
            self._send(401, json.dumps({"error": "Unauthorized"}))
            return False
        return True

    def do_GET(self) -> None:
        if not self._allowed():
            return
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": MODEL, "max_model_len": 4096}]}))
        elif self.path == "/version":
            self._send(200, json.dumps({"version": "0.0.0-standin"}))
        else:
            self._send(404, "{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._allowed():
            return
        n = int(body["max_tokens"])
        events = [
            {"choices": [{"index": 0, "text": "t"}], "usage": {"prompt_tokens": 1, "completion_tokens": i, "total_tokens": 1 + i}}
            for i in range(1, n + 1)
        ]
        self._send(200, "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n", "text/event-stream")


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder(new_key())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(index=i, prompt="hi", max_tokens=3, ignore_eos=True) for i in range(n)]


@pytest.mark.parametrize("workers", [1, 2])
def test_every_request_of_a_run_carries_the_key(recorder: _Recorder, workers: int) -> None:
    """In the event loop's own process and in spawned worker processes alike."""
    options = LoadOptions(api_key=ApiKey(recorder.key, "VLLM_API_KEY"))
    if workers == 1:
        load = run_load_sync([recorder.url], MODEL, specs(6), ClosedLoop(2), options)
    else:
        load = run_load_in_workers(workers, [recorder.url], MODEL, specs(6), ClosedLoop(2), options)
    assert [r.error for r in load.records if not r.ok] == []
    assert [auth for _, _, auth in recorder.seen] == [f"Bearer {recorder.key}"] * 6


def test_bench_sends_the_key_from_the_environment_and_writes_it_nowhere(recorder: _Recorder, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ("bench", "--endpoint", recorder.url, "--dataset-name", "fixed", "--prompt", "hi", "--output-len", "3")
    args += ("--num-prompts", "6", "--max-concurrency", "2", "--progress", "off", "--json", str(out), "--detailed")
    done = cli(*args, env=clean_env(VLLM_API_KEY=recorder.key))
    assert done.returncode == 0, done.stderr
    v1 = [auth for _, path, auth in recorder.seen if path.startswith("/v1")]
    assert len(v1) >= 1 + 1 + 6 and set(v1) == {f"Bearer {recorder.key}"}  # probe, describe, first request, the run
    assert recorder.key not in done.stdout + done.stderr + out.read_text()


def test_bench_api_key_option_wins_over_the_environment(recorder: _Recorder) -> None:
    args = ("bench", "--endpoint", recorder.url, "--dataset-name", "fixed", "--prompt", "hi", "--output-len", "2")
    args += ("--num-prompts", "2", "--progress", "off", "--api-key", recorder.key)
    done = cli(*args, env=clean_env(VLLM_API_KEY="stale", OPENAI_API_KEY="other"))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {},
            "the server requires an API key and none was sent; put it in the environment as VLLM_API_KEY or OPENAI_API_KEY, or pass --api-key",
        ),
        ({"OPENAI_API_KEY": "stale"}, "the server requires an API key and it rejected the one from OPENAI_API_KEY"),
    ],
)
def test_bench_says_at_once_that_the_server_wants_a_key(recorder: _Recorder, env: dict[str, str], message: str) -> None:
    done = cli(
        "bench",
        "--endpoint",
        recorder.url,
        "--dataset-name",
        "fixed",
        "--prompt",
        "hi",
        "--progress",
        "off",
        env=clean_env(**env),
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_external_endpoints_that_want_another_key_fail_at_once(recorder: _Recorder) -> None:
    """A 401 does not go away by waiting: no boot timeout spent on it."""
    with pytest.raises(ServerAuthError, match="rejected the one from VLLM_API_KEY"):
        ExternalServer((recorder.url,), boot_timeout_s=30, api_key=ApiKey("wrong", "VLLM_API_KEY")).wait_ready()
    server = ExternalServer((recorder.url,), boot_timeout_s=30, api_key=ApiKey(recorder.key, "VLLM_API_KEY")).wait_ready()
    assert server.model == MODEL


# ------------------------------------------------------------- servers this package starts


def test_a_started_server_gets_the_key_through_its_environment_not_its_argv(tmp_path: Path) -> None:
    key = new_key()
    spec = ServerSpec(model=MODEL, launcher=STANDIN, boot_timeout_s=30, api_key=ApiKey(key, "VLLM_API_KEY"))
    with ManagedServer(spec, tmp_path) as server:  # ready: its probes sent the key
        assert server.pid is not None
        proc = psutil.Process(server.pid)
        assert proc.environ()["VLLM_API_KEY"] == key
        assert key not in " ".join(proc.cmdline())
        assert http_get(f"{server.base_url}/v1/models")[0] == 401  # the stand-in does enforce it
    assert key not in server.log_path.read_text()


def test_a_server_without_a_key_does_not_inherit_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """VLLM_API_KEY in this process's environment would make vLLM require it; the spec has no key, so the server requires none."""
    monkeypatch.setenv("VLLM_API_KEY", new_key())
    with ManagedServer(ServerSpec(model=MODEL, launcher=STANDIN, boot_timeout_s=20), tmp_path) as server:
        assert http_get(f"{server.base_url}/v1/models")[0] == 200


def test_a_key_in_the_launcher_argv_is_redacted_in_the_log_header(tmp_path: Path) -> None:
    key = new_key()
    spec = ServerSpec(model=MODEL, launcher=(*STANDIN, "--api-key", key), boot_timeout_s=30, api_key=ApiKey(key, "test"))
    with ManagedServer(spec, tmp_path) as server:
        assert server.log_path is not None
        header = server.log_path.read_text().splitlines()[0]
    assert header.startswith("# qwenperf: ") and '"--api-key", "***"' in header and key not in header


def test_the_port_owner_named_in_an_error_has_its_key_redacted(tmp_path: Path) -> None:
    key, port = new_key(), free_port()
    owner = subprocess.Popen([*STANDIN, "--model", MODEL, "--port", str(port), "--api-key", key], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while probe_ready(f"http://127.0.0.1:{port}", MODEL, ApiKey(key, "test")) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(PortInUseError) as taken:
            ManagedServer(ServerSpec(model=MODEL, launcher=STANDIN, port=port, boot_timeout_s=30), tmp_path).start()
        assert f"by pid {owner.pid}" in str(taken.value) and "--api-key ***" in str(taken.value) and key not in str(taken.value)
    finally:
        owner.kill()
        owner.wait()


def test_plugin_boots_servers_with_the_key_from_the_named_variable(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_key()
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("CI_VLLM_KEY", key)
    pytester.makepyfile(
        test_keyed="""
import os, psutil, pytest
from pytest_qwenperf.suite.config import ServingConfig
from pytest_qwenperf.core.http import http_get
A = ServingConfig(id="cfg-a", model="model-a")
@pytest.mark.parametrize("serving_config", [A], ids=[A.id])
def test_server(vllm_server):
    proc = psutil.Process(vllm_server.pid)
    assert proc.environ()["VLLM_API_KEY"] == os.environ["CI_VLLM_KEY"]
    assert os.environ["CI_VLLM_KEY"] not in " ".join(proc.cmdline())
    assert http_get(vllm_server.base_url + "/v1/models")[0] == 401
"""
    )
    launcher = shlex.join(STANDIN)
    result = pytester.runpytest_subprocess(
        f"--qwenperf-launcher={launcher}",
        "--qwenperf-boot-timeout=30",
        "--qwenperf-api-key-env=CI_VLLM_KEY",
        f"--qwenperf-log-dir={pytester.path / 'logs'}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=1)
    written = "".join(p.read_text() for p in (pytester.path / "logs").iterdir())
    assert written and key not in written and key not in result.stdout.str() + result.stderr.str()


def test_plugin_refuses_a_named_variable_that_is_not_set(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VARIABLE", raising=False)
    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    result = pytester.runpytest_subprocess("--qwenperf-api-key-env=NO_SUCH_KEY_VARIABLE", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--qwenperf-api-key-env: environment variable NO_SUCH_KEY_VARIABLE is not set or empty*"])


# --------------------------------------------------------------- suites, baselines, k8s


@pytest.mark.parametrize(
    ("table", "line", "key"),
    [
        ("suite.vllm", 'api-key = "{key}"', "suite.vllm.api-key"),
        ("suite.vllm", 'api-k = "{key}"', "suite.vllm.api-k"),
        ("suite.env", 'VLLM_API_KEY = "{key}"', "suite.env.VLLM_API_KEY"),
    ],
)
def test_a_suite_file_with_a_key_is_refused_without_echoing_it(tmp_path: Path, table: str, line: str, key: str) -> None:
    secret = new_key()
    text = CPU.read_text().replace(f"[{table}]\n", f"[{table}]\n{line.format(key=secret)}\n", 1)
    suite = tmp_path / "keyed.toml"
    suite.write_text(text)
    with pytest.raises(SuiteError) as refused:
        load_suite(suite)
    assert f"{suite}: {key}: an API key does not belong in a suite file; set VLLM_API_KEY" in str(refused.value)
    shown = cli("show", str(suite))
    assert shown.returncode == 2 and secret not in shown.stdout + shown.stderr


def _run_with_argv(argv: tuple[str, ...]) -> Run:
    """A run, as a file's is read, of the CPU suite's base config with ``argv``."""
    cpu = load_suite(CPU)
    values = {"duration": 10.0, "completed": 256, "failed": 0, "total_input_tokens": 32768, "total_output_tokens": 32768}
    values |= {"request_throughput": 39.0, "output_throughput": 5000.0, "total_token_throughput": 10000.0}
    result = build_run(
        dataclasses.replace(cpu.config("base"), vllm_args=argv),
        cpu.workloads[0],
        observation(RunSummary.from_values(values)),
        Method(suite=cpu.name),
        (ServerInfo("http://127.0.0.1:8000", "tiny", "0.32.0", 2048),),
        Hardware(kind="cpu", cpu_model="Test CPU", cpu_ids=frozenset({0, 1})),
    )
    return decode_run(json.loads(json.dumps(json_safe(msgspec.to_builtins(result)))))


def test_a_key_in_a_configs_argv_is_redacted_in_run_json_and_baselines(tmp_path: Path) -> None:
    """A config built in Python (no suite file to refuse it): the key is neither written nor part of the identity."""
    first, second = new_key(), new_key()
    run = _run_with_argv(("--max-model-len", "2048", "--api-key", first))
    assert run.identity.argv == ("--max-model-len", "2048", "--api-key", "***")
    path = write_baseline(tmp_path, run, source="test")
    assert first not in path.read_text()
    rotated = _run_with_argv(("--max-model-len", "2048", "--api-key", second))
    assert rotated.identity.baseline() == run.identity.baseline()  # a new key: still comparable with the baseline


def render(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("render-k8s", str(B200), "--config", "dp8-ctx4k-fp8kv-mtp1", "--replicas", "2", *args)


@pytest.mark.parametrize(
    ("given", "name", "key"), [("vllm-api-key", "vllm-api-key", "api-key"), ("perf.keys:vllm_token", "perf.keys", "vllm_token")]
)
def test_render_k8s_reads_the_key_from_a_secret(given: str, name: str, key: str) -> None:
    done = render("--api-key-secret", given)
    assert done.returncode == 0, done.stderr
    deployment, service = yaml.safe_load_all(done.stdout)
    for manifest in (deployment, service):
        assert_valid(manifest)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    keyed = [var for var in container["env"] if var["name"] == "VLLM_API_KEY"]
    assert keyed == [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}]  # no literal value
    assert not any("api-key" in arg for arg in container["args"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"  # vLLM asks no key there


@pytest.mark.parametrize("given", ["Vllm_Key", "key:", ":api-key", "key:with space", "-leading"])
def test_render_k8s_refuses_a_bad_secret_reference(given: str) -> None:
    done = render(f"--api-key-secret={given}")
    assert done.returncode == 2 and "--api-key-secret: expected NAME[:KEY]" in done.stderr, done.stderr

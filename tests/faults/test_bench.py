"""``qwenperf bench`` stops at once on SIGINT / SIGTERM, leaves no worker behind, and fails when requests fail.

Every case runs the installed command as a subprocess against a stand-in streaming
server that serves from a thread of this test process: it logs when each completions
request arrives (``time.monotonic``, CLOCK_MONOTONIC, the same clock in every process)
and answers by arrival number, so a test knows exactly which requests succeed, fail or
are held open until it releases them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from tests.processes import alive, interruptible
from tests.stream_source import _Format, _frame

QWENPERF = str(Path(sys.executable).parent / "qwenperf")
MARK = "QWENPERF_TEST_BENCH"  # in the bench's environment, so every process it starts carries it too
MODEL = "stand-in-model"
GONE_WITHIN_S = 30.0  # generous: a loaded 2-core machine; the workers normally go within a fraction of a second
STARTED_WITHIN_S = 120.0  # imports, the first-request check and spawning the workers

Answer = str | tuple[int, str]  # "ok", "hold" (stream once released), or (HTTP status, the server's message)


class StandIn:
    """A vLLM-like completions endpoint that counts requests and answers the n-th (from 0) as ``plan(n)`` says."""

    def __init__(self, plan: Callable[[int], Answer], profiler: bool = False) -> None:
        """``profiler``: ``/server_info`` names a torch profiler folder, and ``/start_profile`` fails with a 500."""
        self.plan = plan
        self.profiler = profiler
        self.arrivals: list[float] = []  # time.monotonic() of each completions request, in arrival order
        self.lock = threading.Lock()
        self.release = threading.Event()  # held streams go on once set
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self) -> int:
        with self.lock:
            return len(self.arrivals)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: object) -> None:
                pass

            def _reply(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._reply(200, {})
                elif self.path == "/v1/models":
                    self._reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]})
                elif self.path == "/version":
                    self._reply(200, {"version": "0.0.0-standin"})
                elif self.path.split("?")[0] == "/server_info" and standin.profiler:
                    self._reply(200, {"vllm_config": {"profiler_config": {"profiler": "torch", "torch_profiler_dir": "/nowhere"}}})
                else:
                    self._reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/start_profile":
                    self._reply(500, {"detail": "the profiler broke"})
                    return
                body = json.loads(raw)
                with standin.lock:
                    n = len(standin.arrivals)
                    standin.arrivals.append(time.monotonic())
                answer = standin.plan(n)
                try:
                    if isinstance(answer, tuple):
                        status, message = answer
                        error = {"message": message, "type": "BadRequestError", "param": None, "code": status}  # vLLM's layout
                        self._reply(status, {"error": error})
                        return
                    if answer == "hold":
                        standin.release.wait()
                    self._stream(int(body["max_tokens"]))
                except OSError:  # the client is gone (killed mid-stream): nothing to answer
                    self.close_connection = True

            def _stream(self, tokens: int) -> None:
                fmt = _Format(False, MODEL, 2, True)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [fmt.chunk("tok", k + 1, "length" if k == tokens - 1 else None) for k in range(tokens)]
                events += [fmt.final(tokens), b"data: [DONE]\n\n"]
                self.wfile.write(b"".join(_frame(event) for event in events) + b"0\r\n\r\n")

        return Handler


@contextmanager
def stand_in(plan: Callable[[int], Answer], profiler: bool = False) -> Iterator[StandIn]:
    server = StandIn(plan, profiler)
    thread = threading.Thread(target=server.server.serve_forever, name="bench-stand-in", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.server.shutdown()
        server.server.server_close()


def start_bench(url: str, out: Path, *args: str, new_session: bool = False) -> subprocess.Popen[bytes]:
    """The command as a user starts it from a terminal, output to files nobody needs to drain; the
    processes it starts are found by :func:`processes_of` ``(bench)``."""
    argv = [QWENPERF, "bench", "--endpoint", url, "--dataset-name", "fixed", "--prompt", "hello there", "--output-len", "4"]
    with open(out / "stdout", "wb") as stdout, open(out / "stderr", "wb") as stderr:
        return subprocess.Popen(
            interruptible([*argv, "--progress", "off", *args]),
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, MARK: str(out)},
            start_new_session=new_session,
        )


def processes_of(out: Path) -> list[psutil.Process]:
    """Live processes of the bench started with ``out``, however they were started and whoever their parent is now."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == str(out) and alive(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def left_after(out: Path, timeout: float) -> list[str]:
    """Poll until no process of the bench started with ``out`` is left; the command lines of those left at ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := processes_of(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [" ".join(p.cmdline()) for p in left if alive(p)]


def finish(bench: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return bench.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def workers_of(bench: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The load generator's processes (spawned by multiprocessing) that ``bench``, still running, has started."""
    assert bench.poll() is None, f"bench ended early with {bench.returncode}"
    return [p for p in psutil.Process(bench.pid).children() if "spawn_main" in " ".join(p.cmdline())]


# The interrupted runs: 40 measured requests over 4 lanes (closed loop, concurrency 4). The
# first-request check and the first 12 measured requests complete; every later one is held open.
MEASURED, COMPLETING, LANES = 40, 12, 4
HELD_AT = 1 + COMPLETING  # arrival number of the first held request (0 is the first-request check)


def held_after_twelve(n: int) -> Answer:
    return "ok" if n < HELD_AT else "hold"


def load_of(workers: int) -> list[str]:
    return ["--num-prompts", str(MEASURED), "--max-concurrency", str(LANES), "--workers", str(workers)]


@contextmanager
def running_bench(
    tmp_path: Path, workers: int, *, new_session: bool = False
) -> Iterator[tuple[StandIn, subprocess.Popen[bytes]]]:
    """A bench run parked mid-way (every lane waiting on a held stream); afterwards, no result file."""
    results = tmp_path / "results"
    results.mkdir()
    with stand_in(held_after_twelve) as server:
        bench = start_bench(server.url, tmp_path, *load_of(workers), "--json", str(results / "r.json"), new_session=new_session)
        try:
            deadline = time.monotonic() + STARTED_WITHIN_S
            while server.count() < HELD_AT + LANES:
                assert bench.poll() is None, f"bench ended early ({bench.returncode}): {(tmp_path / 'stderr').read_text()}"
                assert time.monotonic() < deadline, f"only {server.count()} requests arrived"
                time.sleep(0.05)
            assert len(workers_of(bench)) == (workers if workers > 1 else 0)
            yield server, bench
        finally:
            end(bench, tmp_path)
    assert not list(results.iterdir()), "an interrupted run must write no result, not even a partial or temporary file"


def end(bench: subprocess.Popen[bytes], out: Path) -> None:
    """Cleanup for a test that failed half-way: kill what is left of the bench started with ``out``."""
    if bench.poll() is None:
        bench.kill()
    bench.wait()
    for proc in processes_of(out):
        proc.kill()


def interrupted_line(name: str, done: str = r"\d+") -> str:
    """The one line an interrupted run prints, as a regular expression."""
    return rf"qwenperf: interrupted by {name} after {done} of {MEASURED} requests; no result written\n"


def assert_no_request_after(server: StandIn, signalled_at: float) -> None:
    """Release the held streams and check that no request arrived after the signal.

    The invariant is exact: nothing may arrive after the signal at all. It can be exact
    because no stream could end between the signal and the release (every lane was
    parked on a held stream), so even a client that reacts late had no finished request
    to follow with a new one. Releasing the streams afterwards is what would let a
    surviving worker go on (its requests end, its lanes send their next ones): before
    the fix, the orphaned workers sent the rest of the 40 requests here.
    """
    server.release.set()
    time.sleep(1.0)  # a survivor would send within milliseconds of its streams ending; this only bounds the wait
    late = [at - signalled_at for at in server.arrivals if at > signalled_at]
    assert server.count() == HELD_AT + LANES and not late, f"requests arrived {late} s after the signal"


@pytest.mark.parametrize("workers", [2, 1], ids=["2-workers", "in-process"])
def test_sigterm_stops_the_run_and_every_worker_at_once(tmp_path: Path, workers: int) -> None:
    with running_bench(tmp_path, workers) as (server, bench):
        signalled_at = time.monotonic()
        bench.send_signal(signal.SIGTERM)
        code = finish(bench, GONE_WITHIN_S)
        stderr = (tmp_path / "stderr").read_text()
        assert code == 128 + signal.SIGTERM, f"exit {code}; stderr:\n{stderr}"
        assert left_after(tmp_path, GONE_WITHIN_S) == []
        assert_no_request_after(server, signalled_at)
    assert re.fullmatch(interrupted_line("SIGTERM"), stderr), stderr


def test_ctrl_c_prints_one_line_and_stops_every_worker(tmp_path: Path) -> None:
    """Ctrl-C at a terminal signals the whole foreground process group, workers included:
    the parent alone decides, and no process prints a traceback."""
    with running_bench(tmp_path, 2, new_session=True) as (server, bench):
        signalled_at = time.monotonic()
        os.killpg(bench.pid, signal.SIGINT)
        code = finish(bench, GONE_WITHIN_S)
        stderr = (tmp_path / "stderr").read_text()
        assert code == 128 + signal.SIGINT, f"exit {code}; stderr:\n{stderr}"
        assert left_after(tmp_path, GONE_WITHIN_S) == []
        assert_no_request_after(server, signalled_at)
    assert "Traceback" not in stderr
    assert re.fullmatch(interrupted_line("SIGINT"), stderr), stderr


def wait_for_a_worker(bench: subprocess.Popen[bytes], cpu_s: float) -> psutil.Process:
    """The first worker seen to have used ``cpu_s`` of CPU: 0 as soon as it exists (the parent may
    still be starting it or the next), 0.05 once Python runs in it and imports what it needs."""
    deadline = time.monotonic() + STARTED_WITHIN_S
    while True:
        for worker in workers_of(bench):
            try:
                times = worker.cpu_times()
            except psutil.Error:
                continue
            if times.user + times.system >= cpu_s:
                return worker
        assert time.monotonic() < deadline, "no worker started"
        time.sleep(0.002)


@pytest.mark.parametrize("cpu_s", [0.0, 0.05], ids=["spawned", "importing"])
def test_ctrl_c_while_the_workers_start_prints_one_line(tmp_path: Path, cpu_s: float) -> None:
    """Ctrl-C while the parent starts the workers (a worker process exists), or while one imports
    (a good part of a second): an interrupt in the middle of starting one would leave it reading
    a closed pipe, and a worker that sees SIGINT prints a traceback of its own; the parent stops
    them all. The verdict does not depend on when the signal lands; the two moments are where
    it used to hurt."""
    with stand_in(held_after_twelve) as server:
        bench = start_bench(server.url, tmp_path, *load_of(2), new_session=True)
        try:
            wait_for_a_worker(bench, cpu_s)
            os.killpg(bench.pid, signal.SIGINT)
            code = finish(bench, GONE_WITHIN_S)
            left = left_after(tmp_path, GONE_WITHIN_S)
        finally:
            end(bench, tmp_path)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 128 + signal.SIGINT, f"exit {code}; stderr:\n{stderr}"
    assert left == []
    assert re.fullmatch(interrupted_line("SIGINT", done="0"), stderr), stderr


def test_a_worker_never_acts_on_sigint(tmp_path: Path) -> None:
    """SIGINT to a worker alone, while it imports (or at any later time): stopping is the parent's
    decision, so the worker goes on and the run completes as if nothing happened."""
    with stand_in(lambda n: "ok") as server:
        bench = start_bench(server.url, tmp_path, *load_of(2))
        try:
            wait_for_a_worker(bench, 0.05).send_signal(signal.SIGINT)
            code = finish(bench, STARTED_WITHIN_S)
        finally:
            end(bench, tmp_path)
    assert code == 0, f"exit {code}; stderr:\n{(tmp_path / 'stderr').read_text()}"
    assert (tmp_path / "stderr").read_text() == ""
    assert server.count() == 1 + MEASURED


def test_workers_die_with_a_sigkilled_bench(tmp_path: Path) -> None:
    with running_bench(tmp_path, 2) as (server, bench):
        signalled_at = time.monotonic()
        bench.kill()
        bench.wait()
        assert left_after(tmp_path, GONE_WITHIN_S) == []
        assert_no_request_after(server, signalled_at)


def test_workers_die_with_a_bench_sigkilled_while_they_start(tmp_path: Path) -> None:
    """SIGKILL while a worker imports, before its watch on the parent can begin: it must still
    notice that the parent it was started by is gone, not watch its new parent (init) instead."""
    with stand_in(lambda n: "ok") as server:
        bench = start_bench(server.url, tmp_path, *load_of(2))
        try:
            wait_for_a_worker(bench, 0.05)
            bench.kill()
            bench.wait()
            assert left_after(tmp_path, GONE_WITHIN_S) == []
        finally:
            end(bench, tmp_path)
    assert server.count() <= 1, "only the first-request check may have been sent"


def failing_nine_of_ten(n: int) -> Answer:
    """The first-request check and the first measured request succeed; of the 9 others,
    every third is rejected (400), the rest fail on the server (500)."""
    if n < 2:
        return "ok"
    return (400, "prompt is too long for the stand-in") if n % 3 == 0 else (500, "stand-in overloaded\n  try again later")


def test_failed_requests_fail_the_run_with_their_reasons_grouped(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    with stand_in(failing_nine_of_ten) as server:
        bench = start_bench(server.url, tmp_path, "--num-prompts", "10", "--max-concurrency", "2", "--json", str(result))
        code = finish(bench, STARTED_WITHIN_S)
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert code == 1, f"exit {code}; stderr:\n{stderr}"
    assert "qwenperf: 9 of 10 measured requests failed (90.0%), more than --max-failed-fraction 0 allows" in stderr
    reasons = stdout[stdout.index("Failed requests by reason:") :].splitlines()[1:3]
    assert [line.split() for line in reasons] == [
        ["6", "HTTP", "500", "stand-in", "overloaded", "try", "again", "later"],
        ["3", "HTTP", "400", "prompt", "is", "too", "long", "for", "the", "stand-in"],
    ], stdout
    failures = json.loads(result.read_text())["failures"]  # a complete run that recorded failures is still written
    assert failures["fraction"] == 0.9 and failures["max_fraction"] == 0.0
    assert failures["reasons"] == [
        {"kind": "HTTP 500", "message": "stand-in overloaded try again later", "count": 6},
        {"kind": "HTTP 400", "message": "prompt is too long for the stand-in", "count": 3},
    ]


def test_max_failed_fraction_allows_that_many_failures(tmp_path: Path) -> None:
    with stand_in(failing_nine_of_ten) as server:
        bench = start_bench(server.url, tmp_path, "--num-prompts", "10", "--max-concurrency", "2", "--max-failed-fraction", ".95")
        code = finish(bench, STARTED_WITHIN_S)
    assert code == 0, f"exit {code}; stderr:\n{(tmp_path / 'stderr').read_text()}"
    assert "6  HTTP 500" in (tmp_path / "stdout").read_text()  # allowed, still reported


@pytest.mark.parametrize("value", ["1.5", "-1", "abc", "nan"])
def test_max_failed_fraction_must_be_a_fraction(value: str) -> None:
    argv = [QWENPERF, "bench", "--endpoint", "http://127.0.0.1:9", "--max-failed-fraction", value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert f"argument --max-failed-fraction: expected a fraction from 0 to 1 (e.g. 0.05 for 5 %), got '{value}'" in done.stderr


def test_a_profile_that_fails_after_the_measured_run_keeps_the_result_and_fails_the_command(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    with stand_in(lambda n: "ok", profiler=True) as server:
        bench = start_bench(server.url, tmp_path, "--num-prompts", "6", "--max-concurrency", "2", "--profile", "--json", str(result))
        code = finish(bench, STARTED_WITHIN_S)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 2, f"exit {code}; stderr:\n{stderr}"
    assert "start_profile answered 500" in stderr and "the measured result is kept without a profile" in stderr, stderr
    kept = json.loads(result.read_text())
    assert kept["metrics"]["completed"] == 6 and kept["profile"] is None

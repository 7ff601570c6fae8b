"""A server's boot as it goes: the meter's lines on the boot's own times, the log's last line read
from its end, the observer threaded through a server, a pool and its replicas, and a session's log
against the stand-in launcher (no vLLM; nothing here waits on a terminal or on the wall clock)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_qwenperf.measure.progress import SLOW_BOOT_S, BootMeter
from pytest_qwenperf.plugin.progress import LIVE_EVERY_S
from pytest_qwenperf.serving import process
from pytest_qwenperf.serving.boot_progress import TAIL_BYTES, BootWatch, last_line, phase_of
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.serving.server import ManagedServer, ServerSpec
from pytest_qwenperf.suite.config import ServingConfig
from tests.test_progress import terminal

STANDIN = (sys.executable, str(Path(__file__).parent / "standins" / "openai_standin.py"))


def meter(every_s: float | None, side: str = "") -> tuple[BootMeter, list[str]]:
    lines = list[str]()
    return BootMeter(lines.append, every_s, side), lines


# ------------------------------------------------------------------ the meter's lines


def test_a_log_gets_a_boot_line_at_its_start_then_at_most_every_interval_and_one_when_it_is_up() -> None:
    progress, lines = meter(every_s=30)
    for elapsed in range(0, 50, 2):  # polled every 2 s
        progress.waiting("cpu/base", float(elapsed), "waiting for /health", "INFO loading weights")
    progress.booted("cpu/base", 43.2)
    assert lines == [
        "qwenperf booting cpu/base (0 s, waiting for /health)",
        "qwenperf booting cpu/base (30 s, waiting for /health)",  # the log's line only once the boot is slow
        "qwenperf booted cpu/base in 43 s",
    ]


def test_a_slow_boot_shows_the_logs_last_line() -> None:
    progress, lines = meter(every_s=0, side="candidate")
    progress.waiting("cpu/base", SLOW_BOOT_S - 1, "waiting for /health", "INFO loading weights")
    progress.waiting("cpu/base", 80.0, "waiting for the model on /v1/models", "INFO Capturing CUDA graphs " + "x" * 300)
    progress.waiting("cpu/base", 81.0, "waiting for /health", None)  # an empty log: nothing to add
    assert lines[0] == "qwenperf booting candidate cpu/base (59 s, waiting for /health)"
    assert lines[1].startswith("qwenperf booting candidate cpu/base (1 m 20 s, waiting for the model on /v1/models); log: INFO Capturing")
    assert len(lines[1]) < 300  # a long log line is cut
    assert lines[2] == "qwenperf booting candidate cpu/base (1 m 21 s, waiting for /health)"


def test_a_quiet_log_gets_only_the_boots_end() -> None:
    progress, lines = meter(every_s=None)
    progress.waiting("cpu/base", 0.0, "waiting for /health", None)
    progress.waiting("cpu/base", 90.0, "waiting for /health", "INFO still loading")
    progress.booted("cpu/base", 95.0)
    assert lines == ["qwenperf booted cpu/base in 1 m 35 s"]


def test_replicas_each_keep_their_own_interval() -> None:
    progress, lines = meter(every_s=10)
    for elapsed in (0.0, 5.0, 10.0):
        progress.waiting("cpu/dp2-r0", elapsed, "waiting for /health", None)
        progress.waiting("cpu/dp2-r1", elapsed + 1, "waiting for /health", None)
    assert lines == [
        "qwenperf booting cpu/dp2-r0 (0 s, waiting for /health)",
        "qwenperf booting cpu/dp2-r1 (1 s, waiting for /health)",
        "qwenperf booting cpu/dp2-r0 (10 s, waiting for /health)",
        "qwenperf booting cpu/dp2-r1 (11 s, waiting for /health)",
    ]


def test_a_terminal_ends_a_points_line_before_a_boot_and_redraws_the_boot_in_place() -> None:
    shown, calls = terminal(live=True)
    shown.show("qwenperf cpu/a / w: repeat 3 of 3 done")  # a point measured before, in the same test
    progress = BootMeter(shown.show, LIVE_EVERY_S, begin=shown.end)
    progress.waiting("cpu/b", 0.0, "waiting for /health", None)
    progress.waiting("cpu/b", 0.2, "waiting for /health", None)  # within the redraw interval: not drawn
    progress.waiting("cpu/b", 0.6, "waiting for /health", None)
    progress.booted("cpu/b", 0.9)
    drawn = [(kind, text) for kind, text, _ in calls if kind in ("rewrite", "write")]
    assert drawn == [
        ("rewrite", "qwenperf cpu/a / w:"),  # cut to the fake terminal's width of 20
        ("write", "\n"),  # the point's last state stays
        ("rewrite", "qwenperf booting cp"),
        ("rewrite", "qwenperf booting cp"),
        ("rewrite", "qwenperf booted cpu"),
    ]


def test_a_boot_that_is_ready_at_once_still_ends_the_line_before_it() -> None:
    begun, lines = list[str](), list[str]()
    progress = BootMeter(lines.append, 30, begin=lambda: begun.append("end"))
    progress.booted("cpu/a", 0.4)
    progress.waiting("cpu/dp2-r0", 0.0, "waiting for /health", None)
    progress.waiting("cpu/dp2-r1", 0.0, "waiting for /health", None)  # another boot is on the line: nothing to end
    progress.booted("cpu/dp2-r0", 30.0)
    progress.booted("cpu/dp2-r1", 31.0)
    assert begun == ["end", "end"]
    assert lines[-2:] == ["qwenperf booted cpu/dp2-r0 in 30 s", "qwenperf booted cpu/dp2-r1 in 31 s"]


# ------------------------------------------------------------------ the log's last line and the phase


def test_the_last_line_is_read_from_the_logs_end(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    assert last_line(None) is None and last_line(log) is None  # no log yet
    log.write_text("")
    assert last_line(log) is None
    log.write_text("INFO one\n" * 100_000 + "INFO loading weights\n\n")
    assert last_line(log) == "INFO loading weights"
    with open(log, "a") as out:  # a progress bar redrawn with carriage returns: its latest state
        out.write("Loading shards:  10%|#  | 1/10\rLoading shards:  20%|## | 2/10\r")
    assert last_line(log) == "Loading shards:  20%|## | 2/10"
    log.write_text("start\n" + "y" * (2 * TAIL_BYTES))  # one line longer than what is read: its end
    assert last_line(log) == "y" * TAIL_BYTES


def test_last_line_reads_only_the_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 1_000_000 + b"\nlast\n")
    sizes = list[int]()
    real_open = open

    def counting_open(path: Path, mode: str = "r"):  # type: ignore[no-untyped-def]
        handle = real_open(path, mode)
        read = handle.read

        def counted(size: int = -1) -> bytes:
            data = read(size)
            sizes.append(len(data))
            return data

        handle.read = counted  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr("builtins.open", counting_open)
    assert last_line(log) == "last"
    assert sizes == [TAIL_BYTES]


@pytest.mark.parametrize(
    ("reason", "phase"),
    [
        ("URLError: [Errno 111] Connection refused", "waiting for /health"),
        ("ConnectionRefusedError: [Errno 111] Connection refused", "waiting for /health"),
        ("/health returned 503", "waiting for /health"),
        ("/v1/models returned 404", "waiting for the model on /v1/models"),
        ("/v1/models lists ['a'], not 'b'", "waiting for the model on /v1/models"),
    ],
)
def test_the_phase_is_what_the_probe_waits_for(reason: str, phase: str) -> None:
    assert phase_of(reason) == phase


# ------------------------------------------------------------------ threading the observer


class Recorder:
    """A BootProgress that records what it is told (from several threads, for replicas)."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []
        self._lock = threading.Lock()

    def waiting(self, config_key: str, elapsed_s: float, phase: str, last_log_line: str | None) -> None:
        with self._lock:
            self.events.append(("waiting", config_key, elapsed_s, phase, last_log_line))

    def booted(self, config_key: str, elapsed_s: float) -> None:
        with self._lock:
            self.events.append(("booted", config_key, elapsed_s))

    def of(self, key: str) -> list[tuple[object, ...]]:
        return [event for event in self.events if event[1] == key]


def test_a_watch_names_its_boot_and_its_replicas() -> None:
    recorder = Recorder()
    watch = BootWatch(recorder, "cpu/dp2")
    watch.replica(1).waiting(3.0, "/health returned 503", None)
    watch.booted(40.0)
    assert recorder.events == [("waiting", "cpu/dp2-r1", 3.0, "waiting for /health", None), ("booted", "cpu/dp2", 40.0)]


def check_boot(events: list[tuple[object, ...]]) -> None:
    """Polls while the stand-in is not ready (it answers /health 503 for its first second), each
    with the log's last line, then its end: told in order, on growing times."""
    *waits, done = events
    assert waits, "the stand-in is not ready for a second after it starts: the first probe waits"
    assert {event[3] for event in waits} == {"waiting for /health"}
    assert all(str(event[4]).startswith(("# qwenperf: ", "stand-in serving")) for event in waits), waits
    times = [float(str(event[2])) for event in events]
    assert times == sorted(times)
    assert done[0] == "booted" and float(str(done[2])) >= 1.0


def test_a_managed_server_tells_its_watch_from_the_readiness_loop(tmp_path: Path) -> None:
    recorder = Recorder()
    spec = ServerSpec(model="standin-model", launcher=STANDIN, args=("--ready-after", "1"), boot_timeout_s=30, stop_grace_s=2)
    with ManagedServer(spec, tmp_path, BootWatch(recorder, "standin/base")):
        check_boot(recorder.of("standin/base"))
        assert len(recorder.events) == len(recorder.of("standin/base"))
    with ManagedServer(spec, tmp_path / "unwatched"):  # no watch: booted all the same
        pass


def test_a_pool_hands_its_observer_to_each_server_and_replica(tmp_path: Path) -> None:
    recorder = Recorder()
    pool = ServerPool(PoolSettings(log_dir=tmp_path, launcher=STANDIN, boot_timeout_s=30, boot_progress=recorder))
    one = ServingConfig(id="base", model="standin-model", vllm_args=("--ready-after", "1"), suite="standin")
    two = ServingConfig(id="dp2", model="standin-model", vllm_args=("--ready-after", "1"), suite="standin", replicas=2)
    try:
        pool.get(one)
        pool.get(two)
        pool.get(one)  # running already: no boot, nothing told
    finally:
        pool.close()
    assert {str(event[1]) for event in recorder.events} == {"standin/base", "standin/dp2-r0", "standin/dp2-r1"}
    for key in ("standin/base", "standin/dp2-r0", "standin/dp2-r1"):
        check_boot(recorder.of(key))



def test_a_pool_of_endpoints_tells_each_endpoints_wait_by_its_url(tmp_path: Path) -> None:
    """Endpoints started elsewhere (a deployment still booting them) are waited for as boots are,
    named by their URL; their log is not ours to read."""
    port = process.free_port()
    url = f"http://127.0.0.1:{port}"
    started = subprocess.Popen([*STANDIN, "--model", "standin-model", "--port", str(port), "--ready-after", "1"])
    recorder = Recorder()
    pool = ServerPool(PoolSettings(log_dir=tmp_path, endpoints=(url,), boot_timeout_s=30, boot_progress=recorder))
    try:
        assert pool.get(ServingConfig(id="base", model="standin-model", suite="standin")).base_urls == (url,)
    finally:
        pool.close()
        started.terminate()
        started.wait(timeout=10)
    *waits, done = recorder.of(url)
    assert waits and {event[3] for event in waits} == {"waiting for /health"} and {event[4] for event in waits} == {None}
    assert done[0] == "booted" and float(str(done[2])) >= 1.0 and len(recorder.events) == len(waits) + 1

# ------------------------------------------------------------------ a session's log

SUITE = """\
[suite]
name = "standin"
hardware = "cpu"
model = "standin-model"
repeats = 1

[[config]]
id = "base"
vllm = { ready-after = 1 }

[[workload]]
name = "w"
kind = "fixed"
prompt = "hello world"
output_len = 4
num_prompts = 8
load = { concurrency = 2 }
"""

BOOT = "def test_boot(vllm_server, suite_workload):\n    assert vllm_server.base_urls\n"
WAITING = "qwenperf booting standin/base (* s, waiting for /health)"
BOOTED = "qwenperf booted standin/base in * s"


def session(pytester: pytest.Pytester, *args: str, ini: str = "") -> list[str]:
    """The stdout lines of a session that boots the stand-in (ready a second after it starts) for one test."""
    (pytester.path / "suite.toml").write_text(SUITE)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_boot=BOOT)
    launcher = " ".join(shlex.quote(part) for part in STANDIN)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--qwenperf-suite=suite.toml", f"--qwenperf-launcher={launcher}", "--qwenperf-no-history", *args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    return result.stdout.lines


def test_a_log_shows_the_boot_waiting_and_its_end(pytester: pytest.Pytester) -> None:
    lines = session(pytester, "--qwenperf-progress=0")
    pytest.LineMatcher(lines).fnmatch_lines(["qwenperf booting standin/base (0 s, waiting for /health)", BOOTED])
    ours = [line for line in lines if line.startswith("qwenperf boot")]
    assert ours[-1].startswith("qwenperf booted") and all(line.startswith("qwenperf booting") for line in ours[:-1]), ours


def test_a_quiet_log_shows_the_boots_end_alone(pytester: pytest.Pytester) -> None:
    lines = session(pytester, "-q", "--qwenperf-progress=0")
    pytest.LineMatcher(lines).fnmatch_lines([BOOTED])
    pytest.LineMatcher(lines).no_fnmatch_line(WAITING)


@pytest.mark.parametrize(("args", "ini"), [(("--qwenperf-progress=off",), ""), ((), "qwenperf_progress = off"), (("-qq",), "")])
def test_boot_progress_switched_off_or_very_quiet_shows_nothing(pytester: pytest.Pytester, args: tuple[str, ...], ini: str) -> None:
    lines = session(pytester, *args, ini=ini)
    assert not [line for line in lines if "qwenperf boot" in line], "\n".join(lines)

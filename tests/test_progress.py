"""A point's live progress: the meter's lines on an injected clock, the terminal's in-place line,
the option, and a session's log against a stand-in server (no vLLM)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import cast

import msgspec
import pytest

from pytest_qwenperf.core.options import ProgressSetting, progress_setting
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import CapacitySearch
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.tables import format_duration as duration
from pytest_qwenperf.loadgen.arrivals import ClosedLoop, OpenLoop
from pytest_qwenperf.measure import sequential
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.observe import Watching
from pytest_qwenperf.measure.progress import Meter, load_label, measured_output, repeat_of, told, watched
from pytest_qwenperf.measure.run import Repeat
from pytest_qwenperf.plugin.progress import Terminal
from pytest_qwenperf.serving.server import Server
from tests.stream_source import stream_source
from tests.test_max_repeats import write_suite
from tests.test_measure_sequential import repeat_at, suite

PLAN = SequentialPlan(0.95, 3, 3)


class Clock:
    """Seconds set by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(tokens: int = 100) -> RequestRecord:
    return RequestRecord(index=0, endpoint="http://x", scheduled_at=0.0, sent_at=0.0, ended_at=1.0, completion_tokens=tokens)


def meter(every_s: float | None) -> tuple[Meter, Clock, list[str]]:
    clock, lines = Clock(), list[str]()
    return Meter("cpu/base / w", lines.append, every_s, clock), clock, lines


# ------------------------------------------------------------------ the meter's lines


def test_a_log_gets_a_status_line_at_most_every_interval_and_one_per_finished_repeat() -> None:
    progress, clock, lines = meter(every_s=30)
    progress.repeat_started(1, PLAN, "")
    progress.load_started(100, "")
    for second in range(1, 101):  # one request of 100 output tokens a second
        clock.now = second
        progress.request_done(record())
    progress.repeat_done(120.5)
    assert lines == [
        "qwenperf cpu/base / w: repeat 1 of 3, 0/100 requests, 0 s elapsed",
        # the window's 10 s of 100 tokens a second; 70 requests left at the rate so far
        "qwenperf cpu/base / w: repeat 1 of 3, 30/100 requests, 100 out tok/s, 30 s elapsed, ~1 m 10 s left",
        "qwenperf cpu/base / w: repeat 1 of 3, 60/100 requests, 100 out tok/s, 1 m 00 s elapsed, ~40 s left",
        "qwenperf cpu/base / w: repeat 1 of 3, 90/100 requests, 100 out tok/s, 1 m 30 s elapsed, ~10 s left",
        # the sample the verdicts weigh, not the status lines' live rate
        "qwenperf cpu/base / w: repeat 1 of 3 done, 100 requests in 1 m 40 s, 120 out tok/s measured",
    ]


def test_the_output_rate_is_the_recent_window_and_the_time_left_the_rate_so_far() -> None:
    progress, clock, lines = meter(every_s=0)
    progress.repeat_started(2, SequentialPlan(0.95, 2, 4), "candidate")
    progress.load_started(40, "2 replicas")
    for second in range(1, 21):  # 20 requests of 100 tokens, a second apart
        clock.now = second
        progress.request_done(record())
    clock.now = 25.0
    progress.request_done(record(tokens=3000))
    # 6 requests in the last 10 s (16 to 20, and 25): 3,500 tokens; 21 of 40 in 25 s leaves 19 at 25/21 s each
    assert lines[-1] == (
        "qwenperf cpu/base / w: candidate repeat 2 of 2 (up to 4), 2 replicas, 21/40 requests, 350 out tok/s, 25 s elapsed, ~23 s left"
    )
    # five seconds on, the window holds the last request alone
    assert progress.status(30.0).endswith("21/40 requests, 300 out tok/s, 30 s elapsed, ~27 s left")


def test_the_first_seconds_count_their_own_length_not_the_whole_window() -> None:
    progress, clock, lines = meter(every_s=0)
    progress.repeat_started(1, PLAN, "")
    progress.load_started(10, "")
    clock.now = 2.0
    progress.request_done(record(tokens=500))
    assert lines[-1] == "qwenperf cpu/base / w: repeat 1 of 3, 1/10 requests, 250 out tok/s, 2 s elapsed, ~18 s left"


def test_a_quiet_log_gets_only_the_finished_repeats() -> None:
    progress, clock, lines = meter(every_s=None)
    for number in (1, 2):
        progress.repeat_started(number, PLAN, "")
        progress.load_started(2, "")
        clock.now += 4
        progress.request_done(record())
        progress.request_done(record())
        progress.repeat_done(None if number == 2 else 1234.0)  # None: a search's repeat
    assert lines == [
        "qwenperf cpu/base / w: repeat 1 of 3 done, 2 requests in 4 s, 1,234 out tok/s measured",
        "qwenperf cpu/base / w: repeat 2 of 3 done, 2 requests in 4 s",
    ]


def test_a_load_run_measured_again_gets_a_line_naming_why() -> None:
    progress, _, lines = meter(every_s=None)
    progress.repeat_started(2, PLAN, "")
    progress.load_started(40, "2 replicas")
    progress.load_retaken("cpu-contention, cpu-steal")
    assert lines == [
        "qwenperf cpu/base / w: repeat 2 of 3, 2 replicas: spoiled by the machine's other load (cpu-contention, cpu-steal), measured again"
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59.4, "59 s"), (59.6, "1 m 00 s"), (125, "2 m 05 s"), (3600, "1 h 00 m"), (3725, "1 h 02 m"), (-3, "0 s")],
)
def test_durations_read_as_long_as_they_need(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_repeat_says_how_many_the_plan_may_add() -> None:
    assert repeat_of(2, SequentialPlan(0.95, 3, 3)) == "repeat 2 of 3"
    assert repeat_of(4, SequentialPlan(0.95, 3, 6)) == "repeat 4 of 3 (up to 6)"


def test_a_load_run_is_named_by_its_route_and_its_probe() -> None:
    assert load_label(None, None) == ""
    assert load_label(1, None) == "1 replica"
    assert load_label(4, ClosedLoop(concurrency=16)) == "4 replicas, probe at concurrency 16"
    assert load_label(None, OpenLoop(rate=2.5)) == "probe at 2.5 req/s"


# ------------------------------------------------------------------ threading the observer


class Recorder:
    """A PointProgress that records what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def repeat_started(self, number: int, plan: SequentialPlan, side: str) -> None:
        self.events.append(("started", number, plan.most, side))

    def load_started(self, requests: int, label: str) -> None:
        self.events.append(("load", requests, label))

    def request_done(self, record: RequestRecord) -> None:
        self.events.append(("request", record.completion_tokens))

    def load_retaken(self, reasons: str) -> None:
        self.events.append(("retaken", reasons))

    def repeat_done(self, measured: float | None) -> None:
        self.events.append(("done", measured))


def test_told_numbers_each_repeat_tells_its_measured_output_and_without_an_observer_is_the_repeat_itself() -> None:
    repeats = [repeat_at(1.0), {**repeat_at(0.5), 2: repeat_at(1.2)[1]}]  # the second on 1 and 2 replicas
    taken = iter(repeats)

    def repeat() -> Repeat:
        return next(taken)

    assert told(repeat, PLAN, None) is repeat
    recorder = Recorder()
    counted = told(repeat, PLAN, recorder, "reference")
    assert [counted(), counted()] == repeats  # each repeat handed back as taken
    # the run on the most replicas: the config's own route
    assert recorder.events == [("started", 1, 3, "reference"), ("done", 5_000.0), ("started", 2, 3, "reference"), ("done", 6_000.0)]


def test_a_searchs_repeat_has_no_measured_output_to_tell() -> None:
    (run,) = repeat_at(1.0).values()
    search = CapacitySearch(
        search="concurrency", slo={"p99_ttft_ms": 800.0}, load=8.0, interval=None, output_throughput=900.0,
        binding=None, cliff=False, bound="found", probes=(),
    )
    searched = msgspec.structs.replace(run, capacity=(search,))
    assert measured_output({1: searched}) is None and measured_output({1: run}) == 5_000.0


def test_watched_tells_the_observer_every_record_beside_a_probes_watch() -> None:
    recorder, seen = Recorder(), list[RequestRecord]()

    def stop() -> bool:
        return False

    assert watched(None, None) is None
    alone = watched(None, recorder)
    both = watched(Watching(progress=seen.append, stop=stop), recorder)
    assert alone is not None and both is not None and both.stop is stop
    assert alone.progress is not None and both.progress is not None
    alone.progress(record(1))
    both.progress(record(2))
    assert recorder.events == [("request", 1), ("request", 2)] and [r.completion_tokens for r in seen] == [2]


def test_measure_point_tells_the_observer_each_repeat_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's repeats, numbered, each handed the same observer for its load runs and the
    repeat taken before it (where a search starts)."""
    recorder, handed, taken = Recorder(), [], []

    def measure_repeat(server: object, config: object, workload: object, method: object, progress: object, after: object) -> object:
        handed.append((progress, after))
        taken.append(repeat_at(1.0))
        return taken[-1]

    monkeypatch.setattr(sequential, "measure_repeat", measure_repeat)
    cpu = suite("cpu")
    sequential.measure_point(cast(Server, None), cpu.config("base"), cpu.workloads[0], Method(plan=repeats(2)), lambda run: None, recorder)
    assert recorder.events == [("started", 1, 2, ""), ("done", 5_000.0), ("started", 2, 2, ""), ("done", 5_000.0)]
    assert handed == [(recorder, None), (recorder, taken[0])]


# ------------------------------------------------------------------ the terminal


class Reporter:
    """The parts of pytest's TerminalReporter the progress lines use, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []
        self.config = SimpleNamespace(get_terminal_writer=lambda: SimpleNamespace(fullwidth=20))

    def write_line(self, line: str) -> None:
        self.calls.append(("line", line, False))

    def ensure_newline(self) -> None:
        self.calls.append(("newline", "", False))

    def rewrite(self, line: str, erase: bool = False) -> None:
        self.calls.append(("rewrite", line, erase))

    def write(self, content: str, flush: bool = False) -> None:
        self.calls.append(("write", content, flush))


class Capture:
    def __init__(self, calls: list[tuple[str, str, bool]]) -> None:
        self.calls = calls

    @contextmanager
    def global_and_fixture_disabled(self) -> Iterator[None]:
        self.calls.append(("uncaptured", "", False))
        yield
        self.calls.append(("captured", "", False))


def terminal(live: bool) -> tuple[Terminal, list[tuple[str, str, bool]]]:
    reporter = Reporter()
    return Terminal(cast(pytest.TerminalReporter, reporter), Capture(reporter.calls), live), reporter.calls


def test_a_terminal_redraws_one_line_in_place_and_ends_it_once() -> None:
    shown, calls = terminal(live=True)
    shown.show("qwenperf a long status line")
    shown.show("qwenperf next")
    shown.end()
    shown.end()  # nothing drawn since: nothing to end
    assert calls == [
        ("uncaptured", "", False),
        ("newline", "", False),  # pytest's partial line is ended once, not overwritten
        ("rewrite", "qwenperf a long sta", True),  # cut to the terminal's width
        ("captured", "", False),
        ("uncaptured", "", False),
        ("rewrite", "qwenperf next", True),
        ("captured", "", False),
        ("uncaptured", "", False),
        ("write", "\n", True),  # the last state stays, and pytest's next output starts a line
        ("captured", "", False),
    ]


def test_a_log_gets_plain_lines_past_the_capture() -> None:
    shown, calls = terminal(live=False)
    shown.show("qwenperf a long status line")
    shown.end()
    assert calls == [("uncaptured", "", False), ("line", "qwenperf a long status line", False), ("captured", "", False)]


@pytest.mark.parametrize(
    ("text", "setting"),
    [("off", ProgressSetting(on=False)), ("ON", ProgressSetting()), ("10", ProgressSetting(every_s=10.0)), ("0", ProgressSetting(every_s=0.0))],
)
def test_the_option_is_off_on_or_seconds(text: str, setting: ProgressSetting) -> None:
    assert progress_setting(text) == setting


@pytest.mark.parametrize("text", ["-1", "soon", "nan", "inf", ""])
def test_a_bad_option_names_what_it_expected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected off, on or the seconds between two progress lines"):
        progress_setting(text)


# ------------------------------------------------------------------ a session's log


POINT = "def test_point(qwenperf_run):\n    assert qwenperf_run.metrics\n"
STATUS = "qwenperf standin/base / w: repeat * of 2, *"
DONE = "qwenperf standin/base / w: repeat {n} of 2 done, 8 requests in * s, * out tok/s measured"


@pytest.fixture(scope="module")
def source_url() -> Iterator[str]:
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 5, "itl_ms": 2}) as source:
        yield source.urls[0]


def session(pytester: pytest.Pytester, url: str, *args: str, ini: str = "") -> list[str]:
    """The stdout lines of a session measuring one point of 2 repeats of 8 requests on the stand-in
    (a progress line that went into the test's captured output would not be among them)."""
    write_suite(pytester.path)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_point=POINT)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--qwenperf-suite=suite.toml", f"--qwenperf-endpoint={url}", "--qwenperf-no-history", *args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    return result.stdout.lines


def test_a_log_shows_each_request_with_a_zero_interval_and_each_finished_repeat(pytester: pytest.Pytester, source_url: str) -> None:
    lines = session(pytester, source_url, "--qwenperf-progress=0")
    ours = [line for line in lines if line.startswith("qwenperf standin/base")]
    assert len(ours) == 2 * (1 + 8 + 1), "\n".join(lines)  # per repeat: its load run's start, each request, its end
    pytest.LineMatcher(ours).fnmatch_lines(
        [
            "qwenperf standin/base / w: repeat 1 of 2, 0/8 requests, * elapsed",
            "qwenperf standin/base / w: repeat 1 of 2, 8/8 requests, * out tok/s, * elapsed, ~0 s left",
            DONE.format(n=1),
            "qwenperf standin/base / w: repeat 2 of 2, 0/8 requests, * elapsed",
            DONE.format(n=2),
        ]
    )


def test_a_quiet_log_shows_the_finished_repeats_alone(pytester: pytest.Pytester, source_url: str) -> None:
    lines = session(pytester, source_url, "-q", "--qwenperf-progress=0")
    pytest.LineMatcher(lines).fnmatch_lines([DONE.format(n=1), DONE.format(n=2)])
    pytest.LineMatcher(lines).no_fnmatch_line(STATUS)


@pytest.mark.parametrize(("args", "ini"), [(("--qwenperf-progress=off",), ""), ((), "qwenperf_progress = off"), (("-qq",), "")])
def test_progress_switched_off_or_very_quiet_shows_nothing(
    pytester: pytest.Pytester, source_url: str, args: tuple[str, ...], ini: str
) -> None:
    lines = session(pytester, source_url, *args, ini=ini)
    assert not [line for line in lines if "qwenperf standin/base" in line], "\n".join(lines)

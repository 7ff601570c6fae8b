"""A time-bounded load's window: the spec, the client keeping it against a stream source with known
timing (tests/stream_source.py), the figures summarized over it, and the suite key."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_qwenperf.core.run import WINDOW_SHORT
from pytest_qwenperf.core.summary import cross_check, summarize
from pytest_qwenperf.core.window import KeptWindow, Window, common
from pytest_qwenperf.loadgen.arrivals import ClosedLoop, OpenLoop, Replay
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.client import run_load_sync
from pytest_qwenperf.loadgen.workers import pin_current_process, run_load_in_workers
from pytest_qwenperf.measure.observe import ClientSetup, Load, Target, observe
from tests.stream_source import MODEL, StreamSource, stream_source
from tests.suite_files import HEADER, refused, suite_at
from tests.test_client import CLIENT_CPUS, SOURCE_CPUS, spec
from tests.test_metrics import rec


@pytest.fixture(scope="module")
def source() -> Iterator[StreamSource]:
    with stream_source(cpus=SOURCE_CPUS) as src:
        yield src


# --- the spec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("90s", Window(seconds=90)),
        ("0.5 s", Window(seconds=0.5)),
        ("4 lifetimes", Window(lifetimes=4)),
        ("1 lifetime", Window(lifetimes=1)),
    ],
)
def test_a_window_parses_seconds_or_lifetimes(text: str, window: Window) -> None:
    assert Window.parse(text) == window
    assert Window.parse(str(window)) == window


@pytest.mark.parametrize("text", ["", "0s", "90", "4 minutes", "-3s", "lifetimes", "2 lifetimes 3s"])
def test_a_bad_window_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r'seconds or of request lifetimes, e.g. "90s" or "4 lifetimes", got'):
        Window.parse(text)


def test_a_window_in_lifetimes_needs_a_lifetime() -> None:
    assert Window(lifetimes=3).length_s(0.5) == 1.5
    assert Window(seconds=7).length_s(None) == 7
    with pytest.raises(ValueError, match="needs a request lifetime"):
        Window(lifetimes=3).length_s(None)
    with pytest.raises(ValueError, match="a window needs"):
        Window(seconds=1, lifetimes=1)


def test_workers_windows_overlap_and_any_running_out_counts() -> None:
    a, b = KeptWindow(1.0, 3.0, 2.0), KeptWindow(1.2, 3.2, 2.0, ran_out=True)
    both = common([a, b])
    assert both is not None and both.span == (1.2, 3.0) and both.ran_out
    assert common([None, None]) is None
    assert common([a, None]) is None  # a worker whose window never opened: no window, which the run reports
    assert common([KeptWindow(1.0, 2.0, 1.0), KeptWindow(2.5, 3.5, 1.0)]) is None  # no overlap: no window either


# --- the client keeps it ------------------------------------------------------------------


def test_a_closed_loop_measures_its_window_waits_for_what_was_sent_inside_and_cuts_the_rest(source: StreamSource) -> None:
    """4 lanes of requests of 60 ms and 1.2 s alternately, a 0.6 s window, a supply of 400.

    The window opens once the batch has turned over (as many requests ended as it has lanes) and
    lasts what was asked. The load keeps
    the batch full until every request sent inside the window has ended (the long ones sent near
    its end are measured whole, their ends lying past it), then sends no more and cuts what is
    still in flight, all of it sent after the window: the run ends without their lifetimes.
    """
    specs = [spec(i, max_tokens=2, ttft_ms=30 if i % 2 else 600, itl_ms=30 if i % 2 else 600) for i in range(400)]
    load = run_load_sync(source.urls, MODEL, specs, ClosedLoop(4), LoadOptions(warmup=4, window=Window(seconds=0.6)))
    kept = load.window
    assert kept is not None and kept.length_s == pytest.approx(0.6) and kept.short() is None and kept.lifetime_s is None
    measured = [r for r in load.records if not r.warmup]
    fourth_end = sorted(r.ended_at for r in measured)[3]
    assert fourth_end <= kept.opened < fourth_end + 0.05  # the batch of 4 turned over: 4 requests ended
    inside = [r for r in measured if kept.opened <= r.sent_at < kept.closed]
    assert inside and all(r.ok for r in inside)
    last_end = max(r.ended_at for r in inside)
    assert last_end > kept.closed  # a request sent inside ended after it, and was waited for
    assert all(r.sent_at <= last_end for r in measured)  # then nothing more was sent
    cut = [r for r in measured if r.cut]
    assert cut and all(r.sent_at >= kept.closed and not r.ok and r.error for r in cut)
    assert all(r.ok for r in load.records if not r.cut)
    assert all(r.completion_tokens < 2 for r in cut)  # not waited for: they ended short of their 2 tokens
    assert len(measured) < 100
    summary = summarize(load.records, window=kept.span)
    assert summary["completed"].value == len(inside) and summary["failed"].value == 0
    assert summary["mean_e2el_ms"].value == pytest.approx(1000 * sum(r.chunk_times[-1] - r.sent_at for r in inside) / len(inside))


def test_a_window_the_requests_run_out_of_closes_at_the_last_send_and_says_so(source: StreamSource) -> None:
    specs = [spec(i, max_tokens=2, ttft_ms=20, itl_ms=20) for i in range(24)]
    load = run_load_sync(source.urls, MODEL, specs, ClosedLoop(4), LoadOptions(warmup=4, window=Window(seconds=30)))
    kept = load.window
    assert kept is not None and kept.ran_out
    assert kept.closed == max(r.sent_at for r in load.records) > kept.opened
    assert "requests ran out" in (kept.short() or "") and "num_prompts" in (kept.short() or "")


def test_a_window_in_lifetimes_is_timed_by_the_warm_up(source: StreamSource) -> None:
    """Every request lasts at least 100 ms at the source (a 60 ms first token and a 40 ms gap), so
    the warm-up's median lifetime is at least that, and the window is 3 of them."""
    specs = [spec(i, max_tokens=2, ttft_ms=60, itl_ms=40) for i in range(200)]
    load = run_load_sync(source.urls, MODEL, specs, ClosedLoop(4), LoadOptions(warmup=8, window=Window(lifetimes=3)))
    kept = load.window
    assert kept is not None and kept.lifetime_s is not None and kept.lifetime_s >= 0.1
    assert kept.length_s == pytest.approx(3 * kept.lifetime_s) and kept.asked_s == kept.length_s
    warm = sorted(r.ended_at - r.sent_at for r in load.records if r.warmup)
    assert kept.lifetime_s == warm[len(warm) // 2]


def test_an_open_loops_window_opens_a_lifetime_after_it_starts(source: StreamSource) -> None:
    specs = [spec(i, max_tokens=2, ttft_ms=60, itl_ms=40) for i in range(300)]
    arrival = OpenLoop(rate=40, distribution="constant")
    load = run_load_sync(source.urls, MODEL, specs, arrival, LoadOptions(warmup=4, window=Window(seconds=0.5)))
    kept = load.window
    assert kept is not None and kept.lifetime_s is None and not kept.ran_out
    warm = sorted(r.ended_at - r.sent_at for r in load.records if r.warmup)
    assert kept.opened == pytest.approx(load.started_at + warm[len(warm) // 2])
    assert len([r for r in load.records if not r.warmup]) < 100


def test_the_token_cross_check_allows_a_cut_request_what_the_server_may_have_counted_more() -> None:
    whole = rec(0, 0.0, [(1.0, 4)], prompt=10, expected=4)
    read_some = dataclasses.replace(rec(1, 0.5, [(1.5, 1)], prompt=10, expected=4), cut=True, error="cut")
    unread = dataclasses.replace(
        rec(2, 0.9, [], prompt=0, completion=0, expected=4), cut=True, error="cut", expected_prompt_tokens=10
    )
    records = [whole, read_some, unread]
    assert cross_check(records, 20, 5).matches  # what the client read
    assert cross_check(records, 30, 12).matches  # and all that the cut ones could have added: 10 prompt, 3 + 4 output
    assert not cross_check(records, 31, 5).matches and not cross_check(records, 20, 13).matches
    assert not cross_check(records, 19, 5).matches  # never fewer than the client read
    check = cross_check(records, 30, 12)
    assert check.cut == 2 and "2 request(s) cut at the window's end" in check.describe()
    assert cross_check([whole], 10, 4).describe().startswith("token counts agree: client")


def test_windows_that_cannot_be_kept_are_refused() -> None:
    urls = ["http://127.0.0.1:9"]
    specs = [spec(i) for i in range(8)]
    with pytest.raises(ValueError, match="not both"):
        LoadOptions(duration_s=1, window=Window(seconds=1))
    with pytest.raises(ValueError, match="needs a warm-up that runs before the measured phase"):
        run_load_sync(urls, MODEL, specs, ClosedLoop(2), LoadOptions(window=Window(lifetimes=2)))
    with pytest.raises(ValueError, match="an open loop's window needs a warm-up or a ramp"):
        run_load_sync(urls, MODEL, specs, OpenLoop(rate=10), LoadOptions(window=Window(seconds=2)))
    timed = [spec(i) for i in range(8)]
    with pytest.raises(ValueError, match="a replay is measured over its trace's span"):
        run_load_sync(urls, MODEL, timed, Replay(), LoadOptions(window=Window(seconds=2)))


def test_workers_keep_one_window(source: StreamSource) -> None:
    specs = [spec(i, max_tokens=2, ttft_ms=20, itl_ms=20) for i in range(400)]
    previous = pin_current_process(CLIENT_CPUS or os.sched_getaffinity(0))
    try:
        load = run_load_in_workers(2, source.urls, MODEL, specs, ClosedLoop(4), LoadOptions(warmup=4, window=Window(seconds=0.4)))
    finally:
        pin_current_process(previous)
    kept = load.window
    assert kept is not None and not kept.ran_out and 0 < kept.length_s <= 0.4
    inside = [r for r in load.records if not r.warmup and kept.opened <= r.sent_at < kept.closed]
    assert inside and all(r.ok for r in inside)


# --- the figures over it ------------------------------------------------------------------


def test_a_windows_latency_counts_what_was_sent_inside_it_not_what_ended_there() -> None:
    """Two requests sent inside [0, 10): a short one ending at 2 and a long one ending at 14. Both
    count in the latency; the long one's tokens count only where they came inside the window."""
    short = rec(0, 1.0, [(1.5, 1), (2.0, 1)], prompt=5)
    long = rec(1, 8.0, [(9.0, 1), (12.0, 1), (14.0, 1)], prompt=7)
    after = rec(2, 10.0, [(10.5, 1)], prompt=3)
    values = summarize([short, long, after], window=(0.0, 10.0)).values()
    assert values["completed"] == 2
    assert values["mean_e2el_ms"] == pytest.approx((1000 + 6000) / 2)
    assert values["total_output_tokens"] == 3  # 2 of the short one, 1 of the long one
    assert values["total_input_tokens"] == 12
    assert values["output_throughput"] == 0.3
    with pytest.raises(ValueError, match="not both"):
        summarize([short], window=(0.0, 1.0), duration_s=1.0)


# --- the suite key ------------------------------------------------------------------------

WORKLOAD = """
[[workload]]
name = "w"
kind = "random"
input_len = 8
output_len = 8
num_prompts = 100
"""


def test_a_suite_workload_states_its_window(tmp_path: Path) -> None:
    suite = suite_at(tmp_path, HEADER + WORKLOAD + 'warmup = 8\nload = { concurrency = 4 }\nwindow = "3 lifetimes"\n')
    assert suite.workloads[0].window == Window(lifetimes=3)
    assert suite_at(tmp_path, HEADER + WORKLOAD + 'load = { concurrency = 4 }\nwindow = "20s"\n').workloads[0].window == Window(
        seconds=20
    )


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ('load = { concurrency = 4 }\nwindow = "20 minutes"', r"workload 'w'\.window: expected a positive number of seconds"),
        (
            'load = { concurrency = 4 }\nwindow = "2 lifetimes"',
            r"workload 'w'\.window: expected a window of 2 lifetimes needs a warm-up",
        ),
        (
            'load = { rate = 5.0 }\nwindow = "20s"',
            r"workload 'w'\.window: expected an open loop's window needs a warm-up or a ramp",
        ),
        (
            'load = { concurrency = 4 }\nslo = "ttft:100"\nwindow = "20s"\nsearch = { by = "concurrency", lowest = 2, highest = 8 }',
            r"workload 'w'\.window: expected no window with a search",
        ),
    ],
)
def test_a_window_the_suite_cannot_keep_is_refused_naming_the_field(tmp_path: Path, keys: str, message: str) -> None:
    refused(tmp_path, HEADER + WORKLOAD + keys + "\n", message)


def test_a_window_is_part_of_what_a_run_is_measured_on(tmp_path: Path) -> None:
    plain = suite_at(tmp_path, HEADER + WORKLOAD + "load = { concurrency = 4 }\n").workloads[0]
    timed = suite_at(tmp_path, HEADER + WORKLOAD + 'load = { concurrency = 4 }\nwindow = "20s"\n').workloads[0]
    longer = suite_at(tmp_path, HEADER + WORKLOAD + 'load = { concurrency = 4 }\nwindow = "30s"\n').workloads[0]
    assert plain.fingerprint() == plain.workload.fingerprint() == timed.workload.fingerprint()
    assert len({plain.fingerprint(), timed.fingerprint(), longer.fingerprint()}) == 3


def test_a_tier_other_than_nightly_or_weekly_is_refused_naming_the_field(tmp_path: Path) -> None:
    refused(
        tmp_path,
        HEADER + WORKLOAD + 'load = { concurrency = 4 }\ntier = "monthly"\n',
        r"workload 'w'\.tier: expected \"nightly\" or \"weekly\", got 'monthly'",
    )
    refused(
        tmp_path,
        HEADER.replace('id = "base"', 'id = "base"\ntier = "hourly"') + WORKLOAD + "load = { concurrency = 4 }\n",
        r"tier: expected \"nightly\" or \"weekly\", got 'hourly'",
    )
    assert suite_at(tmp_path, HEADER + WORKLOAD + 'load = { concurrency = 4 }\ntier = "weekly"\n').workloads[0].tier == "weekly"


def test_an_earliest_look_after_the_planned_repeats_is_refused(tmp_path: Path) -> None:
    header = HEADER.replace('model = "embedded:tiny"', 'model = "embedded:tiny"\nrepeats = 3\nmin_repeats = 4')
    refused(
        tmp_path,
        header + WORKLOAD + "load = { concurrency = 4 }\n",
        r"suite.min_repeats: expected a whole number of repeats from 2 to suite.repeats \(3\), got 4",
    )


def test_a_window_that_never_opens_is_a_loss_not_a_silent_whole_run(source: StreamSource) -> None:
    """6 measured requests for a batch of 4 that must turn over before its window opens: the requests
    run out as the window opens (or before: then none is kept), and the run says so (window-short)
    instead of reporting the whole run's figures."""
    specs = [spec(i, max_tokens=2, ttft_ms=20, itl_ms=20) for i in range(10)]
    load = Load(specs, ClosedLoop(4), LoadOptions(warmup=4, window=Window(seconds=5)))
    seen = observe(Target(tuple(source.urls), MODEL), load, ClientSetup(sample=False))
    assert seen.load.window is None or seen.load.window.ran_out
    (loss,) = seen.record_losses()
    assert loss.reason == WINDOW_SHORT and "raise its num_prompts" in loss.detail

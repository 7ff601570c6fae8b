"""Load from several client processes, for loads one Python event loop cannot keep up with.

Request ``i`` goes to worker ``i % n``, or, with conversations, conversation ``i``: its turns
stay together in one worker, which alone knows when the previous turn ended. Each worker gets its
share of the closed loop's concurrency, or the open loop's schedule (and ramp) for its own
requests (the schedule is drawn once for the whole workload, so it does not depend on the number
of workers). Workers meet at a barrier before the warm-up and again before the measured phase
(after a ramp, which runs on into the measured phase, only before it), so they start together.
Every worker routes by the same ``options.routing`` over all endpoints, keeping each
request's position in the whole workload, so round-robin sends request ``i`` to
``endpoints[i % n]`` as one process would; least-outstanding balances each worker's own
requests in flight, as it cannot see the other workers'.
Records come back as each request finishes (a CLI can draw progress) and are merged by
``sent_at``: ``perf_counter`` is CLOCK_MONOTONIC, comparable across processes.

Stopping is the parent's job alone. Workers ignore SIGINT (a terminal's Ctrl-C reaches
the whole process group; they would otherwise die mid-import with a traceback each), and
the parent SIGTERMs every worker at once when its wait ends for any reason (Ctrl-C,
SIGTERM turned into an interrupt, a failed worker), so none sends another request. A
parent that dies without running that (SIGKILL) is noticed by each worker's
:func:`exit_with_parent` watch.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import replace
from multiprocessing.synchronize import Barrier
from types import FrameType
from typing import Any

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.window import KeptWindow, common
from pytest_qwenperf.loadgen.arrivals import Arrival, ClosedLoop, OpenLoop
from pytest_qwenperf.loadgen.assignment import Assignment, LoadOptions
from pytest_qwenperf.loadgen.client import LoadResult, new_event_loop, run_jobs
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.requester import Progress

BARRIER_TIMEOUT_S = 120.0  # a worker that never arrives (crashed while starting) breaks the barrier
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL


PARENT_POLL_S = 0.1


def exit_with_parent(parent: int, poll_s: float = PARENT_POLL_S) -> None:
    """End this process as soon as ``parent`` (the pid of the process that started it) is
    gone, however it ended; at once if it is gone already.

    For helpers that have no children of their own (the load generator's workers): a
    daemon thread notices the re-parenting within ``poll_s`` and exits at once, so a
    SIGKILLed parent leaves no worker sending load. The pid is passed in because a parent
    that died while this process was still starting has already handed it to init.
    Polling rather than ``PR_SET_PDEATHSIG``: that signal follows the *thread* that
    started the child, which may end long before the process does.
    """
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(128 + signal.SIGKILL)

    threading.Thread(target=watch, name="qwenperf-parent-watch", daemon=True).start()


def pin_current_process(cpus: Iterable[int]) -> set[int]:
    """Restrict this process (and the processes it starts later) to ``cpus``; returns the previous set.

    Pinning the client away from the server's cores keeps the instrument from competing
    with what it measures.
    """
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    return previous


def _share(total: int, n: int, k: int) -> int:
    """Worker ``k``'s part of ``total`` split as evenly as possible over ``n``."""
    return total // n + (k < total % n)


def _worker(k: int, parent: int, barrier: Barrier, results: multiprocessing.Queue[Any], assignment: Assignment) -> None:
    """Worker ``k``, one process: its own event loop and connections; sends each record as it finishes.

    ``parent`` is the pid of the process that started it: a parent SIGKILLed while this one
    was still importing is gone before the watch begins, and the watch would guard init.
    It runs on the cores it inherited from the parent (pinned by whoever pins the client).
    """
    exit_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the parent while it started us
    try:

        async def sync() -> None:
            await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)

        async def measured_phase() -> tuple[float, float, KeptWindow | None]:  # the records went out one by one through ``results``
            _, started_at, ended_at, window = await run_jobs(assignment, progress=results.put, sync=sync)
            return started_at, ended_at, window

        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            started_at, ended_at, window = runner.run(measured_phase())
        results.put(("done", k, started_at, ended_at, tuple(sorted(os.sched_getaffinity(0))), window))
    except BaseException:
        barrier.abort()
        results.put(("error", k, traceback.format_exc()))


def check_split(arrival: Arrival, n_workers: int) -> None:
    """Refuse a split of ``arrival`` over ``n_workers`` that cannot be made (ValueError)."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    if isinstance(arrival, ClosedLoop) and arrival.concurrency < n_workers:
        raise ValueError(f"concurrency {arrival.concurrency} cannot be split over {n_workers} workers")


def share_of(whole: Assignment, n: int, k: int) -> Assignment:
    """Worker ``k``'s part of ``whole``: every ``n``-th unit (a request, or a whole conversation) from
    the ``k``-th, with the open loop's send times and ramp kept and the concurrency split."""
    arrival = whole.arrival
    if isinstance(arrival, ClosedLoop):
        arrival = replace(arrival, concurrency=_share(arrival.concurrency, n, k))
    elif isinstance(arrival, OpenLoop) and arrival.max_concurrency is not None:
        arrival = replace(arrival, max_concurrency=max(1, _share(arrival.max_concurrency, n, k)))
    offsets = whole.offsets[k::n] if whole.offsets is not None else None
    ramp = whole.ramp[k::n] if whole.ramp is not None else None
    return replace(whole, warmup=whole.warmup[k::n], units=whole.units[k::n], arrival=arrival, offsets=offsets, ramp=ramp)


def _start(procs: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """Start the workers; a Ctrl-C meanwhile interrupts only the parent, and only once they are all started.

    SIGINT is blocked while a worker is started, so it begins life with SIGINT blocked (the
    mask survives exec) until it ignores it. The parent's own SIGINT handler (and SIGTERM,
    which the CLI routes through it) waits until the last ``start`` returned: an interrupt
    between starting a process and sending it its arguments would leave it reading a closed
    pipe, and a worker that no ``Process`` records, which nobody would stop.
    """
    deferred: list[FrameType | None] = []
    current = signal.getsignal(signal.SIGINT)
    handler = current if callable(current) and threading.current_thread() is threading.main_thread() else None
    if handler is not None:
        signal.signal(signal.SIGINT, lambda signum, frame: deferred.append(frame))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for proc in procs:
            proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    if handler is not None and deferred:
        handler(signal.SIGINT, deferred[0])


def _stop(procs: Sequence[multiprocessing.process.BaseProcess], *, now: bool) -> None:
    """Wait for the workers to exit; ``now`` (interrupted or failing): SIGTERM all of them first, at once,
    rather than one after another's exit. Whatever is left after :data:`STOP_GRACE_S` is killed."""
    started = [proc for proc in procs if proc.pid is not None]
    if now:
        for proc in started:
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in started:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in started:
        if proc.is_alive():
            proc.kill()
            proc.join()


def run_load_in_workers(
    n_workers: int,
    endpoints: Sequence[str],
    model: str,
    requests: Iterable[RequestSpec],
    arrival: Arrival,
    options: LoadOptions = LoadOptions(),
    *,
    progress: Progress | None = None,
) -> LoadResult:
    """:func:`~pytest_qwenperf.loadgen.client.run_load` split over ``n_workers`` processes.

    The workers run on this process's cores (pin it first to pin them). The result's
    ``started_at`` and ``ended_at`` span all workers' measured phases; ``client_cpus`` has
    each worker's affinity.
    """
    check_split(arrival, n_workers)
    whole = Assignment.of(endpoints, model, requests, arrival, options)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n_workers)
    results: multiprocessing.Queue[Any] = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(k, os.getpid(), barrier, results, share_of(whole, n_workers, k)),
            name=f"qwenperf-loadgen-{k}",
            daemon=True,
        )
        for k in range(n_workers)
    ]
    records: list[RequestRecord] = []
    done: dict[int, tuple[float, float, tuple[int, ...], KeptWindow | None]] = {}
    try:
        _start(procs)
        while len(done) < n_workers:
            try:
                message = results.get(timeout=1.0)
            except queue.Empty:
                crashed = [proc for proc in procs if proc.exitcode not in (None, 0)]
                if crashed:
                    raise RuntimeError(f"load generator worker {crashed[0].name} died with exit code {crashed[0].exitcode}") from None
                continue
            if isinstance(message, RequestRecord):
                records.append(message)
                if progress is not None:
                    progress(message)
            elif message[0] == "done":
                done[message[1]] = message[2:]
            else:
                raise RuntimeError(f"load generator worker {message[1]} failed:\n{message[2]}")
    finally:
        _stop(procs, now=len(done) < n_workers)
    records.sort(key=lambda record: record.sent_at)
    spans = [done[k] for k in range(n_workers)]
    return LoadResult(
        records=tuple(records),
        started_at=min(span[0] for span in spans),
        ended_at=max(span[1] for span in spans),
        arrival=arrival,
        options=options,
        client_cpus=tuple(span[2] for span in spans),
        requested_rate=whole.requested_rate,
        window=common([span[3] for span in spans]),
    )

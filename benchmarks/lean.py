"""Client CPU per streamed chunk: ``qwenperf bench`` against ``vllm bench serve``.

**Paced, whole commands (the figure to quote).** A local source (``tests/stream_source.py``,
pinned to the first CPU) streams like a server under load: one token per chunk, a chunk every
20 ms on each of 128 streams, vLLM's chunk layout, no prompt work at all (so prefix caching
cannot matter). Each tool runs as the whole command a user types, pinned to the last CPU,
with the same requests (random prompts of 64 tokens, :data:`PACED` outputs, ``ignore_eos``,
no per-chunk usage) and its CPU time taken from ``wait4`` (user + system, the process and
anything it waited for). Start-up is taken out by difference: each tool also runs the same
number of requests with one output token, and the cost per chunk is the extra CPU of the
long run over its extra chunks. Rounds interleave the tools (ours, theirs, theirs, ours, ...).

**Unpaced, in process (``--unpaced``): a lower bound only.** The source sends every chunk as fast
as it can on 4 streams and each client reads hundreds of chunks per ``recv``; the figure is the
client's CPU over the chunks it parsed, start-up not counted. Whole commands are not compared
this way: at that speed ``vllm bench serve`` fails its streams (its SSE reader strips whitespace
at read boundaries and merges or breaks events: ``completed 0, failed 4`` in a probe here), so
it would spend less CPU by reading less.

**The floor (``--floor``).** The paced load read by the least a Python client can do: ``epoll``
and one ``recvmsg_into`` per ready socket, nothing parsed, timed or kept (in process, start-up not
counted). What the kernel and a bare loop cost per chunk bounds what any client here can reach.

**Per request (``--per-request``).** The same paced source and whole commands, each tool run three
ways: :data:`PER_REQUEST` requests of one output token, :data:`FEW` requests of one token, and
:data:`PER_REQUEST` of :data:`REQUEST_TOKENS` tokens. The CPU per request is the extra CPU of the
many one-token requests over the few; start-up is the few's CPU less their requests'; and a
request of :data:`REQUEST_TOKENS` tokens costs the long run's CPU less start-up, per request.
That last figure, ours over theirs, is the per-request ratio to quote (target :data:`TARGET`).

    python -m benchmarks.lean --rounds 3 --out lean.json
    python -m benchmarks.lean --per-request --rounds 5 --out per-request.json
    python -m benchmarks.lean --unpaced --rounds 3
    python -m benchmarks.lean --floor --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.commands import Requests, qwenperf_bench, turns, vllm_bench_serve

CHUNKS = 400_000  # per unpaced measurement, over STREAMS streams
STREAMS = 4
TARGET = 0.5  # our CPU per chunk may be at most this share of theirs
PACED_TARGET_US = 8.0  # and at most this many microseconds, paced, on the 2-vCPU runner
CLIENTS = ("qwenperf", "vllm")


@dataclass(frozen=True)
class Paced:
    """The paced comparison's load: ``streams`` streams, a chunk every ``itl_ms`` on each."""

    streams: int = 128
    itl_ms: float = 20.0
    requests: int = 512
    input_len: int = 64
    output_len: int = 256


PACED = Paced()
PER_REQUEST = 512  # requests of the per-request runs
FEW = 64  # requests of the run that leaves mostly start-up
REQUEST_TOKENS = 128  # output tokens of the request whose whole cost is compared


def chunks_per_cpu_second(url: str, model: str, client: str, chunks: int = CHUNKS, streams: int = STREAMS) -> float:
    """Chunks this process parses per CPU-second with ``client``, ``chunks`` in all from ``url``."""
    per_stream = chunks // streams
    if client == "qwenperf":
        from pytest_qwenperf.loadgen.arrivals import ClosedLoop
        from pytest_qwenperf.loadgen.assignment import LoadOptions
        from pytest_qwenperf.loadgen.client import new_event_loop, run_load
        from pytest_qwenperf.loadgen.request import RequestSpec

        specs = [RequestSpec(i, per_stream, prompt=(1, 2, 3)) for i in range(streams)]
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            start = time.process_time()
            # Without per-chunk usage, as vllm bench serve asks: the same bytes for both clients.
            load = runner.run(run_load([url], model, specs, ClosedLoop(streams), LoadOptions(continuous_usage=False)))
            cpu = time.process_time() - start
        if not all(r.ok for r in load.records):
            raise RuntimeError(f"our client failed a stream: {[r.error for r in load.records if not r.ok]}")
        return sum(len(r.chunk_tokens) for r in load.records) / cpu

    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    async def theirs() -> tuple[int, float]:
        request = RequestFuncInput(
            prompt=[1, 2, 3], api_url=url + "/v1/completions", prompt_len=3, output_len=per_stream, model=model, ignore_eos=True
        )
        async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=600)) as session:
            start = time.process_time()
            outputs = await asyncio.gather(*(async_request_openai_completions(request, session) for _ in range(streams)))
            cpu = time.process_time() - start
        return sum(len(o.itl) + (o.ttft > 0) for o in outputs), cpu

    parsed, cpu = asyncio.run(theirs())
    return parsed / cpu


def _measure_in_fresh_process(url: str, model: str, client: str, cpu: int) -> float:
    code = f"from benchmarks.lean import chunks_per_cpu_second as f; print(f({url!r}, {model!r}, {client!r}))"
    done = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{client} client failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def paced_command(client: str, url: str, tokenizer: str, output_len: int, out: Path, count: int = PACED.requests) -> list[str]:
    """The whole command of ``client`` for ``count`` of :data:`PACED`'s requests with ``output_len`` tokens each."""
    from tests.stream_source import MODEL

    p = PACED
    requests = Requests(url, p.input_len, output_len, count, p.streams)
    if client == "qwenperf":
        return qwenperf_bench(requests, out, "--model", MODEL, "--tokenizer", tokenizer)
    return vllm_bench_serve(requests, out, MODEL, tokenizer)


def cpu_seconds(argv: list[str], cpu: int) -> float:
    """User + system CPU seconds of ``argv`` run to its end, pinned to ``cpu`` (``wait4``'s rusage)."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(["taskset", "-c", str(cpu), *argv], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "CI": "1"})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            raise SystemExit(f"{' '.join(argv[:5])} ... failed ({proc.returncode}):\n{log.read()[-4000:].decode(errors='replace')}")
    return usage.ru_utime + usage.ru_stime


def _check_complete(client: str, out: Path, output_len: int, count: int = PACED.requests) -> None:
    """Every request answered in full: the chunks counted are the chunks read."""
    result = json.loads(out.read_text())
    figures = result["metrics"] if client == "qwenperf" else result
    expected = count * output_len
    if figures["completed"] != count or figures["total_output_tokens"] != expected:
        raise SystemExit(f"{client}: {figures['completed']} of {count} requests, {figures['total_output_tokens']} of {expected} tokens ({out})")


def paced_round(url: str, tokenizer: str, cpu: int, order: Sequence[str], tmp: Path) -> dict[str, dict[str, float]]:
    """One round: each client's CPU for the long and the one-token run, and its CPU per chunk."""
    figures: dict[str, dict[str, float]] = {}
    for client in order:
        cpu_s = {}
        for output_len in (PACED.output_len, 1):
            out = tmp / f"{client}-{output_len}.json"
            out.unlink(missing_ok=True)  # the last round's: qwenperf bench never overwrites a result
            cpu_s[output_len] = cpu_seconds(paced_command(client, url, tokenizer, output_len, out), cpu)
            _check_complete(client, out, output_len)
        extra_chunks = PACED.requests * (PACED.output_len - 1)
        figures[client] = {"long_cpu_s": cpu_s[PACED.output_len], "short_cpu_s": cpu_s[1], "us_per_chunk": (cpu_s[PACED.output_len] - cpu_s[1]) / extra_chunks * 1e6}
    return figures


Round = Callable[[str, str, int, Sequence[str], Path], dict[str, dict[str, float]]]


def paced_rounds(rounds: int, one: Round, figure: str) -> tuple[list[dict[str, dict[str, float]]], list[int], tuple[float, float]]:
    """``rounds`` of ``one`` against the paced source (ABBA), each round's ``figure`` shown as it
    ends; with the CPUs used (source first, commands last) and the load average before and after."""
    from pytest_qwenperf.suite.embedded import resolve_model
    from tests.stream_source import stream_source

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the stream source, one for the clients")
    tokenizer = resolve_model("embedded:tiny")
    per_round: list[dict[str, dict[str, float]]] = []
    load_before = os.getloadavg()
    with stream_source(cpus={cpus[0]}, default_schedule={"itl_ms": PACED.itl_ms}) as source, tempfile.TemporaryDirectory() as tmp:
        for n in range(rounds):
            per_round.append(one(source.urls[0], tokenizer, cpus[-1], turns(CLIENTS, n), Path(tmp)))
            print(f"round {n + 1}: " + ", ".join(f"{c} {figure} {per_round[-1][c][figure]:.2f}" for c in CLIENTS), file=sys.stderr)
    return per_round, cpus, (load_before[0], os.getloadavg()[0])


def paced(rounds: int, out: Path | None) -> int:
    per_round, cpus, (load_before, load_after) = paced_rounds(rounds, paced_round, "us_per_chunk")
    median = {c: statistics.median(r[c]["us_per_chunk"] for r in per_round) for c in CLIENTS}
    startup = {c: statistics.median(r[c]["short_cpu_s"] for r in per_round) for c in CLIENTS}
    ratio = median["qwenperf"] / median["vllm"]
    p = PACED
    print(f"stream source on CPU {cpus[0]}, each command on CPU {cpus[-1]}; {p.streams} streams, a chunk every {p.itl_ms:g} ms on each;")
    print(f"{p.requests} requests of {p.output_len} tokens against {p.requests} of 1; load average {load_before:.2f} before, {load_after:.2f} after\n")
    print("| command | CPU us per chunk, per round | median | CPU s of the one-token run (start-up), median |")
    print("| --- | --- | --- | --- |")
    for c in CLIENTS:
        each = " / ".join(f"{r[c]['us_per_chunk']:.2f}" for r in per_round)
        print(f"| {c} | {each} | {median[c]:.2f} | {startup[c]:.2f} |")
    print(f"\nours / theirs = {ratio:.2f} (target <= {TARGET}); ours {median['qwenperf']:.2f} us per chunk (target <= {PACED_TARGET_US})")
    if out:
        out.write_text(json.dumps({"paced": p.__dict__, "rounds": per_round, "us_per_chunk": median, "ratio": ratio}, indent=2) + "\n")
    return 0 if ratio <= TARGET and median["qwenperf"] <= PACED_TARGET_US else 1


def per_request_round(url: str, tokenizer: str, cpu: int, order: Sequence[str], tmp: Path) -> dict[str, dict[str, float]]:
    """One round of ``--per-request``: each client's CPU for the three runs, and what they give."""
    figures: dict[str, dict[str, float]] = {}
    for client in order:
        cpu_s = {}
        for count, output_len in ((PER_REQUEST, REQUEST_TOKENS), (PER_REQUEST, 1), (FEW, 1)):
            out = tmp / f"{client}-{count}x{output_len}.json"
            out.unlink(missing_ok=True)
            cpu_s[count, output_len] = cpu_seconds(paced_command(client, url, tokenizer, output_len, out, count), cpu)
            _check_complete(client, out, output_len, count)
        request_s = (cpu_s[PER_REQUEST, 1] - cpu_s[FEW, 1]) / (PER_REQUEST - FEW)
        startup_s = cpu_s[FEW, 1] - FEW * request_s
        figures[client] = {
            **{f"cpu_s_{count}x{tokens}": value for (count, tokens), value in cpu_s.items()},
            "us_per_request": request_s * 1e6,
            "startup_s": startup_s,
            "us_per_chunk": (cpu_s[PER_REQUEST, REQUEST_TOKENS] - cpu_s[PER_REQUEST, 1]) / (PER_REQUEST * (REQUEST_TOKENS - 1)) * 1e6,
            "us_per_long_request": (cpu_s[PER_REQUEST, REQUEST_TOKENS] - startup_s) / PER_REQUEST * 1e6,
            "whole_long_run_s": cpu_s[PER_REQUEST, REQUEST_TOKENS],
        }
    return figures


def per_request(rounds: int, out: Path | None) -> int:
    per_round, cpus, (load_before, load_after) = paced_rounds(rounds, per_request_round, "us_per_long_request")
    keys = ("us_per_request", "us_per_chunk", "us_per_long_request", "startup_s", "whole_long_run_s")
    median = {c: {k: statistics.median(r[c][k] for r in per_round) for k in keys} for c in CLIENTS}
    ratio = median["qwenperf"]["us_per_long_request"] / median["vllm"]["us_per_long_request"]
    whole = median["qwenperf"]["whole_long_run_s"] / median["vllm"]["whole_long_run_s"]
    print(f"stream source on CPU {cpus[0]}, each command on CPU {cpus[-1]}; {PACED.streams} streams, a chunk every {PACED.itl_ms:g} ms on each;")
    print(f"runs of {PER_REQUEST} x {REQUEST_TOKENS}, {PER_REQUEST} x 1 and {FEW} x 1 tokens; load average {load_before:.2f} before, {load_after:.2f} after\n")
    print(f"| command | CPU us per request, per round | per chunk | a {REQUEST_TOKENS}-token request, per round | medians: request / chunk / {REQUEST_TOKENS}-token request | start-up CPU s | whole {PER_REQUEST} x {REQUEST_TOKENS} run, CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for c in CLIENTS:
        m = median[c]
        each = " / ".join(f"{r[c]['us_per_request']:.0f}" for r in per_round)
        chunks = " / ".join(f"{r[c]['us_per_chunk']:.2f}" for r in per_round)
        longs = " / ".join(f"{r[c]['us_per_long_request']:.0f}" for r in per_round)
        print(f"| {c} | {each} | {chunks} | {longs} | {m['us_per_request']:.0f} / {m['us_per_chunk']:.2f} / {m['us_per_long_request']:.0f} | {m['startup_s']:.2f} | {m['whole_long_run_s']:.2f} |")
    print(f"\nours / theirs for a {REQUEST_TOKENS}-token request, start-up out = {ratio:.2f} (target <= {TARGET}); whole commands, start-up in = {whole:.2f}")
    if out:
        out.write_text(json.dumps({"paced": PACED.__dict__, "rounds": per_round, "medians": median, "ratio": ratio, "whole_ratio": whole}, indent=2) + "\n")
    return 0 if ratio <= TARGET else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write all figures here as JSON")
    parser.add_argument("--unpaced", action="store_true", help="in process, as fast as the source sends: a lower bound")
    parser.add_argument("--floor", action="store_true", help="the paced load read by a bare epoll and recvmsg_into loop")
    parser.add_argument("--per-request", action="store_true", help=f"CPU per request and per {REQUEST_TOKENS}-token request, whole commands")
    args = parser.parse_args()
    if args.floor:
        return floor(args.rounds)
    if args.per_request:
        return per_request(args.rounds, args.out)
    return unpaced(args.rounds, args.out) if args.unpaced else paced(args.rounds, args.out)


def bare_reads(url: str, tokens: int = PACED.output_len) -> tuple[float, float]:
    """CPU us per chunk and reads per chunk of :data:`PACED`'s streams, one request each, read by
    nothing but ``epoll`` and ``recvmsg_into`` (this process)."""
    import resource
    import select
    import socket

    from pytest_qwenperf.loadgen.stamped_socket import SO_TIMESTAMPNS
    from tests.stream_source import MODEL

    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": tokens, "stream": True, "ignore_eos": True}).encode()
    request = b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body)
    buffer, ancillary = bytearray(256 * 1024), socket.CMSG_SPACE(16)
    poller, socks = select.epoll(), {}
    for _ in range(PACED.streams):
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # as the client asks
        sock.setblocking(False)
        socks[sock.fileno()] = sock
        poller.register(sock.fileno(), select.EPOLLIN)
    before, reads, open_ = resource.getrusage(resource.RUSAGE_SELF), 0, set(socks)
    for sock in socks.values():
        sock.send(request)
    while open_:
        for fd, _ in poller.poll():
            size, _, _, _ = socks[fd].recvmsg_into([buffer], ancillary)
            reads += 1
            if not size or buffer[:size].endswith(b"0\r\n\r\n"):
                open_.discard(fd)
    after = resource.getrusage(resource.RUSAGE_SELF)
    for sock in socks.values():
        sock.close()
    poller.close()
    chunks = PACED.streams * tokens
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu / chunks * 1e6, reads / chunks


def floor(rounds: int) -> int:
    from tests.stream_source import stream_source

    cpus = sorted(os.sched_getaffinity(0))
    with stream_source(cpus={cpus[0]}, default_schedule={"itl_ms": PACED.itl_ms}) as source:
        os.sched_setaffinity(0, {cpus[-1]})
        figures = [bare_reads(source.urls[0]) for _ in range(rounds)]
    print(f"bare epoll + recvmsg_into, {PACED.streams} streams paced at {PACED.itl_ms:g} ms, CPU {cpus[-1]}:")
    print(" / ".join(f"{us:.2f} us per chunk ({reads:.2f} reads a chunk)" for us, reads in figures))
    return 0


def unpaced(rounds: int, out: Path | None) -> int:
    from tests.stream_source import MODEL, stream_source

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the stream source, one for the clients")
    rates: dict[str, list[float]] = {client: [] for client in CLIENTS}
    with stream_source(cpus={cpus[0]}, default_schedule={"fast": True}) as source:
        for n in range(rounds):
            for client in CLIENTS:
                rates[client].append(_measure_in_fresh_process(source.urls[0], MODEL, client, cpus[-1]))
            print(f"round {n + 1}: " + ", ".join(f"{c} {rates[c][-1]:,.0f}" for c in CLIENTS) + " chunks per CPU-second", file=sys.stderr)
    cost = {client: 1e6 / statistics.median(values) for client, values in rates.items()}
    ratio = cost["qwenperf"] / cost["vllm"]
    print(f"stream source on CPU {cpus[0]}, clients on CPU {cpus[-1]}; {STREAMS} streams, {CHUNKS:,} chunks per run\n")
    print("| client | chunks per CPU-second, per round | CPU s per million chunks (median) |")
    print("| --- | --- | --- |")
    for client, values in rates.items():
        print(f"| {client} | {' / '.join(f'{v:,.0f}' for v in values)} | {cost[client]:.2f} |")
    print(f"\nours / theirs = {ratio:.2f} (target <= {TARGET}); unpaced and in process: a lower bound on both clients' cost")
    if out:
        out.write_text(json.dumps({"chunks_per_cpu_s": rates, "cpu_s_per_million": cost, "ratio": ratio}, indent=2) + "\n")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

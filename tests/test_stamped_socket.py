"""The client's socket: reads carry when the kernel received the bytes, writes arrive whole."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from pytest_qwenperf.loadgen.stamped_socket import StampedConnection, _RealtimeClock


class Collect:
    def __init__(self) -> None:
        self.reads: list[tuple[bytes, float]] = []
        self.lost: list[Exception | None] = []
        self.ended = asyncio.get_running_loop().create_future()

    def received(self, data: bytes, at: float) -> None:
        self.reads.append((data, at))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)
        self.ended.set_result(None)


def listener() -> socket.socket:
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(10)
    return sock


def test_a_read_is_timed_when_the_bytes_arrived_not_when_they_were_read() -> None:
    """The loop is blocked for 200 ms after the peer wrote: the stamp is the write's time, the read's is 200 ms later.

    On loopback the kernel stamps the bytes' arrival inside the peer's ``sendall``, so the
    stamp lies between the times taken just before and just after it, however long the
    write itself took (50 us allowed for moving the stamp onto ``perf_counter``'s clock).
    """

    async def main() -> tuple[float, float, float, float]:
        with listener() as server:
            receiver = Collect()
            conn = await StampedConnection.open("127.0.0.1", server.getsockname()[1], receiver)
            peer, _ = server.accept()
            await asyncio.sleep(0.05)  # the kernel turns packet stamping on in deferred work when the first socket asks
            with peer:
                before = time.perf_counter()
                peer.sendall(b"hello")
                after = time.perf_counter()
                time.sleep(0.2)  # noqa: ASYNC251  the event loop must not run: the bytes wait in the kernel
                await asyncio.sleep(0)
                while not receiver.reads:
                    await asyncio.sleep(0.001)
                read_at = time.perf_counter()
            await receiver.ended
            conn.abort()
        data, at = receiver.reads[0]
        assert data == b"hello" and receiver.lost == [None]  # and the peer's close is an orderly end
        return before, after, at, read_at

    before, after, at, read_at = asyncio.run(main())
    assert before - 50e-6 < at < after + 50e-6, ((at - before) * 1e3, (after - before) * 1e3)
    assert read_at - at > 0.2 - 50e-6


def test_a_write_larger_than_the_socket_buffer_arrives_whole() -> None:
    payload = bytes(range(256)) * (32 * 1024)  # 8 MiB: more than the kernel takes in one send

    async def main() -> bytes:
        with listener() as server:
            receiver = Collect()
            conn = await StampedConnection.open("localhost", server.getsockname()[1], receiver)
            peer, _ = server.accept()
            got = bytearray()

            def drain() -> None:
                while len(got) < len(payload):
                    got.extend(peer.recv(1 << 20))

            reader = threading.Thread(target=drain)
            reader.start()
            conn.write(payload[:100])
            conn.write(payload[100:])
            while reader.is_alive():
                await asyncio.sleep(0.01)
            conn.abort()
            peer.close()
            assert receiver.lost == []  # abort tells the receiver nothing
            return bytes(got)

    assert asyncio.run(main()) == payload


def test_a_refused_connection_raises_what_the_kernel_said() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused

        async def main() -> None:
            await StampedConnection.open("127.0.0.1", port, Collect())

        with pytest.raises(ConnectionRefusedError):
            asyncio.run(main())


def test_realtime_stamps_move_onto_perf_counters_clock() -> None:
    """A wall-clock reading lands between the ``perf_counter`` readings taken around it, to 50 us
    (however long the thread was interrupted between them)."""
    clock = _RealtimeClock()
    before, realtime, now = time.perf_counter(), time.time_ns(), time.perf_counter()
    assert before - 50e-6 < clock.to_perf_counter(realtime, now) <= now
    assert before - 50e-6 < clock.to_perf_counter(realtime - 5_000_000, now) + 0.005 < now + 50e-6
    assert clock.to_perf_counter(realtime + 10**9, now) == now  # never later than the read: a stamp cannot be from the future


def test_chunks_arriving_while_the_client_is_busy_are_all_read_each_with_its_own_arrival() -> None:
    """Many sockets written to at different times while the loop cannot run: every socket's
    bytes are delivered, each timed by its own write, though all are read late and through the
    one buffer the thread's reads share."""

    async def main() -> tuple[list[tuple[float, float]], list[float]]:
        with listener() as server:
            port = server.getsockname()[1]
            receivers, conns, peers = [], [], []
            for _ in range(16):
                receivers.append(Collect())
                conns.append(await StampedConnection.open("127.0.0.1", port, receivers[-1]))
                peers.append(server.accept()[0])
            await asyncio.sleep(0.05)
            writes = []
            for peer in peers:  # the loop is blocked all along: the bytes wait in the kernel
                before = time.perf_counter()
                peer.sendall(b"chunk")
                writes.append((before, time.perf_counter()))
                time.sleep(0.002)  # noqa: ASYNC251
            while not all(r.reads for r in receivers):
                await asyncio.sleep(0.001)
            for conn, peer in zip(conns, peers, strict=True):
                conn.abort()
                peer.close()
        return writes, [r.reads[0][1] for r in receivers]

    writes, stamps = asyncio.run(main())
    for (before, after), at in zip(writes, stamps, strict=True):
        assert before - 50e-6 < at < after + 50e-6, ((at - before) * 1e3, (after - before) * 1e3)


def test_closing_every_connection_leaves_no_descriptor_behind() -> None:
    fds = set(os.listdir("/proc/self/fd"))

    async def main() -> None:
        with listener() as server:
            conns = [await StampedConnection.open("127.0.0.1", server.getsockname()[1], Collect()) for _ in range(3)]
            peers = [server.accept()[0] for _ in conns]
            assert len(set(os.listdir("/proc/self/fd")) - fds) >= len(conns) * 2  # both ends of each
            for conn in conns:
                conn.abort()
            for peer in peers:
                peer.close()

    asyncio.run(main())
    assert set(os.listdir("/proc/self/fd")) - fds == set()

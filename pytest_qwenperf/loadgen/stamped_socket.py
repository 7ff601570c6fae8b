"""A TCP connection whose every read carries the time the kernel received its bytes.

The client times each streamed chunk by when it arrived. Stamping it when Python gets to
the bytes adds whatever kept Python busy meanwhile: other streams' chunks handled first,
a garbage collection, or the hypervisor pausing the client's vCPU for a few milliseconds
(on 2-vCPU CI runners this happens several times a second, and it was what cost the
client its sub-millisecond p99 there). Linux time-stamps received packets in the network
stack when a socket asks for it (``SO_TIMESTAMPNS``) and ``recvmsg`` returns the stamp of
the newest packet in each read, so a chunk is timed when it reached this machine,
whatever the client was doing then. A read holding several chunks that arrived apart
times them all at the last one, as a read-time stamp would. Where the kernel gives no
stamp (not Linux), the read time is used.

The socket is read and written through the event loop's ``add_reader``/``add_writer``
(asyncio's transports read with ``recv``, which drops the stamp), and it calls the
:class:`Receiver` it serves directly; one request is written at a time, so writes are
buffered only for what the kernel did not take at once.

Reading late would be harmless with kernel stamps, so the client could wake once a millisecond
and read every ready socket in one pass instead of waking per chunk; measured (128 paced
streams, four interleaved rounds), that saved nothing the noise did not hide, as the loop already
finds several sockets ready per wake-up at that load, so reads stay on ``add_reader``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading
from time import perf_counter, perf_counter_ns, time_ns
from typing import Protocol

# <asm-generic/socket.h>: SO_TIMESTAMPNS (SO_TIMESTAMPNS_OLD), and SCM_TIMESTAMPNS, its
# control message, share the value on x86-64 and arm64; the stamp is a struct timespec
# of two 64-bit fields there (a shorter one, on 32-bit systems, is not read).
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)
_READ_SIZE = 256 * 1024
"""The most one read takes. Reads land in one buffer of this size per thread (``recvmsg_into``)
and are copied out at their length: ``recvmsg`` allocates a fresh buffer of the size asked for on
every call, which cost the client 28-30 us of CPU per chunk against 16-20 us into a kept buffer
(128 streams paced at a chunk per 20 ms, benchmarks/README.md "Lean")."""
_BUFFERS = threading.local()
_KERNEL_STAMPS = sys.platform == "linux"


class _RealtimeClock:
    """Moves kernel stamps (CLOCK_REALTIME) onto ``perf_counter``'s clock (CLOCK_MONOTONIC).

    The two clocks differ by an offset that changes only when the wall clock is stepped
    (NTP slews both alike), so it is measured every 100 ms rather than per read; a step
    (chrony's first correction after a VM boots) then skews stamps for at most that long.
    Reading the two clocks one after the other is off by however long the thread was
    interrupted in between, so the pair read closest together out of a few is kept.
    """

    def __init__(self) -> None:
        self.offset_ns = 0
        self.measured_at = float("-inf")

    def to_perf_counter(self, realtime_ns: int, now: float) -> float:
        if now - self.measured_at > 0.1:
            self._measure()
            self.measured_at = now
        return min(now, (realtime_ns - self.offset_ns) * 1e-9)

    def _measure(self) -> None:
        tightest = None
        for _ in range(5):
            before, realtime, after = perf_counter_ns(), time_ns(), perf_counter_ns()
            if tightest is None or after - before < tightest:
                tightest, self.offset_ns = after - before, realtime - (before + after) // 2


_CLOCK = _RealtimeClock()


class Receiver(Protocol):
    """What a :class:`StampedConnection` delivers to."""

    def received(self, data: bytes, at: float) -> None:
        """Bytes read, with when they arrived (``perf_counter`` scale)."""

    def connection_lost(self, exc: Exception | None) -> None:
        """The peer closed the connection (``exc`` None) or it failed; called once, never after :meth:`abort`."""


class StampedConnection:
    def __init__(self, sock: socket.socket, receiver: Receiver) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock, self._fd, self._receiver = sock, sock.fileno(), receiver
        self._unsent = bytearray()
        self.closed = False
        if not hasattr(_BUFFERS, "read"):  # one per thread: a read is copied out before the next can land
            _BUFFERS.read = memoryview(bytearray(_READ_SIZE))
        self._buffer: memoryview = _BUFFERS.read
        self._loop.add_reader(self._fd, self._on_readable)

    @classmethod
    async def open(cls, host: str, port: int, receiver: Receiver) -> StampedConnection:
        """Connect to the first address of ``host`` that accepts, as ``loop.create_connection`` does."""
        loop = asyncio.get_running_loop()
        failures: list[OSError] = []
        for family, kind, proto, _, address in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if _KERNEL_STAMPS:
                    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                failures.append(exc)
                continue
            except BaseException:
                sock.close()
                raise
            return cls(sock, receiver)
        raise failures[0] if failures else OSError(f"{host} resolves to no address")

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self._unsent:
            self._unsent += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lose(exc)
            return
        if sent < len(data):
            self._unsent += data[sent:]
            self._loop.add_writer(self._fd, self._on_writable)

    def abort(self) -> None:
        """Close now, dropping anything unsent; the receiver hears nothing more."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._unsent:
            self._loop.remove_writer(self._fd)
            self._unsent.clear()
        self._sock.close()

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        del self._unsent[:sent]
        if not self._unsent:
            self._loop.remove_writer(self._fd)

    def _on_readable(self) -> None:
        try:
            size, ancillary, _, _ = self._sock.recvmsg_into((self._buffer,), _ANCILLARY_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        now = perf_counter()
        if not size:
            self._lose(None)
            return
        data = self._buffer[:size].tobytes()
        at = now
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                at = _CLOCK.to_perf_counter(seconds * 1_000_000_000 + nanoseconds, now)
        self._receiver.received(data, at)

    def _lose(self, exc: Exception | None) -> None:
        self.abort()
        self._receiver.connection_lost(exc)

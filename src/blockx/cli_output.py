"""``blockx run``'s outputs: JSON Lines, written by a thread of their own.

Theory of operation
-------------------
The event loop must never wait for stdout. A slow reader (``| less``) or a
pipe nobody drains would otherwise stall the whole run — executors idle,
heartbeats unchecked — and keep the loop's signal handlers from running. So
the loop only encodes rows (orjson, as before) and appends the bytes to a
queue; one writer thread takes whatever has accumulated and writes it, in
order, to a descriptor of its own::

    event loop                               writer thread "blockx-rows"
    put_rows(rows)      -> queue of bytes -> os.write(fd, all queued, <= 1 MiB)
    await wait_for_room()  <-- woken by call_soon_threadsafe after each write
    await wait_drained()   <--

Backpressure: the queue holds at most ``max_pending_bytes`` (4 MiB) of
encoded rows, plus the slice being put. Past it, the loop's row consumer
awaits room; the loop itself keeps running (signals, heartbeats, progress).
As the consumer stops taking rows, the worker's stream producer stops reading
the calls file at its credit window, so memory stays flat however long the
stream and however slow the reader.

The descriptor: ``-o FILE`` is opened here. stdout is duplicated — except a
pipe, which is opened anew through ``/proc/self/fd/1`` (Linux): a file
description of our own that can be non-blocking without touching the one the
shell and other writers share. On it the writer waits in ``poll`` (with a
wake-up pipe) instead of in ``write``, so it knows exactly which bytes the
reader has been given and can be stopped. Elsewhere (a terminal, a socket,
no ``/proc``) writes block in the writer thread — still never in the loop.

Invariants (under ``_lock``): ``_pending_bytes``/``_pending_rows`` count
everything put and not yet accepted by the kernel; rows are written in the
order they were put; every row is one line, so ``rows`` (fully written) is
the number of newlines written. Only the writer thread touches the
descriptor until it has ended.

Ends: :meth:`RowWriter.wait_drained` then :meth:`RowWriter.close` (joins the
thread). :meth:`RowWriter.abandon` when the reader does not drain after an
interruption: queued rows are dropped and counted; the thread stops (on a
blocking descriptor it is left in ``write``: a daemon, it cannot hold up the
process's exit). The reader going away (EPIPE) stops the writer; the loop
sees :class:`OutputClosed` from its next put or wait (or polls
:attr:`RowWriter.reader_gone`).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import os
import select
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = ["MAX_PENDING_BYTES", "PUT_SLICE_ROWS", "OutputClosed", "RowWriter"]

#: Encoded rows queued for the writer before the producer waits for room.
MAX_PENDING_BYTES: Final = 4 * 1024 * 1024
#: The most one write is handed (what has accumulated, up to this).
WRITE_CHUNK_BYTES: Final = 1024 * 1024
#: Rows encoded and queued at once when many are written (a one-shot task's outputs).
PUT_SLICE_ROWS: Final = 1024


class OutputClosed(Exception):
    """The reader of stdout went away (``blockx run ... | head``)."""


class _Abandoned(Exception):
    """The writer was told to stop (:meth:`RowWriter.abandon`)."""


def _encode(rows: Sequence[Any]) -> bytes:
    import orjson

    from blockx.wire import dumps_wire

    chunks: list[bytes] = []
    for row in rows:
        try:
            chunks.append(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
        except TypeError:  # an int beyond 64 bits: the exact encoder
            chunks.append(dumps_wire(row) + b"\n")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _open_stdout(stdout: Any) -> tuple[int, bool]:
    """A descriptor of our own for stdout, and whether it is non-blocking (a pipe)."""
    if stdout is None:  # Python's answer to a process started with fd 1 closed
        raise OSError(errno.EBADF, "stdout is closed")
    stdout.flush()  # nothing buffered may end up behind the rows
    fd = stdout.fileno()
    if sys.platform.startswith("linux") and stat.S_ISFIFO(os.fstat(fd).st_mode):
        try:
            flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
            return os.open(f"/proc/self/fd/{fd}", flags), True
        except OSError:  # no /proc, or the reader is gone already (ENXIO): plain dup
            pass
    return os.dup(fd), False


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class RowWriter:
    """JSON Lines to stdout (``path`` None) or a file, through the writer thread.

    Open it before the run (a bad ``-o`` path raises :class:`OSError` here);
    one event loop puts rows and waits; :meth:`close` at the end. ``stdout``: what
    stands for stdout (default ``sys.stdout``; it needs ``fileno`` and ``flush``).
    """

    def __init__(
        self,
        path: str | None,
        *,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        stdout: Any = None,
    ) -> None:
        self.path = path
        if path is None:
            self._fd, self._nonblocking = _open_stdout(stdout or sys.stdout)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            self._fd, self._nonblocking = os.open(path, flags, 0o666), False
        # The writer's poll() also watches this pipe: a byte in it means "stop".
        self._stop_read, self._stop_write = os.pipe() if self._nonblocking else (-1, -1)
        self._max_pending_bytes = max_pending_bytes
        self._lock = threading.Lock()
        self._writer_wake = threading.Condition(self._lock)
        self._queue: collections.deque[bytes] = collections.deque()
        self._pending_bytes = 0  # put, not yet accepted by the kernel
        self._pending_rows = 0
        self._writer_idle = False  # the thread waits for rows
        self._writing = False  # the thread is in _write()
        self._closing = False  # no more rows will be put
        self._abandoned = False
        self._failure: BaseException | None = None  # OutputClosed, or the OSError of a write
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        #: Rows (whole lines) and bytes the kernel accepted.
        self.rows = 0
        self.bytes = 0
        self._ends_mid_line = False  # the last byte written was not a newline
        #: After :meth:`abandon`: the last line written is cut short.
        self.torn = False
        #: After :meth:`abandon`: its count is exact. It is an upper bound when the thread
        #: was stuck in a blocking write() (part of that write may have reached the reader).
        self.drop_count_exact = True
        self._thread = threading.Thread(target=self._run, name="blockx-rows", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return (
            f"RowWriter({self.label}: {self.rows} rows written, {self._pending_rows} pending "
            f"({self._pending_bytes} bytes), nonblocking={self._nonblocking}, "
            f"failure={self._failure!r}, abandoned={self._abandoned})"
        )

    @property
    def label(self) -> str:
        return self.path if self.path is not None else "stdout"

    @property
    def full(self) -> bool:
        """The producer should :meth:`wait_for_room` before putting more."""
        return self._pending_bytes >= self._max_pending_bytes

    @property
    def reader_gone(self) -> bool:
        return isinstance(self._failure, OutputClosed)

    # --- the producer side (the event loop) -----------------------------------------------------

    def put_rows(self, rows: Sequence[Any]) -> None:
        """Encode ``rows`` and queue them; never blocks. Raises :class:`OutputClosed` when
        the reader went away, or the :class:`OSError` a write failed with."""
        if not rows:
            return
        data = _encode(rows)
        with self._lock:
            self._raise_failure()
            if self._closing or self._abandoned:
                raise RuntimeError("RowWriter.put_rows after close() or abandon()")
            self._queue.append(data)
            self._pending_bytes += len(data)
            self._pending_rows += len(rows)
            if self._writer_idle:
                self._writer_wake.notify()

    async def wait_for_room(self) -> None:
        """Return once the queue is below its bound (raises as :meth:`put_rows`)."""
        await self._wait_until(lambda: self._pending_bytes < self._max_pending_bytes)

    async def wait_drained(self) -> None:
        """Return once every row put has been written (raises as :meth:`put_rows`)."""
        await self._wait_until(lambda: self._pending_bytes == 0)

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                self._raise_failure()
                if ready():
                    return
                if self._waiter is not None:
                    raise RuntimeError("RowWriter: one waiter at a time")
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, waiter)
            try:
                await waiter
            finally:
                with self._lock:
                    self._waiter = None

    def abandon(self) -> int:
        """Give up on the rows not written yet; returns how many (a row cut short by the
        stop counts: see :attr:`torn`). Nothing may be put afterwards."""
        with self._lock:
            self._abandoned = True
            self._queue.clear()
            self._writer_wake.notify()
        if self._stop_write >= 0:
            os.write(self._stop_write, b"\0")
        if self._nonblocking:
            self._thread.join(1.0)  # it stops at once: it waits in poll(), not in write()
        with self._lock:
            self.torn = self._ends_mid_line
            self.drop_count_exact = self._nonblocking or not self._writing
            return self._pending_rows

    def close(self, timeout: float | None = None) -> int:
        """No more rows: let the thread write what is queued (waiting up to ``timeout``),
        join it and close the descriptors. Returns the rows dropped by an :meth:`abandon`
        this had to do (0 after :meth:`wait_drained`). Raises nothing for the output."""
        with self._lock:
            self._closing = True
            self._writer_wake.notify()
        dropped = 0
        if not self._abandoned:
            self._thread.join(timeout)
            if self._thread.is_alive():
                dropped = self.abandon()
        if not self._thread.is_alive():  # else it is still in write(fd): leave fd open
            os.close(self._fd)
        if self._stop_read >= 0:
            os.close(self._stop_read)
            os.close(self._stop_write)
            self._stop_read = self._stop_write = -1
        return dropped

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:
            if isinstance(failure, OutputClosed):
                raise OutputClosed
            raise failure

    # --- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing and not self._abandoned:
                    self._writer_idle = True
                    self._writer_wake.wait()
                self._writer_idle = False
                if self._abandoned or not self._queue:
                    return  # dropped, or closed with everything written
                chunks: list[bytes] = []
                size = 0
                while self._queue and size < WRITE_CHUNK_BYTES:
                    chunks.append(self._queue.popleft())
                    size += len(chunks[-1])
                self._writing = True
            try:
                self._write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                with self._lock:
                    self._writing = False
            except _Abandoned:
                return
            except BrokenPipeError:
                self._fail(OutputClosed())
                return
            except OSError as exc:
                self._fail(exc)
                return

    def _write(self, data: bytes) -> None:
        """Write ``data`` whole, accounting for each part the kernel accepts."""
        fd = self._fd
        poller: select.poll | None = None
        offset = 0
        while offset < len(data):
            try:
                written = os.write(fd, memoryview(data)[offset : offset + WRITE_CHUNK_BYTES])
            except BlockingIOError:  # the pipe is full: wait for room, or to be stopped
                if poller is None:
                    poller = select.poll()
                    poller.register(fd, select.POLLOUT)
                    poller.register(self._stop_read, select.POLLIN)
                events = dict(poller.poll())
                if self._stop_read in events:
                    raise _Abandoned from None
                continue  # writable, or an error the next write() reports
            rows = data.count(b"\n", offset, offset + written)
            offset += written
            with self._lock:
                self.rows += rows
                self.bytes += written
                self._pending_bytes -= written
                self._pending_rows -= rows
                self._ends_mid_line = data[offset - 1] != 0x0A
                self._wake_waiter()

    def _fail(self, failure: BaseException) -> None:
        with self._lock:
            self._failure = failure
            self._wake_waiter()

    def _wake_waiter(self) -> None:
        """Under ``_lock``: the loop's waiter, if any, re-checks its condition."""
        if self._waiter is not None:
            loop, waiter = self._waiter
            self._waiter = None
            loop.call_soon_threadsafe(_wake, waiter)

"""``blockx run``'s outputs: JSON Lines, written by a thread of their own.

Theory of operation
-------------------
The event loop must never wait for stdout. A slow reader (``| less``) or a
pipe nobody drains would otherwise stall the whole run — executors idle,
heartbeats unchecked — and keep the loop's signal handlers from running. So
the loop only encodes rows — a batch of them with one call, msgspec's
``encode_lines``; or, for a settled batch's outputs that are all objects, not
even that: they are the rows' JSON already (:func:`encode_outputs`) — and appends
the bytes to a queue; one writer thread takes
whatever has accumulated and writes it, in order, to a descriptor of its own::

    event loop                               writer thread "blockx-rows"
    put_outputs(outs)   -> queue of bytes -> os.write(fd, all queued, <= 1 MiB)
    await wait_for_room()  <-- woken by call_soon_threadsafe after each write
    await wait_drained()   <--

Backpressure: the queue holds at most ``max_pending_bytes`` (4 MiB) of
encoded rows, plus the slice being put. Past it, the loop's row consumer
awaits room; the loop itself keeps running (signals, heartbeats, progress).
As the consumer stops taking rows, the worker's stream producer stops reading
the calls file at its credit window, so memory stays flat however long the
stream and however slow the reader.

The descriptor (``-o FILE`` is opened here; stdout is duplicated, or opened anew
when it is a pipe, so the writer can wait in ``poll`` and be stopped), the thread
and the accounting are :class:`~blockx.cli.writer.WriterThread`'s, shared with
stderr's writer. Every row is one line, so ``rows`` (fully written) is the number
of newlines written.

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
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from blockx.cli.writer import OutputClosed, WriterThread, open_std_stream
from blockx.worker.json_values import rows_from_outputs, rows_jsonl

if TYPE_CHECKING:
    from blockx.worker.handle import TaskHandle

__all__ = [
    "MAX_PENDING_BYTES",
    "PUT_SLICE_ROWS",
    "OutputClosed",
    "RowPart",
    "RowWriter",
    "encode_outputs",
    "encode_rows",
    "row_parts",
]

#: Encoded rows queued for the writer before the producer waits for room.
MAX_PENDING_BYTES: Final = 4 * 1024 * 1024
#: Rows encoded and queued at once when many are written (a batch, a one-shot task's
#: outputs): the queue's bound is checked between slices.
PUT_SLICE_ROWS: Final = 1024

_lines_encoder: Final = msgspec.json.Encoder()


def _encode(rows: Sequence[Any]) -> bytes:
    """``rows`` as JSON Lines: one ``encode_lines`` call for all of them (msgspec: ~40 ns a
    row, against ~250 for one orjson call a row). A value msgspec will not encode goes
    row by row through the wire's strict encoder, which says what is wrong with it."""
    try:
        return _lines_encoder.encode_lines(rows)
    except (TypeError, ValueError, OverflowError):
        pass
    from blockx.wire import dumps_wire

    return b"".join([dumps_wire(row) + b"\n" for row in rows])


#: Rows as JSON Lines exactly as ``blockx run`` writes them (``blockx serve`` stores them so).
encode_rows: Final = _encode


def encode_outputs(outputs: Sequence[bytes]) -> tuple[bytes, int]:
    """The rows of a settled batch's raw ``outputs`` as JSON Lines, and how many: the
    same bytes as :func:`encode_rows` of the decoded rows, without decoding the outputs
    when each is one object (``blockx.worker.json_values.rows_jsonl``)."""
    encoded = rows_jsonl(outputs)
    if encoded is not None:
        return encoded
    rows = rows_from_outputs(outputs)
    return (_encode(rows) if rows else b""), len(rows)


#: A settled batch's rows as :meth:`RowWriter.put_part` takes them: ``(True, its raw
#: outputs)``, or ``(False, rows)`` when only decoded rows are at hand.
RowPart = tuple[bool, Sequence[Any]]


async def row_parts(handle: TaskHandle) -> AsyncIterator[RowPart]:
    """The task's settled batches as :data:`RowPart` items: raw outputs unless the rows
    were decoded already; a batch with neither is skipped."""
    async for settled in handle.settled_batches():
        if settled.outputs and not settled.decoded:
            yield True, settled.outputs
        elif settled.rows:
            yield False, settled.rows


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class RowWriter(WriterThread):
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
            fd, nonblocking = open_std_stream(stdout or sys.stdout, "stdout")
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            fd, nonblocking = os.open(path, flags, 0o666), False
        super().__init__(fd, nonblocking, name="blockx-rows")
        self._max_pending_bytes = max_pending_bytes
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        #: After :meth:`abandon`: the last line written is cut short.
        self.torn = False
        #: After :meth:`abandon`: its count is exact. It is an upper bound when the thread
        #: was stuck in a blocking write() (part of that write may have reached the reader).
        self.drop_count_exact = True
        self._start()

    def __repr__(self) -> str:
        return (
            f"RowWriter({self.label}: {self.rows} rows written, {self._pending_lines} pending "
            f"({self._pending_bytes} bytes), nonblocking={self._nonblocking}, "
            f"failure={self._failure!r}, abandoned={self._abandoned})"
        )

    @property
    def label(self) -> str:
        return self.path if self.path is not None else "stdout"

    @property
    def rows(self) -> int:
        """Rows (whole lines) the kernel accepted."""
        return self.lines

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
        self._put(_encode(rows), len(rows))

    def put_outputs(self, outputs: Sequence[bytes]) -> None:
        """:meth:`put_rows` for the rows of a settled batch's raw outputs
        (:func:`encode_outputs`: most often, nothing to decode or encode)."""
        if not outputs:
            return
        data, count = encode_outputs(outputs)
        if count:
            self._put(data, count)

    def put_part(self, part: RowPart) -> None:
        """:meth:`put_outputs` or :meth:`put_rows`, as ``part`` says."""
        raw, items = part
        if raw:
            self.put_outputs(items)
        else:
            self.put_rows(items)

    def _put(self, data: bytes, lines: int) -> None:
        with self._lock:
            self._raise_failure()
            if self._closing or self._abandoned:
                raise RuntimeError("RowWriter.put_rows after close() or abandon()")
            self._queue_bytes(data, lines)

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
        self._abandon()
        return self._count_dropped()

    def close(self, timeout: float | None = None) -> int:
        """No more rows: let the thread write what is queued (waiting up to ``timeout``),
        join it and close the descriptors. Returns the rows dropped by an :meth:`abandon`
        this had to do (0 after :meth:`wait_drained`). Raises nothing for the output."""
        return self._count_dropped() if self._finish(timeout) else 0

    def _count_dropped(self) -> int:
        """After the thread stopped: the rows not written (sets :attr:`torn` and
        :attr:`drop_count_exact`)."""
        with self._lock:
            self.torn = self._ends_mid_line
            self.drop_count_exact = self._nonblocking or not self._writing
            return self._pending_lines

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:
            if isinstance(failure, OutputClosed):
                raise OutputClosed
            raise failure

    # --- the writer thread ----------------------------------------------------------------------

    def _on_progress(self) -> None:
        """Under ``_lock``: the loop's waiter, if any, re-checks its condition."""
        if self._waiter is not None:
            loop, waiter = self._waiter
            self._waiter = None
            loop.call_soon_threadsafe(_wake, waiter)

"""The writer threads of ``blockx run``: bytes queued by the event loop, written in order by
a thread of their own, so the loop never waits for stdout or stderr.

Theory of operation
-------------------
A reader that does not read (``| less`` paused, a pipe nobody drains, a supervisor that
stopped reading) must not stall the run: a write the event loop made itself would block it —
executors idle, heartbeats unchecked, signal handlers never run. So the loop only appends
bytes to a queue; one thread per stream takes whatever has accumulated and writes it, in
order, to a descriptor of its own::

    event loop (or any thread)           writer thread
    _queue_bytes(data, lines) -> deque -> os.write(fd, all queued, <= 1 MiB)
                                          _on_progress() after each part the kernel accepts
                                          _on_idle() when the queue ran empty

:class:`WriterThread` is that machinery; what a full queue means is the subclass's:
:class:`~blockx.cli.output.RowWriter` (stdout's rows) makes the producer wait for room,
:class:`~blockx.cli.console.StderrWriter` (log records, the progress line, the final texts)
drops lines and counts them, because diagnostics must never slow the work.

The descriptor: stdout and stderr are duplicated — except a pipe, which is opened anew
through ``/proc/self/fd/N`` (Linux): a file description of our own that can be
non-blocking without touching the one the shell and other writers share. On it the writer
waits in ``poll`` (with a wake-up pipe) instead of in ``write``, so it knows exactly which
bytes the reader has been given and can be stopped. Elsewhere (a terminal, a socket, no
``/proc``) writes block in the writer thread — still never in the loop.

Invariants (under ``_lock``): ``_pending_bytes``/``_pending_lines`` count everything
queued and not yet accepted by the kernel; bytes are written in the order they were
queued; ``lines`` (written) is the number of newlines the kernel accepted. Only the writer
thread touches the descriptor until it has ended.

Ends: :meth:`WriterThread._finish` (the subclasses' ``close``) lets the thread write what is
queued, joins it and closes the descriptors; :meth:`WriterThread._abandon` gives up on what
is queued: the thread stops (on a blocking descriptor it is left in ``write``: a daemon, it
cannot hold up the process's exit). The reader going away (EPIPE) stops the writer with
:class:`OutputClosed` as its failure.
"""

from __future__ import annotations

import collections
import errno
import os
import select
import stat
import sys
import threading
import time
from typing import Any, Final

__all__ = ["WRITE_CHUNK_BYTES", "OutputClosed", "WriterThread", "open_std_stream"]

#: The most one write is handed (what has accumulated, up to this).
WRITE_CHUNK_BYTES: Final = 1024 * 1024


class OutputClosed(Exception):
    """The reader of the stream went away (``blockx run ... | head``)."""


class _Abandoned(Exception):
    """The writer was told to stop (:meth:`WriterThread._abandon`)."""


def open_std_stream(stream: Any, name: str) -> tuple[int, bool]:
    """A descriptor of our own for ``stream`` (``sys.stdout``, ``sys.stderr`` or a stand-in
    with ``fileno`` and ``flush``), and whether it is non-blocking (a pipe)."""
    if stream is None:  # Python's answer to a process started with the descriptor closed
        raise OSError(errno.EBADF, f"{name} is closed")
    stream.flush()  # nothing buffered may end up behind what the writer writes
    fd = stream.fileno()
    if sys.platform.startswith("linux") and stat.S_ISFIFO(os.fstat(fd).st_mode):
        try:
            flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
            return os.open(f"/proc/self/fd/{fd}", flags), True
        except OSError:  # no /proc, or the reader is gone already (ENXIO): plain dup
            pass
    return os.dup(fd), False


class WriterThread:
    """Bytes written in order to ``fd`` by a daemon thread named ``name``.

    Subclasses queue with :meth:`_queue_bytes` (under ``_lock``), may override the hooks
    :meth:`_on_progress` and :meth:`_on_idle`, and call :meth:`_start` at the end of their
    ``__init__``.
    """

    def __init__(self, fd: int, nonblocking: bool, *, name: str) -> None:
        self._fd = fd
        self._nonblocking = nonblocking
        # The writer's poll() also watches this pipe: a byte in it means "stop".
        self._stop_read, self._stop_write = os.pipe() if nonblocking else (-1, -1)
        self._lock = threading.Lock()
        self._writer_wake = threading.Condition(self._lock)
        self._queue: collections.deque[bytes] = collections.deque()
        self._pending_bytes = 0  # queued, not yet accepted by the kernel
        self._pending_lines = 0
        self._writer_idle = False  # the thread waits for bytes
        self._writing = False  # the thread is in _write()
        self._closing = False  # nothing more will be queued
        self._abandoned = False
        self._failure: BaseException | None = None  # OutputClosed, or the OSError of a write
        #: Lines (newlines) and bytes the kernel accepted.
        self.lines = 0
        self.bytes = 0
        self._ends_mid_line = False  # the last byte written was not a newline
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _start(self) -> None:
        self._thread.start()

    # --- the producer side ----------------------------------------------------------------------

    def _queue_bytes(self, data: bytes, lines: int) -> None:
        """Under ``_lock``: queue ``data`` (holding ``lines`` newlines) for the thread."""
        self._queue.append(data)
        self._pending_bytes += len(data)
        self._pending_lines += lines
        if self._writer_idle:
            self._writer_wake.notify()

    def _abandon(self) -> None:
        """Give up on what is not written yet; the thread stops (see the module docstring)."""
        with self._lock:
            self._abandoned = True
            self._queue.clear()
            self._writer_wake.notify()
        if self._stop_write >= 0:
            os.write(self._stop_write, b"\0")
        if self._nonblocking:
            self._thread.join(1.0)  # it stops at once: it waits in poll(), not in write()

    def _finish(self, timeout: float | None, *, while_progressing: bool = False) -> bool:
        """Nothing more will be queued: let the thread write what is (waiting up to
        ``timeout`` s — with ``while_progressing``, ``timeout`` s without a byte written),
        join it and close the descriptors. True when it gave up (:meth:`_abandon`)."""
        with self._lock:
            self._closing = True
            self._writer_wake.notify()
        gave_up = False
        if not self._abandoned:
            self._join(timeout, while_progressing)
            if self._thread.is_alive():
                self._abandon()
                gave_up = True
        if not self._thread.is_alive():  # else it is still in write(fd): leave fd open
            os.close(self._fd)
        if self._stop_read >= 0:
            os.close(self._stop_read)
            os.close(self._stop_write)
            self._stop_read = self._stop_write = -1
        return gave_up

    def _join(self, timeout: float | None, while_progressing: bool) -> None:
        if timeout is None or not while_progressing:
            self._thread.join(timeout)
            return
        written = self.bytes
        deadline = time.monotonic() + timeout
        while self._thread.is_alive():
            now = time.monotonic()
            if self.bytes != written:
                written, deadline = self.bytes, now + timeout
            if now >= deadline:
                return
            self._thread.join(min(0.05, deadline - now))

    # --- the writer thread ----------------------------------------------------------------------

    def _on_progress(self) -> None:
        """Under ``_lock``: bytes were written, or the writer failed."""

    def _on_idle(self) -> None:
        """Under ``_lock``: the queue ran empty (the hook may queue more)."""

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._abandoned:
                    self._on_idle()
                    if self._queue or self._closing:
                        break
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
            lines = data.count(b"\n", offset, offset + written)
            offset += written
            with self._lock:
                self.lines += lines
                self.bytes += written
                self._pending_bytes -= written
                self._pending_lines -= lines
                self._ends_mid_line = data[offset - 1] != 0x0A
                self._on_progress()

    def _fail(self, failure: BaseException) -> None:
        with self._lock:
            self._failure = failure
            self._on_progress()

"""stderr of ``blockx run`` and ``blockx validate``: log records, the progress line, plain texts.

Theory of operation
-------------------
One :class:`Console` per command writes everything that goes to stderr.
:func:`setup_logging` routes the ``blockx`` loggers through it (a
:class:`logging.Handler` that filters by ``-v``/``--quiet`` and keeps the
executors' forwarded ``print()`` output apart from their own logs), so a log
record never tears the progress line: the line is cleared first and redrawn
at the next tick.

Progress (when stderr is a terminal or with ``--progress``; never with
``--quiet``): the run's ticker calls :meth:`Progress.render` at most every
:data:`PROGRESS_INTERVAL_S` (8 redraws a second) with the dispatcher's
per-task counters (read-only: ``done/total``, retries, failures) and shows
the text with :meth:`Console.show_progress` — ``total`` is the inline list's
length or the calls file's line count from the pre-run check. The rate is
taken over the last 3 s.

During ``blockx run`` the console writes through a :class:`StderrWriter`
(:meth:`Console.attach`): a thread of its own writes stderr, so the event loop
never waits for it (a pipe nobody drains, a supervisor that stopped reading).
Diagnostics must not slow the work, so its queue is bounded
(:data:`STDERR_MAX_PENDING_BYTES`) and, when it is full, lines are dropped and
counted until the writer has caught up (its queue ran empty); then it writes
one line saying how many (``blockx: warning: 1,234 stderr lines dropped:
stderr was not read fast enough``), before anything queued later. Lines that are
written keep their order. Progress redraws are coalesced: a frame still
queued is replaced by the next one, and none is queued while lines are being
dropped. The final texts (report, summary) are queued after
:meth:`StderrWriter.keep_all`, which lifts the bound (they are bounded
themselves and the loop is gone); :meth:`Console.detach` then waits for them
to be written as long as the reader takes something every
:data:`STDERR_GRACE_S`, and gives up otherwise (the command exits on time).

``--log-format json`` (:attr:`Console.json`): every line written is one JSON
object (:mod:`blockx.observability.logs`): log records through
:class:`~blockx.observability.logs.JsonLogFormatter` (an executor's forwarded
line keeps its ``executor``, ``call_id``, ``task_id``), the console's own texts
as records whose level is read from their ``blockx: error:`` / ``blockx: warning:``
prefix, whatever else reaches ``sys.stderr`` (a Python warning, a traceback) as
a record of the logger ``stderr``, the drop notice as a record too; no progress
line at all. The lines go through the same writer thread, in the same order.

The number and text helpers (:func:`count_text`, :func:`plural`,
:func:`indent`, :func:`print_problems`) are shared by the progress line,
:mod:`blockx.cli.run`, :mod:`blockx.cli.validate` and :mod:`blockx.cli.report`,
so every count and every problem reads the same way. This module
imports nothing from BlockX but the writer thread (:mod:`blockx.cli.writer`) and the
JSON lines (:mod:`blockx.observability.logs`, standard library only).
"""

from __future__ import annotations

import collections
import io
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any, Final

from blockx.cli.writer import WriterThread, open_std_stream
from blockx.observability.logs import JsonLogFormatter, json_line

__all__ = [
    "PROGRESS_INTERVAL_S",
    "STDERR_GRACE_S",
    "STDERR_MAX_PENDING_BYTES",
    "Console",
    "Progress",
    "StderrWriter",
    "count_text",
    "indent",
    "plural",
    "print_problems",
    "setup_logging",
]

#: Progress redraw interval (s): at most 8 redraws a second.
PROGRESS_INTERVAL_S: Final = 0.125


#: stderr lines queued for the writer before further ones are dropped (and counted).
STDERR_MAX_PENDING_BYTES: Final = 1024 * 1024
#: At the end, how long stderr may take nothing before the command stops waiting for it (s).
STDERR_GRACE_S: Final = 2.0

_CLEAR_LINE: Final = b"\r\x1b[K"


class StderrWriter(WriterThread):
    """stderr's lines and progress frames, written by the thread ``blockx-stderr``.

    Never blocks and never raises for the stream: a full queue drops lines (counted, and
    said once the writer caught up), a reader that went away drops everything. Any thread
    may put. ``stream``: what stands for stderr (default ``sys.stderr``; it needs ``fileno``
    and ``flush``); an :class:`OSError` when it is closed.
    """

    def __init__(
        self,
        stream: Any = None,
        *,
        max_pending_bytes: int = STDERR_MAX_PENDING_BYTES,
        json_lines: bool = False,
    ) -> None:
        stream = stream or sys.stderr
        fd, nonblocking = open_std_stream(stream, "stderr")
        super().__init__(fd, nonblocking, name="blockx-stderr")
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._max_pending_bytes = max_pending_bytes
        self._frame_last = False  # the last thing queued is a progress frame (shown, once written)
        self._dropping = False  # a line was dropped: drop all until the queue ran empty
        self._unreported = 0  # lines dropped and not yet said
        self._bounded = True
        #: The drop notice as a JSON line (``--log-format json``).
        self.json_lines = json_lines
        #: Lines dropped in all.
        self.lines_dropped = 0
        self._start()

    def __repr__(self) -> str:
        return (
            f"StderrWriter({self.lines} lines written, {self._pending_bytes} bytes pending, "
            f"{self.lines_dropped} lines dropped, dropping={self._dropping}, "
            f"nonblocking={self._nonblocking}, failure={self._failure!r})"
        )

    def put_line(self, text: str) -> None:
        """Queue ``text`` (one or more lines) and a newline — or drop it when the queue is full."""
        data = (text + "\n").encode(self._encoding, "backslashreplace")
        with self._lock:
            if self._closed_for_puts():
                return
            if self._bounded and (
                self._dropping or self._pending_bytes + len(data) > self._max_pending_bytes
            ):
                self._dropping = True
                self._unreported += text.count("\n") + 1
                self.lines_dropped += text.count("\n") + 1
                if self._writer_idle:
                    # Nothing queued (one line bigger than the bound): the writer is idle
                    # already — wake it to report the drop and take lines again.
                    self._writer_wake.notify()
                return
            self._queue_line(data)

    def put_frame(self, frame: str) -> None:
        """Queue a progress frame (``\\r...``), replacing one still queued; skipped while
        lines are dropped."""
        data = frame.encode(self._encoding, "backslashreplace")
        with self._lock:
            if self._closed_for_puts():
                return
            if self._frame_last and self._queue:  # the last item queued: not taken yet
                self._pending_bytes += len(data) - len(self._queue[-1])
                self._queue[-1] = data
            elif not self._dropping and self._pending_bytes + len(data) <= self._max_pending_bytes:
                self._queue_bytes(data, 0)
                self._frame_last = True

    def clear_frame(self) -> None:
        """Queue the clearing of the progress line, if one is shown."""
        with self._lock:
            if self._frame_last and not self._closed_for_puts():
                self._queue_bytes(_CLEAR_LINE, 0)
                self._frame_last = False

    def keep_all(self) -> None:
        """From now on no line is dropped (the final texts); the count of those dropped so
        far is queued first."""
        with self._lock:
            self._bounded = False
            if not self._closed_for_puts():
                self._report_dropped()

    def close(self, grace: float | None = STDERR_GRACE_S) -> bool:
        """Write what is queued, waiting as long as the reader takes something every
        ``grace`` s; then give up. True when it gave up (what was left is lost)."""
        return self._finish(grace, while_progressing=True)

    def write_at_once(self, text: str) -> None:
        """Best effort, from any thread, never blocking on a pipe: ``text`` now, ahead of
        what is queued (the second signal's last word)."""
        fd = self._fd if self._nonblocking else 2
        try:
            os.write(fd, text.encode(self._encoding, "backslashreplace"))
        except OSError:
            pass

    def _closed_for_puts(self) -> bool:
        return self._closing or self._abandoned or self._failure is not None

    def _queue_line(self, data: bytes) -> None:
        if self._frame_last:
            data = _CLEAR_LINE + data
            self._frame_last = False
        self._queue_bytes(data, 1)

    def _report_dropped(self) -> None:
        if self._unreported:
            lines = f"{self._unreported:,} stderr line{'' if self._unreported == 1 else 's'}"
            text = f"{lines} dropped: stderr was not read fast enough"
            notice = (
                json_line("warning", "blockx.cli", text, {"lines_dropped": self._unreported})
                if self.json_lines
                else f"blockx: warning: {text}"
            )
            self._queue_line((notice + "\n").encode())
            self._unreported = 0

    def _on_idle(self) -> None:
        """The writer caught up: say how many lines were dropped, and take lines again."""
        if self._failure is None:
            self._report_dropped()
        self._dropping = False


class _WriterStream(io.TextIOBase):
    """``sys.stderr`` while a :class:`StderrWriter` is attached: whole lines go to the
    writer, so code that writes to ``sys.stderr`` itself (a ``warnings`` message,
    ``logging.lastResort``, a thread's traceback) cannot block the event loop either.
    Any thread may write; a partial line waits for its newline (or :meth:`flush`). With
    ``json_lines`` each write's whole lines become one JSON record (logger ``stderr``)."""

    def __init__(self, writer: StderrWriter, original: Any, *, json_lines: bool = False) -> None:
        super().__init__()
        self._writer = writer
        self._original = original
        self._json_lines = json_lines
        self._partial = ""
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", None) or "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return bool(self._original.isatty())

    def fileno(self) -> int:
        return int(self._original.fileno())

    def write(self, text: str) -> int:
        with self._lock:
            buffered = self._partial + text
            head, newline, self._partial = buffered.rpartition("\n")
        if newline:
            self._put(head)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            partial, self._partial = self._partial, ""
        if partial:
            self._put(partial)

    def _put(self, text: str) -> None:
        if self._json_lines:
            text = json_line("warning", "stderr", text)
        self._writer.put_line(text)


class Console:
    """stderr: log records, the progress line (redrawn in place) and the final texts —
    written directly, or through a :class:`StderrWriter` once attached (``sys.stderr``
    then writes through it too). ``log_format``: ``text`` or ``json`` (see the module
    docstring)."""

    def __init__(self, stream: IO[str], *, tty: bool, log_format: str = "text") -> None:
        self.stream = stream
        self.tty = tty
        #: ``--log-format json``: every line is a JSON object, no progress line.
        self.json = log_format == "json"
        self._line_shown = False
        self.writer: StderrWriter | None = None
        self._saved_stderr: Any = sys.stderr  # what sys.stderr was before attach()

    def __repr__(self) -> str:
        return (
            f"Console(tty={self.tty}, json={self.json}, line_shown={self._line_shown}, "
            f"writer={self.writer!r})"
        )

    def attach(self, writer: StderrWriter) -> None:
        """From now on write through ``writer``, and so does ``sys.stderr``."""
        self.clear_progress()
        self.writer = writer
        self._saved_stderr = sys.stderr
        sys.stderr = _WriterStream(writer, sys.stderr, json_lines=self.json)

    def detach(self, grace: float = STDERR_GRACE_S) -> bool:
        """Write directly again, once the writer has written what is queued (see
        :meth:`StderrWriter.close`); True when it gave up on some of it."""
        writer, self.writer = self.writer, None
        if writer is None:
            return False
        stand_in = sys.stderr
        if isinstance(stand_in, _WriterStream):
            stand_in.flush()
            sys.stderr = self._saved_stderr
        return writer.close(grace)

    def clear_progress(self) -> None:
        if self.writer is not None:
            self.writer.clear_frame()
        elif self._line_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._line_shown = False

    def show_progress(self, text: str) -> None:
        if self.json:  # never mixed into JSON lines
            return
        width = shutil.get_terminal_size((100, 24)).columns
        frame = "\r" + text[: max(width - 1, 20)] + "\x1b[K"
        if self.writer is not None:
            self.writer.put_frame(frame)
            return
        self.stream.write(frame)
        self.stream.flush()
        self._line_shown = True

    def print(self, text: str = "") -> None:
        """``text`` (one or more lines); in ``json`` one record, its level read from a
        ``blockx: error:`` / ``blockx: warning:`` prefix (an empty text, layout, is left out)."""
        if self.json:
            if text:
                level, message = _level_of(text)
                self.write_line(json_line(level, "blockx.cli", message))
            return
        self.write_line(text)

    def record(
        self,
        level: str,
        message: str,
        fields: dict[str, Any] | None = None,
        *,
        logger: str = "blockx.cli",
    ) -> None:
        """In ``json`` one record with ``fields``; in ``text`` ``message`` as it is."""
        if self.json:
            self.write_line(json_line(level, logger, message, fields))
        else:
            self.write_line(message)

    def write_line(self, text: str) -> None:
        """``text`` and a newline, as they are."""
        if self.writer is not None:
            self.writer.put_line(text)
            return
        self.clear_progress()
        self.stream.write(text + "\n")
        self.stream.flush()

    def write_at_once(self, text: str) -> None:
        """``text`` now, whatever is queued or blocked (the second signal: see blockx.cli.run)."""
        if self.json:
            text = json_line("warning", "blockx.cli", text.strip()) + "\n"
        if self.writer is not None:
            self.writer.write_at_once(text)
        else:
            os.write(2, text.encode())


def print_problems(console: Console, problems: Sequence[str]) -> None:
    """Each problem (bad input) as one ``blockx: error:`` line."""
    for problem in problems:
        console.print(f"blockx: error: {problem}")


_LEVEL_PREFIXES: Final = (
    ("blockx: error: ", "error"),
    ("blockx: warning: ", "warning"),
    ("blockx: info: ", "info"),
    ("blockx: note: ", "info"),
    ("blockx: ", "info"),
)


def _level_of(text: str) -> tuple[str, str]:
    """(level, message) of a console text: its ``blockx: error:`` & co. prefix read off."""
    for prefix, level in _LEVEL_PREFIXES:
        if text.startswith(prefix):
            return level, text[len(prefix) :]
    return "info", text


class _ConsoleHandler(logging.Handler):
    """Log records on stderr, keeping the progress line intact; see :func:`setup_logging`."""

    def __init__(self, console: Console, *, verbose: bool, quiet: bool) -> None:
        super().__init__(logging.DEBUG)
        self.console = console
        self.verbose = verbose
        self.quiet = quiet
        self.json_formatter: JsonLogFormatter | None = JsonLogFormatter() if console.json else None

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name == "blockx.worker.executor" and record.levelno < logging.WARNING:
            # print() output of user code: shown unless --quiet; the executor's own logs: -v.
            user_output = getattr(record, "executorStream", None) == "stdout" and not hasattr(
                record, "executorLogger"
            )
            return self.verbose or (user_output and not self.quiet)
        if record.levelno < logging.WARNING:
            return self.verbose
        msg = str(record.msg)
        if name == "blockx.worker.code" and msg.startswith("function %s cannot run"):
            return False  # the CLI reports it with the file and line
        return not (self.quiet and record.levelno < logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.json_formatter is not None:
                self.console.write_line(self.json_formatter.format(record))
                return
            text = record.getMessage()
            if record.name == "blockx.worker.executor" and record.levelno < logging.WARNING:
                line = text
            else:
                line = f"blockx: {record.levelname.lower()}: {text}"
            if record.exc_info and self.verbose:
                line += "\n" + logging.Formatter().formatException(record.exc_info)
            self.console.print(line)
        except Exception:  # pragma: no cover - logging must not raise
            self.handleError(record)


def setup_logging(console: Console, *, verbose: bool, quiet: bool) -> _ConsoleHandler:
    """Route the ``blockx`` loggers to ``console`` (replacing an earlier console's handler)."""
    handler = _ConsoleHandler(console, verbose=verbose, quiet=quiet)
    logger = logging.getLogger("blockx")
    for old in list(logger.handlers):
        if isinstance(old, _ConsoleHandler):
            logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    # Executors forward their output at INFO; the pool only formats what is enabled.
    logging.getLogger("blockx.worker.executor").setLevel(logging.INFO)
    return handler


def count_text(n: int) -> str:
    """``n`` with thousands separators: ``12,345``."""
    return f"{n:,}"


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, an ``s`` added unless ``n`` is 1: ``1 row``, ``12,345 rows``."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else (f"{seconds // 60}:{seconds % 60:02d}")
    )


class Progress:
    """The live progress line (see the module docstring)."""

    def __init__(self, console: Console, total: int | None, executors: int) -> None:
        self.console = console
        self.total = total
        self.executors = executors
        self.started = time.monotonic()
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self.last: tuple[int, int, int] | None = None
        unicode = (getattr(console.stream, "encoding", "") or "").lower().startswith("utf")
        self._full, self._empty = ("█", "░") if unicode else ("#", "-")

    def render(self, done: int, retries: int, failed: int, attached: int) -> str:
        now = time.monotonic()
        window = self._window
        window.append((now, done))
        while len(window) > 2 and now - window[0][0] > 3.0:
            window.popleft()
        t0, d0 = window[0]
        rate = (done - d0) / (now - t0) if now - t0 > 0.2 else 0.0
        elapsed = now - self.started
        parts: list[str] = []
        total = self.total
        if attached < self.executors and done == 0:
            parts.append(f"starting executors {attached}/{self.executors}")
        if total:
            fraction = min(done / total, 1.0)
            width = 24
            filled = int(fraction * width)
            bar = self._full * filled + self._empty * (width - filled)
            parts.append(f"{fraction * 100:3.0f}% {bar} {count_text(done)}/{count_text(total)}")
        else:
            parts.append(f"{count_text(done)} calls")
        parts.append(f"{rate:,.0f} calls/s")
        parts.append(f"retries {count_text(retries)}")
        parts.append(f"failed {count_text(failed)}")
        parts.append(_duration(elapsed))
        if total and rate > 0 and done < total:
            parts.append(f"ETA {_duration((total - done) / rate)}")
        return "  ".join(parts)


def indent(text: str, prefix: str) -> str:
    """Every non-empty line of ``text`` prefixed with ``prefix`` (trailing newlines dropped)."""
    return "\n".join(prefix + line if line else line for line in text.rstrip("\n").splitlines())

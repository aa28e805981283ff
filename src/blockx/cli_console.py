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

The number and text helpers (:func:`count_text`, :func:`plural`,
:func:`indent`, :func:`print_problems`) are shared by the progress line,
:mod:`blockx.cli_run`, :mod:`blockx.cli_validate` and :mod:`blockx.cli_report`,
so every count and every problem reads the same way. This module
imports nothing from BlockX.
"""

from __future__ import annotations

import collections
import logging
import shutil
import time
from collections.abc import Sequence
from typing import IO, Final

__all__ = [
    "PROGRESS_INTERVAL_S",
    "Console",
    "Progress",
    "count_text",
    "indent",
    "plural",
    "print_problems",
    "setup_logging",
]

#: Progress redraw interval (s): at most 8 redraws a second.
PROGRESS_INTERVAL_S: Final = 0.125


class Console:
    """stderr: log records, the progress line (redrawn in place) and the final texts."""

    def __init__(self, stream: IO[str], *, tty: bool) -> None:
        self.stream = stream
        self.tty = tty
        self._line_shown = False

    def clear_progress(self) -> None:
        if self._line_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._line_shown = False

    def show_progress(self, text: str) -> None:
        width = shutil.get_terminal_size((100, 24)).columns
        self.stream.write("\r" + text[: max(width - 1, 20)] + "\x1b[K")
        self.stream.flush()
        self._line_shown = True

    def print(self, text: str = "") -> None:
        self.clear_progress()
        self.stream.write(text + "\n")
        self.stream.flush()


def print_problems(console: Console, problems: Sequence[str]) -> None:
    """Each problem (bad input) as one ``blockx: error:`` line."""
    for problem in problems:
        console.print(f"blockx: error: {problem}")


class _ConsoleHandler(logging.Handler):
    """Log records on stderr, keeping the progress line intact; see :func:`setup_logging`."""

    def __init__(self, console: Console, *, verbose: bool, quiet: bool) -> None:
        super().__init__(logging.DEBUG)
        self.console = console
        self.verbose = verbose
        self.quiet = quiet

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

"""Structured logging for the executor process: one JSON object per line on stderr.

Theory of operation
-------------------
``configure_logging(executor_id)`` is called once by ``__main__`` before
anything logs. It reads two environment variables:

* ``BLOCKX_LOG_LEVEL`` — ``debug``, ``info`` (default), ``warning``, ``error``,
  ``critical`` (any case; a number works too);
* ``BLOCKX_LOG_FORMAT`` — ``json`` (default) or ``text`` for plain lines.

A JSON line holds ``ts`` (RFC 3339 UTC, milliseconds), ``level``, ``logger``,
``msg``, ``executorId``, and the call fields ``callId``, ``taskId``,
``attemptSeq``, ``functionId`` when the record carries them — passed with
``extra={...}`` or supplied automatically by a *call-fields provider* the
runtime registers with :func:`set_call_fields_provider` (it returns the fields
of the call whose greenlet is running, or None). Other ``extra`` keys are kept
too; ``exc`` holds a formatted traceback when the record has one.

stdout belongs to user code (and debug capture): left alone — unless
``BLOCKX_LOG_FORMAT=json`` is set explicitly (as ``blockx run --log-format json``
and ``blockx serve --log-format json`` do for their executors): then each line
user code writes to ``sys.stdout`` (``print()``) becomes a JSON line too
(:class:`JsonLinesStdout`: ``ts``, ``level`` ``info``, ``msg`` the line, and the
running call's ``callId`` / ``taskId`` / ``attemptSeq`` / ``functionId`` from the
call-fields provider), so the worker can tell which call printed it. It has no
``logger`` key: the worker still tells it apart from the executor's own logs. A
line begun by one call and ended by another is the second's; bytes written to
``sys.stdout.buffer`` or to descriptor 1 stay raw lines (forwarded as text).
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any, Final

__all__ = [
    "CALL_FIELDS",
    "JsonFormatter",
    "JsonLinesStdout",
    "TextFormatter",
    "configure_logging",
    "parse_log_level",
    "set_call_fields_provider",
]

#: Record attributes copied into every line when present.
CALL_FIELDS: Final = ("callId", "taskId", "attemptSeq", "functionId")

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {
    "message",
    "asctime",
    "taskName",
}

CallFieldsProvider = Callable[[], Mapping[str, Any] | None]
_call_fields_provider: CallFieldsProvider | None = None


def set_call_fields_provider(provider: CallFieldsProvider | None) -> None:
    """Register the function that names the running call (``None`` unregisters).

    It is called for every record that does not carry a ``callId`` itself, from
    any thread; it must be cheap and must not log.
    """
    global _call_fields_provider
    _call_fields_provider = provider


def parse_log_level(value: str | None, default: int = logging.INFO) -> int:
    """``BLOCKX_LOG_LEVEL`` to a :mod:`logging` level; unknown values give ``default``."""
    if not value:
        return default
    text = value.strip().lower()
    if text in _LEVELS:
        return _LEVELS[text]
    if text.isdigit():
        return int(text)
    return default


def _format_ts(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class _FieldsFilter(logging.Filter):
    """Stamps ``executorId`` and, when the record has no ``callId``, the running call's fields."""

    def __init__(self, executor_id: str) -> None:
        super().__init__()
        self.executor_id = executor_id

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "executorId"):
            record.executorId = self.executor_id
        provider = _call_fields_provider
        if provider is not None and not hasattr(record, "callId"):
            try:
                fields = provider()
            except Exception:  # a logging hook must never break the caller
                fields = None
            if fields:
                for key, value in fields.items():
                    if value is not None and not hasattr(record, key):
                        setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One compact JSON object per record."""

    def __init__(self) -> None:
        super().__init__()
        import orjson  # already loaded by blockx.wire; imported here to keep text mode light

        self._dumps = orjson.dumps
        self._option = orjson.OPT_NON_STR_KEYS

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _format_ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        attrs = record.__dict__
        executor_id = attrs.get("executorId")
        if executor_id is not None:
            line["executorId"] = executor_id
        for key in CALL_FIELDS:
            value = attrs.get(key)
            if value is not None:
                line[key] = value
        for key, value in attrs.items():
            if key not in _STANDARD_ATTRS and key not in line:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        try:
            return self._dumps(line, default=repr, option=self._option).decode()
        except TypeError:  # e.g. an int beyond 64 bits in `extra`
            return self._dumps(
                {key: repr(value) for key, value in line.items()}, option=self._option
            ).decode()


class TextFormatter(logging.Formatter):
    """Plain lines: ``ts level logger [executorId callId] msg key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        attrs = record.__dict__
        ids = " ".join(
            f"{key}={attrs[key]}"
            for key in ("executorId", *CALL_FIELDS)
            if attrs.get(key) is not None
        )
        extras = " ".join(
            f"{key}={value!r}"
            for key, value in attrs.items()
            if key not in _STANDARD_ATTRS and key not in CALL_FIELDS and key != "executorId"
        )
        text = (
            f"{_format_ts(record.created)} {record.levelname.lower():<8} {record.name} "
            f"[{ids}] {record.getMessage()}"
        )
        if extras:
            text += f" {extras}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text


class JsonLinesStdout(io.TextIOBase):
    """``sys.stdout`` whose whole lines go out as JSON lines naming the running call (see
    the module docstring); a partial line waits for its newline (or :meth:`flush`)."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        import orjson

        self._dumps = orjson.dumps
        self._stream = stream
        self._partial = ""
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"JsonLinesStdout({self._stream!r}, partial={len(self._partial)} chars)"

    @property
    def wrapped(self) -> IO[str]:
        return self._stream

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    @property
    def buffer(self) -> Any:
        return getattr(self._stream, "buffer", None)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()

    def write(self, text: str) -> int:
        with self._lock:
            head, newline, self._partial = (self._partial + text).rpartition("\n")
            if newline:
                self._emit(head.split("\n"))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                partial, self._partial = self._partial, ""
                self._emit([partial])
            self._stream.flush()

    def _emit(self, lines: list[str]) -> None:
        provider = _call_fields_provider
        fields: Mapping[str, Any] | None = None
        if provider is not None:
            try:
                fields = provider()
            except Exception:  # never break the caller's print()
                fields = None
        ts = _format_ts(time.time())
        for line in lines:
            record: dict[str, Any] = {"ts": ts, "level": "info", "msg": line.rstrip("\r")}
            if fields:
                for key in CALL_FIELDS:
                    value = fields.get(key)
                    if value is not None:
                        record[key] = value
            try:
                data = self._dumps(record, default=repr).decode()
            except TypeError:
                data = self._dumps({key: str(value) for key, value in record.items()}).decode()
            self._stream.write(data + "\n")


def configure_logging(
    executor_id: str,
    *,
    environ: Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Install the executor's handler on the root logger; return it.

    Replaces handlers installed by an earlier call (so tests may call it
    repeatedly). ``environ`` and ``stream`` default to ``os.environ`` and
    ``sys.stderr``.
    """
    env = os.environ if environ is None else environ
    level = parse_log_level(env.get("BLOCKX_LOG_LEVEL"))
    fmt = (env.get("BLOCKX_LOG_FORMAT") or "json").strip().lower()
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(TextFormatter() if fmt == "text" else JsonFormatter())
    handler.addFilter(_FieldsFilter(executor_id))
    handler.set_name("blockx-executor")
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == "blockx-executor":
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    explicit = (env.get("BLOCKX_LOG_FORMAT") or "").strip().lower() == "json"
    stdout = sys.stdout
    if (
        explicit
        and stream is None
        and stdout is not None
        and not isinstance(stdout, JsonLinesStdout)
    ):
        sys.stdout = JsonLinesStdout(stdout)  # print() output named by its call
    return handler

"""The executor's stdout / stderr, forwarded to the worker's log line by line.

The pool hands each child pipe to an :class:`OutputReader`: a non-blocking fd read
from the event loop (``add_reader``), split into lines, each logged on the
``blockx.worker.executor`` logger with the executor id. The executor writes JSON log
lines; their level, message and call fields are kept (as the record's ``executorText``,
``callId``, ... : ``blockx.observability.logs`` writes them out under ``--log-format json``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Final

import orjson

__all__ = ["OutputReader"]

_output_log = logging.getLogger("blockx.worker.executor")

#: Longest forwarded output line; the rest is cut.
_MAX_LINE: Final = 64 * 1024
_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
#: Fields of the executor's JSON log lines kept on the forwarded record.
_FORWARDED_FIELDS: Final = ("callId", "taskId", "attemptSeq", "functionId")


class OutputReader:
    """Forwards one child pipe to the log, line by line, from the event loop."""

    __slots__ = ("_buffer", "_fd", "_loop", "_stream", "executor_id")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fd: int, executor_id: str, stream: str
    ) -> None:
        self._loop = loop
        self._fd = fd
        self._stream = stream
        self._buffer = bytearray()
        self.executor_id = executor_id
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        buffer = self._buffer
        buffer += data
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            self._emit(bytes(buffer[start:end]))
            start = end + 1
        del buffer[:start]
        if len(buffer) > _MAX_LINE:
            self._emit(bytes(buffer[:_MAX_LINE]) + b" [cut]")
            buffer.clear()

    def close(self) -> None:
        """Stop reading (EOF or pool shutdown); the rest of the buffer is logged."""
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        if self._buffer:
            self._emit(bytes(self._buffer))
            self._buffer.clear()

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _emit(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        if not text:
            return
        executor_id = self.executor_id
        level = logging.WARNING if self._stream == "stderr" else logging.INFO
        extra: dict[str, Any] = {"executorId": executor_id, "executorStream": self._stream}
        if text.startswith("{"):
            try:
                record = orjson.loads(text)
            except orjson.JSONDecodeError:
                record = None
            if isinstance(record, dict) and "msg" in record:
                level = _LEVELS.get(str(record.get("level", "")).lower(), level)
                text = str(record["msg"])
                if record.get("exc"):
                    text += "\n" + str(record["exc"])
                for key in _FORWARDED_FIELDS:
                    if key in record:
                        extra[key] = record[key]
                if "logger" in record:
                    extra["executorLogger"] = record["logger"]
        if _output_log.isEnabledFor(level):
            extra["executorText"] = text  # without the prefix: a JSON log line's message
            _output_log.log(level, "[%s] %s", executor_id, text, extra=extra)

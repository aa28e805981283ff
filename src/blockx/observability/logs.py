"""JSON log lines on stderr for ``blockx run`` and ``blockx serve`` (``--log-format json``).

Theory of operation
-------------------
The format is chosen once per command (:func:`resolve_log_format`): the option
``--log-format json|text``, else ``BLOCKX_LOG_FORMAT``, else ``text``. In ``json``
every line the command writes to stderr is one JSON object (:func:`json_line`)::

    {"ts": "2026-12-01T23:53:11.123Z", "level": "info", "logger": "blockx.cli",
     "message": "...", "task_id": "...", "call_id": "...", "executor": "exec-0", ...}

``ts`` is RFC 3339 in UTC with milliseconds, ``level`` a lower-case
:mod:`logging` level name, ``logger`` the logger's name, ``message`` the text
(one record may span lines: JSON escapes the newlines, so it stays one line).
``task_id``, ``call_id``, ``executor`` are there when known, and so are a few more
fields a record carries (``attempt``, ``function``, ``stream``, ...). An
executor's line names the worker's run of the task (``TASK_ID#N``): its
``task_id`` is the task's (as in the CLI's records), ``task_run`` the run's;
``call_id`` (``TASK_ID#N/cI``) is the same everywhere.

Where the lines come from:

* log records of the worker, the CLI and ``blockx serve`` (and aiohttp's, in
  ``blockx serve``): :class:`JsonLogFormatter`, which maps the fields the
  executor's lines are forwarded with (:mod:`blockx.worker.pool.output`:
  ``executorId``, ``callId``, ``taskId``, ...) to the names above — so an
  executor's own JSON line, forwarded by the worker, comes out in the same stream
  tagged with its ``executor``;
* texts the CLI writes itself (warnings, the failure report — one record per
  failed call —, the summary — one record, its figures under ``summary``):
  :func:`json_line` with the fields the CLI knows;
* anything else written to ``sys.stderr`` (a Python warning, a thread's
  traceback) while ``blockx run``'s writer is attached: wrapped, one record per
  write (logger ``stderr``).

The executors write JSON lines already (their default,
:mod:`blockx.executor.logging_setup`); in ``json`` the command makes sure they do
(:func:`executors_write_json`: ``BLOCKX_LOG_FORMAT=json`` in the environment they
inherit), so the worker can read each line's level and call fields.

This module imports only the standard library: ``blockx.cli.console`` and
``blockx.cli.serve`` import it before anything heavy.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, MutableMapping
from typing import Any, Final

__all__ = [
    "LOG_FORMATS",
    "LOG_FORMAT_ENV",
    "RECORD_FIELDS",
    "JsonLogFormatter",
    "LogFormatError",
    "executors_write_json",
    "json_line",
    "record_fields",
    "record_message",
    "resolve_log_format",
    "rfc3339",
]

#: The environment variable that chooses the format when no option does.
LOG_FORMAT_ENV: Final = "BLOCKX_LOG_FORMAT"
#: The formats; the first is the default.
LOG_FORMATS: Final = ("text", "json")

#: Record attributes (as the worker forwards an executor's line, or as ``extra=``
#: gives them) and the key each gets in a JSON line.
RECORD_FIELDS: Final = (
    ("taskId", "task_id"),
    ("task_id", "task_id"),
    ("callId", "call_id"),
    ("call_id", "call_id"),
    ("executorId", "executor"),
    ("executor", "executor"),
    ("attemptSeq", "attempt"),
    ("functionId", "function"),
    ("executorStream", "stream"),
    ("executorLogger", "executor_logger"),
)
#: A record's attribute holding more fields for its line (a dict: ``extra={"fields": ...}``).
EXTRA_FIELDS_ATTR: Final = "fields"


class LogFormatError(ValueError):
    """``BLOCKX_LOG_FORMAT`` (or the option) names no format."""


def resolve_log_format(option: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``option`` when given, else ``BLOCKX_LOG_FORMAT``, else ``text``.

    Raises :class:`LogFormatError` for an unknown value in the environment (the option's
    are checked by argparse)."""
    if option:
        return option
    env = os.environ if environ is None else environ
    value = (env.get(LOG_FORMAT_ENV) or "").strip().lower()
    if not value:
        return LOG_FORMATS[0]
    if value not in LOG_FORMATS:
        given = env.get(LOG_FORMAT_ENV)
        raise LogFormatError(f"{LOG_FORMAT_ENV}={given!r}: expected text or json")
    return value


def executors_write_json(environ: MutableMapping[str, str] | None = None) -> None:
    """Make the executors this process starts write JSON lines (they inherit
    ``BLOCKX_LOG_FORMAT``; a sandboxed executor gets it passed on too)."""
    env = os.environ if environ is None else environ
    env[LOG_FORMAT_ENV] = "json"


def rfc3339(created: float) -> str:
    """``created`` (seconds since the epoch) as RFC 3339 UTC with milliseconds:
    ``2026-12-01T23:53:11.123Z``."""
    seconds = int(created)
    millis = min(int((created - seconds) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _dumps(data: Mapping[str, Any]) -> str:
    try:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):  # a key that is not a string, a circular value
        return json.dumps(
            {str(key): repr(value) for key, value in data.items()},
            ensure_ascii=False,
            separators=(",", ":"),
        )


def json_line(
    level: str,
    logger: str,
    message: str,
    fields: Mapping[str, Any] | None = None,
    *,
    created: float | None = None,
) -> str:
    """One JSON object (no newline): ``ts``, ``level``, ``logger``, ``message``, then
    ``fields`` (those that are not None; the four keys above are never overwritten)."""
    line: dict[str, Any] = {
        "ts": rfc3339(time.time() if created is None else created),
        "level": level,
        "logger": logger,
        "message": message,
    }
    if fields:
        for key, value in fields.items():
            if value is not None and key not in line:
                line[key] = value
    return _dumps(line)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The known fields a record carries (see :data:`RECORD_FIELDS`), by their JSON names."""
    attrs = record.__dict__
    fields: dict[str, Any] = {}
    for attr, key in RECORD_FIELDS:
        value = attrs.get(attr)
        if value is not None and key not in fields:
            fields[key] = value
    run = attrs.get("taskId")
    if isinstance(run, str):
        # The worker's id of a run is the task's id and "#N" (blockx.worker.app): the
        # task's id is what the CLI's and the service's records name; the run's is kept.
        task_id, hash_sign, seq = run.rpartition("#")
        if hash_sign and task_id and seq.isdigit():
            fields["task_id"] = task_id
            fields["task_run"] = run
    more = attrs.get(EXTRA_FIELDS_ATTR)
    if isinstance(more, Mapping):
        for key, value in more.items():
            fields.setdefault(str(key), value)
    return fields


def record_message(record: logging.LogRecord) -> str:
    """The record's text; a line forwarded from an executor without the ``[exec-0]``
    prefix the text format gives it (its ``executor`` field says which)."""
    text = record.__dict__.get("executorText")
    if isinstance(text, str):
        return text
    return record.getMessage()


class JsonLogFormatter(logging.Formatter):
    """A :mod:`logging` record as one JSON line (see the module docstring); a traceback
    goes under ``exc``, a stack under ``stack``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["exc"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json_line(
            record.levelname.lower(),
            record.name,
            record_message(record),
            fields,
            created=record.created,
        )

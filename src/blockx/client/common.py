"""What both clients share: errors, the row stream's reconnect bookkeeping, what ``submit``
sends (the package docstring of :mod:`blockx.client` tells the whole story).

:class:`RowCursor` is pure (no clock, no IO): the clients sleep the delays it returns.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from blockx.cli.taskfile import TaskFile

__all__ = [
    "BATCH_BYTES",
    "BATCH_LINES",
    "DEFAULT_SERVER",
    "FINISHED_STATES",
    "ClientError",
    "RowCursor",
    "ServerUnavailable",
    "TaskUpload",
    "iter_call_batches",
    "prepare_upload",
    "problem_error",
    "unavailable",
]

#: The server when neither ``url`` nor ``$BLOCKX_SERVER`` says.
DEFAULT_SERVER: Final = "http://127.0.0.1:8470"
#: A calls file is POSTed in batches of at most this many lines ...
BATCH_LINES: Final = 10_000
#: ... and at most this many bytes (a longer single line goes alone).
BATCH_BYTES: Final = 4 * 1024 * 1024
#: The states a task ends in.
FINISHED_STATES: Final = frozenset({"succeeded", "failed", "cancelled"})
#: Backoff before the n-th reconnect in a row: FIRST * 2**(n-1), at most MAX (seconds).
BACKOFF_FIRST_S: Final = 0.05
BACKOFF_MAX_S: Final = 2.0
#: Bytes asked for per read of a row stream.
READ_BLOCK: Final = 64 * 1024

RowKind = Literal["rows", "lines", "blocks"]


# --- errors ----------------------------------------------------------------------------------


class ClientError(Exception):
    """The server refused a request (``status``: its HTTP status; ``problem``: its RFC 9457
    body), or could not be reached (:class:`ServerUnavailable`, ``status`` None)."""

    def __init__(self, status: int | None, problem: Mapping[str, Any], message: str) -> None:
        super().__init__(message)
        self.status = status
        self.problem: dict[str, Any] = dict(problem)

    @property
    def problems(self) -> list[dict[str, Any]]:
        """The problem's ``problems`` list (an invalid task: ``{"path", "message"}`` each)."""
        found = self.problem.get("problems")
        return [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []


class ServerUnavailable(ClientError):
    """No answer from the server: connection refused, name unknown, reset before an answer."""


def problem_error(
    status: int, reason: str, body: bytes, *, url: str, token_given: bool
) -> ClientError:
    """The :class:`ClientError` of an error answer (a problem document, or any body)."""
    problem: dict[str, Any]
    try:
        decoded = json.loads(body) if body else {}
        problem = decoded if isinstance(decoded, dict) else {"detail": str(decoded)}
    except ValueError:
        problem = {"detail": body.decode("utf-8", "replace").strip()[:500]}
    title = str(problem.get("title") or reason or "error")
    detail = str(problem.get("detail") or "")
    listed = [p for p in problem.get("problems") or () if isinstance(p, dict)]
    if listed and listed[0].get("path"):  # the detail repeats the first problem: listed below
        detail = detail.split(f": {listed[0]['path']}: ", 1)[0]
    head = f"{status} {title}" + (f": {detail}" if detail and detail != title else "")
    if status == 401:
        head += (
            " — the server refused the token (check --token-file / $BLOCKX_TOKEN)"
            if token_given
            else " — the server needs a token: give --token-file FILE or set $BLOCKX_TOKEN"
        )
    lines = [f"{url}: {head}"]
    for item in listed:
        path = item.get("path")
        lines.append(f"  {path}: {item.get('message')}" if path else f"  {item.get('message')}")
    return ClientError(status, problem, "\n".join(lines))


def unavailable(url: str, exc: BaseException) -> ServerUnavailable:
    """The :class:`ServerUnavailable` of a failed connection to ``url``."""
    why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return ServerUnavailable(
        None,
        {"detail": why},
        f"cannot reach the BlockX server at {url}: {why} (is it running? start one with "
        f"`blockx serve`, or give --server URL / $BLOCKX_SERVER)",
    )


def retryable(exc: ClientError) -> bool:
    """Worth another try: no answer, a 5xx, or 429 (queue full)."""
    return exc.status is None or exc.status >= 500 or exc.status == 429


# --- the reconnect bookkeeping (pure) ----------------------------------------------------------


class RowCursor:
    """Where a row stream is and how many reopenings failed in a row.

    ``position`` is the number of the next row (rows ``[0, position)`` were handed
    out): the ``after`` of the next reopening. ``feed`` cuts whole lines out of the
    bytes read (a partial line waits for the rest, and is dropped with the
    connection). ``dropped`` counts a failure and returns the delay before the next
    try, or raises :class:`ClientError` when ``max_failures`` failed in a row;
    ``opened`` (an answer 200) starts the count again.
    """

    __slots__ = ("failures", "max_failures", "partial", "position", "reconnects")

    def __init__(self, position: int = 0, *, max_failures: int = 10) -> None:
        if position < 0:
            raise ValueError(f"after must be >= 0, got {position}")
        self.position = position
        self.max_failures = max_failures
        #: Failed attempts (drops, refusals, 5xx) since the last successful opening.
        self.failures = 0
        #: Openings after the first.
        self.reconnects = 0
        self.partial = b""

    def __repr__(self) -> str:
        return (
            f"RowCursor(position={self.position}, failures={self.failures}/{self.max_failures}, "
            f"reconnects={self.reconnects}, partial={len(self.partial)} bytes)"
        )

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """``(whole lines, how many)`` of ``data`` after what was left over; position advances."""
        cut = data.rfind(b"\n")
        if cut < 0:
            self.partial += data
            return b"", 0
        block = self.partial + data[: cut + 1] if self.partial else data[: cut + 1]
        self.partial = data[cut + 1 :]
        count = block.count(b"\n")
        self.position += count
        return block, count

    def opened(self) -> None:
        self.failures = 0

    def dropped(self, error: BaseException, url: str) -> float:
        """A failed attempt: the delay before the next one, or :class:`ClientError`."""
        self.partial = b""
        self.failures += 1
        self.reconnects += 1
        if self.failures > self.max_failures:
            if isinstance(error, ClientError):
                detail = str(error)
            else:
                detail = f"{type(error).__name__}: {error}"
            raise ClientError(
                getattr(error, "status", None),
                {"detail": detail},
                f"{url}: gave up reading rows after {self.failures - 1} failed reconnects "
                f"at row {self.position} (read on with `?after={self.position}`); last "
                f"error: {detail}",
            ) from error
        return float(min(BACKOFF_FIRST_S * 2.0 ** (self.failures - 1), BACKOFF_MAX_S))

    def ended(self, status: Mapping[str, Any]) -> bool:
        """After a clean end of a stream: whether it was all (else reopen)."""
        self.partial = b""
        return status.get("state") in FINISHED_STATES and self.position >= int(
            status.get("rows") or 0
        )


# --- what submit sends -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskUpload:
    """A task ready to send: the document for ``POST /v1/tasks`` and, for a calls-file
    task, the file whose lines follow (``POST .../calls``)."""

    document: dict[str, Any]
    calls_file: Path | None = None
    #: The checked task file (None for a dict): for locations in failure reports.
    spec: TaskFile | None = None
    #: What the task file says that is not sent (its ``io`` section), one line each.
    warnings: tuple[str, ...] = ()


def prepare_upload(task: str | os.PathLike[str] | Mapping[str, Any]) -> TaskUpload:
    """The :class:`TaskUpload` of a task file (read and checked here, like ``blockx
    validate``: :class:`~blockx.cli.taskfile.SpecError` on a problem) or of a dict (as is).

    A task file's ``io`` section is left out (the server refuses one: its own IO
    configuration applies), with a line in ``warnings`` saying so."""
    if isinstance(task, Mapping):
        return TaskUpload(dict(task))
    from blockx.cli.taskfile import SpecError, load_task_file

    spec = load_task_file(task)
    from blockx.cli.console import indent

    problems = [
        p.message + (f"\n{indent(p.excerpt, '    ')}" if p.excerpt else "")
        for p in spec.code_problems()
    ]
    warnings: tuple[str, ...] = ()
    if spec.io:  # the server refuses one: its own IO configuration applies to every task
        warnings = (
            f"{spec.label}: io: not sent: the server's IO configuration applies to a "
            "submitted task (blockx serve --config)",
        )
    if spec.is_stream:
        spec.scan_calls_file()
    if problems:
        raise SpecError(problems)
    document: dict[str, Any] = {
        "functions": {fid: {"source": fn.source} for fid, fn in spec.functions.items()}
    }
    if spec.task_id is not None:
        document["task_id"] = spec.task_id
    if spec.instance is not None:
        document["instance"] = spec.instance
    if spec.policy:
        document["policy"] = dict(spec.policy)
    if spec.audit is not None:
        document["audit"] = spec.audit
    if spec.is_stream:
        document["calls_stream"] = True
    else:
        document["calls"] = [{"function": fid, "args": args} for fid, args in spec.calls or ()]
    return TaskUpload(document, spec.calls_file, spec, warnings)


def iter_call_batches(
    path: str | os.PathLike[str], *, max_lines: int = BATCH_LINES, max_bytes: int = BATCH_BYTES
) -> Iterator[tuple[bytes, int]]:
    """``(JSON Lines body, line count)`` batches of a calls file, blank lines left out."""
    lines: list[bytes] = []
    size = 0
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                raw += b"\n"
            if lines and (len(lines) >= max_lines or size + len(raw) > max_bytes):
                yield b"".join(lines), len(lines)
                lines, size = [], 0
            lines.append(raw)
            size += len(raw)
    if lines:
        yield b"".join(lines), len(lines)


def server_url(url: str | None) -> str:
    chosen = (url or os.environ.get("BLOCKX_SERVER") or DEFAULT_SERVER).strip().rstrip("/")
    if "://" not in chosen:
        chosen = "http://" + chosen
    parts = urllib.parse.urlsplit(chosen)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a server URL: {chosen!r} (expected http://HOST:PORT)")
    return chosen


def default_token(token: str | None) -> str | None:
    chosen = token if token is not None else os.environ.get("BLOCKX_TOKEN")
    return chosen.strip() or None if chosen is not None else None


def task_path(task_id: str, tail: str = "") -> str:
    return f"/v1/tasks/{urllib.parse.quote(task_id, safe='')}{tail}"


def decode_lines(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines() if line.strip()]

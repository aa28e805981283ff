"""The synchronous client: :class:`Client` (stdlib :mod:`http.client`, one keep-alive
connection), :class:`RemoteTask`, :class:`RowStream` (see :mod:`blockx.client`)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.parse
import warnings
from collections.abc import Generator, Iterator, Mapping
from typing import Any

from blockx.client.common import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    BATCH_BYTES,
    BATCH_LINES,
    FINISHED_STATES,
    READ_BLOCK,
    ClientError,
    RowCursor,
    RowKind,
    TaskUpload,
    decode_lines,
    default_token,
    iter_call_batches,
    prepare_upload,
    problem_error,
    retryable,
    server_url,
    task_path,
    unavailable,
)

__all__ = ["Client", "RemoteTask", "RowStream"]


class Client:
    """A connection to a ``blockx serve`` (see the module docstring).

    ``url``: default ``$BLOCKX_SERVER``, else :data:`DEFAULT_SERVER`. ``token``:
    default ``$BLOCKX_TOKEN``. ``timeout``: seconds for a request's answer and for
    each read of a row stream (a stream that times out is reopened). Not for
    several threads at once (one keep-alive connection).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        reconnect_attempts: int = 10,
        batch_lines: int = BATCH_LINES,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        self.url = server_url(url)
        self.token = default_token(token)
        self.timeout = timeout
        self.reconnect_attempts = reconnect_attempts
        #: A calls file is POSTed in batches of at most this many lines and bytes.
        self.batch_lines = batch_lines
        self.batch_bytes = batch_bytes
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None
        self._last_used = 0.0

    def __repr__(self) -> str:
        return f"Client({self.url!r}, token={'set' if self.token else 'none'})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- requests --------------------------------------------------------------------------------

    def new_connection(self, timeout: float | None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json, application/problem+json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if extra:
            headers.update(extra)
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        content_type: str | None = None,
        expect: tuple[int, ...] = (200,),
        timeout: float | None = -1.0,
    ) -> tuple[int, bytes]:
        """One request on the keep-alive connection: ``(status, body)``; an answer not in
        ``expect`` raises :class:`ClientError`. ``timeout`` -1: the client's."""
        extra = {"Content-Type": content_type} if content_type else None
        headers = self.headers(extra)
        wait = self.timeout if timeout == -1.0 else timeout
        # A connection idle a while may have been closed by the server: a POST (not safe to
        # send twice) goes on a fresh one then; a GET / DELETE is simply tried again.
        if self._conn is not None and method == "POST" and time.monotonic() - self._last_used > 1:
            self.close()
        for attempt in (0, 1):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = self.new_connection(wait)
            conn = self._conn
            conn.timeout = wait
            if conn.sock is not None:
                conn.sock.settimeout(wait)
            try:
                conn.request(method, self._prefix + path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (ConnectionError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 0 and reused and method != "POST":
                    continue
                raise unavailable(self.url, exc) from exc
            except OSError as exc:  # refused, unknown host, timeout
                self.close()
                raise unavailable(self.url, exc) from exc
            self._last_used = time.monotonic()
            if response.will_close:
                self.close()
            if response.status not in expect:
                raise problem_error(
                    response.status,
                    response.reason,
                    data,
                    url=self.url,
                    token_given=self.token is not None,
                )
            return response.status, data
        raise AssertionError("unreachable")  # pragma: no cover

    def get_json(self, path: str) -> Any:
        return json.loads(self.request("GET", path)[1])

    # --- the API ---------------------------------------------------------------------------------

    def submit(self, task: str | os.PathLike[str] | Mapping[str, Any]) -> RemoteTask:
        """Send a task (a task file's path, or a dict in the task-file schema) and return
        it once the server has it (a calls-file task: once every call is sent and it is
        closed). A bad task file raises :class:`~blockx.cli.taskfile.SpecError` before
        anything is sent; the server's refusal a :class:`ClientError` (400: its problems)."""
        upload = prepare_upload(task)
        for warning in upload.warnings:
            warnings.warn(warning, UserWarning, stacklevel=2)
        return self.submit_upload(upload)

    def submit_upload(self, upload: TaskUpload) -> RemoteTask:
        """:meth:`submit` of a prepared :class:`TaskUpload`."""
        task = self.create(upload)
        if upload.calls_file is not None:
            self.upload_calls(task, upload.calls_file)
        return task

    def create(self, upload: TaskUpload) -> RemoteTask:
        """``POST /v1/tasks``: the task, its calls not yet sent when it streams a calls file
        (then :meth:`upload_calls`, possibly on another :class:`Client` in another thread,
        while this one reads the rows)."""
        body = json.dumps(upload.document, ensure_ascii=False).encode("utf-8")
        _, data = self.request(
            "POST", "/v1/tasks", body, content_type="application/json", expect=(201,)
        )
        answer = json.loads(data)
        return RemoteTask(self, str(answer["id"]), answer.get("task_id"))

    def upload_calls(self, task: RemoteTask, calls_file: str | os.PathLike[str]) -> int:
        """Send a calls file's lines to a streamed task in batches, then close its calls; the
        number of calls. On any failure the task is cancelled (half a task is no task) and
        the error raised."""
        on_this = RemoteTask(self, task.id, task.task_id)
        total = 0
        try:
            for batch, count in iter_call_batches(
                calls_file, max_lines=self.batch_lines, max_bytes=self.batch_bytes
            ):
                total = on_this.send_calls(batch, count)
            on_this.close_calls()
        except BaseException:
            try:
                on_this.cancel()
            except (ClientError, OSError):
                pass
            raise
        return total

    def task(self, task_id: str) -> RemoteTask:
        """A task already on the server, by its id (``t-...``)."""
        return RemoteTask(self, task_id, None)

    def tasks(self, state: str | None = None) -> list[dict[str, Any]]:
        """Every task's status object, oldest first (``state``: only those in it)."""
        query = "?" + urllib.parse.urlencode({"state": state}) if state else ""
        return list(self.get_json("/v1/tasks" + query)["tasks"])

    def ready(self) -> dict[str, Any]:
        """``GET /readyz``: ``{"status": "ready", "executors": n}`` or a ClientError (503)."""
        return dict(self.get_json("/readyz"))


class RemoteTask:
    """A task on a server (see :class:`Client`)."""

    __slots__ = ("client", "id", "task_id")

    def __init__(self, client: Client, id: str, task_id: str | None) -> None:
        self.client = client
        self.id = id
        self.task_id = task_id

    def __repr__(self) -> str:
        return f"RemoteTask({self.id!r}, task_id={self.task_id!r}, server={self.client.url!r})"

    def status(self) -> dict[str, Any]:
        """The status object (state, counters, times; ``summary`` once it ended)."""
        return dict(self.client.get_json(task_path(self.id)))

    def send_calls(self, body: bytes, count: int) -> int:
        """Append calls (JSON Lines, ``count`` of them) to a streamed task; the total so far.

        Held by the server while the task's window is full (no timeout here). When the
        answer is lost, the task's ``calls`` counter tells whether the batch arrived: it
        is sent again only if it did not."""
        before = int(self.status()["calls"])
        path = task_path(self.id, "/calls")
        for attempt in range(self.client.reconnect_attempts + 1):
            try:
                _, data = self.client.request(
                    "POST", path, body, content_type="application/x-ndjson", timeout=None
                )
                return int(json.loads(data)["calls"])
            except ClientError as exc:
                if not retryable(exc) or attempt == self.client.reconnect_attempts:
                    raise
                time.sleep(min(BACKOFF_FIRST_S * 2**attempt, BACKOFF_MAX_S))
                try:
                    now = int(self.status()["calls"])
                except ClientError:
                    continue
                if now >= before + count:
                    return now
        raise AssertionError("unreachable")  # pragma: no cover

    def close_calls(self) -> dict[str, Any]:
        """No more calls for a streamed task; its status."""
        _, data = self.client.request("POST", task_path(self.id, "/close"))
        return dict(json.loads(data))

    def rows(self, after: int = 0) -> RowStream:
        """The task's rows, decoded, from row ``after`` on: an iterator that follows the task
        while it runs and survives reconnects (every row once, in order)."""
        return RowStream(self, after, "rows")

    def row_lines(self, after: int = 0) -> RowStream:
        """Like :meth:`rows`, the raw JSON lines (bytes, each ending in ``\\n``)."""
        return RowStream(self, after, "lines")

    def row_blocks(self, after: int = 0) -> RowStream:
        """Like :meth:`row_lines`, whole lines as they arrive, several at a time (bytes)."""
        return RowStream(self, after, "blocks")

    def wait(self, timeout: float | None = None, *, poll: float = 0.5) -> dict[str, Any]:
        """The status once the task has ended (polls); TimeoutError after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        failures = 0
        while True:
            try:
                status = self.status()
                failures = 0
            except ClientError as exc:
                failures += 1
                if not retryable(exc) or failures > self.client.reconnect_attempts:
                    raise
            else:
                if status.get("state") in FINISHED_STATES:
                    return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self.id} did not end within {timeout} s")
            time.sleep(delay)
            delay = min(delay * 2, poll)

    def cancel(self) -> dict[str, Any]:
        """Cancel the task (nothing changes for a finished one); its status."""
        _, data = self.client.request("DELETE", task_path(self.id), expect=(202,))
        return dict(json.loads(data))

    def purge(self) -> None:
        """Delete a finished task's data from the server."""
        self.client.request("DELETE", task_path(self.id) + "?purge=true", expect=(204,))

    def failures(self) -> list[dict[str, Any]]:
        """The finally failed calls (``index, function, args, kind, message, stack,
        attempts, retryable``), by index."""
        return decode_lines(self.client.request("GET", task_path(self.id, "/failures"))[1])


class RowStream:
    """An iterator over a task's rows that reopens the stream where it broke off.

    ``position``: rows handed out so far (counting the ``after`` it started at);
    ``reconnects``: how many times it reopened. ``close()`` ends it."""

    __slots__ = ("_conn", "_cursor", "_gen", "kind", "task")

    def __init__(self, task: RemoteTask, after: int, kind: RowKind) -> None:
        self.task = task
        self.kind: RowKind = kind
        self._cursor = RowCursor(after, max_failures=task.client.reconnect_attempts)
        self._conn: http.client.HTTPConnection | None = None
        self._gen = self._blocks()

    def __repr__(self) -> str:
        return f"RowStream({self.task.id!r}, {self.kind}, {self._cursor!r})"

    @property
    def position(self) -> int:
        return self._cursor.position

    @property
    def reconnects(self) -> int:
        return self._cursor.reconnects

    def __iter__(self) -> Iterator[Any]:
        if self.kind == "blocks":
            return self._gen
        return self._items()

    def _items(self) -> Iterator[Any]:
        for block in self._gen:
            lines = block.split(b"\n")
            lines.pop()  # after the last newline: empty
            if self.kind == "rows":
                for line in lines:
                    yield json.loads(line)
            else:
                for line in lines:
                    yield line + b"\n"

    def close(self) -> None:
        self._gen.close()
        self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _blocks(self) -> Generator[bytes, None, None]:
        client = self.task.client
        cursor = self._cursor
        path = client._prefix + task_path(self.task.id, "/rows")
        try:
            while True:
                try:
                    self._conn = conn = client.new_connection(client.timeout)
                    try:
                        conn.request(
                            "GET", f"{path}?after={cursor.position}", headers=client.headers()
                        )
                        response = conn.getresponse()
                    except OSError as exc:
                        raise unavailable(client.url, exc) from exc
                    if response.status != 200:
                        raise problem_error(
                            response.status,
                            response.reason,
                            response.read(),
                            url=client.url,
                            token_given=client.token is not None,
                        )
                    cursor.opened()
                    while True:
                        data = response.read1(READ_BLOCK)
                        if not data:
                            break
                        block, count = cursor.feed(data)
                        if count:
                            yield block
                    self._drop()
                    if cursor.ended(self.task.status()):
                        return
                    delay = BACKOFF_FIRST_S
                except ClientError as exc:
                    if not retryable(exc):
                        raise
                    self._drop()
                    delay = cursor.dropped(exc, client.url)
                except (OSError, http.client.HTTPException) as exc:
                    self._drop()
                    delay = cursor.dropped(exc, client.url)
                time.sleep(delay)
        finally:
            self._drop()

    def _break_connection(self) -> None:
        """Cut the connection under the stream as a network failure would (for tests)."""
        conn = self._conn
        if conn is not None and conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)

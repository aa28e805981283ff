"""The asynchronous client on aiohttp's ``ClientSession``: :class:`AsyncClient`,
:class:`AsyncRemoteTask`, :class:`AsyncRowStream` (the twins of :mod:`blockx.client.sync`)."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
import warnings
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

from blockx.client.common import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    BATCH_BYTES,
    BATCH_LINES,
    FINISHED_STATES,
    ClientError,
    RowCursor,
    RowKind,
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

if TYPE_CHECKING:
    import aiohttp

__all__ = ["AsyncClient", "AsyncRemoteTask", "AsyncRowStream"]


class AsyncClient:
    """The asyncio twin of :class:`Client` on an aiohttp ``ClientSession`` (made on first
    use, inside the running loop; ``await close()`` or ``async with``)."""

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
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r}, token={'set' if self.token else 'none'})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def session(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json, application/problem+json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    def client_timeout(self, total: float | None = -1.0) -> aiohttp.ClientTimeout:
        import aiohttp

        if total == -1.0:
            return aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout, sock_read=self.timeout
            )
        return aiohttp.ClientTimeout(total=total)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        content_type: str | None = None,
        expect: tuple[int, ...] = (200,),
        timeout: float | None = -1.0,
    ) -> tuple[int, bytes]:
        """Like :meth:`Client.request`."""
        import aiohttp

        headers = {"Content-Type": content_type} if content_type else None
        try:
            async with self.session().request(
                method,
                self.url + path,
                data=body,
                headers=headers,
                timeout=self.client_timeout(timeout),
            ) as response:
                data = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise unavailable(self.url, exc) from exc
        if response.status not in expect:
            raise problem_error(
                response.status,
                response.reason or "",
                data,
                url=self.url,
                token_given=self.token is not None,
            )
        return response.status, data

    async def get_json(self, path: str) -> Any:
        return json.loads((await self.request("GET", path))[1])

    async def submit(self, task: str | os.PathLike[str] | Mapping[str, Any]) -> AsyncRemoteTask:
        """Like :meth:`Client.submit` (the task file is read and checked synchronously)."""
        upload = prepare_upload(task)
        for warning in upload.warnings:
            warnings.warn(warning, UserWarning, stacklevel=2)
        body = json.dumps(upload.document, ensure_ascii=False).encode("utf-8")
        _, data = await self.request(
            "POST", "/v1/tasks", body, content_type="application/json", expect=(201,)
        )
        answer = json.loads(data)
        remote = AsyncRemoteTask(self, str(answer["id"]), answer.get("task_id"))
        if upload.calls_file is not None:
            try:
                for batch, count in iter_call_batches(
                    upload.calls_file, max_lines=self.batch_lines, max_bytes=self.batch_bytes
                ):
                    await remote.send_calls(batch, count)
                await remote.close_calls()
            except BaseException:
                try:
                    await remote.cancel()
                except (ClientError, OSError):
                    pass
                raise
        return remote

    def task(self, task_id: str) -> AsyncRemoteTask:
        return AsyncRemoteTask(self, task_id, None)

    async def tasks(self, state: str | None = None) -> list[dict[str, Any]]:
        query = "?" + urllib.parse.urlencode({"state": state}) if state else ""
        return list((await self.get_json("/v1/tasks" + query))["tasks"])

    async def ready(self) -> dict[str, Any]:
        return dict(await self.get_json("/readyz"))


class AsyncRemoteTask:
    """The asyncio twin of :class:`RemoteTask`."""

    __slots__ = ("client", "id", "task_id")

    def __init__(self, client: AsyncClient, id: str, task_id: str | None) -> None:
        self.client = client
        self.id = id
        self.task_id = task_id

    def __repr__(self) -> str:
        return f"AsyncRemoteTask({self.id!r}, task_id={self.task_id!r}, server={self.client.url!r})"

    async def status(self) -> dict[str, Any]:
        return dict(await self.client.get_json(task_path(self.id)))

    async def send_calls(self, body: bytes, count: int) -> int:
        before = int((await self.status())["calls"])
        path = task_path(self.id, "/calls")
        for attempt in range(self.client.reconnect_attempts + 1):
            try:
                _, data = await self.client.request(
                    "POST", path, body, content_type="application/x-ndjson", timeout=None
                )
                return int(json.loads(data)["calls"])
            except ClientError as exc:
                if not retryable(exc) or attempt == self.client.reconnect_attempts:
                    raise
                await asyncio.sleep(min(BACKOFF_FIRST_S * 2**attempt, BACKOFF_MAX_S))
                try:
                    now = int((await self.status())["calls"])
                except ClientError:
                    continue
                if now >= before + count:
                    return now
        raise AssertionError("unreachable")  # pragma: no cover

    async def close_calls(self) -> dict[str, Any]:
        _, data = await self.client.request("POST", task_path(self.id, "/close"))
        return dict(json.loads(data))

    def rows(self, after: int = 0) -> AsyncRowStream:
        return AsyncRowStream(self, after, "rows")

    def row_lines(self, after: int = 0) -> AsyncRowStream:
        return AsyncRowStream(self, after, "lines")

    async def wait(self, timeout: float | None = None, *, poll: float = 0.5) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 0.02
        failures = 0
        while True:
            try:
                status = await self.status()
                failures = 0
            except ClientError as exc:
                failures += 1
                if not retryable(exc) or failures > self.client.reconnect_attempts:
                    raise
            else:
                if status.get("state") in FINISHED_STATES:
                    return status
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"task {self.id} did not end within {timeout} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, poll)

    async def cancel(self) -> dict[str, Any]:
        _, data = await self.client.request("DELETE", task_path(self.id), expect=(202,))
        return dict(json.loads(data))

    async def purge(self) -> None:
        await self.client.request("DELETE", task_path(self.id) + "?purge=true", expect=(204,))

    async def failures(self) -> list[dict[str, Any]]:
        return decode_lines((await self.client.request("GET", task_path(self.id, "/failures")))[1])


class AsyncRowStream:
    """The asyncio twin of :class:`RowStream` (``async for``)."""

    __slots__ = ("_cursor", "_gen", "_response", "kind", "task")

    def __init__(self, task: AsyncRemoteTask, after: int, kind: RowKind) -> None:
        self.task = task
        self.kind: RowKind = kind
        self._cursor = RowCursor(after, max_failures=task.client.reconnect_attempts)
        self._response: aiohttp.ClientResponse | None = None
        self._gen = self._items()

    def __repr__(self) -> str:
        return f"AsyncRowStream({self.task.id!r}, {self.kind}, {self._cursor!r})"

    @property
    def position(self) -> int:
        return self._cursor.position

    @property
    def reconnects(self) -> int:
        return self._cursor.reconnects

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        return self._gen

    async def aclose(self) -> None:
        await self._gen.aclose()

    async def _items(self) -> AsyncGenerator[Any, None]:
        async for block in self._blocks():
            if self.kind == "blocks":
                yield block
                continue
            lines = block.split(b"\n")
            lines.pop()
            for line in lines:
                yield json.loads(line) if self.kind == "rows" else line + b"\n"

    async def _blocks(self) -> AsyncGenerator[bytes, None]:
        import aiohttp

        client = self.task.client
        cursor = self._cursor
        url = client.url + task_path(self.task.id, "/rows")
        while True:
            try:
                try:
                    response = await client.session().get(
                        url, params={"after": str(cursor.position)}, timeout=client.client_timeout()
                    )
                except (aiohttp.ClientConnectorError, OSError) as exc:
                    raise unavailable(client.url, exc) from exc
                self._response = response
                try:
                    if response.status != 200:
                        raise problem_error(
                            response.status,
                            response.reason or "",
                            await response.read(),
                            url=client.url,
                            token_given=client.token is not None,
                        )
                    cursor.opened()
                    async for data in response.content.iter_any():
                        block, count = cursor.feed(data)
                        if count:
                            yield block
                finally:
                    self._response = None
                    response.release()
                if cursor.ended(await self.task.status()):
                    return
                delay = BACKOFF_FIRST_S
            except ClientError as exc:
                if not retryable(exc):
                    raise
                delay = cursor.dropped(exc, client.url)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                delay = cursor.dropped(exc, client.url)
            await asyncio.sleep(delay)

    def _break_connection(self) -> None:
        """Cut the connection under the stream as a network failure would (for tests)."""
        response = self._response
        if response is not None and response.connection is not None:
            transport = response.connection.transport
            if transport is not None:
                transport.abort()

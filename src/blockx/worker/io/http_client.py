"""A small HTTP/1.1 keep-alive client on asyncio, for the ``rpc`` backend's POSTs.

Theory of operation
-------------------
:class:`HttpClient` answers one question: ``await client.post(url, body, headers)``
→ ``(status, body_bytes)`` (:meth:`HttpClient.post_answer` adds the ``Retry-After``
header's text, for the ``rpc`` backend's rate limits). It exists because aiohttp's
client costs the worker ~0.1–0.2 s of import at the first rpc read (most of it
building SSL contexts) and a few hundred µs of CPU per request; this one imports nothing heavy and
parses a response with a handful of ``bytes.find`` calls.

**Requests.** HTTP/1.1 only. The request is one write: the request line
(path and query of the URL, percent-encoded where needed), ``Host``,
``Content-Type``/``Accept`` and whatever the caller passes, ``Content-Length``,
``Connection: keep-alive``, ``Accept-Encoding: gzip, deflate`` (as aiohttp
sent; a compressed answer is decompressed), and ``Authorization: Basic`` when
the URL carries ``user:password@``. URLs are split once with
``urllib.parse.urlsplit`` and remembered; the default ports are 80 and 443;
an IPv6 literal (``http://[::1]:8545/``) works.

**Responses.** :class:`ResponseParser` (``http_response.py``) is sans-IO: bytes in, a finished
response out (``feed`` / ``feed_eof``). The head ends at the first
``\\r\\n\\r\\n`` (at most :data:`MAX_HEAD_BYTES`); header names are compared
case-insensitively; a body is delimited by ``Transfer-Encoding: chunked``, else
by ``Content-Length``, else by the server closing the connection (then the
connection is not reused). 1xx responses are skipped; 204 and 304 have no
body. Anything else — a bad status line, a header line without a colon, a bad
length or chunk size — raises :class:`MalformedResponseError`.

**Connections.** One :class:`_Connection` (an ``asyncio.Protocol``) per TCP
connection, one request at a time on it. Per ``(scheme, host, port)`` a
:class:`_HostPool` lets at most ``max_connections`` requests hold a connection
at once — the others wait in FIFO order — and keeps the idle connections,
reusing the most recently used first. A connection goes back to the pool
only after a complete response that allows keep-alive (HTTP/1.1, no
``Connection: close``, no read-to-close body, no stray bytes after it); a
connection the server closes while idle leaves the pool at once
(``connection_lost``), and one idle for longer than :data:`IDLE_S` is closed
when next picked.

**Retry on a stale connection.** A server may close an idle keep-alive
connection just as we send on it. So a request that fails on a *reused*
connection before any byte of the response arrived is sent once more on a
*fresh* connection. That is safe here because the ``rpc`` backend's JSON-RPC
calls are reads — idempotent — and it is the only retry this client makes
(the backend's own retries are in ``rpc.py``).

**Writing in the caller's turn.** :meth:`HttpClient.start_post` writes a request
at once, without a coroutine, when a slot and an idle keep-alive connection are
free (else it answers None and the caller uses :meth:`HttpClient.post_answer`);
:meth:`HttpClient.finish_post` then reads its answer exactly as ``post_answer``
would (the stale-connection retry included). The ``rpc`` backend uses it so a
batch leaves in the loop turn that flushed it instead of one turn later, when its
task first runs. A :class:`StartedPost` whose answer nobody will read (its task
cancelled before it ran) is dropped with :meth:`StartedPost.abandon`: its
connection closed, its slot freed.

**Time and cancellation.** ``timeout_s`` bounds a whole ``post`` — waiting for
a slot, connecting, sending, reading — and ends it with ``TimeoutError``.
A request cancelled or timed out mid-way aborts the connection it was using:
a half-read connection never goes back to the pool.

**TLS.** ``https://`` uses ``ssl.create_default_context()``, made when the
first https URL is used (never at import: that is where aiohttp paid);
the server name checked is the URL's host.

**Closing.** :meth:`HttpClient.close` closes every connection, idle or in
use, and wakes the waiters; a ``post`` after it raises
:class:`ClientClosedError`.

Errors: :class:`HttpClientError` is the root. The caller misused the client:
:class:`InvalidURLError`, :class:`ClientClosedError`. The peer misbehaved:
:class:`MalformedResponseError`, :class:`ServerDisconnectedError`. Socket
errors arrive as ``OSError``; the time limit as ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ssl
from collections.abc import Mapping
from typing import Final, cast
from urllib.parse import quote, unquote, urlsplit

from .http_response import (
    MAX_HEAD_BYTES,
    ClientClosedError,
    HttpClientError,
    InvalidURLError,
    MalformedResponseError,
    ResponseParser,
    ServerDisconnectedError,
    decode_body,
)

__all__ = [
    "IDLE_S",
    "MAX_HEAD_BYTES",
    "ClientClosedError",
    "HttpClient",
    "HttpClientError",
    "InvalidURLError",
    "MalformedResponseError",
    "ResponseParser",
    "ServerDisconnectedError",
    "StartedPost",
]

#: An idle connection older than this is closed rather than reused (as aiohttp's 30 s).
IDLE_S: Final = 30.0
#: Characters left as they are when a URL's path and query go on the request line.
_SAFE_TARGET: Final = "!#$%&'()*+,/:;=?@[]~"


# --- connections -------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; one request at a time (see the module docstring)."""

    __slots__ = (
        "_parser",
        "_pool",
        "_waiter",
        "closed",
        "idle_since",
        "received_any",
        "reused",
        "transport",
    )

    def __init__(self, pool: _HostPool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        #: The response being read, or None while idle.
        self._parser: ResponseParser | None = None
        self._waiter: asyncio.Future[ResponseParser] | None = None
        #: Set once the transport is gone or being closed: never used again.
        self.closed = False
        #: Whether a request already completed on this connection.
        self.reused = False
        #: Whether a byte of the current request's response arrived.
        self.received_any = False
        self.idle_since = 0.0

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("busy" if self._waiter is not None else "idle")
        return f"_Connection({self._pool.key!r}, {state}, reused={self.reused})"

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # bytes nobody asked for: the connection is out of step
            self.close()
            return
        self.received_any = True
        try:
            done = parser.feed(data)
        except MalformedResponseError as exc:
            self._fail(exc)
            return
        if done:
            self._complete(parser)

    def eof_received(self) -> bool | None:
        self._end_of_stream(None)
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_of_stream(exc)
        self.closed = True
        self._pool.forget(self)

    # the request

    def send(self, data: bytes) -> asyncio.Future[ResponseParser]:
        """Write one request; the future answers its parsed response."""
        transport = self.transport
        assert transport is not None and self._waiter is None
        waiter: asyncio.Future[ResponseParser] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._parser = ResponseParser()
        self.received_any = False
        if self.closed or transport.is_closing():
            self._fail(ServerDisconnectedError("the connection was closed before the request"))
        else:
            transport.write(data)
        return waiter

    def close(self) -> None:
        self.closed = True
        transport = self.transport
        if transport is not None:
            transport.abort()
        self._fail(ServerDisconnectedError("the connection was closed"))

    def _end_of_stream(self, exc: Exception | None) -> None:
        parser = self._parser
        if parser is None or self._waiter is None:
            return
        try:
            parser.feed_eof()
        except ServerDisconnectedError as disconnected:
            if exc is not None:
                disconnected.__cause__ = exc
            self._fail(disconnected)
            return
        self._complete(parser)

    def _complete(self, parser: ResponseParser) -> None:
        waiter = self._waiter
        self._waiter = None
        self._parser = None
        if parser.extra or not parser.keep_alive:
            self.closed = True
        if waiter is not None and not waiter.done():
            waiter.set_result(parser)

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        self._waiter = None
        self._parser = None
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()
        self._pool.forget(self)
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class _HostPool:
    """The connections to one ``(scheme, host, port)``: at most ``limit`` in use."""

    __slots__ = ("_idle", "_in_use", "_waiters", "all", "key", "limit")

    def __init__(self, key: tuple[str, str, int], limit: int) -> None:
        self.key = key
        self.limit = limit
        #: Idle connections, the most recently used last.
        self._idle: list[_Connection] = []
        #: Requests holding a slot (with or without a connection yet).
        self._in_use = 0
        #: Requests waiting for a slot, FIFO; a waiter's result hands it the slot.
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        #: Every open connection, idle or in use (for close).
        self.all: set[_Connection] = set()

    def __repr__(self) -> str:
        return (
            f"_HostPool({self.key!r}, in_use={self._in_use}/{self.limit}, "
            f"idle={len(self._idle)}, waiting={len(self._waiters)})"
        )

    async def acquire_slot(self) -> None:
        if self._in_use < self.limit and not self._waiters:
            self._in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release_slot()  # the slot was handed over as we were cancelled
            else:
                waiter.cancel()  # release_slot skips it
            raise

    def try_acquire_slot(self) -> bool:
        """Take a free slot now (nobody waiting for one); False when none is free."""
        if self._in_use < self.limit and not self._waiters:
            self._in_use += 1
            return True
        return False

    def release_slot(self) -> None:
        """Hand the slot to the first live waiter, or free it."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: _in_use is unchanged
                return
        self._in_use -= 1

    def take_idle(self, now: float) -> _Connection | None:
        idle = self._idle
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_S:
                return connection
            connection.close()
        return None

    def put_idle(self, connection: _Connection, now: float) -> None:
        connection.idle_since = now
        connection.reused = True
        self._idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        """The connection is closed: drop it (and never hand it out again)."""
        self.all.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        for connection in list(self.all):
            connection.close()
        self.all.clear()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ClientClosedError("the HTTP client was closed"))


class _Target:
    """A URL split once: where to connect and what goes on the request line."""

    __slots__ = ("head_prefix", "host", "key", "port", "scheme")

    def __init__(self, url: str, extra_headers: Mapping[str, str]) -> None:
        try:
            split = urlsplit(url)
            port = split.port
        except ValueError as exc:
            raise InvalidURLError(f"invalid URL {url!r}: {exc}") from exc
        scheme = split.scheme.lower()
        if scheme not in ("http", "https"):
            raise InvalidURLError(f"invalid URL {url!r}: the scheme must be http or https")
        host = split.hostname
        if not host:
            raise InvalidURLError(f"invalid URL {url!r}: no host")
        if port is None:
            port = 443 if scheme == "https" else 80
        self.scheme = scheme
        self.host = host
        self.port = port
        self.key = (scheme, host, port)
        netloc = split.netloc.rpartition("@")[2]
        path = quote(split.path or "/", safe=_SAFE_TARGET)
        if split.query:
            path += "?" + quote(split.query, safe=_SAFE_TARGET)
        lines = [f"POST {path} HTTP/1.1", f"Host: {netloc}"]
        names = {name.lower() for name in extra_headers}
        if split.username is not None and "authorization" not in names:
            credentials = f"{unquote(split.username)}:{unquote(split.password or '')}"
            token = base64.b64encode(credentials.encode("utf-8")).decode("ascii")
            lines.append(f"Authorization: Basic {token}")
        for name, value in extra_headers.items():
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
                raise InvalidURLError(f"header {name!r}: a line break in a header")
            lines.append(f"{name}: {value}")
        if "connection" not in names:
            lines.append("Connection: keep-alive")
        if "accept-encoding" not in names:
            lines.append("Accept-Encoding: gzip, deflate")
        lines.append("Content-Length: ")
        #: The request head up to the Content-Length value.
        self.head_prefix = "\r\n".join(lines).encode("latin-1")

    def __repr__(self) -> str:
        return f"_Target({self.scheme}://{self.host}:{self.port})"


class StartedPost:
    """A request :meth:`HttpClient.start_post` wrote, its answer not read yet.

    Hand it to :meth:`HttpClient.finish_post`, or :meth:`abandon` it; the first of the
    two owns its connection and slot (the second does nothing).
    """

    __slots__ = ("claimed", "client", "connection", "pool", "request", "target", "waiter")

    def __init__(
        self,
        client: HttpClient,
        target: _Target,
        pool: _HostPool,
        connection: _Connection,
        request: bytes,
        waiter: asyncio.Future[ResponseParser],
    ) -> None:
        #: The client that wrote it: the one to finish it.
        self.client = client
        self.target = target
        self.pool = pool
        self.connection = connection
        self.request = request
        self.waiter = waiter
        #: True once finish_post or abandon took the connection and the slot.
        self.claimed = False

    def __repr__(self) -> str:
        return f"StartedPost({self.target.key!r}, claimed={self.claimed})"

    def abandon(self, _done: object = None) -> None:
        """Nobody will read the answer: close the connection, free the slot (unless
        :meth:`HttpClient.finish_post` took them over). Usable as a done callback."""
        if self.claimed:
            return
        self.claimed = True
        waiter = self.waiter
        if waiter.done() and not waiter.cancelled():
            waiter.exception()  # read, so asyncio does not log it as never retrieved
        self.connection.close()
        self.pool.release_slot()


class HttpClient:
    """POSTs over pooled HTTP/1.1 keep-alive connections (see the module docstring).

    Create and use it on one event loop. ``max_connections`` bounds the
    connections in use per ``(scheme, host, port)``; ``timeout_s`` bounds each
    :meth:`post`. ``headers`` go on every request.
    """

    __slots__ = ("_closed", "_pools", "_ssl_context", "_targets", "headers", "limit", "timeout_s")

    def __init__(
        self,
        *,
        max_connections: int = 32,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.limit = max_connections
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self._pools: dict[tuple[str, str, int], _HostPool] = {}
        self._targets: dict[str, _Target] = {}
        self._ssl_context: ssl.SSLContext | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pools={list(self._pools.values())!r}"
        return f"HttpClient({state})"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context, once an https URL was used (None before)."""
        return self._ssl_context

    def open_connections(self) -> int:
        """How many connections are open, idle or in use (for tests and stats)."""
        return sum(len(pool.all) for pool in self._pools.values())

    async def post(self, url: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` to ``url``; answer ``(status, body)``.

        Raises ``TimeoutError`` past ``timeout_s``, ``OSError`` for socket errors,
        :class:`HttpClientError` for the rest. A failure leaves no connection
        half-used: the one in use is closed.
        """
        status, data, _retry_after = await self.post_answer(url, body)
        return status, data

    async def post_answer(self, url: str, body: bytes) -> tuple[int, bytes, str]:
        """As :meth:`post`, answering ``(status, body, retry_after)``: the ``Retry-After``
        header's text, ``""`` when the response has none."""
        if self._closed:
            raise ClientClosedError("the HTTP client was closed")
        target = self._target(url)
        request = b"%s%d\r\n\r\n%s" % (target.head_prefix, len(body), body)
        async with asyncio.timeout(self.timeout_s):
            return await self._exchange(target, request, None)

    def start_post(self, url: str, body: bytes) -> StartedPost | None:
        """Write a POST of ``body`` to ``url`` now, when a slot and an idle connection
        are free; None (nothing done) otherwise, or when the client is closed.

        Read its answer with :meth:`finish_post` (or drop it with
        :meth:`StartedPost.abandon`). Raises :class:`InvalidURLError` for a bad URL.
        """
        if self._closed:
            return None
        target = self._target(url)
        pool = self._pool(target)
        if not pool.try_acquire_slot():
            return None
        connection = pool.take_idle(asyncio.get_running_loop().time())
        if connection is None:
            pool.release_slot()
            return None
        request = b"%s%d\r\n\r\n%s" % (target.head_prefix, len(body), body)
        return StartedPost(self, target, pool, connection, request, connection.send(request))

    async def finish_post(self, started: StartedPost) -> tuple[int, bytes, str]:
        """The answer to a :meth:`start_post`, as :meth:`post_answer` answers (the
        stale-connection retry, ``timeout_s`` and errors alike)."""
        if started.claimed or started.client is not self:
            raise RuntimeError(f"{started!r} was finished or abandoned, or is another client's")
        started.claimed = True
        async with asyncio.timeout(self.timeout_s):
            return await self._exchange(started.target, started.request, started)

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _Target(url, self.headers)
        return target

    def _pool(self, target: _Target) -> _HostPool:
        pool = self._pools.get(target.key)
        if pool is None:
            pool = self._pools[target.key] = _HostPool(target.key, self.limit)
        return pool

    async def _exchange(
        self, target: _Target, request: bytes, started: StartedPost | None
    ) -> tuple[int, bytes, str]:
        loop = asyncio.get_running_loop()
        # The connection in use: closed by the finally unless it went back to the pool.
        connection: _Connection | None = None
        if started is None:
            pool = self._pool(target)
            await pool.acquire_slot()
        else:  # the slot is held and the request written (start_post)
            pool = started.pool
            connection = started.connection
        try:
            if started is None:
                using = pool.take_idle(loop.time())
                if using is None:
                    using = await self._connect(pool, target)
                connection = using
                sent = using.send(request)
            else:
                using = started.connection
                sent = started.waiter
            try:
                parser = await sent
            except (ServerDisconnectedError, ConnectionError):
                if not using.reused or using.received_any:
                    raise
                using.close()  # stale keep-alive connection: once more on a fresh one
                connection = None
                using = connection = await self._connect(pool, target)
                parser = await using.send(request)
            if using.closed:
                using.close()
            else:
                pool.put_idle(using, loop.time())
            connection = None
        except (HttpClientError, OSError) as exc:
            if self._closed and not isinstance(exc, ClientClosedError):
                raise ClientClosedError("the HTTP client was closed") from exc
            raise
        finally:
            if connection is not None:  # failed or cancelled mid-way
                connection.close()
            pool.release_slot()
        body = parser.body
        if parser.content_encoding:
            body = decode_body(body, parser.content_encoding)
        return parser.status, body, parser.retry_after

    async def _connect(self, pool: _HostPool, target: _Target) -> _Connection:
        if self._closed:
            raise ClientClosedError("the HTTP client was closed")
        loop = asyncio.get_running_loop()
        connection = _Connection(pool)
        if target.scheme == "https":
            context = self._ssl_context
            if context is None:
                context = self._ssl_context = ssl.create_default_context()
            await loop.create_connection(
                lambda: connection,
                target.host,
                target.port,
                ssl=context,
                server_hostname=target.host,
            )
        else:
            await loop.create_connection(lambda: connection, target.host, target.port)
        if self._closed:  # closed while connecting
            connection.close()
            raise ClientClosedError("the HTTP client was closed")
        pool.all.add(connection)
        return connection

    async def close(self) -> None:
        """Close every connection; later posts raise :class:`ClientClosedError`."""
        self._closed = True
        for pool in self._pools.values():
            pool.close()
        await asyncio.sleep(0)  # let the transports run their connection_lost

"""The rpc backend's HTTP/1.1 client (``blockx.worker.io.http_client``): its response
parser fed whole and one byte at a time, and the client against real loopback servers
whose answers each test scripts byte for byte (keep-alive reuse, a stale connection,
max_connections, timeouts, cancellation, read-to-close bodies, malformed answers,
TLS with a self-signed certificate), on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import base64
import gzip
import socket
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from blockx.worker.io.http_client import (
    MAX_HEAD_BYTES,
    ClientClosedError,
    HttpClient,
    InvalidURLError,
    MalformedResponseError,
    ResponseParser,
    ServerDisconnectedError,
    _HostPool,
)

pytestmark = pytest.mark.timeout(60)


def ok_response(body: bytes = b'{"ok":1}', *extra_headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra_headers)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        head.encode(),
        body,
    )


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for chunk in chunks:
        out += b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk)
    return out + b"0\r\n" + trailer + b"\r\n"


# --- the parser, without IO -------------------------------------------------------------------


def parse(raw: bytes, *, bytewise: bool, eof: bool = False) -> ResponseParser:
    parser = ResponseParser()
    pieces = [raw[i : i + 1] for i in range(len(raw))] if bytewise else [raw]
    done = False
    for piece in pieces:
        done = parser.feed(piece)
    if eof:
        done = parser.feed_eof()
    assert done and parser.done
    return parser


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize(
    ("raw", "body", "keep_alive", "eof"),
    [
        (ok_response(b"hello"), b"hello", True, False),
        (ok_response(b""), b"", True, False),
        (chunked(b"hel", b"lo\r\n", b"x" * 300), b"hello\r\n" + b"x" * 300, True, False),
        (chunked(b"ab", trailer=b"X-Trailer: 1\r\n"), b"ab", True, False),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + ok_response(b"after"), b"after", True, False),
        (
            b"HTTP/1.1 200 OK\r\nCONTENT-length: 2\r\nConnection: Close\r\n\r\nhi",
            b"hi",
            False,
            False,
        ),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", b"hi", False, False),
        (b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\nread to close", b"read to close", False, True),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", b"", True, False),
        (b"HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nContent-Length: 1\r\n\r\nz", b"z", True, False),
    ],
    ids=[
        "length",
        "empty",
        "chunked",
        "trailer",
        "1xx-skipped",
        "connection-close",
        "http-1.0",
        "read-to-close",
        "204",
        "folded-header",
    ],
)
def test_the_parser_reads_a_body_however_the_bytes_arrive(
    raw: bytes, body: bytes, keep_alive: bool, eof: bool, bytewise: bool
) -> None:
    parser = parse(raw, bytewise=bytewise, eof=eof)
    assert parser.body == body
    assert parser.keep_alive is keep_alive
    assert not parser.extra


def test_bytes_after_the_response_are_noticed() -> None:
    parser = ResponseParser()
    assert parser.feed(ok_response(b"x") + b"HTTP/1.1 200")
    assert parser.extra


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"HTTP/1.1 OK\r\n\r\n", "bad status line"),
        (b"ICY 200 OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd", "CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n folded\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10), "longer than"),
    ],
    ids=[
        "status",
        "protocol",
        "colon",
        "length",
        "two-lengths",
        "chunk-size",
        "chunk-end",
        "folded-length",
        "head-too-long",
    ],
)
def test_a_malformed_response_is_a_clear_error(raw: bytes, message: str, bytewise: bool) -> None:
    parser = ResponseParser()
    pieces = [raw[i : i + 1] for i in range(len(raw))] if bytewise else [raw]
    with pytest.raises(MalformedResponseError, match=message):
        for piece in pieces:
            parser.feed(piece)


def test_a_response_cut_short_by_the_server_is_an_error() -> None:
    parser = ResponseParser()
    with pytest.raises(ServerDisconnectedError, match="without answering"):
        parser.feed_eof()
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(ServerDisconnectedError, match="middle of the response"):
        parser.feed_eof()


def test_waiters_for_a_slot_are_served_first_come_first_served() -> None:
    async def main() -> list[int]:
        pool = _HostPool(("http", "h", 80), limit=1)
        await pool.acquire_slot()
        order: list[int] = []

        async def wait(i: int) -> None:
            await pool.acquire_slot()
            order.append(i)
            pool.release_slot()

        tasks = [asyncio.create_task(wait(i)) for i in range(5)]
        await asyncio.sleep(0)
        tasks[2].cancel()  # a waiter that leaves does not take a slot with it
        await asyncio.sleep(0)
        pool.release_slot()
        await asyncio.gather(*tasks, return_exceptions=True)
        return order

    assert asyncio.run(main()) == [0, 1, 3, 4]


# --- against loopback servers -----------------------------------------------------------------


class Request:
    def __init__(self, connection: int, head: bytes, body: bytes) -> None:
        self.connection = connection
        self.head = head
        self.body = body

    def header(self, name: str) -> str | None:
        for line in self.head.decode("latin-1").split("\r\n")[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


#: An answer: given the request and the writer, write what the test wants; return False
#: to close the connection afterwards.
Answer = Callable[[Request, asyncio.StreamWriter], Awaitable[bool]]


class RawServer:
    """An HTTP/1.1 server on the test's loop; ``answer`` writes each response."""

    def __init__(self, answer: Answer, host: str = "127.0.0.1") -> None:
        self.answer = answer
        self.host = host
        self.requests: list[Request] = []
        self.accepted = 0
        self.open = 0
        self.max_open = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self.ssl: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/"

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        connection = self.accepted
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                request = Request(connection, head[:-4], body)
                self.requests.append(request)
                if not await self.answer(request, writer):
                    return
        finally:
            self.open -= 1
            writer.close()


def always(response: bytes) -> Answer:
    async def answer(_request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(response)
        return True

    return answer


def echo() -> Answer:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok_response(request.body))
        return True

    return answer


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine on a fresh loop of the kind the test is parametrized with."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        factory = uvloop.new_event_loop

    def run(coro: Coroutine[Any, Any, Any]) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(asyncio.wait_for(coro, 30))

    return run


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def test_a_post_sends_the_request_and_answers_status_and_body(loop_run: Any) -> None:
    async def main() -> None:
        async with RawServer(echo()) as server:
            client = HttpClient(headers={"Content-Type": "application/json"})
            url = f"http://rpc%2Buser:p%40ss@127.0.0.1:{server.port}/v3/key?a=1&b=%20x"
            try:
                assert await client.post(url, b'{"id":0}') == (200, b'{"id":0}')
            finally:
                await client.close()
            (request,) = server.requests
            assert request.head.startswith(b"POST /v3/key?a=1&b=%20x HTTP/1.1\r\n")
            assert request.header("host") == f"127.0.0.1:{server.port}"
            assert request.header("content-type") == "application/json"
            assert request.header("content-length") == "8"
            assert request.header("connection") == "keep-alive"
            expected = base64.b64encode(b"rpc+user:p@ss").decode()
            assert request.header("authorization") == f"Basic {expected}"
            assert client.ssl_context is None  # no TLS context for plain http

    loop_run(main())


@pytest.mark.parametrize(
    "response",
    [
        ok_response(b"x" * 200_000),
        chunked(b"a" * 70_000, b"b", b"c" * 5000),
        b"HTTP/1.1 100 Continue\r\n\r\n" + ok_response(b"x" * 200_000),
        ok_response(gzip.compress(b"x" * 200_000), "Content-Encoding: gzip"),
    ],
    ids=["content-length", "chunked", "interim-1xx", "gzip"],
)
def test_bodies_by_length_or_chunks_arrive_whole_and_keep_the_connection(
    loop_run: Any, response: bytes
) -> None:
    async def main() -> None:
        async with RawServer(always(response)) as server:
            client = HttpClient()
            try:
                for _ in range(3):
                    status, body = await client.post(server.url, b"{}")
                    assert status == 200
                    assert len(body) in (200_000, 75_001)
            finally:
                await client.close()
            assert server.accepted == 1  # keep-alive: one connection for the three

    loop_run(main())


def test_sequential_requests_reuse_one_connection(loop_run: Any) -> None:
    async def main() -> None:
        async with RawServer(echo()) as server:
            client = HttpClient()
            try:
                for i in range(10):
                    assert await client.post(server.url, b"%d" % i) == (200, b"%d" % i)
                assert client.open_connections() == 1
            finally:
                await client.close()
            assert server.accepted == 1 and len(server.requests) == 10

    loop_run(main())


def test_a_connection_the_server_closes_while_idle_is_replaced(loop_run: Any) -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok_response(request.body))
        return False  # then close, without saying so in a header

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient()
            try:
                assert await client.post(server.url, b"1") == (200, b"1")
                await wait_until(lambda: client.open_connections() == 0)
                assert await client.post(server.url, b"2") == (200, b"2")
            finally:
                await client.close()
            assert server.accepted == 2 and len(server.requests) == 2

    loop_run(main())


@pytest.mark.parametrize("started", [False, True], ids=["post", "start_post"])
def test_a_stale_keep_alive_connection_is_retried_once_on_a_fresh_one(
    loop_run: Any, started: bool
) -> None:
    """The server drops the reused connection on receiving the second request, before
    any byte of an answer (as a server closing an idle connection at that moment);
    a request start_post wrote is retried the same way by finish_post."""

    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.connection == 1 and request.body == b"2":
            return False
        writer.write(ok_response(request.body))
        return True

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient()
            try:
                assert await client.post(server.url, b"1") == (200, b"1")
                if started:
                    written = client.start_post(server.url, b"2")
                    assert written is not None
                    assert await client.finish_post(written) == (200, b"2", "")
                else:
                    assert await client.post(server.url, b"2") == (200, b"2")
            finally:
                await client.close()
            assert [(r.connection, r.body) for r in server.requests] == [
                (1, b"1"),
                (1, b"2"),
                (2, b"2"),
            ]

    loop_run(main())


def test_start_post_writes_at_once_on_an_idle_connection(loop_run: Any) -> None:
    """start_post writes before anything is awaited; finish_post reads the answer as
    post_answer would, and the connection goes back to the pool."""

    async def main() -> None:
        async with RawServer(echo()) as server:
            client = HttpClient()
            try:
                assert await client.post(server.url, b"1") == (200, b"1")  # one idle now
                started = client.start_post(server.url, b"2")
                assert started is not None
                await wait_until(lambda: len(server.requests) == 2)  # written already
                assert await client.finish_post(started) == (200, b"2", "")
                assert client.open_connections() == 1
                assert await client.post(server.url, b"3") == (200, b"3")
            finally:
                await client.close()
            assert server.accepted == 1 and [r.body for r in server.requests] == [
                b"1",
                b"2",
                b"3",
            ]

    loop_run(main())


def test_start_post_does_nothing_without_an_idle_connection_or_a_free_slot(
    loop_run: Any,
) -> None:
    release = asyncio.Event()

    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.body == b"held":
            await release.wait()
        writer.write(ok_response(request.body))
        return True

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient(max_connections=1)
            try:
                assert client.start_post(server.url, b"x") is None  # no connection yet
                assert client.open_connections() == 0
                assert await client.post(server.url, b"1") == (200, b"1")
                held = asyncio.create_task(client.post(server.url, b"held"))
                await wait_until(lambda: len(server.requests) == 2)
                assert client.start_post(server.url, b"x") is None  # the one slot is taken
                release.set()
                assert await held == (200, b"held")
                started = client.start_post(server.url, b"2")
                assert started is not None
                assert await client.finish_post(started) == (200, b"2", "")
            finally:
                await client.close()
            assert client.start_post(server.url, b"x") is None  # closed
            assert [r.body for r in server.requests] == [b"1", b"held", b"2"]

    loop_run(main())


def test_an_abandoned_started_post_closes_its_connection_and_frees_its_slot(
    loop_run: Any,
) -> None:
    async def main() -> None:
        async with RawServer(echo()) as server:
            client = HttpClient(max_connections=1)
            other = HttpClient()
            try:
                assert await client.post(server.url, b"1") == (200, b"1")
                started = client.start_post(server.url, b"2")
                assert started is not None
                with pytest.raises(RuntimeError, match="another client's"):
                    await other.finish_post(started)
                started.abandon()
                started.abandon()  # once is enough; the second does nothing
                assert client.open_connections() == 0  # a half-used connection is gone
                assert await client.post(server.url, b"3") == (200, b"3")  # the slot is free
                with pytest.raises(RuntimeError, match="finished or abandoned"):
                    await client.finish_post(started)
            finally:
                await client.close()
                await other.close()

    loop_run(main())


def test_a_started_post_past_its_time_raises_timeout_and_closes_its_connection(
    loop_run: Any,
) -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.body == b"1":
            writer.write(ok_response(request.body))
            return True
        await asyncio.Event().wait()  # never an answer
        return True

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient(timeout_s=0.3, max_connections=1)
            try:
                assert await client.post(server.url, b"1") == (200, b"1")
                started = client.start_post(server.url, b"2")
                assert started is not None
                with pytest.raises(TimeoutError):
                    await client.finish_post(started)
                assert client.open_connections() == 0
                assert client.start_post(server.url, b"3") is None  # no idle connection
            finally:
                await client.close()

    loop_run(main())


def test_a_fresh_connection_dropped_without_an_answer_is_not_retried(loop_run: Any) -> None:
    async def answer(_request: Request, _writer: asyncio.StreamWriter) -> bool:
        return False

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient()
            try:
                with pytest.raises(ServerDisconnectedError, match="without answering"):
                    await client.post(server.url, b"1")
            finally:
                await client.close()
            assert len(server.requests) == 1

    loop_run(main())


def test_at_most_max_connections_are_open_per_host(loop_run: Any) -> None:
    release = asyncio.Event()

    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        await release.wait()
        writer.write(ok_response(request.body))
        return True

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient(max_connections=2)
            try:
                posts = [asyncio.create_task(client.post(server.url, b"%d" % i)) for i in range(8)]
                await wait_until(lambda: len(server.requests) == 2)
                await asyncio.sleep(0.1)  # the others stay queued however long we wait
                assert len(server.requests) == 2 and server.accepted == 2
                release.set()
                answers = await asyncio.gather(*posts)
                assert answers == [(200, b"%d" % i) for i in range(8)]
            finally:
                await client.close()
            assert server.max_open == 2 and server.accepted == 2

    loop_run(main())


def test_a_request_past_its_time_raises_timeout_and_closes_its_connection(
    loop_run: Any,
) -> None:
    async def answer(_request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await asyncio.Event().wait()  # never the rest
        return True

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient(timeout_s=0.3)
            try:
                with pytest.raises(TimeoutError):
                    await client.post(server.url, b"1")
                assert client.open_connections() == 0
            finally:
                await client.close()

    loop_run(main())


def test_a_request_cancelled_mid_response_leaves_no_connection_in_the_pool(
    loop_run: Any,
) -> None:
    def serve() -> Answer:
        async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
            if request.body == b"slow":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
                await writer.drain()
                await asyncio.Event().wait()
            writer.write(ok_response(request.body))
            return True

        return answer

    async def main() -> None:
        async with RawServer(serve()) as server:
            client = HttpClient()
            try:
                assert await client.post(server.url, b"1") == (200, b"1")
                post = asyncio.create_task(client.post(server.url, b"slow"))
                (pool,) = client._pools.values()
                (connection,) = pool.all
                await wait_until(lambda: len(server.requests) == 2 and connection.received_any)
                post.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await post
                assert connection.closed and client.open_connections() == 0
                assert await client.post(server.url, b"2") == (200, b"2")
            finally:
                await client.close()
            assert server.accepted == 2

    loop_run(main())


def test_a_body_read_to_close_ends_the_connection(loop_run: Any) -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + request.body * 3)
        return False

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient()
            try:
                assert await client.post(server.url, b"ab") == (200, b"ababab")
                assert await client.post(server.url, b"cd") == (200, b"cdcdcd")
                assert client.open_connections() == 0
            finally:
                await client.close()
            assert server.accepted == 2

    loop_run(main())


def test_a_malformed_status_line_is_an_error_and_the_connection_is_dropped(
    loop_run: Any,
) -> None:
    async def main() -> None:
        async with RawServer(always(b"HTTP/1.1 OK\r\n\r\n")) as server:
            client = HttpClient()
            try:
                with pytest.raises(MalformedResponseError, match="bad status line"):
                    await client.post(server.url, b"1")
                assert client.open_connections() == 0
            finally:
                await client.close()

    loop_run(main())


def test_after_close_every_connection_is_gone_and_posts_fail(loop_run: Any) -> None:
    async def main() -> None:
        async with RawServer(echo()) as server:
            client = HttpClient()
            await asyncio.gather(*(client.post(server.url, b"x") for _ in range(3)))
            assert client.open_connections() == 3
            await client.close()
            assert client.open_connections() == 0
            await wait_until(lambda: server.open == 0)
            with pytest.raises(ClientClosedError):
                await client.post(server.url, b"x")

    loop_run(main())


def test_a_request_in_flight_when_the_client_closes_fails_clearly(loop_run: Any) -> None:
    async def answer(_request: Request, _writer: asyncio.StreamWriter) -> bool:
        await asyncio.Event().wait()
        return True

    async def main() -> None:
        async with RawServer(answer) as server:
            client = HttpClient(max_connections=1)
            first = asyncio.create_task(client.post(server.url, b"1"))
            queued = asyncio.create_task(client.post(server.url, b"2"))
            await wait_until(lambda: len(server.requests) == 1)
            await client.close()
            for post in (first, queued):
                with pytest.raises(ClientClosedError):
                    await post
            assert client.open_connections() == 0

    loop_run(main())


def test_bad_urls_are_refused() -> None:
    async def main() -> None:
        client = HttpClient()
        for url in ("ftp://host/", "http:///path", "http://host:port/"):
            with pytest.raises(InvalidURLError):
                await client.post(url, b"")
        await client.close()

    asyncio.run(main())


def test_an_ipv6_literal_host_works(loop_run: Any) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")

    async def main() -> None:
        async with RawServer(echo(), host="::1") as server:
            client = HttpClient()
            try:
                assert await client.post(server.url, b"six") == (200, b"six")
            finally:
                await client.close()
            assert server.requests[0].header("host") == f"[::1]:{server.port}"

    loop_run(main())


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, made with the openssl command (skips without it)."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot make a test certificate with openssl: {exc}")
    return cert, key


def test_https_makes_its_tls_context_on_first_use_and_checks_the_server(
    loop_run: Any, self_signed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed
    # ssl.create_default_context() trusts what SSL_CERT_FILE names: our test certificate.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))

    async def main() -> None:
        async with RawServer(echo()) as plain:
            server = RawServer(echo())
            server.ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.ssl.load_cert_chain(cert, key)
            async with server:
                client = HttpClient()
                try:
                    assert await client.post(plain.url, b"plain") == (200, b"plain")
                    assert client.ssl_context is None
                    assert await client.post(server.url, b"tls") == (200, b"tls")
                    assert client.ssl_context is not None
                    assert await client.post(server.url, b"again") == (200, b"again")
                finally:
                    await client.close()
                assert server.accepted == 1
            # The same server under a name its certificate does not carry is refused.
            server = RawServer(echo())
            server.ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.ssl.load_cert_chain(cert, key)
            async with server:
                client = HttpClient()
                try:
                    with pytest.raises(ssl.SSLCertVerificationError):
                        await client.post(f"https://localhost:{server.port}/", b"x")
                finally:
                    await client.close()

    loop_run(main())


def test_the_rpc_backend_imports_no_aiohttp() -> None:
    """aiohttp's import cost ~0.1-0.2 s of a run's start (issue #18): rpc must not pay it."""
    check = "import sys, blockx.worker.io.rpc; print('aiohttp' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"

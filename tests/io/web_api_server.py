"""A real JSON web API for the ``http`` backend's tests: aiohttp.web on 127.0.0.1, own thread.

Routes (every request is recorded in ``server.requests`` as ``(method, path_qs, headers,
body)`` and counted while in flight, ``server.max_in_flight`` the most at once):

* ``GET /echo?...`` — ``{"query": {...}, "headers": {"x-api-key": ...}}``;
* ``POST /echo`` — ``{"got": <the JSON body>}``;
* ``GET /status/<n>`` — answers status ``n`` with ``{"status": n}``;
* ``GET /redirect?to=<url>`` — 302 to ``to``;
* ``GET /text`` — 200 with a body that is not JSON; ``GET /empty`` — 204;
* ``GET /big`` — 200 with ``big_bytes`` bytes;
* ``GET /hold`` — waits until ``barrier`` requests are in flight at once (or
  ``barrier_timeout_s`` passes: then 504), sleeps ``hold_s`` and answers
  ``{"n": <query n>}`` — a test that sends N requests with ``barrier = N``
  passes only if all N were in flight together (one group per :meth:`reset`);
* ``GET /hang`` — never answers (until the server stops); not counted in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time

from aiohttp import web


class WebApiServer:
    """See the module docstring."""

    def __init__(self) -> None:
        self.port = 0
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.barrier = 1
        self.barrier_timeout_s = 60.0
        self.hold_s = 0.2
        self.big_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._all_in: asyncio.Event | None = None
        self._release_hangs: asyncio.Event | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> WebApiServer:
        self._thread = threading.Thread(target=self._serve, name="web-api", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the web API server did not start")
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._release_hangs = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            assert self._release_hangs is not None
            loop.call_soon_threadsafe(self._release_hangs.set)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def reset(self) -> None:
        self.requests.clear()
        self.arrivals.clear()
        self.max_in_flight = 0
        self.barrier = 1
        self.hold_s = 0.2
        self._all_in = None  # the next /hold group waits for its own barrier

    def __enter__(self) -> WebApiServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def paths(self, method: str = "GET") -> list[str]:
        return [path for m, path, _, _ in self.requests if m == method]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.arrivals.append(time.monotonic())
        self.requests.append((request.method, request.path_qs, dict(request.headers), body))
        if request.path == "/hang":  # not counted in flight: it outlives its test
            assert self._release_hangs is not None
            await self._release_hangs.wait()  # set when the server stops
            return web.json_response({"error": "stopped"}, status=503)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._route(request, body)
        finally:
            self.in_flight -= 1

    async def _route(self, request: web.Request, body: bytes) -> web.StreamResponse:
        path = request.path
        if path == "/echo" and request.method == "GET":
            return web.json_response(
                {
                    "query": dict(request.query),
                    "headers": {"x-api-key": request.headers.get("X-Api-Key")},
                }
            )
        if path == "/echo" and request.method == "POST":
            return web.json_response({"got": await request.json()})
        if path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            return web.json_response({"status": status}, status=status)
        if path == "/redirect":
            raise web.HTTPFound(request.query["to"])
        if path == "/text":
            return web.Response(text="<html>not json</html>", content_type="text/html")
        if path == "/empty":
            return web.Response(status=204)
        if path == "/big":
            return web.Response(body=b"1" * self.big_bytes, content_type="application/json")
        if path == "/hold":
            return await self._hold(request)
        return web.json_response({"error": "no such route"}, status=404)

    async def _hold(self, request: web.Request) -> web.StreamResponse:
        if self._all_in is None:
            self._all_in = asyncio.Event()
        if self.in_flight >= self.barrier:
            self._all_in.set()
        try:
            await asyncio.wait_for(self._all_in.wait(), self.barrier_timeout_s)
        except TimeoutError:
            return web.json_response({"error": "barrier not reached"}, status=504)
        await asyncio.sleep(self.hold_s)
        return web.json_response({"n": int(request.query.get("n", "0"))})

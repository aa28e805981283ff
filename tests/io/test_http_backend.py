"""The ``http`` backend against a real local web API: allowlist, resolved-address guard,
redirects, cache and singleflight of GETs, POSTs as writes, errors, per-host limits."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from io_support import answer, payload, run
from web_api_server import WebApiServer

from blockx.wire import keys
from blockx.worker.io.backend import IORequestError
from blockx.worker.io.config import HttpConfig, IOConfigError, load_io_config
from blockx.worker.io.handler import IOResult
from blockx.worker.io.http_backend import HttpBackend
from blockx.worker.io.registry import IOSubsystem
from blockx.worker.io.scope import TaskIOScope

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[WebApiServer]:
    with WebApiServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh(server: WebApiServer) -> None:
    server.reset()


def _backend(server: WebApiServer, **knobs: Any) -> HttpBackend:
    knobs.setdefault("allow_hosts", [f"127.0.0.1:{server.port}"])
    return HttpBackend(HttpConfig(**knobs))


def _scope(backend: HttpBackend) -> TaskIOScope:
    return TaskIOScope("t", lambda name: backend if name == "http" else None)


def _get(url: str, **fields: Any) -> dict[str, Any]:
    return payload("http", "get_json", {"url": url, **fields})


def _post(url: str, body: Any) -> dict[str, Any]:
    return payload("http", "post_json", {"url": url, "body": body}, io_kind=keys.IO_WRITE)


def _json(result: IOResult) -> Any:
    assert result.error is None, result.error
    assert result.result == {"status": result.result["status"]}
    return orjson.loads(result.sidecar) if result.sidecar else None


# --- the allowlist ----------------------------------------------------------------------------


def test_allow_hosts_is_empty_by_default_so_no_http_at_all(server: WebApiServer) -> None:
    assert HttpConfig().allow_hosts == ()
    backend = HttpBackend(HttpConfig())
    with pytest.raises(
        IORequestError, match=r"'127\.0\.0\.1:\d+' refused: io\.http\.allow_hosts is empty"
    ):
        backend.prepare(keys.IO_READ, "get_json", {"url": f"{server.base}/echo"}, None)


def test_a_host_off_the_allowlist_is_refused_and_nothing_is_sent(server: WebApiServer) -> None:
    backend = _backend(server, allow_hosts=["api.example.com", "127.0.0.1:1"])

    async def go() -> IOResult:
        try:
            return await answer(
                _scope(backend).handle_io("t", "c", _get(f"{server.base}/echo"), None)
            )
        finally:
            await backend.close()

    result = run(go())
    assert result.error is not None and not result.error.retryable
    assert f"host '127.0.0.1:{server.port}' is not in io.http.allow_hosts" in result.error.message
    assert server.requests == []
    # a bare name opens every port of that host; host:port only that port
    assert backend.check_url("https://API.example.com:8443/x").domain == "api.example.com:8443"
    assert backend.check_url("http://127.0.0.1:1/").domain == "127.0.0.1:1"
    with pytest.raises(IORequestError, match=r"not in io\.http\.allow_hosts"):
        backend.check_url("http://127.0.0.1:2/")
    with pytest.raises(IORequestError, match=r"not in io\.http\.allow_hosts"):
        backend.check_url("https://evil.example.com/")


@pytest.mark.parametrize(
    "url",
    ["ftp://api.example.com/x", "api.example.com/x", "", "https://user:pw@api.example.com/"],
)
def test_urls_that_are_not_plain_http_are_refused(url: str) -> None:
    backend = HttpBackend(HttpConfig(allow_hosts=("api.example.com",)))
    with pytest.raises(IORequestError):
        backend.check_url(url)


def test_allow_hosts_accepts_exact_names_only() -> None:
    config = load_io_config({"http": {"allow_hosts": ["API.Example.com", "10.0.0.5:8080"]}}, env={})
    assert config.http.allow_hosts == ("api.example.com", "10.0.0.5:8080")
    env = load_io_config(env={"HTTP_ALLOW_HOSTS": "a.example.com, [::1]:9000"})
    assert env.http.allow_hosts == ("a.example.com", "[::1]:9000")
    for bad in ["*.example.com", "https://a.example.com", "a.example.com/path", "a.com:99999"]:
        with pytest.raises(IOConfigError, match=r"io\.http\.allow_hosts"):
            load_io_config({"http": {"allow_hosts": [bad]}}, env={})


class _StaticResolver(AbstractResolver):
    """Answers every name with one address (a DNS record pointing where the test says)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.names: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.names.append(host)
        return [
            {
                "hostname": host,
                "host": self.address,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        pass


def test_a_listed_name_resolving_to_a_loopback_address_is_refused(server: WebApiServer) -> None:
    """DNS rebinding: the name is listed, its address (127.0.0.1) is not -> refused."""
    name = f"api.example.test:{server.port}"
    resolver = _StaticResolver("127.0.0.1")
    backend = HttpBackend(HttpConfig(allow_hosts=(name,)), resolver=resolver)

    async def go() -> IOResult:
        try:
            return await answer(
                _scope(backend).handle_io("t", "c", _get(f"http://{name}/echo"), None)
            )
        finally:
            await backend.close()

    result = run(go())
    assert resolver.names == ["api.example.test"]
    assert result.error is not None and not result.error.retryable
    assert "host 'api.example.test' resolves to 127.0.0.1" in result.error.message
    assert server.requests == []


def test_a_loopback_address_listed_explicitly_is_reached(server: WebApiServer) -> None:
    name = f"api.example.test:{server.port}"
    resolver = _StaticResolver("127.0.0.1")
    backend = HttpBackend(HttpConfig(allow_hosts=(name, "127.0.0.1")), resolver=resolver)

    async def go() -> IOResult:
        try:
            return await answer(
                _scope(backend).handle_io("t", "c", _get(f"http://{name}/echo"), None)
            )
        finally:
            await backend.close()

    assert _json(run(go()))["query"] == {}
    assert server.paths() == ["/echo"]


# --- redirects --------------------------------------------------------------------------------


def test_a_redirect_to_a_host_off_the_list_is_refused(server: WebApiServer) -> None:
    backend = _backend(server)
    url = f"{server.base}/redirect?to=http://evil.example.com/steal"

    async def go() -> IOResult:
        try:
            return await answer(_scope(backend).handle_io("t", "c", _get(url), None))
        finally:
            await backend.close()

    result = run(go())
    assert result.error is not None and not result.error.retryable
    assert "redirect from" in result.error.message
    assert "'evil.example.com:80' is not in io.http.allow_hosts" in result.error.message
    assert server.paths() == ["/redirect?to=http://evil.example.com/steal"]


def test_a_redirect_to_a_listed_host_is_followed(server: WebApiServer) -> None:
    backend = _backend(server)
    url = f"{server.base}/redirect?to={server.base}/echo%3Fa%3D1"

    async def go() -> IOResult:
        try:
            return await answer(_scope(backend).handle_io("t", "c", _get(url), None))
        finally:
            await backend.close()

    assert _json(run(go()))["query"] == {"a": "1"}
    assert server.paths()[-1] == "/echo?a=1"


def test_redirects_are_refused_when_max_redirects_is_0(server: WebApiServer) -> None:
    backend = _backend(server, max_redirects=0)
    url = f"{server.base}/redirect?to={server.base}/echo"

    async def go() -> IOResult:
        try:
            return await answer(_scope(backend).handle_io("t", "c", _get(url), None))
        finally:
            await backend.close()

    result = run(go())
    assert result.error is not None and "more than 0 redirects" in result.error.message


# --- reads and writes -------------------------------------------------------------------------


def test_gets_are_cached_and_shared_posts_are_not_and_drop_the_hosts_cache(
    server: WebApiServer,
) -> None:
    backend = _backend(server)
    url = f"{server.base}/echo"

    async def go() -> list[Any]:
        scope = _scope(backend)
        try:
            get = _get(url, params={"q": "eth", "n": 2, "flag": True}, headers={"X-Api-Key": "k1"})
            together = await asyncio.gather(
                *(answer(scope.handle_io("t", f"c{i}", get, None)) for i in range(5))
            )
            again = await answer(scope.handle_io("t", "c9", get, None))
            before_post = len(server.requests)
            posted = [
                await answer(scope.handle_io("t", "p", _post(url, {"x": [1, 2]}), None))
                for _ in range(2)
            ]
            after = await answer(scope.handle_io("t", "c10", get, None))
            stats = scope.stats.operation("http", "get_json")
            return [together, again, before_post, posted, after, stats]
        finally:
            await backend.close()

    together, again, before_post, posted, after, stats = run(go())
    expected = {"query": {"q": "eth", "n": "2", "flag": "true"}, "headers": {"x-api-key": "k1"}}
    assert all(_json(r) == expected for r in together) and _json(again) == expected
    assert before_post == 1  # five concurrent GETs and a later one: one request
    assert [_json(r) for r in posted] == [{"got": {"x": [1, 2]}}] * 2
    assert _json(after) == expected
    assert server.paths("POST") == ["/echo", "/echo"]
    assert len(server.paths("GET")) == 2  # the POST dropped the cached GET of the host
    assert stats.requests == 7 and stats.backend_calls == 2


def test_non_2xx_answers_fail_with_the_status_retryable_when_transient(
    server: WebApiServer,
) -> None:
    backend = _backend(server)

    async def go() -> list[IOResult]:
        scope = _scope(backend)
        try:
            return [
                await answer(scope.handle_io("t", "c", _get(f"{server.base}/status/{n}"), None))
                for n in (404, 503, 429)
            ]
        finally:
            await backend.close()

    missing, busy, limited = run(go())
    assert missing.error is not None and busy.error is not None and limited.error is not None
    assert missing.error.kind == "io_error" and not missing.error.retryable
    assert missing.error.message.startswith(f"HTTP 404 Not Found: GET {server.base}/status/404")
    assert busy.error.retryable and busy.error.message.startswith("HTTP 503 ")
    assert limited.error.retryable and limited.error.message.startswith("HTTP 429 ")


def test_large_answers_and_bad_requests_are_refused(server: WebApiServer) -> None:
    backend = _backend(server, max_response_bytes=1000)
    server.big_bytes = 5000

    async def go() -> IOResult:
        try:
            return await answer(
                _scope(backend).handle_io("t", "c", _get(f"{server.base}/big"), None)
            )
        finally:
            await backend.close()

    result = run(go())
    assert (
        result.error is not None
        and "larger than io.http.max_response_bytes" in result.error.message
    )
    url = f"{server.base}/echo"
    with pytest.raises(IORequestError, match="'Host' may not be set"):
        backend.prepare(keys.IO_READ, "get_json", {"url": url, "headers": {"Host": "x"}}, None)
    with pytest.raises(IORequestError, match="is a read"):
        backend.prepare(keys.IO_WRITE, "get_json", {"url": url}, None)
    with pytest.raises(IORequestError, match="is a write"):
        backend.prepare(keys.IO_READ, "post_json", {"url": url, "body": 1}, None)
    with pytest.raises(IORequestError, match="unknown operation"):
        backend.prepare(keys.IO_READ, "get", {"url": url}, None)
    with pytest.raises(IORequestError, match="query parameter 'q'"):
        backend.prepare(keys.IO_READ, "get_json", {"url": url, "params": {"q": {"a": 1}}}, None)


def test_a_timeout_sent_with_the_request_bounds_it_below_timeout_s(server: WebApiServer) -> None:
    backend = _backend(server, timeout_s=600)

    async def go() -> IOResult:
        try:
            request = _get(f"{server.base}/hang", timeoutMs=200)
            return await answer(_scope(backend).handle_io("t", "c", request, None))
        finally:
            await backend.close()

    result = run(go())
    assert result.error is not None and result.error.retryable
    assert "timed out after 0.2 s" in result.error.message


# --- limits per host --------------------------------------------------------------------------


def test_at_most_max_concurrency_requests_per_host_are_in_flight(server: WebApiServer) -> None:
    backend = _backend(server, max_concurrency=3)
    server.hold_s = 0.05

    async def go() -> list[IOResult]:
        scope = _scope(backend)
        try:
            return await asyncio.gather(
                *(
                    answer(scope.handle_io("t", f"c{i}", _get(f"{server.base}/hold?n={i}"), None))
                    for i in range(12)
                )
            )
        finally:
            await backend.close()

    results = run(go())
    assert [_json(r)["n"] for r in results] == list(range(12))
    assert server.max_in_flight <= 3  # an upper bound: a slow machine only lowers it


def test_the_default_concurrency_lets_16_requests_to_one_host_run_at_once(
    server: WebApiServer,
) -> None:
    """The server answers none of them until 16 are in flight together."""
    backend = _backend(server)
    server.barrier = 16

    async def go() -> list[IOResult]:
        scope = _scope(backend)
        try:
            return await asyncio.gather(
                *(
                    answer(scope.handle_io("t", f"c{i}", _get(f"{server.base}/hold?n={i}"), None))
                    for i in range(16)
                )
            )
        finally:
            await backend.close()

    assert [_json(r)["n"] for r in run(go())] == list(range(16))
    assert server.max_in_flight == 16


def test_max_requests_per_s_spaces_requests_to_a_host(server: WebApiServer) -> None:
    """An upper bound on the rate the server observed (a slow machine only lowers it)."""
    backend = _backend(server, max_requests_per_s=20)
    server.hold_s = 0

    async def go() -> list[IOResult]:
        scope = _scope(backend)
        try:
            return await asyncio.gather(
                *(
                    answer(scope.handle_io("t", f"c{i}", _get(f"{server.base}/hold?n={i}"), None))
                    for i in range(11)
                )
            )
        finally:
            await backend.close()

    assert all(r.error is None for r in run(go()))
    arrivals = sorted(server.arrivals)
    # 11 requests at 20/s, a burst of 2 (a tenth of a second's worth): the last 9 wait
    # for their tokens, 0.05 s apart, so the first and the last are >= 0.45 s apart
    # (scheduling jitter of the server's clock allowed for: 10%).
    assert arrivals[-1] - arrivals[0] >= 0.4


def test_the_subsystem_builds_the_http_backend_from_io_http(server: WebApiServer) -> None:
    io = IOSubsystem(
        load_io_config({"http": {"allow_hosts": [f"127.0.0.1:{server.port}"]}}, env={})
    )

    async def go() -> IOResult:
        try:
            return await answer(io.handle_io("t", "c", _get(f"{server.base}/echo?x=1"), None))
        finally:
            await io.close()

    assert _json(run(go())) == {"query": {"x": "1"}, "headers": {"x-api-key": None}}


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("172.16.0.9", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),  # cloud metadata
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("::1", True),
        ("fe80::1", True),
        ("fc00::5", True),
        ("::ffff:127.0.0.1", True),  # IPv4-mapped loopback
        ("93.184.216.34", False),
        ("2606:2800:220:1:248:1893:25c8:1946", False),
    ],
)
def test_the_resolver_refuses_every_non_public_address_not_listed(
    address: str, refused: bool
) -> None:
    from blockx.worker.io.http_backend import AddressRefusedError, GuardedResolver

    async def resolve(allowed: tuple[str, ...]) -> list[ResolveResult]:
        guard = GuardedResolver(frozenset(allowed), _StaticResolver(address))
        return await guard.resolve("api.example.com", 443)

    if refused:
        with pytest.raises(AddressRefusedError, match=f"'api.example.com' resolves to {address}"):
            run(resolve(("api.example.com",)))
        listed = f"[{address}]" if ":" in address else address
        assert run(resolve(("api.example.com", listed)))[0]["host"] == address
    else:
        assert run(resolve(("api.example.com",)))[0]["host"] == address

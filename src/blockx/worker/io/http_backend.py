"""The ``http`` backend: JSON web APIs for user code (``Http.get_json`` / ``Http.post_json``).

Theory of operation
-------------------
User code calls ``Http.get_json(url, params, headers)`` (a read) or
``Http.post_json(url, body, headers)`` (a write); the executor suspends only
that call and the worker performs the request here, on an aiohttp client
session, while the executor runs other calls. A blocking library (``requests``,
a raw socket) would instead stall every call of the executor: docs/http.md.

* **Reads and writes.** ``get_json`` is prepared cacheable: the task's
  :class:`~blockx.worker.io.scope.TaskIOScope` answers identical GETs from its
  read cache and shares one request among identical concurrent ones
  (singleflight). ``post_json`` is a write: never cached, never shared, and it
  drops the task's cached GETs of the same host (the *domain* is the host).
* **The allowlist** (``io.http.allow_hosts``, empty = no HTTP): a URL's host
  must be listed exactly (``api.example.com``, or ``api.example.com:8443`` for
  that port only). Checked in :meth:`HttpBackend.prepare` — a refused request
  sends nothing — and again at every redirect hop, which this backend follows
  itself (``io.http.max_redirects``; aiohttp's own following is off).
* **Addresses.** A listed *name* is resolved by :class:`GuardedResolver`, which
  refuses the whole name when any address it resolves to is loopback, private,
  link-local, multicast, reserved or unspecified — so a public name pointing at
  127.0.0.1 (DNS rebinding) reaches nothing — unless that address is itself
  listed. Such addresses are reached only by listing them as such: an IP
  literal (``127.0.0.1:8080``, ``[::1]``, ``10.0.0.5``) or ``localhost``.
  Proxies from the environment are ignored (``trust_env=False``).
* **Limits per host** (:mod:`.http_limits`): at most ``max_concurrency``
  requests in flight and ``max_requests_per_s`` started per second.
* **Time.** ``io.http.timeout_s`` bounds a whole request, redirects included. A
  GET whose last waiter is gone (its call's budget ran out, it was cancelled) is
  cancelled by the scope. A POST is never cancelled (that would not undo it), so
  the SDK sends the call's remaining budget plus a grace (``timeoutMs``) and the
  shorter of the two bounds it.
* **Answers.** A 2xx response: ``{"status": n}`` with the body as the sidecar
  (the SDK parses the JSON in the executor). Anything else fails the request
  with ``io_error``: ``HTTP 404 Not Found: GET https://...: <start of body>``
  (the SDK raises it as ``HttpError`` with ``status``); 408, 425, 429 and 5xx
  answers, timeouts and connection failures are retryable, the rest not.
  Header values never appear in messages (they may hold API keys).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from blockx.wire import keys

from .answers import PreparedRequest, Reply
from .backend import IORequestError
from .config import HttpConfig
from .http_limits import HostGate

__all__ = [
    "BACKEND_NAME",
    "AddressRefusedError",
    "GuardedResolver",
    "HttpBackend",
    "host_key",
]

BACKEND_NAME: Final = "http"
OP_GET_JSON: Final = "get_json"
OP_POST_JSON: Final = "post_json"
#: Statuses worth retrying (the call's retry policy decides whether to).
RETRYABLE_STATUSES: Final = frozenset({408, 425, 429, 500, 502, 503, 504})
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
#: Headers user code may not set: the connection's own framing and routing.
FORBIDDEN_HEADERS: Final = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
)
_BODY_EXCERPT: Final = 200
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


class AddressRefusedError(OSError):
    """A host name resolved to an address the allowlist does not open (see the module doc)."""


def host_key(host: str, port: int | None, scheme: str) -> tuple[str, str]:
    """``(host, "host:port")`` of a URL's host as the allowlist spells them (lowercase,
    an IPv6 literal in brackets, the scheme's default port filled in)."""
    name = host.lower().rstrip(".")
    if ":" in name:
        name = f"[{name}]"
    return name, f"{name}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


def _address_refused(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def _normalized(address: str) -> str:
    """An IP address as :mod:`ipaddress` spells it (``::ffff:7f00:1``), else as given."""
    try:
        return str(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return address


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class _Target:
    """One checked URL: what the allowlist saw and the gate it goes through."""

    __slots__ = ("domain", "url")

    def __init__(self, url: str, domain: str) -> None:
        self.url = url
        self.domain = domain

    def __repr__(self) -> str:
        return f"_Target({self.url!r})"


class HttpBackend:
    """The ``http`` backend (see the module docstring). Build it with an :class:`HttpConfig`."""

    __slots__ = ("_allowed", "_closed", "_gates", "_resolve_with", "_session", "config", "name")

    def __init__(self, config: HttpConfig, *, resolver: AbstractResolver | None = None) -> None:
        """``resolver``: where :class:`GuardedResolver` looks names up (default: the
        system's, in a thread); its answers are checked all the same."""
        self.name = BACKEND_NAME
        self._resolve_with = resolver
        self.config = config
        self._allowed = frozenset(config.allow_hosts)
        self._gates: dict[str, HostGate] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"HttpBackend(allow_hosts={list(self.config.allow_hosts)}, hosts={sorted(self._gates)})"
        )

    # --- checks ---------------------------------------------------------------------------------

    def check_url(self, url: Any) -> _Target:
        """The checked target of ``url``; raises :class:`IORequestError` naming the host."""
        if type(url) is not str or not url:
            raise IORequestError(f"http: url must be a non-empty string, got {url!r}")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise IORequestError(f"http: {url!r} is not a URL: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise IORequestError(f"http: {url!r} is not an http(s) URL with a host")
        if parts.username is not None or parts.password is not None:
            raise IORequestError(
                f"http: credentials in the URL of host {parts.hostname!r} are not accepted; "
                "send them in headers"
            )
        name, name_port = host_key(parts.hostname, port, scheme)
        if not self._allowed:
            raise IORequestError(
                f"http: host {name_port!r} refused: io.http.allow_hosts is empty, so no HTTP "
                "is allowed (list the hosts user code may reach)"
            )
        if name not in self._allowed and name_port not in self._allowed:
            raise IORequestError(
                f"http: host {name_port!r} is not in io.http.allow_hosts {sorted(self._allowed)}"
            )
        return _Target(url, name_port)

    def _check_headers(self, headers: Any) -> dict[str, str]:
        if headers is None:
            return {}
        if not isinstance(headers, Mapping):
            raise IORequestError("http: headers must be a mapping of strings")
        checked: dict[str, str] = {}
        for key, value in headers.items():
            if type(key) is not str or type(value) is not str or not key:
                raise IORequestError(f"http: header {key!r}: names and values must be strings")
            if key.lower() in FORBIDDEN_HEADERS:
                raise IORequestError(f"http: header {key!r} may not be set by user code")
            if "\r" in value or "\n" in value or "\r" in key or "\n" in key or ":" in key:
                raise IORequestError(f"http: header {key!r}: line breaks are not allowed")
            checked[key] = value
        return checked

    @staticmethod
    def _check_params(params: Any) -> list[tuple[str, str]]:
        if params is None:
            return []
        if not isinstance(params, Mapping):
            raise IORequestError("http: params must be a mapping (query parameters)")
        pairs: list[tuple[str, str]] = []
        for key, value in params.items():
            if type(key) is not str:
                raise IORequestError(f"http: query parameter names must be strings, not {key!r}")
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if type(item) is bool:
                    pairs.append((key, "true" if item else "false"))
                elif type(item) in (str, int, float):
                    pairs.append((key, str(item)))
                else:
                    raise IORequestError(
                        f"http: query parameter {key!r}: a string, number, bool or a list of "
                        f"them, not {type(item).__name__}"
                    )
        return pairs

    def _timeout_s(self, body: Mapping[str, Any]) -> float:
        budget_ms = body.get("timeoutMs")
        limit = self.config.timeout_s
        if type(budget_ms) is int and budget_ms > 0:
            return min(limit, budget_ms / 1000.0)
        return limit

    # --- IOBackend ------------------------------------------------------------------------------

    def prepare(
        self, io_kind: str, operation: str, params: Any, sidecar: bytes | None
    ) -> PreparedRequest:
        if operation == OP_GET_JSON:
            if io_kind != keys.IO_READ:
                raise IORequestError(f"http get_json is a read, not a {io_kind}")
        elif operation == OP_POST_JSON:
            if io_kind != keys.IO_WRITE:
                raise IORequestError(f"http post_json is a write, not a {io_kind}")
        else:
            raise IORequestError(f"http: unknown operation {operation!r} (get_json or post_json)")
        if sidecar is not None or not isinstance(params, Mapping):
            raise IORequestError(f"http {operation}: params must be an object")
        target = self.check_url(params.get("url"))
        request: dict[str, Any] = {
            "method": "GET" if operation == OP_GET_JSON else "POST",
            "target": target,
            "query": self._check_params(params.get("params")),
            "headers": self._check_headers(params.get("headers")),
            "timeout_s": self._timeout_s(params),
        }
        if operation == OP_POST_JSON:
            import orjson

            try:
                request["body"] = orjson.dumps(params.get("body"))
            except TypeError as exc:
                raise IORequestError(f"http post_json: the body is not JSON: {exc}") from None
        return PreparedRequest(
            operation, request, domain=target.domain, cacheable=operation == OP_GET_JSON
        )

    def execute(self, request: PreparedRequest) -> Any:
        return self._perform(request.operation, request.body)

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # --- requests -------------------------------------------------------------------------------

    def _session_now(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(self._allowed, self._resolve_with),
                limit=0,
                ttl_dns_cache=10,
            )
            session = self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, auto_decompress=True
            )
        return session

    def _gate(self, domain: str) -> HostGate:
        gate = self._gates.get(domain)
        if gate is None:
            config = self.config
            gate = self._gates[domain] = HostGate(
                domain, config.max_concurrency, config.max_requests_per_s
            )
        return gate

    async def _perform(self, operation: str, request: dict[str, Any]) -> Reply:
        if self._closed:
            return Reply.failure("http: the backend is closed", retryable=True)
        target: _Target = request["target"]
        timeout_s: float = request["timeout_s"]
        try:
            async with asyncio.timeout(timeout_s):
                return await self._follow(request, target)
        except _AsReply as failed:
            return failed.reply
        except TimeoutError:
            return Reply.failure(
                f"http {operation}: {request['method']} {target.url} timed out after "
                f"{timeout_s:g} s",
                retryable=True,
            )

    async def _follow(self, request: dict[str, Any], target: _Target) -> Reply:
        method: str = request["method"]
        body: bytes | None = request.get("body")
        query: list[tuple[str, str]] | None = request["query"]
        for _hop in range(self.config.max_redirects + 1):
            status, reason, location, data = await self._send(
                method, target, query, request["headers"], body
            )
            if status in REDIRECT_STATUSES and location:
                try:
                    target = self.check_url(urljoin(target.url, location))
                except IORequestError as exc:
                    return Reply.failure(
                        f"http: redirect from {target.url} refused: {exc.message}",
                        retryable=False,
                    )
                query = None  # the Location URL carries its own query
                if status == 303 or (status in (301, 302) and method == "POST"):
                    method, body = "GET", None
                continue
            if 200 <= status < 300:
                return Reply({"status": status}, sidecar=data, nbytes=len(data) + 32)
            excerpt = data[:_BODY_EXCERPT].decode("utf-8", "replace")
            return Reply.failure(
                f"HTTP {status} {reason}: {method} {target.url}: {excerpt}",
                retryable=status in RETRYABLE_STATUSES,
            )
        return Reply.failure(
            f"http: {request['method']} {request['target'].url}: more than "
            f"{self.config.max_redirects} redirects (io.http.max_redirects)",
            retryable=False,
        )

    async def _send(
        self,
        method: str,
        target: _Target,
        query: list[tuple[str, str]] | None,
        headers: dict[str, str],
        body: bytes | None,
    ) -> tuple[int, str, str | None, bytes]:
        """One request through the host's gate: ``(status, reason, Location, body)``;
        a failure is raised as :class:`_AsReply`."""
        gate = self._gate(target.domain)
        send_headers = {"Accept": "application/json", **headers}
        if body is not None:
            send_headers.setdefault("Content-Type", "application/json")
        limit = self.config.max_response_bytes
        async with gate.slots:
            if gate.limiter is not None:
                loop = asyncio.get_running_loop()
                delay = gate.limiter.reserve(1, loop.time())
                if delay > 0:
                    await asyncio.sleep(delay)
            try:
                async with self._session_now().request(
                    method,
                    target.url,
                    params=query or None,
                    data=body,
                    headers=send_headers,
                    allow_redirects=False,
                ) as response:
                    declared = response.content_length
                    if declared is not None and declared > limit:
                        raise _TooLargeError(declared)
                    data = await response.content.read(limit + 1)
                    if len(data) > limit:
                        raise _TooLargeError(len(data))
                    return (
                        response.status,
                        response.reason or "",
                        response.headers.get("Location"),
                        data,
                    )
            except _TooLargeError as exc:
                raise _AsReply(
                    Reply.failure(
                        f"http: {method} {target.url}: the response ({exc.size} bytes) is "
                        f"larger than io.http.max_response_bytes ({limit})",
                        retryable=False,
                    )
                ) from None
            except aiohttp.ClientError as exc:
                refused = _refusal_of(exc)
                if refused is not None:
                    raise _AsReply(
                        Reply.failure(f"http: {method} {target.url}: {refused}", retryable=False)
                    ) from None
                raise _AsReply(
                    Reply.failure(
                        f"http: {method} {target.url} failed: {type(exc).__name__}: {exc}",
                        retryable=True,
                    )
                ) from None


class _TooLargeError(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _AsReply(Exception):
    """Carries a failure :class:`Reply` out of :meth:`HttpBackend._send`."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply)
        self.reply = reply


def _refusal_of(exc: BaseException) -> str | None:
    """The message of the :class:`AddressRefusedError` behind ``exc``, if one is."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, AddressRefusedError):
            return str(seen)
        inner = getattr(seen, "os_error", None)
        if isinstance(inner, AddressRefusedError):
            return str(inner)
        seen = seen.__cause__ or seen.__context__
    return None


def listed_addresses(allowed: frozenset[str]) -> frozenset[str]:
    """The IP literals of an allowlist, without brackets or ports."""
    addresses: set[str] = set()
    for entry in allowed:
        if entry.startswith("["):
            name = entry[1 : entry.index("]")]
        else:
            name = entry.split(":", 1)[0]
        if _is_ip_literal(name):
            addresses.add(str(ipaddress.ip_address(name)))
    return frozenset(addresses)


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that refuses names resolving to non-public addresses (module doc).

    ``allowed`` is the allowlist: an address it lists (bare or with a port), and any
    address of ``localhost``, may be reached; other loopback, private, link-local,
    multicast, reserved or unspecified addresses raise :class:`AddressRefusedError`.
    """

    def __init__(self, allowed: frozenset[str], inner: AbstractResolver | None = None) -> None:
        self._inner = inner if inner is not None else ThreadedResolver()
        self._listed = listed_addresses(allowed)

    def __repr__(self) -> str:
        return f"GuardedResolver(listed_addresses={sorted(self._listed)})"

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        name = host.lower().rstrip(".")
        if name == "localhost" or name.endswith(".localhost"):
            return results
        for result in results:
            address = str(result["host"])
            if _address_refused(address) and _normalized(address) not in self._listed:
                raise AddressRefusedError(
                    f"host {host!r} resolves to {address}, a loopback, private or otherwise "
                    "non-public address; such addresses are reached only when io.http."
                    "allow_hosts lists them as such (an IP literal or localhost)"
                )
        return results

    async def close(self) -> None:
        await self._inner.close()

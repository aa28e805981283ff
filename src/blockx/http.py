"""``blockx.http``: call JSON web APIs from user code without stalling the executor.

::

    def _(p):
        quote = Http.get_json("https://api.example.com/v1/price", params={"symbol": p["sym"]})
        Http.post_json("https://hooks.example.com/seen", {"sym": p["sym"], "usd": quote["usd"]})
        return quote["usd"]

``Http`` is predefined in every function module (no import needed; or
``from blockx.http import Http, HttpError``). Each request is performed by the
worker (the ``http`` IO backend, aiohttp): only the calling call suspends, the
executor runs its other calls meanwhile — unlike ``requests``, ``urllib`` or a
raw socket, which block the whole executor process and every call on it
(docs/http.md).

* ``get_json`` is a read: the worker caches its answer per task and shares one
  request among identical concurrent ones (url, params and headers equal).
* ``post_json`` is a write: sent every time, never shared; it drops the task's
  cached GETs of that host.
* Only hosts listed in ``io.http.allow_hosts`` are reachable (empty by default:
  no HTTP); redirects are followed only to listed hosts; loopback and private
  addresses only when listed as such.
* The request is bounded by ``io.http.timeout_s``; the call's budget ends the
  wait (a GET is then cancelled; a POST, which cancelling would not undo, is
  given up on at most ``POST_GRACE_MS`` later).

Errors: a bad argument raises ``TypeError`` here, before any request. A refused
host, a timeout, a connection failure or a non-2xx answer raises
:class:`HttpError` (a ``RemoteIOError``: uncaught, the call fails as
``io_error``, retried when transient — a timeout, 429, 5xx); ``status`` is
the HTTP status when the server answered, else None. A 2xx answer that is not
JSON raises ``HttpError`` too. Outside a call run by the BlockX executor every
function raises ``blockx.sdk.NoProviderError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from blockx.executor.errors import RemoteIOError
from blockx.sdk.runtime import get_provider

__all__ = ["BACKEND", "Http", "HttpError", "get_json", "post_json"]

#: The IO backend these calls are addressed to (``blockx.worker.io.http_backend``).
BACKEND: Final = "http"
_STATUS_RE: Final = re.compile(r"HTTP (\d{3}) ")
_SORTED: Final = orjson.OPT_SORT_KEYS
#: How long past the call's budget the worker lets a POST run before giving up on it.
POST_GRACE_MS: Final = 1000


class HttpError(RemoteIOError):
    """An HTTP request failed: refused, timed out, unreachable, or answered non-2xx.

    ``status`` is the HTTP status when the server answered (404, 503, ...), else None;
    ``retryable`` says whether trying again may help (timeouts, 429, 5xx). Uncaught, the
    call fails as ``io_error`` with that flag.
    """

    status: int | None = None
    url: str = ""
    #: A plain value, not RemoteCallError's property: audited code may hold this class,
    #: and a property would hand it a Python function (its ``fget``).
    error_kind: str = "io_error"


def _remaining_ms() -> int | None:
    """What is left of the running call's budget or deadline, in ms (None: unlimited
    or not on an executor call)."""
    from blockx.executor.context import current_context

    ctx = current_context()
    if ctx is None:
        return None
    remaining = ctx.remaining_s()
    if remaining is None:
        return None
    return max(1, int(remaining * 1000))


def _check_mapping(value: Any, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"Http: {what} must be a dict, not {type(value).__name__}")
    return dict(value)


def _request(operation: str, url: Any, fields: dict[str, Any]) -> Any:
    if type(url) is not str or not url:
        raise TypeError(f"Http.{operation}: url must be a non-empty str, got {url!r}")
    params: dict[str, Any] = {"url": url, **fields}
    provider = get_provider()
    try:
        if operation == "get_json":
            # No time limit of its own: when the call's budget runs out the executor
            # stops waiting and the worker cancels the GET nobody waits for any more.
            try:
                cache_key: str | None = orjson.dumps(params, option=_SORTED).decode()
            except TypeError:
                cache_key = None  # the worker keys it by the params themselves
            answer = provider.read_req(BACKEND, operation, params, cache_key=cache_key)
        else:
            # A POST is never cancelled (that would not undo it): the worker bounds it by
            # the budget left, plus a grace so that the executor's own cut-off ends the
            # call first (as deadline_exceeded, like every other wait).
            remaining_ms = _remaining_ms()
            if remaining_ms is not None:
                params["timeoutMs"] = remaining_ms + POST_GRACE_MS
            answer = provider.write_req(BACKEND, operation, params)
    except RemoteIOError as exc:
        if isinstance(exc, HttpError) or exc.kind != "io_error":
            raise
        raise _http_error(exc.kind, exc.message, exc.retryable, url) from None
    data = answer.get("data") if isinstance(answer, Mapping) else None
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError as exc:
        raise _http_error(
            "io_error", f"the answer of {url} is not JSON: {exc}", False, url
        ) from None


def _http_error(kind: str, message: str, retryable: bool, url: str) -> HttpError:
    error = HttpError(kind, message, retryable)
    match = _STATUS_RE.match(message)
    error.status = int(match.group(1)) if match else None
    error.url = url
    return error


def get_json(
    url: str, params: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None
) -> Any:
    """GET ``url`` (with query ``params``) and return the decoded JSON answer (None when
    empty). Cached per task; raises :class:`HttpError`."""
    return _request(
        "get_json",
        url,
        {
            "params": _check_mapping(params, "params"),
            "headers": _check_mapping(headers, "headers"),
        },
    )


def post_json(url: str, body: Any, headers: Mapping[str, str] | None = None) -> Any:
    """POST ``body`` as JSON to ``url`` and return the decoded JSON answer (None when
    empty). Never cached; raises :class:`HttpError`."""
    return _request("post_json", url, {"body": body, "headers": _check_mapping(headers, "headers")})


class Http:
    """The prelude's ``Http``: ``Http.get_json(url, params=None, headers=None)`` and
    ``Http.post_json(url, body, headers=None)`` (see the module docstring)."""

    __slots__ = ()

    get_json = staticmethod(get_json)
    post_json = staticmethod(post_json)

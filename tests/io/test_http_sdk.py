"""``blockx.http`` (the SDK side of ``Http``) through a recording provider: what it asks
the worker for, how it decodes the answer, how failures become ``HttpError``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pytest

from blockx.executor.errors import RemoteIOError, SubcallFailedError
from blockx.http import Http, HttpError, get_json, post_json
from blockx.sdk import reset_provider, set_provider


class Recorder:
    """A provider answering every IO request with ``answer`` (or raising it)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str, Any, str | None]] = []
        self.answer: Any = {"status": 200, "data": b'{"ok": [1, 2.5, 12345678901234567890]}'}

    def _reply(self) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def read_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str | None = None,
    ) -> Any:
        self.requests.append(("read", backend, operation, dict(params), cache_key))
        return self._reply()

    def write_req(self, backend: str, operation: str, params: Mapping[str, Any]) -> Any:
        self.requests.append(("write", backend, operation, dict(params), None))
        return self._reply()

    def capability_req(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not used")

    def subcall(self, function_id: str, args: Any) -> Any:
        raise AssertionError("not used")

    def sleep(self, seconds: float) -> None:
        raise AssertionError("not used")


@pytest.fixture
def provider() -> Iterator[Recorder]:
    recorder = Recorder()
    token = set_provider(recorder)
    try:
        yield recorder
    finally:
        reset_provider(token)


def test_get_json_is_a_read_keyed_by_url_params_and_headers(provider: Recorder) -> None:
    got = Http.get_json("https://api.example.com/p", params={"q": 1}, headers={"K": "v"})
    assert got == {"ok": [1, 2.5, 12345678901234567890]}  # big ints stay exact
    [(kind, backend, operation, params, cache_key)] = provider.requests
    assert (kind, backend, operation) == ("read", "http", "get_json")
    assert params == {"url": "https://api.example.com/p", "params": {"q": 1}, "headers": {"K": "v"}}
    assert cache_key is not None and orjson.loads(cache_key) == params


def test_post_json_is_a_write_and_an_empty_answer_is_none(provider: Recorder) -> None:
    provider.answer = {"status": 204}
    assert post_json("https://hooks.example.com/x", {"a": [1]}) is None
    [(kind, backend, operation, params, _)] = provider.requests
    assert (kind, backend, operation) == ("write", "http", "post_json")
    assert params == {"url": "https://hooks.example.com/x", "body": {"a": [1]}, "headers": None}


def test_failures_become_http_errors_with_the_status(provider: Recorder) -> None:
    provider.answer = RemoteIOError("io_error", "HTTP 503 Service Unavailable: GET u: busy", True)
    with pytest.raises(HttpError) as caught:
        get_json("https://api.example.com/p")
    error = caught.value
    assert isinstance(error, RemoteIOError)
    assert (error.status, error.retryable, error.kind, error.error_kind) == (
        503,
        True,
        "io_error",
        "io_error",
    )
    assert error.url == "https://api.example.com/p"
    provider.answer = RemoteIOError("io_error", "http: host 'x:443' is not in io.http.allow_hosts")
    with pytest.raises(HttpError) as refused:
        get_json("https://x/")
    assert refused.value.status is None and not refused.value.retryable
    provider.answer = {"status": 200, "data": b"<html>"}
    with pytest.raises(HttpError, match="is not JSON"):
        get_json("https://api.example.com/p")


def test_other_errors_pass_through_and_bad_arguments_raise_type_error(provider: Recorder) -> None:
    provider.answer = SubcallFailedError("user_error", "not an IO failure")
    with pytest.raises(SubcallFailedError):
        get_json("https://api.example.com/p")
    with pytest.raises(TypeError, match="url must be a non-empty str"):
        get_json(b"https://api.example.com/")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="params must be a dict"):
        get_json("https://api.example.com/", params=[("a", 1)])  # type: ignore[arg-type]
    assert len(provider.requests) == 1  # the bad arguments sent nothing


def test_a_function_using_http_runs_under_blockx_testing_with_a_fake_backend() -> None:
    """docs/http.md: load_function's ``backends={"http": ...}`` answers ``{"data": json}``."""
    from blockx.testing import load_function

    seen: list[tuple[str, Any]] = []

    def fake_http(operation: str, params: Any) -> Any:
        seen.append((operation, params))
        return {"status": 200, "data": orjson.dumps({"usd": 3000}).decode()}

    source = 'def _(sym):\n    return Http.get_json("https://api.example.com/p", params={"s": sym})["usd"]\n'
    price = load_function(source, backends={"http": fake_http})
    assert price("ETH") == 3000
    assert seen == [
        ("get_json", {"url": "https://api.example.com/p", "params": {"s": "ETH"}, "headers": None})
    ]

"""Shared helpers for the restricted-runtime tests: run code restricted, a fake provider."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from blockx.executor.restricted_runtime import restricted_namespace
from blockx.sdk.runtime import reset_provider, set_provider


def run_restricted(source: str, function_id: str = "t/fn") -> dict[str, Any]:
    """Execute ``source`` in a fresh restricted namespace (no audit) and return it."""
    filename = f"<blockx:{function_id}>"
    namespace = restricted_namespace(
        {"__name__": function_id, "__file__": filename, "__blockx_digest__": "sha256:test"}
    )
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)
    return namespace


class FakeProvider:
    """A provider that records requests and answers sub-calls, table and rpc reads."""

    def __init__(self) -> None:
        self.requests: list[tuple[Any, ...]] = []

    def read_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str | None = None,
    ) -> Any:
        self.requests.append(("read", backend, operation, dict(params)))
        if backend == "rpc":
            return "0x10"
        if operation == "get_row":
            return {"key": params["key"], "usd": "1.25"}
        if operation == "scan":
            return [["a", {"key": "a"}]]
        return None

    def write_req(self, backend: str, operation: str, params: Mapping[str, Any]) -> Any:
        self.requests.append(("write", backend, operation, dict(params)))
        return len(params.get("rows", ()))

    def capability_req(
        self, backend: str, operation: str, params: Mapping[str, Any], *, cache_key: str = ""
    ) -> Any:
        self.requests.append(("capability", backend, operation, dict(params)))
        return None

    def subcall(self, function_id: str, args: Any) -> Any:
        self.requests.append(("subcall", function_id, args))
        if isinstance(args, dict) and "left" in args:
            return {"sum": args["left"] + args["right"]}
        return {"function": function_id, "args": args}

    def sleep(self, seconds: float) -> None:
        self.requests.append(("sleep", seconds))


@contextmanager
def provider_installed(provider: FakeProvider | None = None) -> Iterator[FakeProvider]:
    provider = provider or FakeProvider()
    token = set_provider(provider)
    try:
        yield provider
    finally:
        reset_provider(token)

"""Helpers of the IO tests: run a coroutine, send one request through a backend or scope."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from blockx.wire import keys
from blockx.worker.io.backend import IOBackend, Reply
from blockx.worker.io.handler import IOResult


def run(coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run ``coro`` on a fresh event loop, with a timeout."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def call_backend(
    backend: IOBackend, io_kind: str, operation: str, params: Any, sidecar: bytes | None = None
) -> Reply:
    """prepare + execute one request (raises IORequestError when refused)."""
    prepared = backend.prepare(io_kind, operation, params, sidecar)
    return await backend.execute(prepared)


def payload(
    backend: str,
    operation: str,
    params: Any = None,
    *,
    io_kind: str = keys.IO_READ,
    cache_key: str | None = None,
) -> dict[str, Any]:
    """A CallWaiting(io) payload as the worker receives it."""
    return {
        keys.FP_TASK_ID: "t",
        keys.FP_WAIT_KIND: keys.WAIT_IO,
        keys.FP_ATTEMPT_SEQ: 1,
        keys.FP_IO_KIND: io_kind,
        keys.FP_BACKEND: backend,
        keys.FP_OPERATION: operation,
        keys.FP_PARAMS: params,
        keys.FP_CACHE_KEY: cache_key,
    }


async def answer(returned: Any) -> IOResult:
    """The IOResult of what handle_io returned (immediate or awaitable)."""
    if type(returned) is IOResult:
        return returned
    result = await returned
    assert type(result) is IOResult, result
    return result


def ok(result: IOResult) -> Any:
    assert result.error is None, result.error
    return result.result

"""BlockX: run huge numbers of calls of plain synchronous Python functions, fast and safely.

The worker API is exported lazily (``blockx.Worker``, ``blockx.Task``, ...): the
executor imports this package too, and must not pay for the worker's imports. So is
the client of ``blockx serve`` (``blockx.Client``, ``blockx.AsyncClient``: :mod:`blockx.client`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blockx import native as _native

__version__ = "0.1.0"

# Before any compiled module can be imported: run them compiled, or from their
# sources when the build is stale or BLOCKX_PURE_PYTHON is set (blockx.native).
_native.install()

#: Lazily exported names -> the module that defines them.
_LAZY = {
    "Worker": "blockx.worker.app",
    "TaskHandle": "blockx.worker.app",
    "Call": "blockx.worker.api",
    "CallFailure": "blockx.worker.api",
    "Task": "blockx.worker.api",
    "TaskFailureInfo": "blockx.worker.api",
    "TaskPolicy": "blockx.worker.api",
    "TaskResult": "blockx.worker.api",
    "TaskSpec": "blockx.worker.api",
    "TaskSpecError": "blockx.worker.api",
    "TaskStats": "blockx.worker.api",
    "IOHandler": "blockx.worker.io",
    "IOResult": "blockx.worker.io",
    "WorkerConfig": "blockx.worker.config",
    "load_config": "blockx.worker.config",
    # blockx.map: a function over an iterable, synchronously (docs/sdk.md)
    "map": "blockx.mapping",
    "MapCallError": "blockx.mapping",
    "MapError": "blockx.mapping",
    # the client of `blockx serve`: no worker import (a client machine needs only HTTP)
    "AsyncClient": "blockx.client",
    "AsyncRemoteTask": "blockx.client",
    "Client": "blockx.client",
    "ClientError": "blockx.client",
    "RemoteTask": "blockx.client",
}

# `map` is left out: `from blockx import *` must not shadow the builtin (use blockx.map).
__all__ = ["__version__", *sorted(name for name in _LAZY if name != "map")]

if TYPE_CHECKING:
    from blockx.client import (  # noqa: F401
        AsyncClient,
        AsyncRemoteTask,
        Client,
        ClientError,
        RemoteTask,
    )
    from blockx.mapping import MapCallError, MapError, map  # noqa: F401
    from blockx.worker.api import (  # noqa: F401
        Call,
        CallFailure,
        Task,
        TaskFailureInfo,
        TaskPolicy,
        TaskResult,
        TaskSpec,
        TaskSpecError,
        TaskStats,
    )
    from blockx.worker.app import TaskHandle, Worker  # noqa: F401
    from blockx.worker.config import WorkerConfig, load_config  # noqa: F401
    from blockx.worker.io import IOHandler, IOResult  # noqa: F401


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'blockx' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

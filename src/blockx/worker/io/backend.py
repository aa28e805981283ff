"""What an IO backend is: the contract between a task's IO scope and ``blockdb``, ``rpc``, ...

Theory of operation
-------------------
A backend answers requests of one name (``payload["backend"]``). The task's
:class:`~blockx.worker.io.scope.TaskIOScope` owns caching, singleflight and
statistics; a backend only does the work, in two steps:

1. :meth:`IOBackend.prepare` — synchronous, on the event loop, no IO: check
   the request (operation, ``ioKind``, params or sidecar) and return a
   :class:`PreparedRequest` naming its *domain* (the table a ``blockdb``
   request touches, the chain of an ``rpc`` request) and whether its answer may
   be cached. A request the backend refuses raises :class:`IORequestError`
   with a message the user can act on; nothing was sent anywhere.
2. :meth:`IOBackend.execute` — start the work and return an awaitable of a
   :class:`Reply`. A future is best (a backend that batches or runs a thread
   resolves it, no task per request); a coroutine is run as one task.
   Expected failures (a lost connection, a JSON-RPC error object) are a
   :class:`Reply` with ``error`` set; an exception escaping ``execute`` is a bug
   and answers ``io_error`` (not retryable).

Errors follow PROTOCOL.md: kind ``io_error``, ``retryable`` as the backend
says — transient failures (a lost connection, a timeout, a busy lock, HTTP 5xx
or 429) are retryable; a bad table name, bad params, a JSON-RPC error object
are not.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Final, Protocol, runtime_checkable

from blockx.wire import RemoteError, keys

from .handler import IOResult

__all__ = [
    "ERR_IO_ERROR",
    "IOBackend",
    "IORequestError",
    "PreparedRequest",
    "Reply",
]

ERR_IO_ERROR: Final = keys.ERR_IO_ERROR


class IORequestError(Exception):
    """A request a backend refuses before doing anything (bad operation, params, table name).

    ``retryable`` is almost always False: the same request would be refused again.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class PreparedRequest:
    """A checked request, ready for :meth:`IOBackend.execute`.

    ``domain`` groups requests for write invalidation: a write to a domain
    drops the task's cached reads of the same backend and domain (``None``: the
    whole backend). ``cacheable`` False keeps a read's answer out of the cache
    (identical concurrent reads still share one backend call). ``body`` is the
    backend's own parsed form of the request.
    """

    __slots__ = ("body", "cacheable", "domain", "operation")

    def __init__(
        self, operation: str, body: Any, *, domain: str | None, cacheable: bool = True
    ) -> None:
        self.operation = operation
        self.body = body
        self.domain = domain
        self.cacheable = cacheable

    def __repr__(self) -> str:
        return (
            f"PreparedRequest({self.operation!r}, domain={self.domain!r}, "
            f"cacheable={self.cacheable})"
        )


class Reply:
    """A backend's answer: a JSON ``result`` (and optional raw ``sidecar``) or an ``error``.

    ``nbytes`` estimates the answer's size (the cache's byte bound uses it); 0
    lets the cache estimate it from ``result``.
    """

    __slots__ = ("error", "nbytes", "result", "sidecar")

    def __init__(
        self,
        result: Any = None,
        *,
        sidecar: bytes | None = None,
        error: RemoteError | None = None,
        nbytes: int = 0,
    ) -> None:
        self.result = result
        self.sidecar = sidecar
        self.error = error
        self.nbytes = nbytes

    @classmethod
    def failure(cls, message: str, *, retryable: bool, kind: str = ERR_IO_ERROR) -> Reply:
        return cls(error=RemoteError(kind=kind, message=message, retryable=retryable))

    def to_io_result(self, budget_used_ms: int | None = None) -> IOResult:
        return IOResult(
            result=self.result,
            error=self.error,
            sidecar=self.sidecar,
            budget_used_ms=budget_used_ms,
        )

    def __repr__(self) -> str:
        if self.error is not None:
            return f"Reply(error={self.error!r})"
        return f"Reply(nbytes={self.nbytes}, sidecar={self.sidecar is not None})"


@runtime_checkable
class IOBackend(Protocol):
    """One named backend (see the module docstring)."""

    #: The ``backend`` value of the requests it serves.
    name: str

    def prepare(
        self, io_kind: str, operation: str, params: Any, sidecar: bytes | None
    ) -> PreparedRequest:
        """Check a request; raise :class:`IORequestError` when it cannot be served."""
        ...

    def execute(self, request: PreparedRequest) -> Awaitable[Reply]:
        """Start the request; the awaitable resolves to its :class:`Reply`."""
        ...

    async def close(self) -> None:
        """Release connections, threads and files. Idempotent."""
        ...

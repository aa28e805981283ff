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

Errors follow docs/protocol.md: kind ``io_error``, ``retryable`` as the backend
says — transient failures (a lost connection, a timeout, a busy lock, HTTP 5xx
or 429) are retryable; a bad table name, bad params, a JSON-RPC error object
are not.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Final, Protocol, runtime_checkable

from blockx.wire import keys

from .answers import PreparedRequest, Reply

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

"""The IO handler interface: how the worker answers a call's ``CallWaiting(waitKind=io)``.

Theory of operation
-------------------
User code reads a table or calls a node (``blockx.sdk.db``, ``blockx.sdk.rpc``,
``Table``, ``ChainState``); the executor suspends the call and sends
``CallWaiting(waitKind=io)`` with ``ioKind``, ``backend``, ``operation``,
``params`` (or a raw sidecar) and ``cacheKey``. The worker's orchestrator finds
the task the frame echoes (``taskId``) and hands the request to that task's
:class:`IOHandler`; whatever the handler answers goes back to the call as
``ResumeCall(resumeKind=io)``.

An :class:`IOHandler` is one method, ``handle_io(task_id, call_id, payload,
sidecar)``, called on the worker's event loop thread. It returns either

* an :class:`IOResult` right away (an answer from memory: the cheapest path,
  no future, no task), or
* an awaitable of one: an ``asyncio.Future`` (the orchestrator adds one done
  callback to it, again no task) or a coroutine (the orchestrator runs it as
  one ``asyncio.Task``; IO requests are naturally concurrent, so a task per
  request is acceptable here, but a backend that batches its requests should
  hand back futures).

The handler must not block the event loop. An exception — raised, or set on
the returned awaitable — fails the wait with ``io_error`` (not retryable) and
is logged. ``IOResult.budget_used_ms`` is charged to the call's budget; when
it is ``None`` the orchestrator charges the wall time the request took.

**Cancellation.** The worker cancels the future it got from ``handle_io``
(a coroutine's: the task it runs it as, so the coroutine is cancelled) when
nobody waits for it any more: the call's attempt failed or ended while it
waited (its budget ran out — the executor cut the wait off —, its executor was
lost), or it was cancelled — at most once per wait (a cancel that comes after
the answer changes nothing), and nothing is sent to the executor for it. So a
handler

* that completes its futures itself checks ``future.done()`` before
  ``set_result`` (a cancelled future refuses a result);
* that hands the *same* future to several waits must not let one waiter's
  cancel end the others' answer — give each waiter its own future
  (:class:`~blockx.worker.io.scope.TaskIOScope` does, and stops a read's
  backend call only when its last waiter is gone); a handler that shares one
  anyway gets the other waits failed with an ``io_error``
  ("the IO request was cancelled"), never left waiting;
* keeps a request that must finish once started (a write: cancelling does not
  undo it) away from the cancel — a separate future, or ``asyncio.shield``.

Real backends (``blockdb``, ``rpc``) arrive with the product issue: they plug in
here, usually behind :class:`BackendRouter`, which routes by
``payload["backend"]``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Final, Protocol, runtime_checkable

from blockx.wire import RemoteError, keys

from .answers import IOResult

__all__ = [
    "BackendRouter",
    "IOHandler",
    "IOResult",
    "IOReturn",
    "io_error",
    "no_io_handler",
]

#: Error kind of a failed IO wait (docs/protocol.md: retryable as the backend says).
ERR_IO_ERROR: Final = keys.ERR_IO_ERROR


#: What ``handle_io`` may return.
IOReturn = IOResult | Awaitable[IOResult]


@runtime_checkable
class IOHandler(Protocol):
    """Answers IO waits for one task (or for every task of a worker)."""

    def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOReturn:
        """Serve one ``CallWaiting(io)``. ``payload`` is the frame's payload (read it,
        do not keep it); ``task_id`` is the task's id as the user gave it. A returned
        future is cancelled when nobody waits for it any more (module docstring)."""
        ...


def io_error(message: str, *, retryable: bool = False, kind: str = ERR_IO_ERROR) -> IOResult:
    """An :class:`IOResult` that fails the wait with ``kind``."""
    return IOResult(error=RemoteError(kind=kind, message=message, retryable=retryable))


class _NoIOHandler:
    """The handler of a task with none: every IO wait fails, clearly."""

    __slots__ = ()

    def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOReturn:
        backend = payload.get(keys.FP_BACKEND)
        return io_error(
            f"no IO backend is configured for task {task_id!r} (backend {backend!r}); pass "
            "io_handlers= to Worker or io_handler= to the task"
        )

    def __repr__(self) -> str:
        return "no_io_handler"


#: Fails every IO wait with ``io_error`` (not retryable).
no_io_handler: Final[IOHandler] = _NoIOHandler()


class BackendRouter:
    """An :class:`IOHandler` that routes each request by its ``backend`` key.

    ``BackendRouter({"blockdb": table_store, "rpc": node_client})``; a request
    for a backend not listed fails with ``io_error`` (not retryable).
    """

    __slots__ = ("_backends",)

    def __init__(self, backends: Mapping[str, IOHandler]) -> None:
        self._backends = dict(backends)

    def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOReturn:
        backend = payload.get(keys.FP_BACKEND)
        handler = self._backends.get(backend) if isinstance(backend, str) else None
        if handler is None:
            return io_error(f"unknown IO backend {backend!r}; configured: {sorted(self._backends)}")
        return handler.handle_io(task_id, call_id, payload, sidecar)

    @property
    def backends(self) -> list[str]:
        return sorted(self._backends)

    def __repr__(self) -> str:
        return f"BackendRouter({self.backends})"

"""The worker adapters' one error hierarchy.

Two branches, as in every layer of BlockX (one hierarchy per layer, keeping
what went wrong outside apart from the caller's misuse, translated at one
boundary):

* :class:`AdapterError` — an outcome the caller must handle: a reservation the
  adapter refused (:class:`BindError`) or a frame it could not queue
  (:class:`SendError`). Each carries ``error_kind`` (a docs/protocol.md error kind
  or an adapter-specific one) and ``retryable``; the orchestrator turns it into
  an event for the core (``ArmCallRetry`` on a failed bind, a retryable failure
  on a failed send). Nothing was reserved or queued when one is raised.
* :class:`AdapterUsageError` — the caller misused the adapter (not started,
  closed, called twice). A bug, never retried.

The peer misbehaving (a malformed frame) is :class:`blockx.wire.ProtocolError`;
the adapter never lets one escape: it logs it, closes the connection and runs
the transport-lost path.

:class:`PoolError` covers the executor pool (a spawner that cannot start a
process, an unsupported spawn mode).
"""

from __future__ import annotations

from typing import ClassVar

from blockx.wire import keys

__all__ = [
    "AdapterError",
    "AdapterUsageError",
    "BindError",
    "CallDrainingError",
    "CallNotBoundError",
    "ExecutorCapacityError",
    "ExecutorUnavailableError",
    "OutboxFullError",
    "ParentNotResidentError",
    "PoolError",
    "SendError",
    "SpawnError",
]


class AdapterError(Exception):
    """Base of the adapter outcomes a caller handles; nothing was reserved or queued."""

    error_kind: ClassVar[str] = keys.ERR_INTERNAL_ERROR
    retryable: ClassVar[bool] = True

    def __init__(self, message: str, *, executor_id: str, call_id: str | None = None) -> None:
        super().__init__(message)
        self.executor_id = executor_id
        self.call_id = call_id


class BindError(AdapterError):
    """A reservation was refused (``bind`` / ``bind_subcall``)."""


class SendError(AdapterError):
    """A frame was not queued (``send_*``)."""


class ExecutorUnavailableError(BindError, SendError):
    """The executor has no attached, live connection (never attached, lost, or reconnecting)."""

    error_kind: ClassVar[str] = keys.ERR_TRANSPORT_LOST

    def __init__(self, executor_id: str, *, call_id: str | None = None, reason: str = "") -> None:
        detail = f": {reason}" if reason else ""
        super().__init__(
            f"executor {executor_id!r} has no live connection{detail}",
            executor_id=executor_id,
            call_id=call_id,
        )
        self.reason = reason


class ExecutorCapacityError(BindError):
    """Every usable context of the executor is reserved (a root call only; sub-calls are exempt)."""

    error_kind: ClassVar[str] = keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED

    def __init__(self, executor_id: str, *, call_id: str, reserved: int, usable: int) -> None:
        super().__init__(
            f"executor {executor_id!r} is full: {reserved} reservations, {usable} usable contexts",
            executor_id=executor_id,
            call_id=call_id,
        )
        self.reserved = reserved
        self.usable = usable


class ParentNotResidentError(BindError):
    """``bind_subcall`` for a parent with no live (bound, not draining) reservation there."""

    error_kind: ClassVar[str] = keys.ERR_SUBCALL_PARENT_NOT_RESIDENT

    def __init__(self, executor_id: str, *, call_id: str, parent_call_id: str) -> None:
        super().__init__(
            f"sub-call {call_id!r}: parent {parent_call_id!r} holds no live reservation "
            f"on executor {executor_id!r}",
            executor_id=executor_id,
            call_id=call_id,
        )
        self.parent_call_id = parent_call_id


class OutboxFullError(SendError):
    """The connection's outbox is full. The adapter no longer raises it (call frames
    wait for a backed-up connection instead: :mod:`.connection`); kept so that code
    and test doubles that name it still work."""

    error_kind: ClassVar[str] = "outbox_full"

    def __init__(self, executor_id: str, *, call_id: str | None, depth: int) -> None:
        super().__init__(
            f"outbox of executor {executor_id!r} is full ({depth} frames queued)",
            executor_id=executor_id,
            call_id=call_id,
        )
        self.depth = depth


class CallNotBoundError(SendError):
    """A call frame for a call with no reservation on this connection (unbound, or a new era)."""

    error_kind: ClassVar[str] = keys.ERR_TRANSPORT_LOST

    def __init__(self, executor_id: str, *, call_id: str) -> None:
        super().__init__(
            f"call {call_id!r} holds no reservation on executor {executor_id!r}",
            executor_id=executor_id,
            call_id=call_id,
        )


class CallDrainingError(SendError):
    """``send_execute_call`` for a reservation already marked draining (the call was cancelled)."""

    error_kind: ClassVar[str] = keys.ERR_CANCELLED
    retryable: ClassVar[bool] = False

    def __init__(self, executor_id: str, *, call_id: str) -> None:
        super().__init__(
            f"call {call_id!r} is draining on executor {executor_id!r}; not sent",
            executor_id=executor_id,
            call_id=call_id,
        )


class AdapterUsageError(RuntimeError):
    """The adapter or pool was used out of order (not started, already closed)."""


class PoolError(Exception):
    """Base of the executor pool's errors."""


class SpawnError(PoolError):
    """An executor process could not be started."""

    def __init__(self, executor_id: str, message: str) -> None:
        super().__init__(f"cannot start executor {executor_id!r}: {message}")
        self.executor_id = executor_id

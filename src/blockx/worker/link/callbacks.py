"""What the executor adapter tells the orchestrator, and the function-code resolver it asks.

Every callback is a plain synchronous function called on the event loop thread
from inside the adapter (mostly from ``data_received``). It must not block and
must not await: the intended body is "append an event to the dispatch actor's
queue". The adapter calls :attr:`AdapterCallbacks.on_batch_done` once after each
batch of inbound frames, so the actor can be woken once per batch rather than
once per frame.

An exception raised by a callback is logged with the executor id and swallowed:
a bug in the orchestrator must not tear down an executor connection.

Ordering guarantees:

* ``on_executor_attached`` precedes every other callback about that executor
  id in that era; ``on_executor_lost`` ends the era and is called after the
  adapter's snapshot already shows the executor unhealthy with no reservations
  (possibly a little later, from a timer or the pool's exit callback, when it
  waits for the process's exit status), and before that id's next attach.
* For one connection, call callbacks arrive in frame order.
* Every ``send_resume_call`` / ``send_cancel_call`` that returned normally is
  reported exactly once, by ``on_control_sent`` or ``on_control_failed``.

Batch delivery: a receiver that handles frames a read at a time (the
orchestrator) sets :attr:`AdapterCallbacks.on_call_frames` and
:attr:`AdapterCallbacks.on_controls_sent`. Then every ``CallCompleted``,
``CallFailed`` and ``CallWaiting`` (io / subcall) frame of one read arrives in
*one* ``on_call_frames`` call, in frame order, instead of one
``on_call_completed`` / ``on_call_failed`` / ``on_call_waiting`` call each; and
the control frames one flush handed to the transport arrive in one
``on_controls_sent`` call. Per frame that is a tuple append instead of a
callback and an event (docs/operations.md, "Compiled modules": the worker
spends 8–15 µs of CPU per trivial call). The order guarantees above hold
across both forms: the batch is delivered before any later callback of the
same connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blockx.wire import RemoteError
from blockx.worker.errors import ExecutorUnavailableError
from blockx.worker.link.connection import ControlSend
from blockx.worker.link.loss import ExecutorLoss
from blockx.worker.link.reservations import LostCall
from blockx.worker.link.snapshot import ExecutorSnapshot

__all__ = [
    "AdapterCallbacks",
    "CallFrame",
    "FunctionCodeResolver",
    "FunctionCodeUnavailable",
    "PeerCheck",
]


#: One inbound call frame for ``on_call_frames``:
#: ``(message_type, call_id, payload, request_id, sidecar)`` -- ``message_type``
#: is ``CallCompleted``, ``CallFailed`` or ``CallWaiting``; ``request_id`` and
#: ``sidecar`` are ``None`` except for ``CallWaiting``. For terminal frames the
#: reservation is already released, as for ``on_call_completed``. The payload is
#: the dict envelope's, or for a ``CallCompleted`` decoded typed its
#: :class:`~blockx.worker.link.completed_frames.CompletedPayload` (output kept
#: as JSON; ``to_wire()`` gives the dict).
CallFrame = tuple[str, str, Any, "str | None", "bytes | None"]


def _ignore(*_args: Any) -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterCallbacks:
    """The orchestrator's entry points; any left out are ignored."""

    #: ``(executor_id, snapshot)`` — the first valid Heartbeat of a connection.
    on_executor_attached: Callable[[str, ExecutorSnapshot], None] = _ignore
    #: ``(executor_id, snapshot)`` — every Heartbeat after the attaching one.
    on_heartbeat: Callable[[str, ExecutorSnapshot], None] = _ignore
    #: ``(executor_id, call_id, payload)`` — CallCompleted; the reservation is
    #: already released (unless the frame was for a replaced attempt).
    on_call_completed: Callable[[str, str, dict[str, Any]], None] = _ignore
    #: ``(executor_id, call_id, payload)`` — CallFailed; released likewise.
    on_call_failed: Callable[[str, str, dict[str, Any]], None] = _ignore
    #: ``(executor_id, call_id, request_id, payload, sidecar)`` — CallWaiting of
    #: kind ``io`` or ``subcall`` (``function_code`` waits are answered by the
    #: adapter and never reach the orchestrator).
    on_call_waiting: Callable[[str, str, str, dict[str, Any], bytes | None], None] = _ignore
    #: ``(executor_id, lost_calls, reason, loss)`` — the connection era ended
    #: (disconnect, heartbeat timeout, protocol error, reconnect, the process
    #: died). Every call that held a reservation there is in ``lost_calls``
    #: (``LostCall.started``: it had sent an io / sub-call wait). ``loss`` says why, as far as
    #: the worker can tell (:class:`~blockx.worker.link.loss.ExecutorLoss`:
    #: cause, message, the call running when it died, the started calls): the
    #: blame rules of docs/security.md take it from there. May come up to the
    #: adapter's ``exit_wait_ms`` after the snapshot went unhealthy (it waits for
    #: the exit status), never after the same executor id attached again.
    on_executor_lost: Callable[[str, tuple[LostCall, ...], str, ExecutorLoss], None] = _ignore
    #: ``(note)`` — a ResumeCall / CancelCall was handed to the transport.
    on_control_sent: Callable[[ControlSend], None] = _ignore
    #: ``(note, error)`` — the connection ended before it could be.
    on_control_failed: Callable[[ControlSend, ExecutorUnavailableError], None] = _ignore
    #: ``(executor_id)`` — a batch of inbound frames has been delivered.
    on_batch_done: Callable[[str], None] = _ignore
    #: ``(executor_id, frames)`` — if set, replaces the three per-frame call
    #: callbacks above: every call frame of one read, in order (see the module
    #: docstring). The list is the receiver's to keep.
    on_call_frames: Callable[[str, list[CallFrame]], None] | None = None
    #: ``(notes)`` — if set, replaces ``on_control_sent``: every control frame
    #: one flush handed to the transport, in order. The list is the receiver's.
    on_controls_sent: Callable[[list[ControlSend]], None] | None = None


class FunctionCodeUnavailable(Exception):
    """Raised by a resolver that cannot supply a source; sent to the executor as the wait's error.

    The executor fails the call with ``function_code_fetch_failed`` and this
    ``retryable`` flag.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


#: ``(task_id, function_id, digest) -> source`` for ``waitKind=function_code``.
#: Return the source text (its sha256 must be ``digest``), or a
#: :class:`~blockx.wire.RemoteError`, or raise :class:`FunctionCodeUnavailable`.
#: Called on the event loop thread: it must answer from memory (the task's
#: pinned code view), never block.
FunctionCodeResolver = Callable[[str, str, str], "str | RemoteError"]

#: ``(executor_id, peer_pid) -> None`` to let a connection attach as ``executor_id``, or
#: why not (see ``ExecutorAdapter.set_peer_check``).
PeerCheck = Callable[[str, "int | None"], "str | None"]

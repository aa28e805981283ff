"""Worker -> executor frames: the part of the executor adapter that sends.

:class:`OutboundSends` is held by
:class:`~blockx.worker.link.adapter.ExecutorAdapter` (``adapter.outbound``),
whose ``send_*``, ``flush`` and ``wait_flushed`` call it. It holds one thing:
the adapter's table of :class:`~blockx.worker.link.state.ExecutorState`, from
which it reads each executor's current connection and reservations (it checks
a reservation and records the attempt sent; it never binds or releases). Every
send only queues: a frame goes into the connection's outbox, which writes up to
``frames_per_write`` frames at once, at the end of the loop turn or when full.

* ``ExecuteCall`` needs the call's reservation on that executor, not draining;
  it waits in the outbox while the connection is backed up (never refused for
  room: :mod:`.connection`). The attempt sent is recorded, so a terminal frame
  of a replaced attempt releases nothing.
* ``ResumeCall`` and ``CancelCall`` are control frames: they count as sent only
  once handed to the transport (``on_controls_flushed``), or fail with the
  connection (``on_control_failed``) -- exactly one of the two.

Envelopes are encoded with orjson on the hot path and with the wire's strict
encoder when orjson refuses a value (big ints), which also raises the typed
:class:`~blockx.wire.EncodeError` for anything unencodable.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

import orjson

from blockx.wire import MAX_FRAME_BYTES, PayloadTooLargeError, encode_frame, keys
from blockx.wire.messages import to_wire
from blockx.wire.schema import ExecuteCallPayload, ResumeCallPayload
from blockx.worker.errors import CallNotBoundError
from blockx.worker.link.connection import ControlSend
from blockx.worker.link.state import ExecutorState, unavailable_error

__all__ = ["OutboundSends"]

_dumps: Final = orjson.dumps
_pack_length: Final = struct.Struct(">I").pack
_new_note: Final = tuple.__new__

_MT_EXECUTE_CALL: Final = keys.MT_EXECUTE_CALL
_MT_RESUME_CALL: Final = keys.MT_RESUME_CALL
_MT_CANCEL_CALL: Final = keys.MT_CANCEL_CALL
_F_MESSAGE_TYPE: Final = keys.F_MESSAGE_TYPE
_F_CALL_ID: Final = keys.F_CALL_ID
_F_REQUEST_ID: Final = keys.F_REQUEST_ID
_F_PAYLOAD: Final = keys.F_PAYLOAD
_F_TRACE: Final = keys.F_TRACE
_FP_ATTEMPT_SEQ: Final = keys.FP_ATTEMPT_SEQ


def _encode(envelope: dict[str, Any]) -> bytes:
    """One plain frame: orjson on the fast path, the wire's strict encoder otherwise."""
    try:
        body = _dumps(envelope)
    except TypeError:
        return encode_frame(envelope)  # big ints via the stdlib, or a typed EncodeError
    if len(body) > MAX_FRAME_BYTES:
        raise PayloadTooLargeError(len(body), MAX_FRAME_BYTES)
    return _pack_length(len(body)) + body


class OutboundSends:
    """The adapter's sends; see the module docstring."""

    __slots__ = ("_executors",)

    def __init__(self, executors: dict[str, ExecutorState]) -> None:
        #: The adapter's table (shared, never replaced).
        self._executors = executors

    def __repr__(self) -> str:
        attached = sum(1 for s in self._executors.values() if s.connection is not None)
        return f"OutboundSends(attached={attached}/{len(self._executors)})"

    def send_execute_call(
        self,
        executor_id: str,
        call_id: str,
        payload: Mapping[str, Any] | ExecuteCallPayload,
        *,
        trace: Mapping[str, str] | None = None,
    ) -> None:
        """Queue an ``ExecuteCall`` for a bound call; never blocks.

        ``payload`` is the ExecuteCall payload dict (docs/protocol.md keys; values
        from user code may be ``orjson.Fragment``) or the wire schema's
        :class:`~blockx.wire.schema.ExecuteCallPayload`. Raises :class:`ExecutorUnavailableError`,
        :class:`CallNotBoundError` (no
        reservation in this era, retryable), :class:`CallDrainingError` (the
        call was cancelled), or an :class:`~blockx.wire.EncodeError`.
        """
        # The hot path of dispatch: a few dict lookups, one orjson call, one list append.
        state = self._executors.get(executor_id)
        conn = None if state is None else state.connection
        if conn is None:
            raise unavailable_error(state, executor_id, call_id)
        reservations = state.reservations  # type: ignore[union-attr]
        reservations.check_sendable(call_id)
        if type(payload) is not dict:
            payload = to_wire(payload) if isinstance(payload, ExecuteCallPayload) else dict(payload)
        envelope: dict[str, Any] = {
            _F_MESSAGE_TYPE: _MT_EXECUTE_CALL,
            _F_CALL_ID: call_id,
            _F_PAYLOAD: payload,
        }
        if trace is not None:
            envelope[_F_TRACE] = dict(trace)
        conn.enqueue(_encode(envelope), call_id)
        attempt = payload.get(_FP_ATTEMPT_SEQ, 1)
        reservations.note_dispatched(call_id, attempt if type(attempt) is int else 1)

    def send_execute_call_encoded(
        self, executor_id: str, call_id: str, attempt_seq: int, body: bytes
    ) -> None:
        """:meth:`send_execute_call` for an envelope encoded by the caller (the
        orchestrator pre-encodes its ExecuteCalls: ``orchestrator_execute.py``).

        ``body`` is the frame's JSON: a complete ``ExecuteCall`` envelope for
        ``call_id`` whose payload's ``attemptSeq`` is ``attempt_seq``. Raises like
        :meth:`send_execute_call` (a body over the frame limit:
        :class:`~blockx.wire.PayloadTooLargeError`).
        """
        state = self._executors.get(executor_id)
        conn = None if state is None else state.connection
        if conn is None:
            raise unavailable_error(state, executor_id, call_id)
        reservations = state.reservations  # type: ignore[union-attr]
        reservations.check_sendable(call_id)
        size = len(body)
        if size > MAX_FRAME_BYTES:
            raise PayloadTooLargeError(size, MAX_FRAME_BYTES)
        conn.enqueue(_pack_length(size) + body, call_id)
        reservations.note_dispatched(call_id, attempt_seq)

    def send_resume_call(
        self,
        executor_id: str,
        call_id: str,
        request_id: str,
        payload: Mapping[str, Any] | ResumeCallPayload,
        *,
        sidecar: bytes | None = None,
        token: Any = None,
    ) -> None:
        """Queue a ``ResumeCall`` answering the wait ``request_id``.

        It counts as sent only once handed to the transport: then
        ``on_control_sent(ControlSend(..., token))`` follows, or
        ``on_control_failed`` if the connection ends first — exactly one of the
        two. Raises (nothing queued, no callback) :class:`ExecutorUnavailableError`,
        :class:`CallNotBoundError` or an
        :class:`~blockx.wire.EncodeError`: fail the waiting call as
        ``resume_send_failed`` (retryable) — or with the EncodeError's kind.
        """
        state = self._executors.get(executor_id)
        conn = None if state is None else state.connection
        if conn is None:
            raise unavailable_error(state, executor_id, call_id)
        if call_id not in state.reservations.reserved:  # type: ignore[union-attr]
            raise CallNotBoundError(executor_id, call_id=call_id)
        if type(payload) is not dict and isinstance(payload, ResumeCallPayload):
            payload = to_wire(payload)
        envelope = {
            _F_MESSAGE_TYPE: _MT_RESUME_CALL,
            _F_CALL_ID: call_id,
            _F_REQUEST_ID: request_id,
            _F_PAYLOAD: payload,
        }
        if sidecar is None:
            frame = _encode(envelope)
        else:
            frame = encode_frame(envelope, sidecar)
        conn.enqueue_control(
            frame,
            # ControlSend(...) without its Python-level __new__ (once per IO wait).
            _new_note(ControlSend, (executor_id, _MT_RESUME_CALL, call_id, request_id, token)),
            call_id,
        )

    def send_cancel_call(
        self,
        executor_id: str,
        call_id: str,
        *,
        attempt_seq: int,
        reason: str = keys.DEFAULT_CANCEL_REASON,
        token: Any = None,
    ) -> None:
        """Queue a best-effort ``CancelCall``; reported like :meth:`send_resume_call`.

        Pair it with :meth:`mark_draining`: the reservation then stays until
        the executor's terminal frame. Sent whether or not the call is still
        reserved (the executor drops a stale cancel). Raises
        :class:`ExecutorUnavailableError`.
        """
        state = self._executors.get(executor_id)
        conn = None if state is None else state.connection
        if conn is None:
            raise unavailable_error(state, executor_id, call_id)
        envelope = {
            _F_MESSAGE_TYPE: _MT_CANCEL_CALL,
            _F_CALL_ID: call_id,
            _F_PAYLOAD: {keys.FP_REASON: reason, _FP_ATTEMPT_SEQ: attempt_seq},
        }
        conn.enqueue_control(
            _encode(envelope),
            ControlSend(executor_id, _MT_CANCEL_CALL, call_id, None, token),
            call_id,
        )

    def flush(self, executor_id: str | None = None) -> None:
        """Write what is queued now instead of at the end of this loop turn (all executors
        when ``executor_id`` is None). Optional: queued frames are flushed anyway."""
        if executor_id is not None:
            state = self._executors.get(executor_id)
            if state is not None and state.connection is not None:
                state.connection.flush()
            return
        for state in self._executors.values():
            if state.connection is not None:
                state.connection.flush()

    async def wait_flushed(self, executor_id: str) -> None:
        """Return once every frame queued so far for ``executor_id`` was handed to the
        transport (one future for the whole batch). Raises :class:`ExecutorUnavailableError`
        if the connection is gone or ends first."""
        state = self._executors.get(executor_id)
        conn = None if state is None else state.connection
        if conn is None:
            raise unavailable_error(state, executor_id, None)
        await conn.wait_flushed()

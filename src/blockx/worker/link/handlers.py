"""Executor → worker message handling (seed: ``adapters/executor/handlers.go``).

:class:`InboundHandlers` is the part of
:class:`~blockx.worker.link.adapter.ExecutorAdapter` that reads; the adapter
holds one (``adapter.inbound``) and every connection hands it its frames
(its :class:`~blockx.worker.link.connection.FrameReceiver`). Every batch of
frames one read completed arrives in :meth:`InboundHandlers.on_frames` (called
by the connection's ``data_received``) and is routed by ``messageType``:

* before attach — the first valid ``Heartbeat`` attaches the connection
  (a new era of its ``executorId``); any other known type is a protocol error;
  unknown types are dropped;
* ``CallCompleted`` / ``CallFailed`` — release the reservation (transport
  truth; a frame for a replaced attempt releases nothing), count it for
  completion compensation, then ``on_call_completed`` / ``on_call_failed``;
* ``CallWaiting`` — ``io`` and ``subcall`` go to ``on_call_waiting``;
  ``function_code`` is answered here from the resolver;
* with ``on_call_frames`` set, the call frames of the two rules above are
  collected and handed over as one list instead (before any other callback of
  the connection, and at the end of the batch);
* ``Heartbeat`` — new snapshot data, a lossy ``HeartbeatAck``, ``on_heartbeat``;
  a Heartbeat announcing ``features: ["batch"]`` turns batched frames on for its
  connection and is acked with ``features: ["batch"]`` (docs/protocol.md
  "Batched frames"); any other is acked with the v1 empty payload;
* a worker→executor type, or a known frame of the wrong shape — protocol
  error: logged, the era ends (connection closed, calls reported lost with
  cause ``protocol_error``). Every call frame is checked *before* it changes
  anything (:func:`call_frame_error`): ``callId`` a non-empty string, the payload
  an object, ``attemptSeq`` an int >= 1 (not ``"1"``, 0, null or a bool) and not
  later than the attempt the worker sent, ``output`` present on
  ``CallCompleted``, ``errorKind`` a non-empty string on ``CallFailed``, the
  optional members of their docs/protocol.md types;
* anything else — logged and dropped (docs/protocol.md, "Envelope").

The hot path reads envelopes as dicts, or as the wire schema's Structs when the
connection decoded them typed (``completed_frames.py``). Heartbeats (one a second)
are validated in full into the schema's ``HeartbeatPayload``
(:func:`blockx.wire.validate`), which the executor's state keeps.

Who owns what: the handlers own the inbound counts (``unknown_frames``,
``refused_attaches``, ``stale_terminal_frames``, ``function_code_answered``)
and hold what the adapter gives them: its table of
:class:`~blockx.worker.link.state.ExecutorState` (they create an entry on a
first attach, update it on heartbeats and terminal frames), its
:class:`~blockx.worker.link.eras.Eras` (an attach begins an era; a protocol
error or a superseded connection ends one), its clock and heartbeat timeout
(for the snapshots they report), and the settings the adapter's setters
replace: ``callbacks``, ``resolver``, ``peer_check``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from blockx.wire import (
    FEATURE_BATCH,
    EncodeError,
    Frame,
    PayloadError,
    encode_frame,
    keys,
    validate,
)
from blockx.wire.schema import HeartbeatPayload
from blockx.worker.errors import ExecutorUnavailableError, OutboxFullError
from blockx.worker.link.callbacks import (
    AdapterCallbacks,
    CallFrame,
    FunctionCodeResolver,
    PeerCheck,
)
from blockx.worker.link.completed_frames import CompletedFrame, WaitingFrame
from blockx.worker.link.connection import ExecutorConnection
from blockx.worker.link.eras import Eras
from blockx.worker.link.function_code import function_code_resume_payload
from blockx.worker.link.state import ExecutorState, attached_state, build_snapshot

__all__ = [
    "HEARTBEAT_ACK_BATCH_FRAME",
    "HEARTBEAT_ACK_FRAME",
    "InboundHandlers",
    "call_frame_error",
]

_log = logging.getLogger("blockx.worker.adapter")

_MT_RESUME_CALL: Final = keys.MT_RESUME_CALL
_MT_CALL_COMPLETED: Final = keys.MT_CALL_COMPLETED
_MT_CALL_FAILED: Final = keys.MT_CALL_FAILED
_MT_CALL_WAITING: Final = keys.MT_CALL_WAITING
_MT_HEARTBEAT: Final = keys.MT_HEARTBEAT
_F_MESSAGE_TYPE: Final = keys.F_MESSAGE_TYPE
_F_CALL_ID: Final = keys.F_CALL_ID
_F_REQUEST_ID: Final = keys.F_REQUEST_ID
_F_PAYLOAD: Final = keys.F_PAYLOAD
_FP_ATTEMPT_SEQ: Final = keys.FP_ATTEMPT_SEQ
_FP_WAIT_KIND: Final = keys.FP_WAIT_KIND
_FP_TASK_ID: Final = keys.FP_TASK_ID
_WAIT_FUNCTION_CODE: Final = keys.WAIT_FUNCTION_CODE
# A tuple, not a set: a waitKind that is not hashable (a list) is then just not one of them.
_ORCHESTRATOR_WAIT_KINDS: Final = (keys.WAIT_IO, keys.WAIT_SUBCALL)

_FP_OUTPUT: Final = keys.FP_OUTPUT
_FP_BUDGET_USED_MS: Final = keys.FP_BUDGET_USED_MS
_FP_ERROR_KIND: Final = keys.FP_ERROR_KIND
#: Optional members of CallCompleted / CallFailed and what they must be when present.
_OPTIONAL_STRINGS: Final = (
    keys.FP_TASK_ID,
    keys.FP_DEBUG_OUTPUT,
    keys.FP_ERROR_MESSAGE,
    keys.FP_ERROR_STACK,
)


def _bad_attempt(attempt: object) -> bool:
    return type(attempt) is not int or attempt < 1


def call_frame_error(message_type: str, call_id: object, payload: object) -> str | None:
    """What is wrong with a ``CallCompleted`` / ``CallFailed`` (generic form), or None.

    Checked before the frame changes anything; the adapter turns an answer into a
    protocol error of the connection.
    """
    if type(call_id) is not str or not call_id:
        return f"{message_type}: callId must be a non-empty string, got {call_id!r}"
    if type(payload) is not dict:
        return f"{message_type} for {call_id}: payload must be an object"
    attempt = payload.get(_FP_ATTEMPT_SEQ)
    if _bad_attempt(attempt):
        return f"{message_type} for {call_id}: attemptSeq must be an int >= 1, got {attempt!r}"
    if message_type == _MT_CALL_COMPLETED:
        if _FP_OUTPUT not in payload:
            return f"CallCompleted for {call_id}: no output"
    else:
        kind = payload.get(_FP_ERROR_KIND)
        if type(kind) is not str or not kind:
            return f"CallFailed for {call_id}: errorKind must be a non-empty string, got {kind!r}"
        retryable = payload.get(keys.FP_RETRYABLE)
        if retryable is not None and type(retryable) is not bool:
            return f"CallFailed for {call_id}: retryable must be a bool, got {retryable!r}"
    budget = payload.get(_FP_BUDGET_USED_MS)
    if budget is not None and (type(budget) is not int or budget < 0):
        return f"{message_type} for {call_id}: budgetUsedMs must be an int >= 0, got {budget!r}"
    for key in _OPTIONAL_STRINGS:
        value = payload.get(key)
        if value is not None and type(value) is not str:
            return f"{message_type} for {call_id}: {key} must be a string, got {value!r}"
    return None


#: A frame as read here: its envelope is a dict or, decoded typed, a CompletedFrame or a
#: WaitingFrame (``Frame`` says dict: compiled with mypyc, reading it as one would check that).
_ReadFrame = tuple[Any, bytes | None]

#: HeartbeatAck never changes: encode it once (the v1 ack, and the one that answers an
#: executor announcing batched frames).
HEARTBEAT_ACK_FRAME: Final = encode_frame(
    {keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT_ACK, keys.F_PAYLOAD: {}}
)
HEARTBEAT_ACK_BATCH_FRAME: Final = encode_frame(
    {
        keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT_ACK,
        keys.F_PAYLOAD: {keys.FP_FEATURES: [FEATURE_BATCH]},
    }
)


def _acknowledge(conn: ExecutorConnection, heartbeat: HeartbeatPayload) -> None:
    """Ack ``heartbeat`` on ``conn``; the executor's announced features decide whether
    the connection sends batched frames from now on, and the ack says so."""
    batching = FEATURE_BATCH in heartbeat.features
    conn.batching = batching
    conn.enqueue_lossy(HEARTBEAT_ACK_BATCH_FRAME if batching else HEARTBEAT_ACK_FRAME)


class InboundHandlers:
    """The adapter's inbound frame handling; see the module docstring."""

    __slots__ = (
        "_clock",
        "_eras",
        "_executors",
        "_heartbeat_timeout_ms",
        "callbacks",
        "function_code_answered",
        "peer_check",
        "refused_attaches",
        "resolver",
        "stale_terminal_frames",
        "unknown_frames",
    )

    def __init__(
        self,
        executors: dict[str, ExecutorState],
        eras: Eras,
        *,
        callbacks: AdapterCallbacks,
        resolver: FunctionCodeResolver | None,
        clock: Callable[[], float],
        heartbeat_timeout_ms: int,
    ) -> None:
        self._executors = executors
        self._eras = eras
        self._clock = clock
        self._heartbeat_timeout_ms = heartbeat_timeout_ms
        #: The orchestrator's entry points (``ExecutorAdapter.set_callbacks``).
        self.callbacks = callbacks
        #: Answers ``function_code`` waits (``ExecutorAdapter.set_function_code_resolver``).
        self.resolver = resolver
        #: Who may attach as which executor id (``ExecutorAdapter.set_peer_check``).
        self.peer_check: PeerCheck | None = None
        # Counters, for tests, benches and logs.
        self.unknown_frames = 0
        self.refused_attaches = 0
        self.stale_terminal_frames = 0
        self.function_code_answered = 0

    def __repr__(self) -> str:
        return (
            f"InboundHandlers(executors={len(self._executors)}, unknown={self.unknown_frames}, "
            f"refused={self.refused_attaches}, stale={self.stale_terminal_frames}, "
            f"function_code_answered={self.function_code_answered})"
        )

    def on_frames(self, conn: ExecutorConnection, frames: list[Frame]) -> None:
        """One batch of inbound frames (one read). The hot path."""
        state = attached_state(self._executors, conn)
        start = 0
        count = len(frames)
        if state is None:
            # Before attach only a Heartbeat may come (unknown types are dropped).
            while start < count:
                first: _ReadFrame = frames[start]
                envelope = first[0]
                start += 1
                if isinstance(envelope, CompletedFrame):  # decoded typed (completed_frames.py)
                    message_type = _MT_CALL_COMPLETED
                elif isinstance(envelope, WaitingFrame):
                    message_type = _MT_CALL_WAITING
                else:
                    message_type = envelope[_F_MESSAGE_TYPE]
                if message_type == _MT_HEARTBEAT:
                    state = self._attach(conn, envelope)
                    if state is None:
                        return
                    break
                if message_type in keys.MESSAGE_TYPES:
                    self._protocol_error(conn, f"{message_type} before the attaching Heartbeat")
                    return
                self._drop_unknown(conn, message_type)
            if state is None:
                return
        executor_id = state.executor_id
        reservations = state.reservations
        callbacks = self.callbacks
        on_completed = callbacks.on_call_completed
        on_failed = callbacks.on_call_failed
        # Batch delivery (callbacks.py): call frames collect here, in order, and go out
        # before any other callback of this connection and at the end of the batch.
        on_call_frames = callbacks.on_call_frames
        call_frames: list[CallFrame] | None = None if on_call_frames is None else []
        error: str | None = None
        for index in range(start, count):
            frame: _ReadFrame = frames[index]
            envelope = frame[0]
            payload: Any
            call_id: Any
            if isinstance(envelope, CompletedFrame):  # decoded typed (completed_frames.py)
                message_type = _MT_CALL_COMPLETED
                call_id = envelope.callId
                payload = envelope.payload
                attempt: object = payload.attemptSeq
            else:
                request_id: Any
                if type(envelope) is WaitingFrame:  # decoded typed (completed_frames.py)
                    message_type = _MT_CALL_WAITING
                    call_id = envelope.callId
                    request_id = envelope.requestId
                    payload = envelope.payload
                else:
                    message_type = envelope[_F_MESSAGE_TYPE]
                    if message_type == _MT_CALL_WAITING:
                        call_id = envelope.get(_F_CALL_ID)
                        request_id = envelope.get(_F_REQUEST_ID)
                        payload = envelope.get(_F_PAYLOAD)
                if message_type == _MT_CALL_WAITING:
                    # The common case, inline and first (once per IO wait): a well-formed
                    # io / subcall wait collected for the batch. Anything else about it
                    # goes to _handle_call_waiting below.
                    if (
                        call_frames is not None
                        and type(call_id) is str
                        and type(request_id) is str
                        and type(payload) is dict
                        and type(payload.get(_FP_TASK_ID)) is str
                        and payload.get(_FP_WAIT_KIND) in _ORCHESTRATOR_WAIT_KINDS
                        and call_id
                        and type(payload.get(_FP_ATTEMPT_SEQ)) is int
                        and payload[_FP_ATTEMPT_SEQ] >= 1
                    ):
                        if call_id in reservations.reserved:
                            reservations.started.add(call_id)
                        call_frames.append(
                            (_MT_CALL_WAITING, call_id, payload, request_id, frame[1])
                        )
                        continue
                elif message_type == _MT_CALL_COMPLETED or message_type == _MT_CALL_FAILED:
                    call_id = envelope.get(_F_CALL_ID)
                    payload = envelope.get(_F_PAYLOAD)
                    error = call_frame_error(message_type, call_id, payload)
                    if error is not None:
                        break
                    attempt = payload[_FP_ATTEMPT_SEQ]
            if message_type == _MT_CALL_COMPLETED or message_type == _MT_CALL_FAILED:
                # attempt: an int >= 1 here (the typed decode or call_frame_error said so).
                if call_id in reservations.reserved:
                    ahead = reservations.attempt_ahead(call_id, attempt)  # type: ignore[arg-type]
                    if ahead is not None:
                        error = (
                            f"{message_type} for {call_id}: attemptSeq {attempt} was never "
                            f"sent (the last attempt sent is {ahead})"
                        )
                        break
                if not reservations.release_on_terminal(call_id, attempt):
                    self.stale_terminal_frames += 1
                state.completions_since_heartbeat += 1
                if call_frames is not None:
                    call_frames.append((message_type, call_id, payload, None, None))
                    continue
                if type(payload) is not dict:  # the per-frame callbacks take the dict form
                    payload = payload.to_wire()
                try:
                    if message_type == _MT_CALL_COMPLETED:
                        on_completed(executor_id, call_id, payload)
                    else:
                        on_failed(executor_id, call_id, payload)
                except Exception:
                    _log.exception(
                        "%s callback failed for %s on %s", message_type, call_id, executor_id
                    )
                continue
            if message_type == _MT_CALL_WAITING:
                if type(envelope) is WaitingFrame:
                    envelope = envelope.to_dict()  # the generic path's form, for its errors
                error = self._handle_call_waiting(state, conn, envelope, frame[1], call_frames)
                if error is not None:
                    break
            elif message_type in keys.MESSAGE_TYPES:
                if call_frames:
                    call_frames = self._deliver_call_frames(executor_id, call_frames)
                if message_type == _MT_HEARTBEAT:
                    self._handle_heartbeat(state, conn, envelope)
                else:
                    self._protocol_error(conn, f"{message_type} is not sent by executors")
            else:
                self._drop_unknown(conn, message_type)
            if conn.closed:
                return  # a handler ended the era; the rest of the batch is void
        if call_frames:
            self._deliver_call_frames(executor_id, call_frames)
        if error is not None:
            self._protocol_error(conn, error)
            return
        try:
            callbacks.on_batch_done(executor_id)
        except Exception:
            _log.exception("on_batch_done callback failed for %s", executor_id)

    def _deliver_call_frames(
        self, executor_id: str, call_frames: list[CallFrame]
    ) -> list[CallFrame]:
        """Hand the collected call frames over (the list is the receiver's); a fresh list."""
        on_call_frames = self.callbacks.on_call_frames
        assert on_call_frames is not None
        try:
            on_call_frames(executor_id, call_frames)
        except Exception:
            _log.exception(
                "on_call_frames callback failed for %d frame(s) on %s",
                len(call_frames),
                executor_id,
            )
        return []

    # --- internals: handlers ----------------------------------------------------------------

    def _protocol_error(self, conn: ExecutorConnection, error: PayloadError | str) -> None:
        self._eras.protocol_error(conn, attached_state(self._executors, conn), error)

    def _drop_unknown(self, conn: ExecutorConnection, message_type: str) -> None:
        self.unknown_frames += 1
        log = _log.warning if self.unknown_frames <= 10 else _log.debug
        log("%r sent unknown messageType %r; dropped", conn, message_type)

    def _parse_heartbeat(
        self, conn: ExecutorConnection, envelope: dict[str, Any]
    ) -> HeartbeatPayload | None:
        payload = envelope.get(_F_PAYLOAD)
        try:
            heartbeat = validate(HeartbeatPayload, payload)
            if not heartbeat.executorId:
                raise PayloadError(_MT_HEARTBEAT, keys.FP_EXECUTOR_ID, "must not be empty")
        except PayloadError as exc:
            self._protocol_error(conn, exc)
            return None
        return heartbeat

    def _attach(self, conn: ExecutorConnection, envelope: dict[str, Any]) -> ExecutorState | None:
        heartbeat = self._parse_heartbeat(conn, envelope)
        if heartbeat is None:
            return None
        executor_id = heartbeat.executorId
        check = self.peer_check
        if check is not None:
            refusal = check(executor_id, conn.peer_pid)
            if refusal is not None:
                self.refused_attaches += 1
                self._protocol_error(conn, f"attach as executor {executor_id!r} refused: {refusal}")
                return None
        state = self._executors.get(executor_id)
        if state is None:
            state = self._executors[executor_id] = ExecutorState(executor_id)
        elif state.connection is not None:
            self._eras.end(
                state, f"superseded by a new connection (#{conn.connection_id})", "transport_lost"
            )
        now = self._clock()
        # (The previous era's report goes out first.)
        self._eras.begin(state, conn, heartbeat, now)
        _acknowledge(conn, heartbeat)
        _log.info(
            "executor %s attached (era %d, connection #%d, process %s)",
            executor_id,
            state.era,
            conn.connection_id,
            heartbeat.executorProcessInstanceId or "?",
            extra={"executorId": executor_id},
        )
        snapshot = build_snapshot(state, now, self._heartbeat_timeout_ms)
        try:
            self.callbacks.on_executor_attached(executor_id, snapshot)
        except Exception:
            _log.exception("on_executor_attached callback failed for %s", executor_id)
        return state

    def _handle_heartbeat(
        self, state: ExecutorState, conn: ExecutorConnection, envelope: dict[str, Any]
    ) -> None:
        heartbeat = self._parse_heartbeat(conn, envelope)
        if heartbeat is None:
            return
        if heartbeat.executorId != state.executor_id:
            self._protocol_error(
                conn,
                f"Heartbeat for {heartbeat.executorId!r} on the connection of "
                f"{state.executor_id!r}",
            )
            return
        now = self._clock()
        state.record_heartbeat(heartbeat, now)
        _acknowledge(conn, heartbeat)
        snapshot = build_snapshot(state, now, self._heartbeat_timeout_ms)
        try:
            self.callbacks.on_heartbeat(state.executor_id, snapshot)
        except Exception:
            _log.exception("on_heartbeat callback failed for %s", state.executor_id)

    def _handle_call_waiting(
        self,
        state: ExecutorState,
        conn: ExecutorConnection,
        envelope: dict[str, Any],
        sidecar: bytes | None,
        call_frames: list[CallFrame] | None,
    ) -> str | None:
        """Route one ``CallWaiting``; returns the protocol error it is, if any."""
        call_id = envelope.get(_F_CALL_ID)
        request_id = envelope.get(_F_REQUEST_ID)
        payload = envelope.get(_F_PAYLOAD)
        if type(call_id) is not str or type(request_id) is not str or type(payload) is not dict:
            return "CallWaiting needs a callId, a requestId and a payload object"
        if not call_id:
            return "CallWaiting: callId must not be empty"
        wait_kind = payload.get(_FP_WAIT_KIND)
        if type(payload.get(_FP_TASK_ID)) is not str:
            return f"CallWaiting for {call_id}: taskId must be a string"
        attempt = payload.get(_FP_ATTEMPT_SEQ)
        if attempt is not None and _bad_attempt(attempt):
            return f"CallWaiting for {call_id}: attemptSeq must be an int >= 1, got {attempt!r}"

        if wait_kind in _ORCHESTRATOR_WAIT_KINDS:
            # An io / subcall wait comes from user code: the call has started. (A
            # function_code wait comes before any of it runs.)
            if call_id in state.reservations.reserved:
                state.reservations.started.add(call_id)
            if call_frames is not None:
                call_frames.append((_MT_CALL_WAITING, call_id, payload, request_id, sidecar))
                return None
            try:
                self.callbacks.on_call_waiting(
                    state.executor_id, call_id, request_id, payload, sidecar
                )
            except Exception:
                _log.exception(
                    "on_call_waiting callback failed for %s on %s", call_id, state.executor_id
                )
        elif wait_kind == _WAIT_FUNCTION_CODE:
            self._answer_function_code(state, conn, call_id, request_id, payload)
        else:
            return f"CallWaiting: unknown waitKind {wait_kind!r}"
        return None

    def _answer_function_code(
        self,
        state: ExecutorState,
        conn: ExecutorConnection,
        call_id: str,
        request_id: str,
        payload: dict[str, Any],
    ) -> None:
        task_id = payload[_FP_TASK_ID]
        function_id = payload.get(keys.FP_FUNCTION_ID)
        digest = payload.get(keys.FP_FUNCTION_CODE_DIGEST)
        if type(function_id) is not str or type(digest) is not str:
            self._protocol_error(
                conn, "CallWaiting(function_code) needs functionId and functionCodeDigest strings"
            )
            return
        answer = function_code_resume_payload(self.resolver, task_id, function_id, digest)
        envelope = {
            _F_MESSAGE_TYPE: _MT_RESUME_CALL,
            _F_CALL_ID: call_id,
            _F_REQUEST_ID: request_id,
            _F_PAYLOAD: answer,
        }
        try:
            conn.enqueue_control(encode_frame(envelope), None, call_id)
        except (EncodeError, ExecutorUnavailableError, OutboxFullError) as exc:
            _log.error(
                "cannot answer the function code wait of %s on %s: %s",
                call_id,
                state.executor_id,
                exc,
            )
            return
        self.function_code_answered += 1

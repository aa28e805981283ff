"""InboundFrames: a worker frame, checked and turned into one of the runtime's entry points.

Theory of operation
-------------------
``ExecutorRuntime`` inherits this, and this inherits :class:`~.call_runner.CallRunner`;
it is the part of the runtime that reads the worker's frames. It owns no state:
it reads a frame's members, drops or fails what is malformed, and hands the
rest to :meth:`ExecutorRuntime.submit_call`, :meth:`ExecutorRuntime.resume_call`
or :meth:`ExecutorRuntime.cancel_call`, which decide what the frame means for
the contexts table.

* :meth:`InboundFrames.handle_inbound_message` — the public entry (tests, and
  anything feeding frames by hand): refuses to run inside a call, then
  :meth:`InboundFrames._handle_inbound`, which ``run_until_idle`` calls
  directly for every frame it drains (it already knows it is the scheduler).
* Typed frames the reader decoded in one pass (:mod:`.execute_frames`): a
  ``ResumeCallFrame`` goes straight to ``resume_call``; an ``ExecuteCallFrame``
  is valid by construction, so :meth:`InboundFrames._handle_execute_frame`
  builds the context from its members.
* A dict envelope dispatches on ``messageType``:
  :meth:`InboundFrames._handle_execute` validates the payload
  (``ExecContext.from_execute_call``); a malformed one for an attempt no newer
  than the live one is dropped (the live attempt is never disturbed), any other
  is answered with one ``CallFailed``, after replacing the live attempt if
  there is one. :meth:`InboundFrames._handle_resume` and
  :meth:`InboundFrames._handle_cancel` read their members and pass them on; a
  ``HeartbeatAck`` is only counted.

Invariants: nothing here raises on bad peer input. Every frame dropped is
counted in ``_counters`` (``invalid_message_dropped``,
``unknown_message_dropped``); an exception while handling a dict envelope or a
typed ``ExecuteCall`` is logged and counted in ``inbound_errors``.
"""

from __future__ import annotations

import logging
from typing import Any

from blockx.wire.keys import (
    DEFAULT_CANCEL_REASON,
    F_CALL_ID,
    F_MESSAGE_TYPE,
    F_PAYLOAD,
    F_REQUEST_ID,
    FP_ATTEMPT_SEQ,
    FP_REASON,
    MT_CANCEL_CALL,
    MT_EXECUTE_CALL,
    MT_HEARTBEAT_ACK,
    MT_RESUME_CALL,
)

from .call_runner import CallRunner, admission_failure
from .context import ExecContext, ResumePayload, current_context
from .errors import InvalidExecuteCall
from .execute_frames import ExecuteCallFrame, ResumeCallFrame

__all__ = ["InboundFrames"]

_log = logging.getLogger("blockx.executor")


class InboundFrames(CallRunner):
    """Reading the worker's frames into the runtime's entry points (see the module doc)."""

    # A base of ExecutorRuntime on top of CallRunner, not a second mixin beside it:
    # mypyc compiles single inheritance only. The entry points are ExecutorRuntime's.

    def submit_call(self, ctx: ExecContext) -> bool:
        raise NotImplementedError  # ExecutorRuntime's

    def resume_call(self, call_id: str, request_id: str, resume: ResumePayload) -> bool:
        raise NotImplementedError  # ExecutorRuntime's

    def cancel_call(
        self, call_id: str, reason: str = DEFAULT_CANCEL_REASON, *, attempt_seq: int = 0
    ) -> bool:
        raise NotImplementedError  # ExecutorRuntime's

    def _replace_existing_attempt(self, old: ExecContext) -> None:
        raise NotImplementedError  # ExecutorRuntime's

    def handle_inbound_message(self, envelope: Any, sidecar: bytes | None = None) -> None:
        """Handle one decoded frame from the worker (any JSON value: the envelope is
        checked here). Never raises on bad peer input.

        Unknown message types and malformed frames are logged and dropped
        (counted in :meth:`stats`); a malformed ExecuteCall is failed.
        Scheduler thread only, never from inside a call.
        """
        if current_context() is not None:
            raise RuntimeError("handle_inbound_message called from inside a call")
        self._handle_inbound(envelope, sidecar)

    def _handle_inbound(
        self,
        envelope: Any,  # a typed frame, a dict envelope, or whatever else the peer sent
        sidecar: bytes | None,
    ) -> None:
        """:meth:`handle_inbound_message` once the caller is known to be the scheduler."""
        if isinstance(envelope, ResumeCallFrame):  # a result, decoded and checked by the reader
            resume = envelope.payload
            self.resume_call(
                envelope.callId,
                envelope.requestId,
                ResumePayload(resume.resumeKind, resume.result, None, resume.budgetUsedMs),
            )
            return
        if isinstance(envelope, ExecuteCallFrame):  # decoded and checked by the reader
            self._handle_execute_frame(envelope)
            return
        try:
            message_type = envelope.get(F_MESSAGE_TYPE) if type(envelope) is dict else None
            if message_type == MT_RESUME_CALL:
                self._handle_resume(envelope, sidecar)
            elif message_type == MT_EXECUTE_CALL:
                self._handle_execute(envelope)
            elif message_type == MT_CANCEL_CALL:
                self._handle_cancel(envelope)
            elif message_type == MT_HEARTBEAT_ACK:
                self._counters["heartbeat_acks"] += 1
            elif type(message_type) is str:
                self._counters["unknown_message_dropped"] += 1
                _log.warning("dropped a frame of unknown messageType %r", message_type)
            else:
                self._counters["invalid_message_dropped"] += 1
                _log.warning("dropped a frame without a messageType")
        except Exception:
            self._counters["inbound_errors"] += 1
            _log.exception("failed to handle an inbound frame")

    def _handle_execute(self, envelope: dict[str, Any]) -> None:
        call_id = envelope.get(F_CALL_ID)
        if type(call_id) is not str or not call_id:
            self._counters["invalid_message_dropped"] += 1
            _log.warning("dropped an ExecuteCall without a callId")
            return
        payload = envelope.get(F_PAYLOAD)
        try:
            ctx = ExecContext.from_execute_call(call_id, payload, clock=self._monotonic)
        except InvalidExecuteCall as exc:
            live = self._contexts.get(call_id)
            if live is not None and exc.attempt_seq <= live.attempt_seq:
                # A duplicate: never disturb the live attempt.
                self._counters["invalid_message_dropped"] += 1
                _log.warning("dropped an invalid ExecuteCall for live call %s: %s", call_id, exc)
                return
            if live is not None:
                # A newer attempt, malformed or not, replaces the live one (the worker
                # now waits for the new attempt's terminal frame only): it is failed below.
                self._replace_existing_attempt(live)
            _log.warning("refused an invalid ExecuteCall: %s", exc, extra={"callId": call_id})
            self._counters["calls_refused"] += 1
            self._send_failed(call_id, exc.task_id, exc.attempt_seq, admission_failure(exc))
            return
        self.submit_call(ctx)

    def _handle_execute_frame(self, frame: ExecuteCallFrame) -> None:
        """An ExecuteCall the reader decoded typed (:mod:`.execute_frames`): valid by
        construction, so the context is built straight from its members."""
        try:
            p = frame.payload
            ctx = ExecContext(  # positional: measurably cheaper on the per-call path
                frame.callId,
                p.taskId,
                p.functionId,
                p.functionCodeDigest,
                self._monotonic,
                p.entrySelector,
                p.args,
                p.parentCallId,
                p.callKey,
                p.ancestry,
                p.callBudgetMs,
                p.attemptSeq,
                p.audit,
                p.debug,
            )
            self.submit_call(ctx)
        except Exception:
            self._counters["inbound_errors"] += 1
            _log.exception("failed to handle an inbound frame")

    def _handle_resume(self, envelope: dict[str, Any], sidecar: bytes | None) -> None:
        call_id = envelope.get(F_CALL_ID)
        request_id = envelope.get(F_REQUEST_ID)
        payload = envelope.get(F_PAYLOAD)
        if type(call_id) is not str or type(request_id) is not str:
            self._counters["invalid_message_dropped"] += 1
            _log.warning("dropped a ResumeCall without callId/requestId")
            return
        self.resume_call(call_id, request_id, ResumePayload.from_wire(payload, sidecar))

    def _handle_cancel(self, envelope: dict[str, Any]) -> None:
        call_id = envelope.get(F_CALL_ID)
        if type(call_id) is not str:
            self._counters["invalid_message_dropped"] += 1
            return
        payload = envelope.get(F_PAYLOAD)
        reason: Any = DEFAULT_CANCEL_REASON
        attempt_seq: Any = 0
        if type(payload) is dict:
            reason = payload.get(FP_REASON) or DEFAULT_CANCEL_REASON
            attempt_seq = payload.get(FP_ATTEMPT_SEQ, 0)
        if type(reason) is not str:
            reason = DEFAULT_CANCEL_REASON
        if type(attempt_seq) is not int:
            attempt_seq = 0
        self.cancel_call(call_id, reason, attempt_seq=attempt_seq)

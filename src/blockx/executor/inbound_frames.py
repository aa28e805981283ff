"""InboundFrames: a worker frame, checked and turned into what it does to the contexts table.

Theory of operation
-------------------
``ExecutorRuntime`` holds one ``InboundFrames`` (``_inbound``): the part of the
runtime that reads the worker's frames and decides what each means for the
contexts table. It is given the table and what admission touches (the ended
attempts, the ``runnable`` queue, the call timers, the counters, the module
registry, the :class:`~.outbox.Outbox`, the SDK bridge) and the
:class:`~.call_runner.CallRunner`, which ends replaced or cancelled attempts
and sends refusals. It owns only ``closed`` (set at shutdown). The runtime's
``submit_call`` / ``resume_call`` / ``cancel_call`` are these.

* :meth:`InboundFrames.handle_inbound_message` — the public entry (tests, and
  anything feeding frames by hand): refuses to run inside a call, then
  :meth:`InboundFrames.handle_inbound`, which ``run_until_idle`` calls
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
  ``HeartbeatAck`` is counted, and one whose ``features`` holds ``"batch"``
  turns on batched frames for the session (docs/protocol.md "Batched frames").
* The three semantic entry points:

  * :meth:`InboundFrames.submit_call` — admission (capacity for top-level
    calls, a resident parent for sub-calls), attempt replacement, then the
    context joins the runnable queue;
  * :meth:`InboundFrames.resume_call` — a ``ResumeCall`` matching the
    context's ``callId``, pending ``requestId`` and state's ``resumeKind``
    stores its payload and queues the context; anything else is dropped and
    counted stale;
  * :meth:`InboundFrames.cancel_call` — a waiting context is ended at once (a
    framework exception thrown into its greenlet); a runnable one gets
    ``cancel_reason`` and ends at its next step.

Invariants: nothing here raises on bad peer input. Every frame dropped is
counted in ``counters`` (``invalid_message_dropped``,
``unknown_message_dropped``); an exception while handling a dict envelope or a
typed ``ExecuteCall`` is logged and counted in ``inbound_errors``. Nothing is
admitted once the transport is gone or the runtime is closed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from blockx.wire.frames import FEATURE_BATCH
from blockx.wire.keys import (
    DEFAULT_CANCEL_REASON,
    F_CALL_ID,
    F_MESSAGE_TYPE,
    F_PAYLOAD,
    F_REQUEST_ID,
    F_TRACE,
    FP_ATTEMPT_SEQ,
    FP_FEATURES,
    FP_REASON,
    MT_CANCEL_CALL,
    MT_EXECUTE_CALL,
    MT_HEARTBEAT_ACK,
    MT_RESUME_CALL,
)

from .call_runner import admission_failure
from .context import (
    RESUME_KIND_BY_STATE,
    WAITING_STATES,
    ExecContext,
    ExecState,
    ResumePayload,
    current_context,
)
from .deadline import take_cancel_request
from .debug_capture import ensure_debug_tee
from .errors import (
    REASON_ATTEMPT_REPLACED,
    AdmissionError,
    ExecutorCapacityExhausted,
    ExecutorClosedError,
    InvalidExecuteCall,
    SubcallParentNotResident,
)
from .execute_frames import ExecuteCallFrame, ResumeCallFrame
from .tracing import execute_span_from

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable

    from .call_runner import CallRunner, EndedAttempts
    from .module_registry import ModuleRegistry
    from .outbox import Outbox
    from .sdk_bridge import SdkBridge
    from .timers import CallTimers

__all__ = ["InboundFrames"]

_log = logging.getLogger("blockx.executor")


class InboundFrames:
    """The worker's frames and the three entry points they map onto (see the module doc).

    Given, shared with the other parts: the contexts table and the ended attempts,
    the ``runnable`` queue, the call ``timers``, the ``counters``, the module
    ``registry``, the :class:`~.outbox.Outbox` (its ``transport_lost``), the SDK
    ``bridge`` every admitted context carries and the :class:`~.call_runner.CallRunner`
    (replaced attempts end there; refusals are sent through it). Owned: ``closed``.
    """

    def __init__(
        self,
        executor_id: str,
        *,
        max_inflight: int,
        call_timeout_ms: int,
        registry: ModuleRegistry,
        contexts: dict[str, ExecContext],
        finished_attempts: EndedAttempts,
        runnable: deque[ExecContext],
        timers: CallTimers,
        counters: dict[str, int],
        monotonic: Callable[[], float],
        outbox: Outbox,
        bridge: SdkBridge,
        runner: CallRunner,
    ) -> None:
        self._executor_id = executor_id
        #: Resident top-level calls admitted at most (0 = unlimited).
        self.max_inflight = max_inflight
        #: The local call-timeout latch armed on admission (ms; 0 = off).
        self.call_timeout_ms = call_timeout_ms
        self._registry = registry
        self._contexts = contexts
        self._finished_attempts = finished_attempts
        self._runnable = runnable
        self._timers = timers
        self._counters = counters
        self._monotonic = monotonic
        self._outbox = outbox
        self._bridge = bridge
        self._runner = runner
        #: Set by ``ExecutorRuntime.shutdown``: every later ExecuteCall is refused.
        self.closed = False

    def __repr__(self) -> str:
        return (
            f"InboundFrames({self._executor_id!r}, inflight={len(self._contexts)}, "
            f"runnable={len(self._runnable)}{', closed' if self.closed else ''})"
        )

    # --- the three semantic entry points ---------------------------------------------------

    def submit_call(self, ctx: ExecContext) -> bool:
        """Admit a new attempt; True when it was queued.

        A live ``callId`` with a lower ``attemptSeq`` is replaced (its slot is
        freed first, so capacity never refuses the replacement); an equal or
        higher one makes this a duplicate, dropped and counted. Refusals answer
        with one ``CallFailed`` (capacity, parent not resident, shutting down);
        after transport loss nothing is admitted and nothing sent.
        """
        counters = self._counters
        if self._outbox.transport_lost:
            counters["refused_after_transport_lost"] += 1
            return False
        existing = self._contexts.get(ctx.call_id)
        if existing is not None:
            if ctx.attempt_seq <= existing.attempt_seq:
                counters["duplicate_execute_dropped"] += 1
                _log.debug("dropped duplicate ExecuteCall", extra=ctx.log_fields())
                return False
            self._replace_existing_attempt(existing)
        elif ctx.attempt_seq <= self._finished_attempts.get(ctx.call_id):
            counters["duplicate_execute_dropped"] += 1
            _log.debug("dropped ExecuteCall of an ended attempt", extra=ctx.log_fields())
            return False
        refusal: AdmissionError | None = None
        if self.closed:
            refusal = ExecutorClosedError("executor is shutting down")
        elif ctx.parent_call_id is not None:
            if ctx.parent_call_id not in self._contexts:
                refusal = SubcallParentNotResident(
                    f"parent call {ctx.parent_call_id!r} is not resident in executor "
                    f"{self._executor_id!r}"
                )
        elif self.max_inflight and len(self._contexts) >= self.max_inflight:
            refusal = ExecutorCapacityExhausted(
                f"executor {self._executor_id!r} is at its limit of {self.max_inflight} calls"
            )
        if refusal is not None:
            counters["calls_refused"] += 1
            self._runner.send_failed(
                ctx.call_id, ctx.task_id, ctx.attempt_seq, admission_failure(refusal)
            )
            return False
        counters["calls_admitted"] += 1
        ctx.bridge = self._bridge
        self._contexts[ctx.call_id] = ctx
        ctx.local_reads = self._registry.acquire_task(ctx.task_id)
        if ctx.debug_capture is not None:
            ensure_debug_tee()
        if self.call_timeout_ms:
            ctx.deadline_at = ctx.admitted_at + self.call_timeout_ms / 1000.0
            self._timers.add_timeout(ctx, ctx.deadline_at, resident=len(self._contexts))
        ctx.queued = True
        self._runnable.append(ctx)
        return True

    def resume_call(self, call_id: str, request_id: str, resume: ResumePayload) -> bool:
        """Deliver a ResumeCall; True when it matched the pending wait and was queued.

        It must match the context's ``callId``, its pending ``requestId`` and
        the ``resumeKind`` of its waiting state; otherwise it is dropped and
        counted in ``stale_resume_dropped``.
        """
        ctx = self._contexts.get(call_id)
        kind = resume.resume_kind  # None: too malformed to name one; delivered as an error
        if (
            ctx is None
            or ctx.pending_request_id != request_id
            or ctx.queued
            or (kind is not None and RESUME_KIND_BY_STATE.get(ctx.state) != kind)
        ):
            self._counters["stale_resume_dropped"] += 1
            _log.debug(
                "dropped stale ResumeCall", extra={"callId": call_id, "requestId": request_id}
            )
            return False
        ctx.pending_request_id = None  # a second ResumeCall for this request is stale
        ctx.resume_payload = resume
        ctx.queued = True
        ctx.enqueued_at = self._monotonic()
        self._runnable.append(ctx)
        return True

    def cancel_call(
        self, call_id: str, reason: str = DEFAULT_CANCEL_REASON, *, attempt_seq: int = 0
    ) -> bool:
        """Cancel a resident attempt (``attempt_seq`` 0 = whichever is resident).

        A waiting context ends now; a runnable one at its next step. The call
        fails as ``cancelled`` (``deadline_exceeded`` for ``call_timeout``).
        Unknown calls and other attempts are dropped and counted stale.
        """
        ctx = self._contexts.get(call_id)
        if ctx is None or (attempt_seq and attempt_seq != ctx.attempt_seq):
            self._counters["stale_cancel_dropped"] += 1
            _log.debug("dropped stale CancelCall", extra={"callId": call_id})
            return False
        if ctx.state in WAITING_STATES:
            self._runner.terminate_context(ctx, reason)
        else:
            if ctx.cancel_reason is None:
                ctx.cancel_reason = reason
            if not ctx.queued and ctx.state is ExecState.RUNNABLE:
                ctx.queued = True
                ctx.enqueued_at = self._monotonic()
                self._runnable.append(ctx)
        return True

    def _replace_existing_attempt(self, old: ExecContext) -> None:
        self._counters["attempts_replaced"] += 1
        old.stale = True
        self._runner.terminate_context(old, REASON_ATTEMPT_REPLACED, suppress_terminal_emit=True)

    # --- frames ---------------------------------------------------------------------------

    def handle_inbound_message(self, envelope: Any, sidecar: bytes | None = None) -> None:
        """Handle one decoded frame from the worker (any JSON value: the envelope is
        checked here). Never raises on bad peer input.

        Unknown message types and malformed frames are logged and dropped
        (counted in :meth:`stats`); a malformed ExecuteCall is failed.
        Scheduler thread only, never from inside a call.
        """
        if current_context() is not None:
            raise RuntimeError("handle_inbound_message called from inside a call")
        self.handle_inbound(envelope, sidecar)

    def handle_inbound(
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
                ResumePayload(
                    resume.resumeKind, resume.result, None, resume.budgetUsedMs, resume.immutable
                ),
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
                self._note_ack_features(envelope.get(F_PAYLOAD))
            elif type(message_type) is str:
                self._counters["unknown_message_dropped"] += 1
                _log.warning("dropped a frame of unknown messageType %r", message_type)
            else:
                self._counters["invalid_message_dropped"] += 1
                _log.warning("dropped a frame without a messageType")
        except Exception:
            self._counters["inbound_errors"] += 1
            _log.exception("failed to handle an inbound frame")

    def _note_ack_features(self, payload: Any) -> None:
        """An ack whose ``features`` holds ``"batch"`` lets the session send batched
        frames from now on (docs/protocol.md "Batched frames"); one without it changes
        nothing (a v1 worker never sends it, so it never gets a batch)."""
        if type(payload) is not dict:
            return
        features = payload.get(FP_FEATURES)
        if type(features) is list and FEATURE_BATCH in features:
            self._outbox.enable_batching()

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
            self._runner.send_failed(call_id, exc.task_id, exc.attempt_seq, admission_failure(exc))
            return
        trace = envelope.get(F_TRACE)
        if trace is not None:  # a traced attempt (the worker writes the key first: this path)
            ctx.execute_span = execute_span_from(trace)
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
        take_cancel_request(call_id)
        self.cancel_call(call_id, reason, attempt_seq=attempt_seq)

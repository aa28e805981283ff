"""ExecutorRuntime: the in-process heart of the Python executor.

Theory of operation
-------------------
The runtime owns every resident call attempt (:class:`ExecContext`, keyed by
``callId`` in ``_contexts``) and is the only code that switches into a call's
greenlet. It runs on one thread (the "scheduler thread", the one that built it);
the session's reader/writer threads and the heartbeat thread never switch.

Inbound frames arrive through :meth:`ExecutorRuntime.handle_inbound_message`
(from ``session.drain_incoming()`` inside :meth:`run_until_idle`, or fed
directly by tests). They map onto three semantic entry points:

* :meth:`submit_call` — admission (capacity for top-level calls, a resident
  parent for sub-calls), attempt replacement, then the context joins the
  runnable queue;
* :meth:`resume_call` — a ``ResumeCall`` matching the context's ``callId``,
  pending ``requestId`` and state's ``resumeKind`` stores its payload and queues
  the context; anything else is dropped and counted stale;
* :meth:`cancel_call` — a waiting context is ended at once (a framework
  exception thrown into its greenlet); a runnable one gets ``cancel_reason``
  and ends at its next step.

:meth:`run_until_idle` wakes due sleepers, refreshes the transport state,
drains inbound frames and steps queued contexts until none is runnable. The
sleep-ready queue goes first, yielding to the runnable queue after 64 in a row.
:meth:`_step_context` has exactly three branches: ``cancel_reason`` set →
terminate; ``resume_payload`` set → switch it in; else the first switch, which
hands the context to a resident greenlet from the pool.

Resident greenlets (PERFORMANCE.md: a fresh greenlet costs ~8 µs, a reused one
~0.5 µs): each pool greenlet loops "take a context, run it to its terminal
frame, switch back ``_CALL_FINISHED``". A call ends by returning, raising, or
by a framework exception (cancel, deadline, replacement, transport loss)
raised at a safe point or thrown into its suspended greenlet; the pool loop
classifies the outcome, sends (or suppresses) exactly one terminal frame and
returns the greenlet to the pool. A greenlet whose user code will not die (it
leaves its greenlet by itself) is discarded, never reused.

Deadlines: before every switch into a budgeted call the runtime makes sure
``signal.setitimer`` has ``SIGALRM`` due by the time that call's budget runs
out (main thread only; re-armed only when an earlier expiry is needed, with a
0.1 s re-check interval; disarmed when the scheduler goes idle). The handler
raises only when the call is ``RUNNING`` on the current greenlet and
:meth:`ExecContext.deadline_expired_reason` says it really expired.

Invariants: every admitted attempt that is not replaced ends in exactly one
``CallCompleted`` / ``CallFailed`` (none once the transport is gone); a
``DONE`` context is no longer in ``_contexts`` (``inflight_count() ==
len(_contexts)``); at most one pending ``requestId`` per context; the runtime
never raises on bad peer input (it logs and drops, or fails that one call).
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

import orjson
from greenlet import GreenletExit, getcurrent, greenlet

from blockx.sdk.runtime import set_provider
from blockx.wire import decode_frame, dumps_wire, encode_frame
from blockx.wire.errors import EncodeError, NotSerializableError
from blockx.wire.keys import (
    DEFAULT_CANCEL_REASON,
    ERR_INTERNAL_ERROR,
    ERR_OUTPUT_NOT_SERIALIZABLE,
    ERR_USER_ERROR,
    EXEC_STATES,
    F_CALL_ID,
    F_MESSAGE_TYPE,
    F_PAYLOAD,
    F_REQUEST_ID,
    FP_ATTEMPT_SEQ,
    FP_AVAILABLE_CONTEXTS,
    FP_CALL_STATE_COUNTS,
    FP_EXECUTOR_CPU_SECONDS_TOTAL,
    FP_EXECUTOR_CPU_UTILIZATION,
    FP_EXECUTOR_ID,
    FP_EXECUTOR_PROCESS_INSTANCE_ID,
    FP_HEARTBEAT_SEQ,
    FP_INFLIGHT_COUNT,
    FP_LAST_SCHEDULER_ACTIVE_AT_MS,
    FP_MEMORY_BYTES,
    FP_REASON,
    FP_RUNNABLE_COUNT,
    FP_RUNNING_CALL_ID,
    FP_SENT_AT_MS,
    FP_TASK_ID,
    MT_CANCEL_CALL,
    MT_EXECUTE_CALL,
    MT_HEARTBEAT_ACK,
    MT_RESUME_CALL,
    UNLIMITED_CONTEXTS,
    WAIT_FUNCTION_CODE,
)

from .context import (
    RESUME_KIND_BY_STATE,
    WAITING_STATES,
    ExecContext,
    ExecState,
    ResumePayload,
    current_context,
    running,
)
from .debug_capture import ensure_debug_tee
from .errors import (
    REASON_ATTEMPT_REPLACED,
    REASON_CALL_TIMEOUT,
    REASON_TRANSPORT_LOST,
    AdmissionError,
    DeadlineSignalExpired,
    ExecutorCapacityExhausted,
    ExecutorClosedError,
    InvalidExecuteCall,
    SubcallParentNotResident,
    termination_exception,
)
from .module_registry import ModuleRegistry
from .outputs import (
    Failure,
    call_completed_envelope,
    call_failed_envelope,
    describe_failure,
    ensure_frame_fits,
    output_failure,
)
from .sdk_bridge import SLEEP_WAKE, SUSPENDED, SdkBridge
from .sdk_bridge_provider import SdkBridgeProvider
from .sleep_patch import install_global_sleep_patch

__all__ = ["ExecutorRuntime", "MetricsLike", "SessionLike"]

_log = logging.getLogger("blockx.executor")

#: Sleep-ready contexts stepped in a row before one runnable context gets a turn.
SLEEP_READY_STREAK: Final = 64
#: Idle resident greenlets kept for reuse; the rest are retired when their call ends.
POOL_MAX_IDLE: Final = 256
#: Bound on the outer passes of one run_until_idle (a call looping on sleep(0)
#: must not keep the main loop from checking its connection).
_MAX_PASSES: Final = 64
#: SIGALRM re-fires this often while a call overruns (the handler re-checks).
_ALARM_INTERVAL_S: Final = 0.1


class SessionLike(Protocol):
    """The transport, as the runtime uses it (``uds_session.UDSSession``)."""

    def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        """Thread-safe enqueue; raises ``ConnectionError`` once the transport is gone."""
        ...

    def drain_incoming(self) -> list[Any]:
        """Every frame received so far (``blockx.wire.Frame``: ``envelope``, ``sidecar``)."""
        ...

    def is_connected(self) -> bool: ...


class MetricsLike(Protocol):
    """Process metrics for heartbeats (``process_metrics.ProcessMetricsSampler``)."""

    def sample_memory_bytes(self) -> int: ...

    def sample_cpu(self) -> tuple[float, float]:
        """``(utilization 0..1, cpu_seconds_total)``."""
        ...


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_CALL_FINISHED: Final = _Marker("call-finished")
_RETIRE: Final = _Marker("retire")


def _on_deadline_signal(signum: int, frame: Any) -> None:
    """SIGALRM: end a call stuck in pure CPU work once its budget really expired."""
    ctx = running.ctx
    if ctx is None or ctx.state is not ExecState.RUNNING or ctx.greenlet is not getcurrent():
        return
    reason = ctx.deadline_expired_reason()
    if reason is None:
        return  # armed early (or the budget moved): the interval timer re-checks
    raise DeadlineSignalExpired(reason, used_ms=ctx.budget_used_ms(), budget_ms=ctx.budget_ms)


def _running_call_fields() -> dict[str, Any] | None:
    ctx = current_context()
    return None if ctx is None else ctx.log_fields()


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ExecutorRuntime:
    """The contexts table, run queues, greenlet scheduling, cancel and deadlines.

    ``session`` is the transport (None in unit tests: sent frames collect in
    :meth:`drain_outbox`). ``max_inflight`` caps resident top-level calls (0 =
    unlimited); ``max_runnable`` is stored only. ``metrics`` feeds heartbeats.
    ``clock_ms`` is the wall clock for timestamps; ``monotonic`` (seconds) the
    clock for budgets, sleeps and queue times — both injectable for tests.
    ``registry`` replaces the default :class:`ModuleRegistry`; ``call_timeout_ms``
    (0 = off) arms the local call-timeout latch: an attempt still resident that
    long after admission ends as ``deadline_exceeded``.

    ``process_instance_id`` defaults to 12 hex digits of a uuid4; it prefixes
    every ``requestId``.

    Construction sets ``BLOCKX_EXECUTOR_RUNTIME=1``, installs the global
    ``time.sleep`` patch and, on the main thread, the ``SIGALRM`` handler.

    Threads: the thread that builds the runtime is its scheduler thread, the
    only one that may call :meth:`handle_inbound_message`, :meth:`run_until_idle`
    and :meth:`shutdown`. :meth:`build_heartbeat` and :meth:`on_transport_lost`
    may be called from any thread. The process shell's main loop is::

        while session.is_connected():
            runtime.run_until_idle()
            session.wait_for_message(timeout=runtime.next_scheduler_delay(None))
    """

    def __init__(
        self,
        executor_id: str,
        *,
        session: SessionLike | None = None,
        max_inflight: int = 128,
        max_runnable: int = 128,
        process_instance_id: str | None = None,
        metrics: MetricsLike | None = None,
        clock_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] | None = None,
        registry: ModuleRegistry | None = None,
        call_timeout_ms: int = 0,
    ) -> None:
        if max_inflight < 0 or max_runnable < 0 or call_timeout_ms < 0:
            raise ValueError("max_inflight, max_runnable and call_timeout_ms must be >= 0")
        self.executor_id = executor_id
        self.max_inflight = max_inflight
        self.max_runnable = max_runnable  # stored only: the worker's dispatch threshold
        self.process_instance_id = process_instance_id or uuid.uuid4().hex[:12]
        self.call_timeout_ms = call_timeout_ms
        self.registry = registry if registry is not None else ModuleRegistry()
        self._session = session
        self._metrics = metrics
        self._clock_ms = clock_ms or _wall_clock_ms
        self._monotonic = monotonic or time.perf_counter
        self._contexts: dict[str, ExecContext] = {}
        self._runnable: deque[ExecContext] = deque()
        self._sleep_ready: deque[ExecContext] = deque()
        self._sleepers: list[tuple[float, int, ExecContext]] = []
        self._timeouts: list[tuple[float, int, ExecContext]] = []
        self._timer_seq = itertools.count(1)
        self._request_prefix = f"req-{self.process_instance_id}-"
        self._request_seq = itertools.count(1)
        self._heartbeat_seq = itertools.count(1)
        self._pool: list[greenlet] = []
        self._running: ExecContext | None = None
        self._outbox: list[bytes] = []
        self._transport_lost = False
        self._closed = False
        self._in_scheduler = False
        self._scheduler_thread = threading.get_ident()
        self._last_scheduler_active_ms = self._clock_ms()
        self._bridge = SdkBridge(self)
        self._provider = SdkBridgeProvider(self._bridge)
        # Every call runs in a copy of this Context (see _step_context).
        self._call_context = contextvars.Context()
        self._call_context.run(set_provider, self._provider)
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "calls_admitted",
                "calls_completed",
                "calls_failed",
                "calls_refused",
                "terminal_suppressed",
                "attempts_replaced",
                "duplicate_execute_dropped",
                "stale_resume_dropped",
                "stale_cancel_dropped",
                "invalid_message_dropped",
                "unknown_message_dropped",
                "heartbeat_acks",
                "transport_lost_calls",
                "refused_after_transport_lost",
                "greenlets_created",
                "greenlets_retired",
                "greenlets_discarded",
                "inbound_errors",
            ),
            0,
        )
        os.environ["BLOCKX_EXECUTOR_RUNTIME"] = "1"
        install_global_sleep_patch()
        self._alarm_enabled = threading.current_thread() is threading.main_thread()
        self._previous_alarm_handler: Any = None
        if self._alarm_enabled:
            self._previous_alarm_handler = signal.signal(signal.SIGALRM, _on_deadline_signal)
        self._alarm_ready = self._alarm_enabled  # the handler is ours (checked every pass)
        self._alarm_due = math.inf  # monotonic time the armed timer fires; inf = disarmed
        try:
            from .logging_setup import set_call_fields_provider
        except ImportError:  # pragma: no cover - the process shell ships with the runtime
            pass
        else:
            set_call_fields_provider(_running_call_fields)

    def __repr__(self) -> str:
        return (
            f"ExecutorRuntime({self.executor_id!r}, inflight={len(self._contexts)}, "
            f"runnable={len(self._runnable) + len(self._sleep_ready)}, "
            f"sleeping={len(self._sleepers)}, pool={len(self._pool)}"
            f"{', transport lost' if self._transport_lost else ''})"
        )

    # --- inbound ------------------------------------------------------------------------

    def handle_inbound_message(
        self, envelope: dict[str, Any], sidecar: bytes | None = None
    ) -> None:
        """Handle one decoded frame from the worker. Never raises on bad peer input.

        Unknown message types and malformed frames are logged and dropped
        (counted in :meth:`stats`); a malformed ExecuteCall is failed.
        Scheduler thread only, never from inside a call.
        """
        if current_context() is not None:
            raise RuntimeError("handle_inbound_message called from inside a call")
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
            if call_id in self._contexts:  # never disturb the live attempt
                self._counters["invalid_message_dropped"] += 1
                _log.warning("dropped an invalid ExecuteCall for live call %s: %s", call_id, exc)
                return
            task_id, attempt_seq = "", 1
            if type(payload) is dict:
                if type(payload.get(FP_TASK_ID)) is str:
                    task_id = payload[FP_TASK_ID]
                seq = payload.get(FP_ATTEMPT_SEQ)
                if type(seq) is int and seq >= 1:
                    attempt_seq = seq
            _log.warning("refused an invalid ExecuteCall: %s", exc, extra={"callId": call_id})
            self._counters["calls_refused"] += 1
            self._send_failed(call_id, task_id, attempt_seq, _admission_failure(exc))
            return
        self.submit_call(ctx)

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
        if self._transport_lost:
            counters["refused_after_transport_lost"] += 1
            return False
        existing = self._contexts.get(ctx.call_id)
        if existing is not None:
            if ctx.attempt_seq <= existing.attempt_seq:
                counters["duplicate_execute_dropped"] += 1
                _log.debug("dropped duplicate ExecuteCall", extra=ctx.log_fields())
                return False
            self._replace_existing_attempt(existing)
        refusal: AdmissionError | None = None
        if self._closed:
            refusal = ExecutorClosedError("executor is shutting down")
        elif ctx.parent_call_id is not None:
            if ctx.parent_call_id not in self._contexts:
                refusal = SubcallParentNotResident(
                    f"parent call {ctx.parent_call_id!r} is not resident in executor "
                    f"{self.executor_id!r}"
                )
        elif self.max_inflight and len(self._contexts) >= self.max_inflight:
            refusal = ExecutorCapacityExhausted(
                f"executor {self.executor_id!r} is at its limit of {self.max_inflight} calls"
            )
        if refusal is not None:
            counters["calls_refused"] += 1
            self._send_failed(
                ctx.call_id, ctx.task_id, ctx.attempt_seq, _admission_failure(refusal)
            )
            return False
        counters["calls_admitted"] += 1
        ctx.bridge = self._bridge
        self._contexts[ctx.call_id] = ctx
        self.registry.acquire_task(ctx.task_id)
        if ctx.debug_capture is not None:
            ensure_debug_tee()
        if self.call_timeout_ms:
            ctx.deadline_at = ctx.admitted_at + self.call_timeout_ms / 1000.0
            heapq.heappush(self._timeouts, (ctx.deadline_at, next(self._timer_seq), ctx))
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
            self._terminate_context(ctx, reason)
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
        self._terminate_context(old, REASON_ATTEMPT_REPLACED, suppress_terminal_emit=True)

    # --- scheduling -----------------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Run every context that can run now; return when none is runnable.

        Each pass refreshes the transport state, drains the session's inbound
        frames, wakes due sleepers and timeouts, then steps the queues (sleep-ready
        first, a runnable context after every 64). Scheduler thread only.
        """
        if self._in_scheduler or current_context() is not None:
            raise RuntimeError("run_until_idle is not re-entrant")
        self._in_scheduler = True
        if self._alarm_enabled:
            # Someone else may have taken SIGALRM (a test runner): never arm for them.
            self._alarm_ready = signal.getsignal(signal.SIGALRM) is _on_deadline_signal
        try:
            self._last_scheduler_active_ms = self._clock_ms()
            session = self._session
            for _ in range(_MAX_PASSES):
                self._refresh_transport_state()
                if session is not None:
                    for frame in session.drain_incoming():
                        self.handle_inbound_message(frame.envelope, frame.sidecar)
                if self._sleepers or self._timeouts:
                    now = self._monotonic()
                    if self._sleepers:
                        self._wake_due_sleepers(now)
                    if self._timeouts:
                        self._expire_timeouts(now)
                if not self._run_queues():
                    break
        finally:
            self._in_scheduler = False
            if self._alarm_due != math.inf:
                self._disarm_alarm()

    def next_scheduler_delay(self, default: float | None) -> float | None:
        """Seconds until the scheduler has work: 0 if some is runnable now,
        else until the next sleeper or timeout is due, else ``default``."""
        if self._runnable or self._sleep_ready or (self._transport_lost and self._contexts):
            return 0.0
        delay = default
        for heap in (self._sleepers, self._timeouts):
            while heap and heap[0][2].finished:
                heapq.heappop(heap)
            if heap:
                due = max(heap[0][0] - self._monotonic(), 0.0)
                delay = due if delay is None else min(delay, due)
        return delay

    def _run_queues(self) -> int:
        runnable = self._runnable
        ready = self._sleep_ready
        stepped = 0
        streak = 0
        while True:
            if ready and (streak < SLEEP_READY_STREAK or not runnable):
                ctx = ready.popleft()
                streak += 1
            elif runnable:
                ctx = runnable.popleft()
                streak = 0
            else:
                return stepped
            if not ctx.queued or ctx.finished:
                continue  # removed from the queues (terminated or replaced) after queueing
            ctx.queued = False
            self._step_context(ctx)
            stepped += 1

    def _step_context(self, ctx: ExecContext) -> None:
        """The three branches: terminate, resume, or first switch."""
        now = self._monotonic()
        ctx.queue_wait_s += now - ctx.enqueued_at
        if ctx.cancel_reason is not None:
            self._terminate_context(ctx, ctx.cancel_reason)
            return
        value = ctx.resume_payload
        if value is not None:
            ctx.resume_payload = None
            glet = ctx.greenlet
            assert glet is not None
        else:
            glet = self._pool.pop() if self._pool else self._new_greenlet()
            # A fresh Context per call: the provider is set, and ContextVars one call
            # sets never leak into the next call on the same resident greenlet.
            glet.gr_context = self._call_context.copy()
            ctx.greenlet = glet
            value = ctx
        self._run_slice(ctx, glet, value, throw=False, now=now)

    def _run_slice(
        self, ctx: ExecContext, glet: greenlet, value: Any, *, throw: bool, now: float
    ) -> None:
        """Switch (or throw) into ``ctx``'s greenlet and settle what it hands back."""
        ctx.state = ExecState.RUNNING
        ctx.slice_started = now
        running.ctx = ctx
        self._running = ctx
        if self._alarm_ready and (ctx.budget_ms or ctx.deadline_at is not None):
            self._arm_alarm(ctx, value, now)
        try:
            result = glet.throw(value) if throw else glet.switch(value)
        except BaseException as exc:  # the greenlet's run raised: a bug, not the user's
            result = exc
        finally:
            running.ctx = None
            self._running = None
            if ctx.slice_started:
                ctx.cpu_s += self._monotonic() - ctx.slice_started
                ctx.slice_started = 0.0
            if not self._in_scheduler and self._alarm_due != math.inf:
                self._disarm_alarm()
        if result is SUSPENDED:
            return
        if result is _CALL_FINISHED:
            if ctx.greenlet is glet:
                ctx.greenlet = None
            self._release_greenlet(glet)
            return
        # The greenlet died, raised, or left its call by switching away by itself.
        if isinstance(result, BaseException) and not isinstance(result, GreenletExit):
            _log.error(
                "call greenlet raised into the scheduler",
                exc_info=result,
                extra=ctx.log_fields(),
            )
        if not ctx.finished:
            if ctx.cancel_reason is not None:  # it was being ended anyway: say why
                termination = termination_exception(
                    ctx.cancel_reason, retryable=ctx.cancel_retryable
                )
                self._finish_failed(ctx, describe_failure(termination))
            else:
                # A dead greenlet is our bug (retryable); one still alive means user
                # code switched away by itself (the user's error).
                kind = ERR_INTERNAL_ERROR if glet.dead else ERR_USER_ERROR
                message = f"call left its greenlet unexpectedly ({result!r})"
                self._finish_failed(ctx, (kind, glet.dead, message, None, None))
        self._discard_greenlet(glet)

    def _arm_alarm(self, ctx: ExecContext, value: Any, now: float) -> None:
        """Make sure SIGALRM fires by the time ``ctx`` would overrun its budget.

        Timers are re-armed only when this call needs an earlier expiry than the
        one armed (two syscalls per switch cost more than the switch); a timer
        that fires early finds nothing expired and its 0.1 s interval re-checks.
        ``run_until_idle`` disarms when the scheduler goes idle.
        """
        remaining = ctx.remaining_s()
        if remaining is None:
            return
        if type(value) is ResumePayload and value.resume_kind != WAIT_FUNCTION_CODE:
            # The wait's budgetUsedMs is charged on the far side of this switch.
            if ctx.budget_ms:
                remaining -= value.budget_used_ms / 1000.0
        remaining = max(remaining, 0.001)
        due = now + remaining
        if due < self._alarm_due:
            signal.setitimer(signal.ITIMER_REAL, remaining, _ALARM_INTERVAL_S)
            self._alarm_due = due

    def _disarm_alarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
        self._alarm_due = math.inf

    def _terminate_context(
        self,
        ctx: ExecContext,
        reason: str,
        *,
        suppress_terminal_emit: bool = False,
        retryable: bool = False,
    ) -> None:
        """End ``ctx`` now: throw the matching framework exception into its greenlet.

        With ``suppress_terminal_emit`` (replacement, transport loss) no terminal
        frame is sent. A never-started context is failed without a greenlet.
        """
        if ctx.finished:
            return
        if ctx.cancel_reason is None:
            ctx.cancel_reason = reason
            ctx.cancel_retryable = retryable
        if suppress_terminal_emit:
            ctx.suppress_terminal_emit = True
        ctx.queued = False
        ctx.resume_payload = None
        glet = ctx.greenlet
        if glet is None:
            exc = termination_exception(ctx.cancel_reason, retryable=ctx.cancel_retryable)
            self._finish_failed(ctx, describe_failure(exc))
            return
        if glet is getcurrent():
            return  # ending itself: the next safe point raises
        exc = termination_exception(ctx.cancel_reason, retryable=ctx.cancel_retryable)
        self._run_slice(ctx, glet, exc, throw=True, now=self._monotonic())

    # --- resident greenlets -------------------------------------------------------------

    def _new_greenlet(self) -> greenlet:
        self._counters["greenlets_created"] += 1
        return greenlet(self._greenlet_main)

    def _greenlet_main(self, ctx: Any) -> None:
        """A resident greenlet: run one call at a time until retired."""
        parent = getcurrent().parent
        assert parent is not None
        while ctx is not _RETIRE:
            try:
                self._run_call(ctx)
            except GreenletExit:
                raise
            except BaseException as exc:  # a preemption signal that landed in framework code
                if not ctx.finished:
                    self._finish_failed(ctx, describe_failure(exc, self.registry.refresh_linecache))
            ctx = parent.switch(_CALL_FINISHED)

    def _run_call(self, ctx: ExecContext) -> None:
        """Load and run the user function; send exactly one terminal frame."""
        try:
            ctx.check_safe_point()  # before the user function
            target = self.registry.load_callable(
                ctx.task_id,
                ctx.function_id,
                ctx.function_code_digest,
                ctx.entry_selector,
                source_loader=self._bridge.do_function_code_req,
                restricted=ctx.audit is not None,
            )
            args = ctx.args
            if type(args) is not list:
                output = target(args)
            elif len(args) == 1:  # no star-call: it re-enters the C eval loop, and a
                output = target(args[0])  # suspended call would keep that C stack
            else:
                output = target(*args)
            ctx.check_safe_point()  # before return
            ctx.state = ExecState.DONE  # user code is over: no preemption from here
        except GreenletExit as exc:
            # Our own kill of a discarded greenlet (the call is already finished), or
            # user code raising it: the call still gets its one terminal frame, and
            # the greenlet ends rather than going back to the pool.
            if not ctx.finished:
                ctx.state = ExecState.DONE
                self._finish_failed(ctx, describe_failure(exc, self.registry.refresh_linecache))
            raise
        except BaseException as exc:
            ctx.state = ExecState.DONE
            self._finish_failed(ctx, describe_failure(exc, self.registry.refresh_linecache))
            return
        self._finish_completed(ctx, output)

    def _release_greenlet(self, glet: greenlet) -> None:
        if len(self._pool) < POOL_MAX_IDLE and not self._closed:
            self._pool.append(glet)
        else:
            self._retire_greenlet(glet)

    def _retire_greenlet(self, glet: greenlet) -> None:
        self._counters["greenlets_retired"] += 1
        if not glet.dead:
            glet.switch(_RETIRE)

    def _discard_greenlet(self, glet: greenlet) -> None:
        """Never reuse a greenlet whose call misbehaved; try once to end it."""
        self._counters["greenlets_discarded"] += 1
        if glet.dead:
            return
        try:
            glet.throw(GreenletExit)
        except BaseException:
            _log.exception("discarded call greenlet raised while ending")
        if not glet.dead:
            _log.error("a call greenlet refused to end; abandoning it")

    # --- terminal frames ----------------------------------------------------------------

    def _finish_completed(self, ctx: ExecContext, output: Any) -> None:
        try:
            encoded = dumps_wire(output)
        except NotSerializableError as exc:
            self._finish_failed(ctx, output_failure(exc))
            return
        except Exception as exc:  # e.g. a dataclass whose asdict() raises
            self._finish_failed(
                ctx,
                (
                    ERR_OUTPUT_NOT_SERIALIZABLE,
                    False,
                    f"call output is not JSON-serializable: {type(exc).__name__}: {exc}",
                    None,
                    None,
                ),
            )
            return
        capture = ctx.debug_capture
        debug_output = capture.getvalue() if capture is not None else None
        now = ctx.clock()
        queue_wait_s = ctx.queue_wait_s
        envelope = call_completed_envelope(
            ctx,
            self.executor_id,
            orjson.Fragment(encoded),
            budget_used_ms=round(ctx.budget_used_ms(now)),
            effective_us=max(round((now - ctx.admitted_at - queue_wait_s) * 1e6), 0),
            queue_wait_us=round(queue_wait_s * 1e6),
            debug_output=debug_output,
        )
        try:
            ensure_frame_fits(envelope, len(encoded) + 4 * len(debug_output or ""))
        except EncodeError as exc:
            self._finish_failed(ctx, output_failure(exc))
            return
        self._finish(ctx, envelope, completed=True)

    def _finish_failed(self, ctx: ExecContext, failure: Failure) -> None:
        envelope = call_failed_envelope(
            ctx.call_id,
            ctx.task_id,
            ctx.attempt_seq,
            self.executor_id,
            failure,
            budget_used_ms=round(ctx.budget_used_ms()),
        )
        self._finish(ctx, envelope, completed=False)

    def _finish(self, ctx: ExecContext, envelope: dict[str, Any], *, completed: bool) -> None:
        """Make ``ctx`` DONE, drop it from the table and send its one terminal frame."""
        if ctx.finished:
            return
        ctx.finished = True
        ctx.state = ExecState.DONE
        ctx.queued = False
        if self._contexts.get(ctx.call_id) is ctx:
            del self._contexts[ctx.call_id]
        self.registry.release_task(ctx.task_id)
        counters = self._counters
        if ctx.suppress_terminal_emit or self._transport_lost:
            counters["terminal_suppressed"] += 1
            return
        counters["calls_completed" if completed else "calls_failed"] += 1
        try:
            self.send_frame(envelope)
        except ConnectionError:
            self.note_transport_lost()
        except EncodeError as exc:
            if not completed:
                _log.error("could not send CallFailed: %s", exc, extra=ctx.log_fields())
                return
            counters["calls_completed"] -= 1
            counters["calls_failed"] += 1
            failed = call_failed_envelope(
                ctx.call_id, ctx.task_id, ctx.attempt_seq, self.executor_id, output_failure(exc)
            )
            try:
                self.send_frame(failed)
            except (ConnectionError, EncodeError):
                _log.error("could not send CallFailed", extra=ctx.log_fields())
        except Exception:  # a transport bug: nothing more can be done for this call
            _log.exception("could not send the terminal frame", extra=ctx.log_fields())

    def _send_failed(self, call_id: str, task_id: str, attempt_seq: int, failure: Failure) -> None:
        """A CallFailed for a call that never became resident (refused at admission)."""
        envelope = call_failed_envelope(call_id, task_id, attempt_seq, self.executor_id, failure)
        try:
            self.send_frame(envelope)
        except ConnectionError:
            self.note_transport_lost()
        except EncodeError as exc:
            _log.error("could not send CallFailed: %s", exc, extra={"callId": call_id})

    # --- the bridge's host interface ------------------------------------------------------

    def next_request_id(self) -> str:
        """``req-<processInstanceId>-<seq>``: unique within and across process restarts."""
        return self._request_prefix + str(next(self._request_seq))

    def send_frame(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        """Send one frame (``ConnectionError`` once the transport is gone; ``EncodeError``
        when it cannot be framed — nothing is sent)."""
        session = self._session
        if session is not None:
            session.send_message(envelope, sidecar)
            return
        if self._transport_lost:
            raise ConnectionError("executor transport is gone")
        self._outbox.append(encode_frame(envelope, sidecar))

    def note_transport_lost(self) -> None:
        """A send found the transport gone; every context converges at the next pass."""
        if not self._transport_lost:
            self._transport_lost = True
            _log.error("executor transport lost; ending every resident call")

    def schedule_sleep(self, ctx: ExecContext, duration_s: float) -> None:
        token = next(self._timer_seq)
        ctx.sleep_token = token
        ctx.state = ExecState.WAITING_SLEEP
        heapq.heappush(self._sleepers, (self._monotonic() + duration_s, token, ctx))

    def wake_context(self, ctx: ExecContext, value: Any) -> None:
        if (
            ctx.finished
            or ctx.queued
            or ctx.state is not ExecState.WAITING_FUNCTION_CODE
            or not ctx.code_fetch_follower
        ):
            return
        ctx.resume_payload = value
        ctx.queued = True
        ctx.enqueued_at = self._monotonic()
        self._runnable.append(ctx)

    def _wake_due_sleepers(self, now: float) -> None:
        heap = self._sleepers
        ready = self._sleep_ready
        while heap and heap[0][0] <= now:
            due, token, ctx = heapq.heappop(heap)
            if ctx.sleep_token != token or ctx.finished or ctx.state is not ExecState.WAITING_SLEEP:
                continue
            ctx.sleep_token = 0
            ctx.resume_payload = SLEEP_WAKE
            ctx.queued = True
            ctx.enqueued_at = due  # waking late is queueing
            ready.append(ctx)

    def _expire_timeouts(self, now: float) -> None:
        heap = self._timeouts
        while heap and heap[0][0] <= now:
            _, _, ctx = heapq.heappop(heap)
            if ctx.finished or self._contexts.get(ctx.call_id) is not ctx:
                continue
            if ctx.state in WAITING_STATES:
                self._terminate_context(ctx, REASON_CALL_TIMEOUT)
            elif ctx.cancel_reason is None:
                ctx.cancel_reason = REASON_CALL_TIMEOUT

    # --- transport ------------------------------------------------------------------------

    def on_transport_lost(self) -> None:
        """The connection is gone: every live context ends as ``transport_lost`` (no
        frame is sent) and new calls are refused. From another thread this only
        records the loss; the scheduler converges at its next pass."""
        self.note_transport_lost()
        if (
            threading.get_ident() == self._scheduler_thread
            and not self._in_scheduler
            and current_context() is None
        ):
            self._converge_transport_lost()

    def _refresh_transport_state(self) -> None:
        session = self._session
        if not self._transport_lost and session is not None and not session.is_connected():
            self.note_transport_lost()
        if self._transport_lost and self._contexts:
            self._converge_transport_lost()

    def _converge_transport_lost(self) -> None:
        for ctx in list(self._contexts.values()):
            if not ctx.finished:
                self._counters["transport_lost_calls"] += 1
                self._terminate_context(ctx, REASON_TRANSPORT_LOST, suppress_terminal_emit=True)

    # --- shutdown -------------------------------------------------------------------------

    def shutdown(self, reason: str = DEFAULT_CANCEL_REASON) -> None:
        """Cancel every resident call (one retryable ``CallFailed(cancelled)`` each, while
        the transport lasts), refuse new ones, retire the idle greenlets and restore
        the previous ``SIGALRM`` handler. Scheduler thread only; idempotent."""
        if threading.get_ident() != self._scheduler_thread or current_context() is not None:
            raise RuntimeError("shutdown must run on the scheduler thread, outside any call")
        self._closed = True
        for ctx in list(self._contexts.values()):
            self._terminate_context(ctx, reason, retryable=True)
        while self._pool:
            self._retire_greenlet(self._pool.pop())
        if self._alarm_enabled and signal.getsignal(signal.SIGALRM) is _on_deadline_signal:
            self._disarm_alarm()
            previous = self._previous_alarm_handler
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        self._alarm_enabled = self._alarm_ready = False

    # --- observation ----------------------------------------------------------------------

    def drain_outbox(self) -> list[tuple[dict[str, Any], bytes | None]]:
        """Without a session: every frame sent so far, decoded as the worker would see it."""
        frames = [decode_frame(data) for data in self._outbox]
        self._outbox.clear()
        return [(frame.envelope, frame.sidecar) for frame in frames]

    def inflight_count(self) -> int:
        """Resident call attempts (sub-calls included); a DONE context is never counted."""
        return len(self._contexts)

    def build_heartbeat(self) -> dict[str, Any]:
        """The ``Heartbeat`` payload (PROTOCOL.md), ``heartbeatSeq`` from 1.

        Safe from the heartbeat thread: it reads a snapshot of the contexts and
        counters and never switches greenlets.
        """
        contexts = list(self._contexts.values())  # atomic copy under the GIL
        counts = dict.fromkeys(EXEC_STATES, 0)
        runnable = 0
        for ctx in contexts:
            state = ctx.state
            if state is ExecState.DONE:
                continue
            counts[state.value] += 1
            if ctx.queued or state is ExecState.RUNNABLE:
                runnable += 1
        inflight = len(contexts)
        if self.max_inflight:
            available = max(0, self.max_inflight - inflight)
        else:
            available = UNLIMITED_CONTEXTS
        memory = 0
        utilization, cpu_total = 0.0, 0.0
        metrics = self._metrics
        if metrics is not None:
            memory = metrics.sample_memory_bytes()
            utilization, cpu_total = metrics.sample_cpu()
        current = self._running
        return {
            FP_EXECUTOR_ID: self.executor_id,
            FP_HEARTBEAT_SEQ: next(self._heartbeat_seq),
            FP_RUNNABLE_COUNT: runnable,
            FP_INFLIGHT_COUNT: inflight,
            FP_AVAILABLE_CONTEXTS: available,
            FP_MEMORY_BYTES: memory,
            FP_EXECUTOR_CPU_UTILIZATION: utilization,
            FP_EXECUTOR_CPU_SECONDS_TOTAL: cpu_total,
            FP_EXECUTOR_PROCESS_INSTANCE_ID: self.process_instance_id,
            FP_LAST_SCHEDULER_ACTIVE_AT_MS: self._last_scheduler_active_ms,
            FP_RUNNING_CALL_ID: current.call_id if current is not None else None,
            FP_CALL_STATE_COUNTS: counts,
            FP_SENT_AT_MS: self._clock_ms(),
        }

    def stats(self) -> dict[str, Any]:
        """Counters for tests, benches and logs (drops, terminals, greenlets, queues)."""
        result: dict[str, Any] = dict(self._counters)
        result["inflight"] = len(self._contexts)
        result["runnable"] = sum(1 for ctx in self._runnable if ctx.queued) + sum(
            1 for ctx in self._sleep_ready if ctx.queued
        )
        result["sleeping"] = sum(1 for entry in self._sleepers if not entry[2].finished)
        result["idle_greenlets"] = len(self._pool)
        result["transport_lost"] = self._transport_lost
        result["closed"] = self._closed
        result["module_registry"] = self.registry.stats()
        return result

    def get_context(self, call_id: str) -> ExecContext | None:
        """The resident context of ``call_id`` (tests and diagnostics)."""
        return self._contexts.get(call_id)


# --- helpers ---------------------------------------------------------------------------


def _admission_failure(exc: AdmissionError) -> Failure:
    return (exc.error_kind, exc.retryable, str(exc), None, None)

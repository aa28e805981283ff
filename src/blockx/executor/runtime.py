"""ExecutorRuntime: the in-process heart of the Python executor.

Theory of operation
-------------------
The runtime owns every resident call attempt (:class:`ExecContext`, keyed by
``callId`` in ``_contexts``) and is the only code that switches into a call's
greenlet. It runs on one thread (the "scheduler thread", the one that built it);
the session's reader/writer threads and the heartbeat thread never switch.

It is composed, not inherited: the way h11's ``Connection`` holds a
``ConnectionState``, the runtime builds the shared tables (the contexts, the
ended attempts, the run queues, the call timers, the counters) and hands each
part exactly the ones it works on. Calls between parts are direct method
calls on attributes of concrete classes (native calls once mypyc compiles
them); none allocates or builds a closure per call. What the split costs,
counted by ``bench/opcodes.py`` on the sources (2026-12-01, against the
base-class chain it replaced): 1,003 bytecodes per trivial call (was 1,000:
the outbox's ``transport_lost`` read through one more attribute in admission
and in the terminal frame) and 4,655 per call of 5 IO waits (was 4,649).
Compiled, those are native attribute reads, and the bridge's ``CallWaiting``
send became a native call (it went through the ``BridgeHost`` Protocol); not
yet counted with ``bench/instructions.py`` (no compiled build where this was
written).

* :class:`~.inbound_frames.InboundFrames` (``_inbound``) — the worker's frames
  (:meth:`handle_inbound_message`; ``run_until_idle`` drains the session into
  it) and the three semantic entry points they map onto, which the runtime's
  :meth:`submit_call`, :meth:`resume_call` and :meth:`cancel_call` are:
  admission and attempt replacement, a matching ``ResumeCall`` queued, a cancel
  ending a waiting call at once or a runnable one at its next step;
* :class:`~.call_runner.CallRunner` (``_runner``) — stepping a context
  (terminate, resume, or first switch), one switch into its greenlet, ending
  it, the call body on its pool greenlet and its one terminal frame; it owns
  the resident greenlet pool (:mod:`.greenlet_pool`: a fresh greenlet costs
  ~8 µs, a reused one ~0.5 µs, docs/operations.md) and the record of the
  switch in progress, which heartbeats read;
* :class:`~.outbox.Outbox` (``_outbox``) — every frame sent, and
  ``transport_lost``;
* :class:`~.sdk_bridge.SdkBridge` (``_bridge``) — the call side of every wait
  (``CallWaiting`` → suspend → ``ResumeCall``); this runtime is its host
  (``next_request_id``, ``limit_wait``, ``schedule_sleep``, ``wake_context``);
* :mod:`.timers` — the sleep, wait-limit and call-timeout heaps
  (``CallTimers``): which contexts are due; the runtime queues or ends them.
  An IO or sub-call wait that outlasts its call's budget (or deadline) is cut
  off: :meth:`ExecutorRuntime._cut_off_wait` forgets the pending request (its
  late ``ResumeCall`` is dropped as stale) and switches ``WAIT_CUT_OFF`` into
  the call, whose wait then fails it as ``deadline_exceeded``;
* :mod:`.deadline` — ``SIGALRM`` preemption of calls that overrun their budget
  in pure CPU work (armed before each switch into a budgeted call, disarmed
  when the scheduler goes idle);
* :mod:`.heartbeat` — the ``Heartbeat`` payload built from a snapshot
  (:meth:`build_heartbeat`): ``runningForMs`` and ``runningCallBudgetMs`` come
  from the runner's switch stamps (two attribute stores per switch, no clock
  read of their own), so a long pass of healthy calls never looks stalled;
* :mod:`.containment` — the black box written around each switch, the
  ``MemoryError`` exit (:meth:`set_memory_exit`), the descriptor-exhaustion flag
  (:attr:`descriptors_exhausted`) and the credit for time stopped by ``SIGSTOP``
  (:meth:`credit_pause`);
* :mod:`.module_registry` — code by digest, namespaces by task (acquired on
  admission, released with the terminal frame).

:meth:`run_until_idle` refreshes the transport state, drains inbound frames,
wakes due timers and steps queued contexts until none is runnable (sleep-ready
first, yielding to the runnable queue after 64 in a row). Another pass follows
only when it can find work. With one call per wake-up the per-pass fixed cost
is paid per call, so it is kept to a few attribute checks.

Imports point one way (no cycle, ``TYPE_CHECKING`` included;
tests/test_import_graph.py checks it): :mod:`.markers`,
:mod:`.outbox` and :mod:`.errors` import nothing of the executor's;
:mod:`.context` only :mod:`.errors`; :mod:`.greenlet_pool` the markers (and the
context, for types); :mod:`.sdk_bridge` the context, the errors, the markers and
the outbox; :mod:`.call_runner` those, the pool, the outputs and the deadline
alarm; :mod:`.inbound_frames` the call runner and the frame types; this module
all of them, and nothing imports it but the process shell.

Invariants: every admitted attempt that is not replaced ends in exactly one
``CallCompleted`` / ``CallFailed`` (none once the transport is gone); a
``DONE`` context is no longer in ``_contexts`` (``inflight_count() ==
len(_contexts)``); at most one pending ``requestId`` per context; the runtime
never raises on bad peer input (it logs and drops, or fails that one call).
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from blockx.sdk.runtime import set_provider
from blockx.wire.blackbox import BlackboxWriter
from blockx.wire.keys import DEFAULT_CANCEL_REASON

from .call_runner import CallRunner, EndedAttempts
from .containment import PauseClock
from .context import (
    CUT_OFF_STATES,
    WAITING_STATES,
    ExecContext,
    ExecState,
    ResumePayload,
    current_context,
)
from .deadline import DeadlineAlarm, note_cancel_request
from .errors import REASON_CALL_TIMEOUT, REASON_TRANSPORT_LOST
from .greenlet_pool import POOL_MAX_IDLE
from .heartbeat import MetricsLike, heartbeat_payload
from .inbound_frames import InboundFrames
from .markers import SLEEP_WAKE, WAIT_CUT_OFF
from .module_registry import ModuleRegistry
from .outbox import Outbox, SessionLike
from .restricted_runtime import restricted_namespace
from .sdk_bridge import SdkBridge
from .sdk_bridge_provider import SdkBridgeProvider
from .sleep_patch import install_global_sleep_patch
from .timers import CallTimers

__all__ = ["POOL_MAX_IDLE", "SLEEP_READY_STREAK", "ExecutorRuntime", "MetricsLike", "SessionLike"]

_log = logging.getLogger("blockx.executor")

#: Sleep-ready contexts stepped in a row before one runnable context gets a turn.
SLEEP_READY_STREAK: Final = 64
#: Bound on the outer passes of one run_until_idle (a call looping on sleep(0)
#: must not keep the main loop from checking its connection).
_MAX_PASSES: Final = 64


def _running_call_fields() -> dict[str, Any] | None:
    ctx = current_context()
    return None if ctx is None else ctx.log_fields()


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ExecutorRuntime:
    """The contexts table, the run queues and the parts that work on them (see the module doc).

    ``session`` is the transport (None in unit tests: sent frames collect in
    :meth:`drain_outbox`). ``max_inflight`` caps resident top-level calls (0 =
    unlimited); ``max_runnable`` is stored only. ``metrics`` feeds heartbeats.
    ``clock_ms`` is the wall clock for timestamps; ``monotonic`` (seconds) the
    clock for budgets, sleeps and queue times — both injectable for tests.
    ``registry`` replaces the default :class:`ModuleRegistry`; ``call_timeout_ms``
    (0 = off) arms the local call-timeout latch: an attempt still resident that
    long after admission ends as ``deadline_exceeded``.

    ``process_instance_id`` defaults to 12 hex digits of a uuid4; it prefixes
    every ``requestId``. ``blackbox`` (``blockx.wire.blackbox.BlackboxWriter``)
    is written around every switch into a call's greenlet: the call holding the
    thread is named in it, none between switches.

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
        blackbox: BlackboxWriter | None = None,
    ) -> None:
        if max_inflight < 0 or max_runnable < 0 or call_timeout_ms < 0:
            raise ValueError("max_inflight, max_runnable and call_timeout_ms must be >= 0")
        self.executor_id = executor_id
        self.max_runnable = max_runnable  # stored only: the worker's dispatch threshold
        self.process_instance_id = process_instance_id or uuid.uuid4().hex[:12]
        if registry is None:
            registry = ModuleRegistry(restricted_namespace_factory=restricted_namespace)
        self._session = session
        self._session_has_incoming = getattr(session, "has_incoming", None)  # optional
        self._metrics = metrics
        self._clock_ms = clock_ms or _wall_clock_ms
        self._monotonic = monotonic or time.perf_counter
        # The shared tables, each handed to the parts that work on it.
        self._contexts: dict[str, ExecContext] = {}
        # callId -> the highest attempt that already ended here, for the most
        # recent FINISHED_ATTEMPTS_REMEMBERED calls: a late re-delivery of an
        # ended attempt is a duplicate, not a new call (one terminal per attempt).
        self._finished_attempts = EndedAttempts()
        self._runnable: deque[ExecContext] = deque()
        self._sleep_ready: deque[ExecContext] = deque()
        self._timers = CallTimers()
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
                "waits_cut_off",
                "invalid_message_dropped",
                "unknown_message_dropped",
                "heartbeat_acks",
                "transport_lost_calls",
                "refused_after_transport_lost",
                "inbound_errors",
            ),
            0,
        )
        self._request_prefix = f"req-{self.process_instance_id}-"
        # A plain int: a native increment once compiled (``next()`` on an itertools.count
        # and ``str()`` of the boxed result cost ~1k instructions per wait). Only the
        # scheduler thread asks (sdk_bridge._perform_wait, inside a call's greenlet).
        self._request_seq = 0
        self._heartbeat_seq = itertools.count(1)
        self._scheduler_thread = threading.get_ident()
        self._last_scheduler_active_ms = self._clock_ms()
        os.environ["BLOCKX_EXECUTOR_RUNTIME"] = "1"
        install_global_sleep_patch()
        self._alarm = DeadlineAlarm()  # installs the SIGALRM handler on the main thread
        reader_hooks: Any = session  # a UDSSession has the hook; fakes in tests need not
        if self._alarm.enabled and hasattr(reader_hooks, "cancel_notice"):
            # The reader thread notes each CancelCall and interrupts a call stuck in pure
            # CPU work at once (deadline.py); the scheduler would never get to the frame.
            reader_hooks.cancel_notice = note_cancel_request
        # The parts.
        self._outbox = Outbox(session)
        self._bridge = SdkBridge(self, self._outbox)
        self._provider = SdkBridgeProvider(self._bridge)
        # Every call runs in a copy of this Context (CallRunner.step_context).
        call_context = contextvars.Context()
        call_context.run(set_provider, self._provider)
        self._runner = CallRunner(
            executor_id,
            registry=registry,
            contexts=self._contexts,
            finished_attempts=self._finished_attempts,
            counters=self._counters,
            monotonic=self._monotonic,
            outbox=self._outbox,
            bridge=self._bridge,
            call_context=call_context,
            alarm=self._alarm,
            blackbox=blackbox,
        )
        self._inbound = InboundFrames(
            executor_id,
            max_inflight=max_inflight,
            call_timeout_ms=call_timeout_ms,
            registry=registry,
            contexts=self._contexts,
            finished_attempts=self._finished_attempts,
            runnable=self._runnable,
            timers=self._timers,
            counters=self._counters,
            monotonic=self._monotonic,
            outbox=self._outbox,
            bridge=self._bridge,
            runner=self._runner,
        )
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
            f"sleeping={len(self._timers.sleepers)}, "
            f"wait_limits={len(self._timers.wait_limits)}, pool={len(self._runner.pool)}"
            f"{', transport lost' if self._outbox.transport_lost else ''})"
        )

    # --- the three semantic entry points (InboundFrames') ----------------------------------

    def submit_call(self, ctx: ExecContext) -> bool:
        """Admit a new attempt; True when it was queued (:meth:`InboundFrames.submit_call`)."""
        return self._inbound.submit_call(ctx)

    def resume_call(self, call_id: str, request_id: str, resume: ResumePayload) -> bool:
        """Deliver a ResumeCall; True when it matched the pending wait and was queued
        (:meth:`InboundFrames.resume_call`)."""
        return self._inbound.resume_call(call_id, request_id, resume)

    def cancel_call(
        self, call_id: str, reason: str = DEFAULT_CANCEL_REASON, *, attempt_seq: int = 0
    ) -> bool:
        """Cancel a resident attempt, ``attempt_seq`` 0 = whichever is resident
        (:meth:`InboundFrames.cancel_call`)."""
        return self._inbound.cancel_call(call_id, reason, attempt_seq=attempt_seq)

    def handle_inbound_message(self, envelope: Any, sidecar: bytes | None = None) -> None:
        """Handle one decoded frame from the worker; never raises on bad peer input
        (:meth:`InboundFrames.handle_inbound_message`). Scheduler thread only, never
        from inside a call."""
        self._inbound.handle_inbound_message(envelope, sidecar)

    # --- what the parts hold, read through the runtime (one holder each) -------------------

    @property
    def registry(self) -> ModuleRegistry:
        """The module registry the parts were given (pass ``registry`` to replace it)."""
        return self._runner.registry

    @property
    def max_inflight(self) -> int:
        """Resident top-level calls admitted at most (0 = unlimited)."""
        return self._inbound.max_inflight

    @property
    def call_timeout_ms(self) -> int:
        """The local call-timeout latch (0 = off)."""
        return self._inbound.call_timeout_ms

    @property
    def descriptors_exhausted(self) -> bool:
        """A call failed for want of file descriptors: the process shell recycles the
        executor (blockx.wire.blackbox.EXIT_DESCRIPTORS_EXHAUSTED)."""
        return self._runner.descriptors_exhausted

    # --- scheduling -----------------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Run every context that can run now; return when none is runnable.

        Each pass refreshes the transport state, drains the session's inbound
        frames, wakes due sleepers, cuts off waits past their budget, expires
        timeouts, then steps the queues (sleep-ready first, a runnable context
        after every 64). Another pass follows only when one can find work: frames
        came in, a sleep or timeout is pending, the transport went away (a wait
        limit is never due at once: the main loop wakes for it). Scheduler
        thread only.
        """
        runner = self._runner
        if runner.in_scheduler or current_context() is not None:
            raise RuntimeError("run_until_idle is not re-entrant")
        runner.in_scheduler = True
        alarm = self._alarm
        # Someone else may have taken SIGALRM (a test runner): never arm for them.
        alarm.refresh()
        try:
            self._last_scheduler_active_ms = self._clock_ms()
            session = self._session
            has_incoming = self._session_has_incoming
            timers = self._timers
            outbox = self._outbox
            inbound = self._inbound  # handle_inbound: run_until_idle checked it is not in a call
            for _ in range(_MAX_PASSES):
                # Inline test first: the method call only when the transport is in doubt.
                if outbox.transport_lost or (session is not None and not session.is_connected()):
                    self._refresh_transport_state()
                if session is not None:
                    for frame in session.drain_incoming():
                        inbound.handle_inbound(frame.envelope, frame.sidecar)
                if timers.sleepers or timers.wait_limits or timers.timeouts:
                    now = self._monotonic()
                    if timers.sleepers:
                        self._wake_due_sleepers(now)
                    if timers.wait_limits and timers.wait_limits[0][0] <= now:
                        self._cut_off_due_waits(now)
                    if timers.timeouts:
                        self._expire_timeouts(now)
                if not self._run_queues():
                    break
                # The queues are empty now; skip the pass that would only find that out.
                if not (
                    timers.sleepers
                    or timers.timeouts
                    or outbox.transport_lost
                    or (
                        session is not None
                        and (has_incoming is None or has_incoming() or not session.is_connected())
                    )
                ):
                    break
        finally:
            runner.in_scheduler = False
            if alarm.due != math.inf:
                alarm.disarm()

    def next_scheduler_delay(self, default: float | None) -> float | None:
        """Seconds until the scheduler has work: 0 if some is runnable now,
        else until the next sleeper, wait limit or timeout is due, else ``default``."""
        if self._runnable or self._sleep_ready or (self._outbox.transport_lost and self._contexts):
            return 0.0
        due = self._timers.next_due()
        if due is None:
            return default
        delay = max(due - self._monotonic(), 0.0)
        return delay if default is None else min(default, delay)

    def _run_queues(self) -> int:
        runnable = self._runnable
        ready = self._sleep_ready
        runner = self._runner
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
            runner.step_context(ctx)
            stepped += 1
            if runner.descriptors_exhausted:
                # Out of descriptors: the next call would fail the same way. Stop here;
                # the process shell recycles the executor (the queued calls go elsewhere).
                return 0

    # --- the bridge's host interface ------------------------------------------------------

    def next_request_id(self) -> str:
        """``req-<processInstanceId>-<seq>``: unique within and across process restarts."""
        seq = self._request_seq + 1
        self._request_seq = seq
        return self._request_prefix + str(seq)

    def limit_wait(self, ctx: ExecContext) -> None:
        """Arm ``ctx``'s wait-limit timer for when its budget runs out."""
        due = ctx.budget_runs_out_at(ctx.slice_started)  # called from the running call
        self._timers.add_wait_limit(ctx, due, resident=len(self._contexts))

    def schedule_sleep(self, ctx: ExecContext, duration_s: float) -> None:
        """Arm ``ctx``'s sleep timer and mark it ``WAITING_SLEEP``."""
        ctx.state = ExecState.WAITING_SLEEP
        due = self._monotonic() + duration_s
        self._timers.add_sleeper(ctx, due, resident=len(self._contexts))

    def wake_context(self, ctx: ExecContext, value: Any) -> None:
        """Queue a code-fetch follower to be switched into with ``value``."""
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
        ready = self._sleep_ready
        for due, ctx in self._timers.pop_due_sleepers(now):
            ctx.sleep_token = 0
            ctx.resume_payload = SLEEP_WAKE
            ctx.queued = True
            ctx.enqueued_at = due  # waking late is queueing
            ready.append(ctx)

    def _cut_off_due_waits(self, now: float) -> None:
        for cut, ctx in self._timers.pop_cut_off_waits(now):
            if self._contexts.get(ctx.call_id) is ctx:
                self._cut_off_wait(ctx, cut, now)

    def _cut_off_wait(self, ctx: ExecContext, cut: float, now: float) -> None:
        """End ``ctx``'s IO / sub-call wait, due to end at ``cut``: no answer is awaited
        any more (a late ResumeCall is stale) and the call is switched ``WAIT_CUT_OFF``,
        which fails it with the time waited charged (``SdkBridge._cut_off``)."""
        self._counters["waits_cut_off"] += 1
        ctx.pending_request_id = None
        ctx.resume_payload = WAIT_CUT_OFF
        ctx.queued = True
        ctx.enqueued_at = cut if cut < now else now  # waking late is queueing
        self._sleep_ready.append(ctx)  # timer wake-ups go first, as for sleepers

    def _expire_timeouts(self, now: float) -> None:
        for ctx in self._timers.pop_expired_timeouts(now):
            if self._contexts.get(ctx.call_id) is not ctx:
                continue
            if ctx.state in CUT_OFF_STATES and not ctx.queued:
                # Waiting on the worker with no answer in: cut the wait off at the
                # deadline, so the failure names what the call waited for.
                self._cut_off_wait(ctx, ctx.wait_cut_off_at(), now)
            elif ctx.resume_payload is WAIT_CUT_OFF:
                continue  # its budget ran out in this same pass: that says why it ends
            elif ctx.state in WAITING_STATES:
                self._runner.terminate_context(ctx, REASON_CALL_TIMEOUT)
            elif ctx.cancel_reason is None:
                ctx.cancel_reason = REASON_CALL_TIMEOUT

    # --- transport ------------------------------------------------------------------------

    def on_transport_lost(self) -> None:
        """The connection is gone: every live context ends as ``transport_lost`` (no
        frame is sent) and new calls are refused. From another thread this only
        records the loss; the scheduler converges at its next pass."""
        self._outbox.note_transport_lost()
        if (
            threading.get_ident() == self._scheduler_thread
            and not self._runner.in_scheduler
            and current_context() is None
        ):
            self._converge_transport_lost()

    def _refresh_transport_state(self) -> None:
        session = self._session
        outbox = self._outbox
        if not outbox.transport_lost and session is not None and not session.is_connected():
            outbox.note_transport_lost()
        if outbox.transport_lost and self._contexts:
            self._converge_transport_lost()

    def _converge_transport_lost(self) -> None:
        for ctx in list(self._contexts.values()):
            if not ctx.finished:
                self._counters["transport_lost_calls"] += 1
                self._runner.terminate_context(
                    ctx, REASON_TRANSPORT_LOST, suppress_terminal_emit=True
                )

    # --- shutdown -------------------------------------------------------------------------

    def shutdown(self, reason: str = DEFAULT_CANCEL_REASON) -> None:
        """Cancel every resident call (one retryable ``CallFailed(cancelled)`` each, while
        the transport lasts), refuse new ones, retire the idle greenlets and restore
        the previous ``SIGALRM`` handler. Scheduler thread only; idempotent."""
        if threading.get_ident() != self._scheduler_thread or current_context() is not None:
            raise RuntimeError("shutdown must run on the scheduler thread, outside any call")
        self._inbound.closed = True
        runner = self._runner
        for ctx in list(self._contexts.values()):
            runner.terminate_context(ctx, reason, retryable=True)
        runner.pool.close()
        self._runner.registry.drop_released()
        self._alarm.restore()

    # --- containment ----------------------------------------------------------------------

    def set_memory_exit(self, end: Callable[[int], None] | None) -> None:
        """What a call that gets ``MemoryError`` does to the process: ``end(0)`` ends it
        (``containment.memory_exit``: black box cause, exit 87) with that call still
        named in the black box. None (the default): the call just fails."""
        self._runner.memory_exit = end

    def credit_pause(self, clock: PauseClock) -> float:
        """``SIGCONT``: the process was stopped from outside; give the time it stood
        still back to the call it was running and to the waits it interrupted, so a
        paused-then-resumed executor fails no healthy call (docs/security.md). Returns
        the seconds credited. Runs on the main thread as a signal handler: between two
        bytecodes of whatever ran, so it only moves start times forward (a credit
        racing the end of a slice is lost, never double-counted)."""
        paused = clock.take_pause(time.monotonic())  # the clock the watchdog ticks
        if paused <= 0.0:
            return 0.0
        runner = self._runner
        ctx = runner.running
        if ctx is not None and ctx.slice_started:
            ctx.slice_started += paused
            ctx.expires_at += paused
            runner.switched_in_at += paused
        for waiting in list(self._contexts.values()):
            if waiting.state in CUT_OFF_STATES and not waiting.queued:
                waiting.suspended_at += paused  # its wait's cut-off moves with it
        _log.warning("executor was stopped for %.1f s; that time is not charged", paused)
        return paused

    # --- observation ----------------------------------------------------------------------

    def drain_outbox(self) -> list[tuple[dict[str, Any], bytes | None]]:
        """Without a session: every frame sent so far, decoded as the worker would see it."""
        return self._outbox.drain()

    def inflight_count(self) -> int:
        """Resident call attempts (sub-calls included); a DONE context is never counted."""
        return len(self._contexts)

    def build_heartbeat(self) -> dict[str, Any]:
        """The ``Heartbeat`` payload (docs/protocol.md), ``heartbeatSeq`` from 1.

        Safe from the heartbeat thread: it reads a snapshot of the contexts and
        counters and never switches greenlets.
        """
        runner = self._runner
        current = runner.running  # first: the stamps below are then as new or newer
        switched_in_at = runner.switched_in_at
        budget_left_ms = runner.running_budget_left_ms
        wall_ms = self._clock_ms()
        since_switch_s = max(self._monotonic() - switched_in_at, 0.0)
        last_active_ms = self._last_scheduler_active_ms
        if switched_in_at:  # a switch into a call is scheduler activity too
            last_active_ms = max(last_active_ms, wall_ms - round(since_switch_s * 1000.0))
        return heartbeat_payload(
            executor_id=self.executor_id,
            heartbeat_seq=next(self._heartbeat_seq),
            contexts=list(self._contexts.values()),  # atomic copy under the GIL
            max_inflight=self._inbound.max_inflight,
            metrics=self._metrics,
            process_instance_id=self.process_instance_id,
            last_scheduler_active_ms=last_active_ms,
            running_call_id=current.call_id if current is not None else None,
            running_for_ms=round(since_switch_s * 1000.0) if current is not None else 0,
            running_call_budget_ms=(
                max(round(budget_left_ms), 1) if current is not None and budget_left_ms else 0
            ),
            sent_at_ms=wall_ms,
        )

    def stats(self) -> dict[str, Any]:
        """Counters for tests, benches and logs (drops, terminals, greenlets, queues)."""
        result: dict[str, Any] = dict(self._counters)
        pool = self._runner.pool
        result["greenlets_created"] = pool.created
        result["greenlets_retired"] = pool.retired
        result["greenlets_discarded"] = pool.discarded
        result["inflight"] = len(self._contexts)
        result["runnable"] = sum(1 for ctx in self._runnable if ctx.queued) + sum(
            1 for ctx in self._sleep_ready if ctx.queued
        )
        result["sleeping"] = self._timers.sleeping()
        result["idle_greenlets"] = len(pool)
        result["transport_lost"] = self._outbox.transport_lost
        result["closed"] = self._inbound.closed
        result["module_registry"] = self._runner.registry.stats()
        return result

    def get_context(self, call_id: str) -> ExecContext | None:
        """The resident context of ``call_id`` (tests and diagnostics)."""
        return self._contexts.get(call_id)

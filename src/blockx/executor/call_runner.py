"""CallRunner: how one admitted context runs, is ended, and sends its terminal frame.

Theory of operation
-------------------
``ExecutorRuntime`` holds one ``CallRunner`` (``_runner``), as h11's
``Connection`` holds its ``ConnectionState``; so does the runtime's
:class:`~.inbound_frames.InboundFrames` (admission ends a replaced attempt and
refuses with :meth:`CallRunner.send_failed`). It is the part that switches into
call greenlets (the scheduler thread only, never from inside a call). It is
given what it works on -- the contexts table, the ended attempts, the counters,
the module registry, the :class:`~.outbox.Outbox`, the SDK bridge (code
fetches), the deadline alarm and the black box -- and owns the resident
greenlet pool and the record of the switch in progress (``running``,
``switched_in_at``, ``running_budget_left_ms``: the heartbeat thread reads
them), ``descriptors_exhausted`` and ``memory_exit``. It imports nothing that
imports it; the runtime's scheduler calls it, never the other way round.

* :meth:`CallRunner.step_context` — the scheduler's one step of a queued
  context, with exactly three branches: ``cancel_reason`` set → terminate;
  ``resume_payload`` set → switch it into the waiting greenlet; else the
  first switch, which hands the context to a resident greenlet
  (:mod:`.greenlet_pool`) in a fresh copy of the call ``contextvars.Context``.
* :meth:`CallRunner._run_slice` — one switch (or throw) into a context's
  greenlet. It marks the context ``RUNNING``, stamps the switch for heartbeats,
  names the call in the black box (cleared when control is back), arms the deadline alarm
  (:mod:`.deadline`), charges the slice to ``cpu_s`` (its end is
  ``suspended_at``: where a wait begins) and settles what the
  greenlet hands back: ``SUSPENDED`` (it waits), ``CALL_FINISHED`` (its
  greenlet goes back to the pool), anything else (the greenlet died or user
  code switched away by itself: the call fails if it has not ended, and the
  greenlet is discarded).
* :meth:`CallRunner.terminate_context` — end a context now: a framework
  exception (cancel, deadline, replacement, transport loss) is thrown into
  its suspended greenlet, or, for a context that never ran, it fails at once.
  A ``ResumeCall`` already delivered but not yet switched in is dropped, and
  its ``budgetUsedMs`` charged: the worker spent that time on the call.
* :meth:`CallRunner._run_call` — runs on the pool greenlet: load the entry
  function, call it, and send exactly one terminal frame.
* Terminal frames: :meth:`CallRunner._finish_completed` /
  :meth:`CallRunner._finish_failed` build them; :meth:`CallRunner._finish`
  makes the context ``DONE``, drops it from the table and sends the frame
  (suppressed for a replaced attempt and once the transport is gone);
  :meth:`CallRunner.send_failed` answers a call refused at admission.

Invariants: a context's terminal outcome is decided once (``finished``);
``_finish`` is the only place that sets it, removes the context from the
table and releases the task's namespaces.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from greenlet import GreenletExit, getcurrent, greenlet

from blockx.wire.errors import EncodeError
from blockx.wire.frames import encode_frame_with_value
from blockx.wire.keys import (
    ERR_INTERNAL_ERROR,
    ERR_OUTPUT_NOT_SERIALIZABLE,
    ERR_USER_ERROR,
    F_PAYLOAD,
    FP_OUTPUT,
)

from .containment import is_descriptor_exhaustion, is_memory_exhaustion
from .context import ExecContext, ExecState, ResumePayload, running
from .errors import AdmissionError, termination_exception
from .greenlet_pool import ResidentGreenletPool
from .markers import CALL_FINISHED, SUSPENDED
from .outputs import (
    Failure,
    call_completed_envelope,
    call_failed_envelope,
    describe_failure,
    output_failure,
    round_half_even,
)
from .tracing import traced_envelope

if TYPE_CHECKING:
    import contextvars
    from collections.abc import Callable

    from blockx.wire.blackbox import BlackboxWriter

    from .deadline import DeadlineAlarm
    from .module_registry import ModuleRegistry
    from .outbox import Outbox
    from .sdk_bridge import SdkBridge

__all__ = ["FINISHED_ATTEMPTS_REMEMBERED", "CallRunner", "EndedAttempts", "admission_failure"]

_log = logging.getLogger("blockx.executor")

#: How many ended calls' attempt numbers are remembered to drop late duplicates.
FINISHED_ATTEMPTS_REMEMBERED: Final = 16384


class EndedAttempts:
    """The highest ended attempt of the last :data:`FINISHED_ATTEMPTS_REMEMBERED` calls
    that ended here, by call id: a late re-delivery of an ended attempt is a duplicate,
    not a new call (one terminal per attempt).

    A dict and a deque of its keys, oldest first. It was an ``OrderedDict``, which
    compiled code reaches only through generic method calls (its ``popitem`` per call
    at the bound); ``del d[next(iter(d))]`` on a plain dict walks the deleted slots at
    its front (14 µs a call at this size, py-spy found it).
    """

    __slots__ = ("_order", "_seqs")

    def __init__(self) -> None:
        self._seqs: dict[str, int] = {}
        self._order: deque[str] = deque()

    def __len__(self) -> int:
        return len(self._seqs)

    def get(self, call_id: str) -> int:
        """The highest ended attempt of ``call_id`` remembered, 0 for none."""
        return self._seqs.get(call_id, 0)

    def note(self, call_id: str, attempt_seq: int) -> None:
        """Attempt ``attempt_seq`` of ``call_id`` ended (a lower one than remembered is
        ignored); past the bound the call remembered longest is forgotten."""
        seqs = self._seqs
        known = seqs.get(call_id)
        if known is None:
            seqs[call_id] = attempt_seq
            order = self._order
            order.append(call_id)
            if len(order) > FINISHED_ATTEMPTS_REMEMBERED:
                del seqs[order.popleft()]
        elif attempt_seq > known:
            seqs[call_id] = attempt_seq


def admission_failure(exc: AdmissionError) -> Failure:
    """The ``CallFailed`` of a call refused at admission."""
    return (exc.error_kind, exc.retryable, str(exc), None, None)


class CallRunner:
    """Stepping, ending and terminal frames of resident contexts (see the module doc).

    Given, shared with the other parts: the contexts table and the ended attempts
    (``contexts``, ``finished_attempts``: :meth:`_finish` writes both), the
    ``counters``, the ``registry`` (code, namespaces released with the terminal
    frame), the ``outbox``, the ``bridge`` (code fetches), the ``alarm`` and the
    black box. Owned: the resident greenlet ``pool`` and the record of the switch
    in progress (``running`` and its stamps, read by the heartbeat thread).
    """

    def __init__(
        self,
        executor_id: str,
        *,
        registry: ModuleRegistry,
        contexts: dict[str, ExecContext],
        finished_attempts: EndedAttempts,
        counters: dict[str, int],
        monotonic: Callable[[], float],
        outbox: Outbox,
        bridge: SdkBridge,
        call_context: contextvars.Context,
        alarm: DeadlineAlarm,
        blackbox: BlackboxWriter | None,
    ) -> None:
        self.executor_id = executor_id
        self.registry = registry
        self._contexts = contexts
        self._finished_attempts = finished_attempts
        self._counters = counters
        self._monotonic = monotonic
        self._outbox = outbox
        self._bridge = bridge
        # Every call runs in a copy of this Context (see step_context).
        self._call_context = call_context
        self._alarm = alarm
        self._blackbox = blackbox
        self.pool = ResidentGreenletPool(self._run_call, self._fail_escaped)
        #: The context whose greenlet holds the thread (None between switches).
        self.running: ExecContext | None = None
        # Read by the heartbeat thread (runningForMs, runningCallBudgetMs): when the
        # scheduler last switched into ``running`` (monotonic seconds) and the budget
        # that call had left then (ms; 0.0 = unlimited). Stored before ``running`` is,
        # so a reader that races a switch sees at worst a newer stamp.
        self.switched_in_at = 0.0
        self.running_budget_left_ms = 0.0
        #: Set when a call failed for want of file descriptors: the process shell then
        #: recycles the executor (blockx.wire.blackbox.EXIT_DESCRIPTORS_EXHAUSTED).
        self.descriptors_exhausted = False
        #: What a call that gets ``MemoryError`` does to the process (None: it just fails).
        self.memory_exit: Callable[[int], None] | None = None
        #: True while the runtime's scheduler pass runs (it disarms the alarm at its
        #: end); a slice run outside one (shutdown, transport loss) disarms its own.
        self.in_scheduler = False

    def __repr__(self) -> str:
        running = self.running
        return (
            f"CallRunner({self.executor_id!r}, running="
            f"{running.call_id if running is not None else None!r}, pool={self.pool!r}"
            f"{', descriptors exhausted' if self.descriptors_exhausted else ''})"
        )

    # --- stepping -----------------------------------------------------------------------

    def step_context(self, ctx: ExecContext) -> None:
        """The three branches: terminate, resume, or first switch."""
        now = self._monotonic()
        ctx.queue_wait_s += now - ctx.enqueued_at
        if ctx.cancel_reason is not None:
            self.terminate_context(ctx, ctx.cancel_reason)
            return
        value = ctx.resume_payload
        if value is not None:
            ctx.resume_payload = None
            glet = ctx.greenlet
            assert glet is not None
        else:
            glet = self.pool.take()
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
        self.switched_in_at = now
        alarm = self._alarm
        budget = ctx.budget_ms
        budget_left = 0.0
        if budget or ctx.deadline_at is not None:
            # When this slice would overrun: what the finished slices, sleeps and waits
            # left of the budget — less the ResumeCall's charge, counted on the far side
            # of the switch — or the deadline, whichever comes first.
            deadline = ctx.deadline_at
            if budget:
                left = budget - (ctx.cpu_s + ctx.sleep_s) * 1000.0 - ctx.wait_ms
                if type(value) is ResumePayload:
                    left -= value.charged_ms()
                budget_left = left if left > 0.5 else 0.5  # 0.0 would say "unlimited"
                due = now + left / 1000.0
                if deadline is not None and deadline < due:
                    due = deadline
            else:
                due = deadline  # type: ignore[assignment]
            ctx.expires_at = due
            # DeadlineAlarm.arm's test, inline: mostly the armed expiry already comes first.
            if alarm.ready and (due < alarm.due or alarm.due <= now):
                alarm.arm(due, now)
        self.running_budget_left_ms = budget_left
        self.running = ctx
        box = self._blackbox
        if box is not None:
            # The black box names this call while it holds the thread: if the process
            # dies now, this is the call to suspect (blockx.wire.blackbox).
            record = ctx.blackbox_record
            if record is None:
                record = ctx.blackbox_record = box.record_of(ctx.call_id, ctx.attempt_seq)
            box.enter(record)
        try:
            result = glet.throw(value) if throw else glet.switch(value)
        except BaseException as exc:  # the greenlet's run raised: a bug, not the user's
            result = exc
        finally:
            if box is not None:
                box.leave()
            running.ctx = None
            self.running = None
            if ctx.slice_started:
                ended = self._monotonic()
                ctx.cpu_s += ended - ctx.slice_started
                ctx.slice_started = 0.0
                ctx.suspended_at = ended  # a wait's cut-off is counted from here
            if not self.in_scheduler and alarm.due != math.inf:
                alarm.disarm()
        if result is SUSPENDED:
            return
        if result is CALL_FINISHED:
            if ctx.greenlet is glet:
                ctx.greenlet = None
            self.pool.release(glet)
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
        self.pool.discard(glet)

    def terminate_context(
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
        delivered = ctx.resume_payload
        if type(delivered) is ResumePayload:
            # The worker already spent this wait on the call; switching the answer in
            # would have charged it, and ending the call first must not lose it.
            ctx.wait_ms += delivered.charged_ms()
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

    # --- the call, on its pool greenlet -------------------------------------------------

    def _run_call(self, ctx: ExecContext) -> None:
        """Load and run the user function; send exactly one terminal frame."""
        try:
            # Safe points, tested inline: check_safe_point (and its judge) only once the
            # call is cancelled or its slice's expiry passed; then it raises.
            if ctx.cancel_reason is not None or ctx.expires_at <= ctx.clock():
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
            if ctx.cancel_reason is not None or ctx.expires_at <= ctx.clock():
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
        except BaseException as error:  # own name: compiled, a name has one type
            ctx.state = ExecState.DONE
            self._note_resource_failure(error)
            self._finish_failed(ctx, describe_failure(error, self.registry.refresh_linecache))
            return
        self._finish_completed(ctx, output)

    def _note_resource_failure(self, error: BaseException) -> None:
        """A call failed for want of memory or descriptors. Memory (with a limit set):
        the process ends now, the call still named in the black box. Descriptors: the
        call fails as usual, then the process shell recycles the executor."""
        end = self.memory_exit
        if end is not None and is_memory_exhaustion(error):
            end(0)
        elif is_descriptor_exhaustion(error):
            if not self.descriptors_exhausted:
                _log.error("a call failed for want of file descriptors: recycling the executor")
            self.descriptors_exhausted = True

    def _fail_escaped(self, ctx: ExecContext, exc: BaseException) -> None:
        """``exc`` escaped :meth:`_run_call` (a signal in its handlers): still one frame."""
        if not ctx.finished:
            ctx.state = ExecState.DONE  # no second SIGALRM into the failure report
            self._note_resource_failure(exc)
            self._finish_failed(ctx, describe_failure(exc, self.registry.refresh_linecache))

    # --- terminal frames ----------------------------------------------------------------

    def _finish_completed(self, ctx: ExecContext, output: Any) -> None:
        capture = ctx.debug_capture
        debug_output = capture.getvalue() if capture is not None else None
        now = ctx.clock()
        if ctx.slice_started:
            # The call's CPU ends here: _run_slice then needs no clock read of its own.
            ctx.cpu_s += now - ctx.slice_started
            ctx.slice_started = 0.0
        queue_wait_s = ctx.queue_wait_s
        envelope = call_completed_envelope(
            ctx,
            self.executor_id,
            output,
            budget_used_ms=round_half_even(ctx.budget_used_ms()),
            effective_us=max(round_half_even((now - ctx.admitted_at - queue_wait_s) * 1e6), 0),
            queue_wait_us=round_half_even(queue_wait_s * 1e6),
            debug_output=debug_output,
        )
        span = ctx.execute_span
        if span is not None:  # a traced attempt: the one check an untraced call pays
            envelope = traced_envelope(envelope, span, self._span_attributes(ctx, "succeeded"))
        try:
            frame = encode_frame_with_value(
                envelope, envelope[F_PAYLOAD], FP_OUTPUT, 1 if debug_output is None else 0
            )
        except EncodeError as exc:  # not serializable, or too large for one frame
            self._finish_failed(ctx, output_failure(exc))
            return
        except Exception as other:  # e.g. a dataclass whose asdict() raises (own name: see
            # setup.py -- compiled, one name has one exception type per function)
            self._finish_failed(
                ctx,
                (
                    ERR_OUTPUT_NOT_SERIALIZABLE,
                    False,
                    f"call output is not JSON-serializable: {type(other).__name__}: {other}",
                    None,
                    None,
                ),
            )
            return
        self._finish(ctx, frame, completed=True)

    def _finish_failed(self, ctx: ExecContext, failure: Failure) -> None:
        capture = ctx.debug_capture
        envelope = call_failed_envelope(
            ctx.call_id,
            ctx.task_id,
            ctx.attempt_seq,
            self.executor_id,
            failure,
            budget_used_ms=round_half_even(ctx.budget_used_ms()),
            debug_output=capture.getvalue() if capture is not None else None,
            local_read_hits=ctx.local_hits_wire(),
        )
        span = ctx.execute_span
        if span is not None:
            attributes = self._span_attributes(ctx, "failed")
            attributes["blockx.error_kind"] = failure[0]
            envelope = traced_envelope(envelope, span, attributes)
        self._finish(ctx, envelope, completed=False)

    def _span_attributes(self, ctx: ExecContext, outcome: str) -> dict[str, Any]:
        """The ``execute`` span's attributes (executor/tracing.py)."""
        return {
            "blockx.call_id": ctx.call_id,
            "blockx.function": ctx.function_id,
            "blockx.attempt": ctx.attempt_seq,
            "blockx.executor": self.executor_id,
            "blockx.outcome": outcome,
        }

    def _finish(
        self, ctx: ExecContext, envelope: dict[str, Any] | bytes, *, completed: bool
    ) -> None:
        """Make ``ctx`` DONE, drop it from the table and send its one terminal frame
        (``envelope``: the envelope, or the frame already encoded)."""
        if ctx.finished:
            return
        ctx.state = ExecState.DONE  # first: SIGALRM leaves a DONE call alone
        ctx.finished = True
        ctx.queued = False
        call_id = ctx.call_id
        contexts = self._contexts
        if contexts.get(call_id) is ctx:
            del contexts[call_id]
        # Remember the ended attempt: a late re-delivery of it is a duplicate.
        self._finished_attempts.note(call_id, ctx.attempt_seq)
        self.registry.release_task(ctx.task_id)
        counters = self._counters
        if ctx.suppress_terminal_emit or self._outbox.transport_lost:
            counters["terminal_suppressed"] += 1
            return
        counters["calls_completed" if completed else "calls_failed"] += 1
        try:
            if isinstance(envelope, bytes):
                self._outbox.send_encoded(envelope)
            else:
                self._outbox.send_frame(envelope)
        except ConnectionError:
            self._outbox.note_transport_lost()
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
                self._outbox.send_frame(failed)
            except (ConnectionError, EncodeError):
                _log.error("could not send CallFailed", extra=ctx.log_fields())
        except Exception:  # a transport bug: nothing more can be done for this call
            _log.exception("could not send the terminal frame", extra=ctx.log_fields())

    def send_failed(self, call_id: str, task_id: str, attempt_seq: int, failure: Failure) -> None:
        """A CallFailed for a call that never became resident (refused at admission)."""
        envelope = call_failed_envelope(call_id, task_id, attempt_seq, self.executor_id, failure)
        try:
            self._outbox.send_frame(envelope)
        except ConnectionError:
            self._outbox.note_transport_lost()
        except EncodeError as exc:
            _log.error("could not send CallFailed: %s", exc, extra={"callId": call_id})

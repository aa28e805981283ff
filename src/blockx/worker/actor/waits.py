"""Waits and resumes: IO requests, sub-calls, and the ``ResumeCall`` that ends each wait.

Theory of operation
-------------------
(seed: ``orchestrator_subcall.go`` and ``HandleIO`` in ``orchestrator_dispatch.go``.)

A call that suspends sends ``CallWaiting``; the adapter answers
``function_code`` waits itself and posts the rest as :class:`CallSuspended`.
The actor then

1. tells the core: ``handle_call_waiting`` (RUNNING -> WAITING). A wait whose
   attempt is not the call's live one (the call was retried, cancelled, its
   task ended) is dropped here: nobody is waiting for its answer;
2. serves it by ``waitKind``:

   * ``io`` — the task's :class:`~blockx.worker.io.IOHandler`, found by the
     ``taskId`` the frame echoes. An :class:`~blockx.worker.io.IOResult`
     returned at once is sent at once; a future gets one done callback (a
     task scope's :class:`~blockx.worker.io.read_answer.ReadAnswer` calls it
     the moment its flight answers: ``deliver_to``, no loop turn between); a
     coroutine runs as one task (IO is naturally concurrent; per-call actor
     work stays task-free). When the answer comes, the ``ResumeCall`` is queued
     straight from the callback — it does not touch the core — and only a
     failure to queue it becomes an event (:class:`ResumeNotQueued`). While
     the call waits, the future sits in its context's ``wait_handle``: if the
     attempt leaves the wait unanswered (it failed — the executor cut the wait
     off at the call's budget —, was cancelled, its executor was lost) the core
     hands it back in a ``ReleaseWait`` and the future is cancelled, which
     stops the backend request nobody waits for (IOHandler's contract);
   * ``subcall`` — the child's digest from the task's pinned code view, its
     arguments encoded canonically, and ``handle_subcall_request``: the core
     checks depth, cycles and the requesting executor, and answers with a
     ``BindCall`` next to the parent (or a refusal / cache hit as
     ``ResumeParentCall``). The child's end comes back as ``ResumeParentCall``:
     ``ResumeCall(subcall)`` with the child's output, or its error as
     ``{"kind", "message", "retryable"}``, and ``budgetUsedMs``.

3. A ``ResumeCall`` counts as delivered once the adapter flushed it
   (:class:`ControlDelivered` -> ``handle_call_resumed``, WAITING -> RUNNING).
   One that cannot be queued fails the waiting attempt as
   ``resume_send_failed`` (retryable) with its attempt number; one queued
   when the connection ends fails it as ``transport_lost`` (retryable), as the
   lost executor's other calls do.

The attempt number rides along as the control frame's ``token``.

**Who owns what.** :class:`Waits` is a part of the
:class:`~blockx.worker.actor.orchestrator.Orchestrator`, built by it with what it
needs: the core, the adapter (``ResumeCall`` / ``CancelCall`` sends), the live
tasks table (a task's IO handler and code view), the counters, and three of the
orchestrator's bound methods -- ``run`` (execute the core's commands), ``post``
(queue an event) and ``fail_attempt``. It owns ``released_waits``. The
orchestrator calls its ``apply_*`` methods for the wait and delivery events and
its ``execute_*`` methods for ``ReleaseWait`` / ``ResumeParentCall``;
:class:`~blockx.worker.actor.attempts.AttemptEnds` hands it a read's runs of
``CallWaiting`` frames (:meth:`Waits.apply_waits`). Everything runs on the actor
except :meth:`Waits._io_answered` (an IO future's done callback), which touches
only the adapter's send queue and ``released_waits``, never the core.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial as _partial
from typing import TYPE_CHECKING, Any, Final, cast

import orjson

from blockx.wire import EncodeError, NotSerializableError, RemoteError, keys
from blockx.worker.actor.events import (
    CallSuspended,
    ControlDelivered,
    ControlsDelivered,
    ControlUndelivered,
    ResumeNotQueued,
)
from blockx.worker.core import (
    CallError,
    CallState,
    ReleaseWait,
    ResumedCall,
    ResumeParentCall,
    SubcallRequest,
    WaitingCall,
)
from blockx.worker.errors import SendError
from blockx.worker.io import IOResult
from blockx.worker.io.read_answer import ReadAnswer as _ReadAnswer
from blockx.worker.json_values import encode_args
from blockx.worker.link.callbacks import CallFrame

if TYPE_CHECKING:
    from blockx.observability.tracing import CallTracer
    from blockx.worker.actor.events import ActorEvent
    from blockx.worker.actor.runs import TaskRuns
    from blockx.worker.actor.stats import OrchestratorStats
    from blockx.worker.actor.task_run import TaskRun
    from blockx.worker.core import DispatchCallContext, DispatchCommand, DispatcherCore
    from blockx.worker.link.adapter import ExecutorAdapter

__all__ = ["Waits"]

_log = logging.getLogger("blockx.worker.orchestrator")

_WAITING: Final = CallState.WAITING
_MT_RESUME_CALL: Final = keys.MT_RESUME_CALL
_MT_CALL_WAITING: Final = keys.MT_CALL_WAITING
_FP_ATTEMPT_SEQ: Final = keys.FP_ATTEMPT_SEQ
_FP_TASK_ID: Final = keys.FP_TASK_ID
_FP_WAIT_KIND: Final = keys.FP_WAIT_KIND
_FP_RESUME_KIND: Final = keys.FP_RESUME_KIND
_FP_IMMUTABLE: Final = keys.FP_IMMUTABLE
_FP_RESULT: Final = keys.FP_RESULT
_FP_ERROR: Final = keys.FP_ERROR
_FP_BUDGET_USED_MS: Final = keys.FP_BUDGET_USED_MS
_WAIT_IO: Final = keys.WAIT_IO
_WAIT_SUBCALL: Final = keys.WAIT_SUBCALL
_Fragment: Final = orjson.Fragment
_isfuture: Final = asyncio.isfuture
_Future: Final = asyncio.Future
#: The message of the cancel of an IO answer nobody waits for any more (ReleaseWait),
#: for the handler's eyes (the worker itself goes by ``released_waits``).
_RELEASED: Final = "blockx: the call no longer waits for this IO answer"
_monotonic: Final = time.monotonic


def _error_wire(kind: str, message: str, retryable: bool) -> dict[str, Any]:
    return {
        keys.FP_ERROR_KIND_FIELD: kind,
        keys.FP_ERROR_MESSAGE_FIELD: message,
        keys.FP_ERROR_RETRYABLE_FIELD: retryable,
    }


class Waits:
    """Waits and resumes (see the module docstring); a part of the
    :class:`~blockx.worker.actor.orchestrator.Orchestrator`, which builds it.

    ``run`` executes commands the core answers with, ``post`` queues an event for
    the actor (from an IO answer's callback), ``fail_attempt(call_id, attempt_seq,
    error, budget_used_ms)`` fails an attempt at the actor run's time: the
    orchestrator's bound methods.
    """

    def __init__(
        self,
        core: DispatcherCore,
        adapter: ExecutorAdapter,
        runs: TaskRuns,
        stats: OrchestratorStats,
        *,
        run: Callable[[list[DispatchCommand]], None],
        post: Callable[[ActorEvent], None],
        fail_attempt: Callable[[str, int, CallError, int], None],
    ) -> None:
        self._core = core
        self._adapter = adapter
        self._runs = runs
        self._stats = stats
        self._run = run
        self._post = post
        self._fail_attempt = fail_attempt
        #: (call id, handler future) of the IO waits released (ReleaseWait) whose
        #: future's done callback has not run yet: it answers nobody.
        self.released_waits: set[tuple[str, Any]] = set()
        #: The span recorder (None: tracing off; set by ``Orchestrator.set_tracer``).
        self.tracer: CallTracer | None = None

    def __repr__(self) -> str:
        return f"Waits(released={len(self.released_waits)}, {self._stats!r})"

    # --- CallWaiting --------------------------------------------------------------------------

    def apply_call_suspended(self, event: CallSuspended) -> None:
        self.apply_waits(
            event.executor_id,
            [(_MT_CALL_WAITING, event.call_id, event.payload, event.request_id, event.sidecar)],
        )

    def apply_waits(self, executor_id: str, frames: list[CallFrame]) -> None:
        """A run of ``CallWaiting`` frames of one executor: the core moves them all to
        WAITING in one call, then each live wait is served in order.

        The hot path of IO-bound work (once per wait): :meth:`_start_io` serves each
        IO wait, and an IO answer comes back through a ``partial`` of
        :meth:`_io_answered` (no per-wait Python object to build). A future
        answer is also put in the call's ``wait_handle`` (one attribute store), so
        that an attempt leaving the wait unanswered can cancel it
        (:meth:`execute_release_wait`).
        """
        core = self._core
        waits: list[WaitingCall] = []
        for frame in frames:
            attempt = frame[2].get(_FP_ATTEMPT_SEQ)
            waits.append((frame[1], attempt if type(attempt) is int else -1))
        core.handle_calls_waiting(waits)
        call_context = core.call_contexts.get
        tasks = self._runs.by_id
        stats = self._stats
        for (call_id, attempt), frame in zip(waits, frames, strict=True):
            ctx = call_context(call_id)
            if (
                ctx is None
                or ctx.state is not _WAITING
                or ctx.attempt_seq != attempt
                or (executor := ctx.executor) is None
                or executor.executor_id != executor_id
            ):
                stats.stale_waits += 1
                continue
            payload = frame[2]
            run = tasks.get(payload[_FP_TASK_ID])
            if run is None:
                stats.stale_waits += 1
                continue
            request_id = frame[3]
            assert request_id is not None
            if payload.get(_FP_WAIT_KIND) != _WAIT_IO:
                try:
                    self._start_subcall(run, executor_id, call_id, request_id, payload, attempt)
                except Exception:
                    stats.handler_errors += 1
                    _log.exception("dispatch actor: serving the wait of %s failed", call_id)
                continue
            self._start_io(run, executor_id, call_id, request_id, attempt, payload, frame[4], ctx)

    def _start_io(
        self,
        run: TaskRun,
        executor_id: str,
        call_id: str,
        request_id: str,
        attempt: int,
        payload: dict[str, Any],
        sidecar: Any,
        ctx: DispatchCallContext,
    ) -> None:
        """Serve one IO wait: the handler answers now (an :class:`IOResult`) or later (a
        future, whose done callback is a ``partial`` of :meth:`_io_answered`)."""
        stats = self._stats
        io_answered = self._io_answered
        stats.io_waits += 1
        run.io_calls += 1
        started = _monotonic()
        try:
            answer: Any = run.io_handler.handle_io(run.user_task_id, call_id, payload, sidecar)
        except Exception as exc:
            _log.exception("IO handler %r raised for %s", run.io_handler, call_id)
            answer = _handler_failed(exc)
        tracer = self.tracer
        if tracer is not None:
            tracer.io_started(
                call_id, request_id, payload, answer, immediate=type(answer) is IOResult
            )
        try:
            if type(answer) is IOResult:
                io_answered(executor_id, call_id, request_id, attempt, started, answer)
                return
            # A C future (or TaskIOScope's subclass of it): no Python-level check.
            if not isinstance(answer, _Future) and not _isfuture(answer):
                try:
                    answer = asyncio.ensure_future(answer)
                except TypeError:
                    io_answered(
                        executor_id,
                        call_id,
                        request_id,
                        attempt,
                        started,
                        _handler_failed(
                            TypeError(
                                f"IO handler returned {type(answer).__name__}, not an "
                                "IOResult or an awaitable of one"
                            )
                        ),
                    )
                    return
            answered = _partial(io_answered, executor_id, call_id, request_id, attempt, started)
            if type(answer) is _ReadAnswer:
                # A task scope's read: no loop turn between. ReadAnswer.deliver_to written
                # out (its flight set ``direct``): an interpreted method call fewer a read.
                if answer.direct is None and not answer.done():
                    answer.direct = answered
                else:
                    answer.add_done_callback(answered)
            else:
                answer.add_done_callback(answered)
            # Only while the call waits: cleared by the core when the answer is delivered.
            ctx.wait_handle = answer
        except Exception:
            stats.handler_errors += 1
            _log.exception("dispatch actor: serving the wait of %s failed", call_id)

    # --- io -----------------------------------------------------------------------------------

    def _io_answered(
        self,
        executor_id: str,
        call_id: str,
        request_id: str,
        attempt: int,
        started: float,
        outcome: asyncio.Future[Any] | IOResult,
    ) -> None:
        """Queue the ResumeCall answering an IO wait: ``outcome`` is the handler's
        :class:`IOResult`, or its future once done (this is then the future's done
        callback, bound through ``functools.partial``). No core access: callable anywhere.
        """
        if type(outcome) is IOResult:
            answer = outcome
        else:
            released = self.released_waits
            if released:
                key = (call_id, outcome)
                if key in released:  # released (execute_release_wait): no wait to answer
                    released.discard(key)
                    return
            try:
                answer = outcome.result()  # one call on the common path
            except asyncio.CancelledError:
                # Cancelled by the handler, or released for another wait that shared this
                # future (a handler must not share one, IOHandler's contract): this wait
                # still waits, so it gets an error, never silence.
                answer = _handler_failed(asyncio.CancelledError("the IO request was cancelled"))
            except BaseException as exc:  # whatever the future holds (as future.exception())
                _log.error("IO request of %s failed: %r", call_id, exc)
                answer = _handler_failed(exc)
            else:
                if type(answer) is not IOResult:
                    answer = _handler_failed(
                        TypeError(f"IO handler answered {type(answer).__name__}, not an IOResult")
                    )
        budget = answer.budget_used_ms
        if budget is None:
            budget = int((_monotonic() - started) * 1000)
        error = answer.error
        tracer = self.tracer
        if tracer is not None:
            tracer.io_answered(call_id, request_id, None if error is None else error.kind)
        if error is None:
            payload: dict[str, Any] = {
                _FP_RESUME_KIND: _WAIT_IO,
                _FP_RESULT: answer.result,
                _FP_BUDGET_USED_MS: budget,
            }
            if answer.immutable:  # the executor may keep it (docs/protocol.md)
                payload[_FP_IMMUTABLE] = True
        else:
            payload = {
                _FP_RESUME_KIND: _WAIT_IO,
                _FP_ERROR: error.to_wire(),
                _FP_BUDGET_USED_MS: budget,
            }
        try:
            self._adapter.send_resume_call(
                executor_id, call_id, request_id, payload, sidecar=answer.sidecar, token=attempt
            )
        except (SendError, EncodeError) as not_sent:  # own name: compiled, a name has one type
            self._post(ResumeNotQueued(call_id, attempt, not_sent, executor_id))

    def execute_release_wait(self, cmd: ReleaseWait) -> None:
        """The attempt left its IO wait unanswered: cancel the future ``handle_io`` gave.

        IOHandler's contract: the worker cancels that future when nobody waits for it
        any more (a coroutine's task: the coroutine is cancelled); TaskIOScope then stops
        a read's backend call once its last waiter is gone. The released
        future's done callback (:meth:`_io_answered`) finds the wait in
        ``released_waits`` and answers nobody, however the future ended (a handler
        may swallow the cancel and answer). Another wait that was given the same
        future (a handler must not share one) is not silenced: it gets an error.
        """
        handle = cast("asyncio.Future[Any]", cmd.handle)
        try:
            released = handle.cancel(_RELEASED)
        except Exception:
            self._stats.handler_errors += 1
            _log.exception("cancelling the IO request of %s failed", cmd.call_id)
            return
        if released:
            # The future's done callbacks run later (call_soon): this wait's finds its key
            # and answers nobody; another wait sharing the future gets an error.
            self.released_waits.add((cmd.call_id, handle))
            self._stats.io_waits_released += 1

    # --- subcall ------------------------------------------------------------------------------

    def _start_subcall(
        self,
        run: TaskRun,
        executor_id: str,
        call_id: str,
        request_id: str,
        payload: dict[str, Any],
        attempt: int,
    ) -> None:
        self._stats.subcall_waits += 1
        run.subcalls += 1
        function_id = payload.get(keys.FP_FUNCTION_ID)
        tracer = self.tracer
        if tracer is not None:
            tracer.subcall_started(call_id, request_id, function_id)
        granted = payload.get(keys.FP_GRANTED_BUDGET_MS, 0)
        if type(function_id) is not str or not function_id:
            self._refuse_subcall(
                executor_id,
                call_id,
                request_id,
                attempt,
                keys.ERR_INTERNAL_ERROR,
                "sub-call request without a functionId",
            )
            return
        try:
            args_json = encode_args(payload.get(keys.FP_ARGS))
        except NotSerializableError as exc:
            self._refuse_subcall(
                executor_id, call_id, request_id, attempt, exc.error_kind, str(exc)
            )
            return
        code = run.code.get(function_id)
        request = SubcallRequest(
            parent_call_id=call_id,
            parent_attempt_seq=attempt,
            executor_id=executor_id,
            request_id=request_id,
            function_id=function_id,
            function_code_digest=code.digest,
            args_json=args_json,
            granted_budget_ms=granted if type(granted) is int and granted > 0 else 0,
        )
        self._run(self._core.handle_subcall_request(request))

    def _refuse_subcall(
        self,
        executor_id: str,
        call_id: str,
        request_id: str,
        attempt: int,
        kind: str,
        message: str,
    ) -> None:
        """Answer a malformed sub-call request with an error, without a child."""
        payload = {
            _FP_RESUME_KIND: _WAIT_SUBCALL,
            _FP_ERROR: _error_wire(kind, message, False),
            _FP_BUDGET_USED_MS: 0,
        }
        self._send_resume(executor_id, call_id, request_id, payload, attempt)

    def execute_resume_parent(self, cmd: ResumeParentCall) -> None:
        parent = self._core.call_context(cmd.parent_call_id)
        attempt = parent.attempt_seq if parent is not None else -1
        error = cmd.error
        if error is None:
            output = cmd.output_json
            payload: dict[str, Any] = {
                _FP_RESUME_KIND: _WAIT_SUBCALL,
                _FP_RESULT: _Fragment(output) if output is not None else None,
                _FP_BUDGET_USED_MS: cmd.budget_used_ms,
            }
        else:
            payload = {
                _FP_RESUME_KIND: _WAIT_SUBCALL,
                _FP_ERROR: _error_wire(error.kind, error.message, error.retryable),
                _FP_BUDGET_USED_MS: cmd.budget_used_ms,
            }
        self._send_resume(cmd.executor_id, cmd.parent_call_id, cmd.request_id, payload, attempt)

    def _send_resume(
        self,
        executor_id: str,
        call_id: str,
        request_id: str,
        payload: dict[str, Any],
        attempt: int,
    ) -> None:
        """Queue a ResumeCall from the actor; a refusal fails the waiting attempt at once."""
        tracer = self.tracer
        if tracer is not None:
            error = payload.get(_FP_ERROR)
            tracer.subcall_ended(
                call_id, request_id, error.get("kind") if type(error) is dict else None
            )
        try:
            self._adapter.send_resume_call(executor_id, call_id, request_id, payload, token=attempt)
        except (SendError, EncodeError) as exc:
            self._resume_failed(call_id, attempt, exc, executor_id)

    # --- delivery -----------------------------------------------------------------------------

    def apply_control_delivered(self, note: ControlDelivered) -> None:
        if note.message_type == _MT_RESUME_CALL:
            self._run(self._core.handle_call_resumed(note.call_id, note.token))

    def apply_controls_delivered(self, event: ControlsDelivered) -> None:
        resumes: list[ResumedCall] = [
            (note.call_id, note.token)
            for note in event.notes
            if note.message_type == _MT_RESUME_CALL
        ]
        if resumes:
            self._run(self._core.handle_calls_resumed(resumes))

    def apply_control_undelivered(self, event: ControlUndelivered) -> None:
        """A queued ResumeCall whose connection ended before it was flushed.

        The executor is gone with the suspended attempt: the attempt fails as
        every other call of that executor does, ``transport_lost`` (retryable;
        the ``ExecutorLost`` that follows finds it failed already). Not a send
        failure of the worker's, and no CancelCall: there is nobody to cancel.
        """
        note = event.note
        if note.message_type != _MT_RESUME_CALL:
            return
        attempt = note.token
        error = CallError(
            kind=keys.ERR_TRANSPORT_LOST,
            message=(
                f"the connection to executor {note.executor_id} ended before the ResumeCall "
                f"for {note.call_id} (attempt {attempt}) was sent: {event.reason}"
            ),
            retryable=True,
        )
        self._fail_attempt(note.call_id, attempt, error, 0)

    def apply_resume_not_queued(self, event: ResumeNotQueued) -> None:
        ctx = self._core.call_context(event.call_id)
        if ctx is None or ctx.attempt_seq != event.attempt_seq or ctx.state is not _WAITING:
            # The attempt ended while its IO was in flight (the executor cut the wait
            # off at the call's budget, a cancel, a retry): nobody waits for this answer.
            self._stats.stale_waits += 1
            return
        self._resume_failed(event.call_id, event.attempt_seq, event.error, event.executor_id)

    def _resume_failed(
        self, call_id: str, attempt: int, exc: BaseException, executor_id: str | None = None
    ) -> None:
        self._stats.resume_send_failures += 1
        if isinstance(exc, EncodeError):
            kind, retryable = exc.error_kind, False
        else:
            kind, retryable = keys.ERR_RESUME_SEND_FAILED, True
        error = CallError(
            kind=kind,
            message=f"ResumeCall for {call_id} (attempt {attempt}) could not be sent: {exc}",
            retryable=retryable,
        )
        self._fail_attempt(call_id, attempt, error, 0)
        if executor_id is not None:
            # The executor still holds that attempt suspended (no answer will come): cancel it
            # there, best effort, or it keeps a context until its budget runs out (forever
            # without one). A later attempt replaces it anyway; a gone connection ended it.
            try:
                self._adapter.send_cancel_call(
                    executor_id, call_id, attempt_seq=attempt, reason=keys.ERR_RESUME_SEND_FAILED
                )
            except SendError:
                pass


def _handler_failed(exc: BaseException) -> IOResult:
    return IOResult(
        error=RemoteError(
            kind=keys.ERR_IO_ERROR, message=f"IO handler failed: {exc!r}", retryable=False
        )
    )

"""DispatcherCore: the worker's pure, single-writer call scheduler (seed ``internal/worker/core``).

Theory of operation
===================

What it owns
------------
Every call the worker runs, from registration to its task's convergence: one
:class:`~.state.DispatchCallContext` per call (root or sub-call), one
:class:`~.state.TaskDispatchState` per task, the executor view
(:class:`~.selection.ExecutorTable`) and the fairness rings
(:class:`~.fairness.ReadyScheduler`). It is an in-memory state machine with no
clock, no randomness of its own (retry jitter comes from the injected
``rng``), no IO and no asyncio: inputs are method calls, outputs are lists of
:mod:`commands <.commands>`. It never calls back into its caller.

Who calls it
------------
Exactly one writer: the worker runtime's dispatch actor (the seed's
``Orchestrator.RunDispatchLoop``). Other tasks and threads post events to the
actor; only the actor calls the core. A re-entrancy guard raises
:class:`~.errors.ReentrantCallError` if an entry point is entered while another
runs. The ``prepare_*`` methods are the exception: they read only their
arguments and the immutable config, have no side effects, and may run anywhere.

How the runtime drives it
-------------------------
::

    # registration (task activation)
    prepared = core.prepare_call_phase_with_digests(task_id, calls, digests)   # off-actor
    run(core.commit_call_phase(prepared))                                      # on the actor
    #   a long one-shot list in chunks: the first with total_count=len(list), then per
    #   chunk prepare_call_batch_with_digests + commit_call_chunk, in order
    #   streams: commit_call_stream, then per batch prepare_call_batch_with_digests +
    #   commit_call_batch (one credit each; BatchSettled returns one), finish_call_stream

    # the actor loop: drain every queued event, then the epilogue
    for event in drained_events:
        run(core.handle_xxx(...))            # see the table below
    run(core.flush_dirty_tasks())            # convergence (fixed point)
    run(core.dispatch_ready(now_ms))         # release calls while executors have room
    run(core.flush_dirty_tasks())            # cache hits may have ended calls

``run(commands)`` executes the commands in order (see :mod:`.commands`). A
``BindCall`` is executed synchronously (``Adapter.Bind`` / ``BindSubcall``)
and answered *immediately*, before any other event, with
``handle_executor_bound`` (which returns the ``DispatchCallCmd``) or
``handle_bind_failed``; their commands are run the same way. Repeat the
epilogue while ``has_dirty_tasks`` is true.

Entry points and the events they stand for:

================================================  ==========================================
``handle_executor_bound(call, executor, seq)``    ``Bind`` succeeded -> ``DispatchCallCmd``
``handle_bind_failed(call, executor, seq, now)``  ``Bind`` failed: attempt given back
``handle_call_waiting(call, seq)``                ``CallWaiting`` io/subcall: -> WAITING
``handle_call_resumed(call, seq)``                ``ResumeCall`` flushed: -> RUNNING
``handle_call_completed(call, seq, output)``      ``CallCompleted``
``handle_attempt_failure(call, seq, err, now)``   ``CallFailed``, ``resume_send_failed`` ...
``handle_retry_ready(call)``                      an ``ArmCallRetry`` timer fired
``handle_subcall_request(request)``               ``CallWaiting`` subcall (digest resolved)
``handle_executor_snapshot_updated(snapshots)``   the 500 ms snapshot sync
``handle_executor_lost(executor, now, report)``   era ended: blame (:mod:`.blame`)
``handle_task_cancelled(task, reason)``           task deadline, user cancel
``try_dispatch_next(now)``, ``dispatch_ready``    one / all release decisions
``flush_dirty_tasks()``                           the convergence epilogue
================================================  ==========================================

Batch forms, for a runtime that receives these events a read (or a flush, or a
run of binds) at a time: ``handle_executors_bound(binds)``,
``handle_calls_waiting(waits)``, ``handle_calls_resumed(resumes)`` and
``handle_calls_completed(completions)`` apply each event in order exactly as
the single-event entry point would and return the commands concatenated (both
run the same functions, :mod:`.attempts`); they only save the per-call entry
overhead. A run of ``BindCall`` commands may be executed together: every ``Bind``
first, then the accepted ones confirmed in one ``handle_executors_bound`` --
still before any other event.

The runtime's side of the contract:

* Answer a ``BindCall`` before any other event (above).
* Call ``handle_call_resumed`` once the ``ResumeCall`` frame is flushed; if it
  cannot be sent, report ``handle_attempt_failure`` for the parent with kind
  ``resume_send_failed`` (retryable). ``waitKind=function_code`` does not
  concern the core: do not call ``handle_call_waiting`` for it.
* A wait served by something that can be stopped (an IO request): put it in
  the call's ``wait_handle`` right after ``handle_call_waiting`` (the one slot of
  the core's state the runtime writes). The core clears it when the wait is
  answered (``handle_call_resumed``) and returns it in a ``ReleaseWait`` when
  the attempt leaves the wait any other way (it fails, its budget ran out while
  it waited, it is cancelled, its executor is lost): stop the request then.
* Refresh the snapshot (``handle_executor_snapshot_updated``) before
  ``handle_executor_lost``, so that retries do not pick the dead executor.
* After ``ConvergeTaskCalls`` the core has forgotten the task: drop any later
  producer event for it (``commit_call_batch`` / ``finish_call_stream`` would
  raise ``UnknownTaskError``), and prefer a fresh task id for a new phase.
* Encode ``args_json`` canonically (e.g. sorted keys): equal calls share the
  call cache and singleflight only when their bytes are equal.

A call's life
-------------
Registration queues root calls READY in call order. ``try_dispatch_next``
(:mod:`.release`) picks a task (task round-robin, or max-min fair across
instances, see :mod:`.fairness`), and looks at the head of its ready queue:

1. a **call-cache** hit ends it at once (``CompleteCallFromCache``);
2. if another call with the same key is running (the **singleflight**
   leader), it waits for the leader's result -- as do the calls right behind it
   with the same key -- and the next head is tried;
3. otherwise :meth:`~.selection.ExecutorTable.select_executor` (Filter ->
   Score) picks an executor and the call becomes RUNNING there (an attempt is
   charged, the budget set, the call becomes its key's leader): ``BindCall``.

A task with ``task_max_inflight_calls`` roots in flight is skipped; when no
executor is eligible the decision returns ``[]`` and the call stays queued.

Attempts end in ``handle_call_completed`` (DONE, the output recorded, the
cache filled, waiters resolved with the same output) or
``handle_attempt_failure``: retryable + attempts left + task not stopping ->
READY with ``ArmCallRetry`` after ``base * 2^(attempt-1)`` + up to 5% jitter,
reusing the same context and call id; otherwise DONE as FAILED (waiters fail
with the same error; under fast-fail the task stops). A failed ``Bind`` gives
its attempt back and re-arms the call at once. Events that do not match the
call's live attempt (unknown call, DONE, backing off, another ``attempt_seq``
or executor, a bind not yet confirmed) are stale: dropped and counted in
``stats.stale_events``.

Task outcome: ``ConvergeTaskCalls.success`` is False when the task stopped --
a root call's final failure under ``FailurePolicy.FAST_FAIL`` (the default;
``CALL_FAILED``), the output limit (``OUTPUT_BYTES_EXCEEDED``), or
``handle_task_cancelled`` (``CANCELLED``); the first reason wins. Under
``FailurePolicy.CONTINUE`` failed calls are listed (``failed_calls``, with their
final error and attempt count) and the task still succeeds with the outputs of
the calls that did.

Sub-calls (:mod:`.subcalls`) get their own context with one attempt, run next
to their parent, answer it with ``ResumeParentCall`` and are cancelled with
their whole subtree when the parent ends or retries. Executor loss blames only
the guilty (:mod:`.blame`): calls not suspected are dispatched again without
spending an attempt, suspects run again alone on an executor
(:mod:`.isolation`), and only a suspect whose executor dies while it runs
alone spends its attempt; parked sub-calls are re-evaluated.

Convergence happens only in ``flush_dirty_tasks`` (:mod:`.convergence`):
``StopCallProduction`` -> drain -> ``BatchSettled`` -> ``ConvergeTaskCalls``,
exactly once per phase, after which the core forgets the task.

Invariants
----------
* One context per call for its whole life; DONE is the only terminal state and
  ``set_call_terminal`` the only place that counts an end (idempotent).
* Per task: ``terminal_roots == succeeded + failed + cancelled <= total``;
  ``inflight_roots`` = roots RUNNING or WAITING <= ``task_max_inflight_calls``
  (checked at release time).
* Per executor: ``local_inflight == len(calls)`` = calls bound there.
* Sub-calls never count in task totals or outputs; no sub-call outlives its
  parent's attempt.
* ``check_invariants()`` recomputes all of the above (for tests).

Errors
------
Peers cannot make the core raise (stale events are dropped). The caller can:
:class:`~.errors.DispatcherUsageError` subclasses for misuse (state unchanged);
:class:`~.errors.DispatcherInvariantError` for a bug in the core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from .attempts import (
    CompletedCall,
    ResumedCall,
    WaitingCall,
    complete_attempt,
    confirm_bind,
    live_attempt,
    pending_bind,
    resume_attempts,
    suspend_attempts,
)
from .blame import take_back_calls
from .commands import BindCall, DispatchCommand
from .config import CallRetryPolicy, DispatcherConfig
from .convergence import flush_dirty_tasks
from .errors import DispatcherInvariantError, InvalidCallSpecError, ReentrantCallError
from .invariants import check_core_invariants
from .keys import PROCESS_SUBCALL_IDS, SubcallIdSequence
from .lifecycle import (
    CoreState,
    cancel_call,
    fail_attempt,
    live_roots,
    mark_dirty,
    requeue_front,
    stop_task,
)
from .registration import (
    PreparedCallBatch,
    PreparedCallPhase,
    commit_call_batch,
    commit_call_chunk,
    commit_call_phase,
    commit_call_stream,
    finish_call_stream,
    prepare_calls,
)
from .release import dispatch_decisions, dispatch_one, unbind_attempt
from .state import DispatchCallContext, DispatcherStats, ExecutorState, TaskDispatchState
from .subcalls import admit_subcall, rebind_parked
from .types import (
    CallError,
    CallSpec,
    CallState,
    ExecutorLossReport,
    ExecutorSnapshot,
    JitterSource,
    SubcallRequest,
    TaskFailure,
    TaskMode,
)

__all__ = ["DispatcherCore"]

_READY: Final = CallState.READY
_RUNNING: Final = CallState.RUNNING
_WAITING: Final = CallState.WAITING
#: A loss reported without a report: nothing known of the cause or the calls.
_UNKNOWN_LOSS: Final = ExecutorLossReport()


class DispatcherCore:
    """The dispatcher state machine. See the module docstring for how to drive it.

    ``rng`` supplies retry jitter (a seeded ``random.Random``); ``subcall_ids``
    numbers sub-calls and defaults to the process-wide counter, so cores in one
    process never mint the same sub-call id.
    """

    __slots__ = ("_core", "_running")

    def __init__(
        self,
        config: DispatcherConfig | None = None,
        *,
        rng: JitterSource,
        subcall_ids: SubcallIdSequence | None = None,
    ) -> None:
        self._core = CoreState(
            config or DispatcherConfig(), rng, subcall_ids or PROCESS_SUBCALL_IDS
        )
        #: Name of the entry point running now (the re-entrancy guard).
        self._running: str | None = None

    def _enter(self, name: str) -> None:
        if self._running is not None:
            raise ReentrantCallError(name, self._running)
        self._running = name

    # === registration ==================================================================

    def prepare_call_phase_with_digests(
        self,
        task_id: str,
        calls: Sequence[CallSpec],
        digests: Mapping[str, str],
        *,
        instance: str | None = None,
        policy: CallRetryPolicy | None = None,
        total_count: int | None = None,
    ) -> PreparedCallPhase:
        """Validate a one-shot call list and compute its call keys. Pure; any thread.

        ``digests`` maps each function id to its code digest at the task's code
        epoch. ``total_count``: the whole phase's size when ``calls`` is only its
        first chunk (the rest follow with ``commit_call_chunk``); ``None``:
        ``calls`` is the whole phase. Raises ``MissingFunctionDigestError`` /
        ``InvalidCallSpecError``.
        """
        prepared = prepare_calls(task_id, calls, digests)
        if total_count is None:
            total_count = len(prepared)
        elif total_count < len(prepared):
            raise InvalidCallSpecError(
                task_id, -1, f"total_count {total_count} is less than the {len(prepared)} calls"
            )
        return PreparedCallPhase(
            task_id=task_id,
            instance=instance,
            policy=policy,
            calls=prepared,
            total_count=total_count,
        )

    def commit_call_phase(self, prepared: PreparedCallPhase) -> list[DispatchCommand]:
        """Register a prepared one-shot phase; its calls are queued READY.

        Returns ``[]`` (dispatching is ``try_dispatch_next``'s job); the task is
        dirty, so an empty phase converges at the next ``flush_dirty_tasks``.
        Raises ``DuplicateTaskError`` if the task id is live.
        """
        self._enter("commit_call_phase")
        try:
            commit_call_phase(self._core, prepared)
            return []
        finally:
            self._running = None

    def commit_call_chunk(self, prepared: PreparedCallBatch) -> list[DispatchCommand]:
        """Register the next chunk of a one-shot phase committed with a larger
        ``total_count`` (prepared with ``prepare_call_batch_with_digests``); its
        calls are queued READY after the ones before, and the chunk that reaches
        ``total_count`` closes registration (the phase may then converge).

        A chunk for a phase that stopped meanwhile (``StopCallProduction``) is
        dropped. Raises ``PhaseStateError`` for a stream, a phase already whole or
        a chunk larger than what is left, ``UnknownTaskError`` for an unknown
        task; a refused chunk changes nothing.
        """
        self._enter("commit_call_chunk")
        try:
            commit_call_chunk(self._core, prepared)
            return []
        finally:
            self._running = None

    def commit_call_stream(
        self,
        task_id: str,
        *,
        instance: str | None = None,
        policy: CallRetryPolicy | None = None,
    ) -> list[DispatchCommand]:
        """Open a streamed call phase; the producer has ``max_outstanding_batches`` credits."""
        self._enter("commit_call_stream")
        try:
            commit_call_stream(self._core, task_id, instance, policy)
            return []
        finally:
            self._running = None

    def prepare_call_batch_with_digests(
        self, task_id: str, calls: Sequence[CallSpec], digests: Mapping[str, str]
    ) -> PreparedCallBatch:
        """Validate one stream batch (or one-shot chunk) and compute its call keys.
        Pure; any thread."""
        return PreparedCallBatch(task_id=task_id, calls=prepare_calls(task_id, calls, digests))

    def commit_call_batch(self, prepared: PreparedCallBatch) -> list[DispatchCommand]:
        """Register a stream batch (takes one credit).

        A batch committed after the core stopped the stream (``StopCallProduction``)
        is dropped. Raises ``CreditWindowExceededError`` with no credit left,
        ``StreamStateError`` after ``finish_call_stream`` or for a one-shot
        task, ``UnknownTaskError`` for an unknown task.
        """
        self._enter("commit_call_batch")
        try:
            commit_call_batch(self._core, prepared)
            return []
        finally:
            self._running = None

    def finish_call_stream(self, task_id: str) -> list[DispatchCommand]:
        """The producer has committed its last batch (idempotent)."""
        self._enter("finish_call_stream")
        try:
            finish_call_stream(self._core, task_id)
            return []
        finally:
            self._running = None

    # === dispatch ========================================================================

    def try_dispatch_next(self, now_ms: int) -> list[DispatchCommand]:
        """Make one release decision: ``[BindCall]``, ``[CompleteCallFromCache, ...]`` or ``[]``.

        ``[]`` means nothing can be released now (no dispatchable task, or no
        eligible executor).
        """
        self._enter("try_dispatch_next")
        try:
            out: list[DispatchCommand] = []
            dispatch_one(self._core, now_ms, out)
            return out
        finally:
            self._running = None

    def dispatch_ready(
        self, now_ms: int, max_decisions: int | None = None
    ) -> list[DispatchCommand]:
        """Make release decisions until none is possible (or ``max_decisions``)."""
        self._enter("dispatch_ready")
        try:
            out: list[DispatchCommand] = []
            limit = -1 if max_decisions is None else max(max_decisions, 0)
            dispatch_decisions(self._core, now_ms, out, limit)
            return out
        finally:
            self._running = None

    # === binding =========================================================================

    def handle_executor_bound(
        self, call_id: str, executor_id: str, attempt_seq: int
    ) -> list[DispatchCommand]:
        """``Bind`` for a ``BindCall`` succeeded: returns the ``DispatchCallCmd``.

        Pass the ``BindCall``'s fields. Also binds sub-calls parked waiting for
        this call. Stale (call ended or re-bound since, already bound) -> ``[]``.
        """
        self._enter("handle_executor_bound")
        try:
            out: list[DispatchCommand] = []
            confirm_bind(self._core, call_id, executor_id, attempt_seq, out)
            return out
        finally:
            self._running = None

    def handle_executors_bound(self, binds: Iterable[BindCall]) -> list[DispatchCommand]:
        """Several ``BindCall``\\ s succeeded: ``handle_executor_bound`` for each, in order.

        Pass the executed ``BindCall`` commands themselves. The commands are
        those of the single-event calls, concatenated.
        """
        self._enter("handle_executors_bound")
        try:
            core = self._core
            out: list[DispatchCommand] = []
            for bind in binds:
                confirm_bind(core, bind.call_id, bind.executor_id, bind.attempt_seq, out)
            return out
        finally:
            self._running = None

    def handle_bind_failed(
        self, call_id: str, executor_id: str, attempt_seq: int, now_ms: int
    ) -> list[DispatchCommand]:
        """``Bind`` for a ``BindCall`` failed: the attempt is given back (not spent).

        A root call is re-armed at once (``ArmCallRetry`` due ``now_ms``); a
        sub-call is parked again until the next snapshot update. Stale -> ``[]``.
        """
        self._enter("handle_bind_failed")
        try:
            ctx = pending_bind(self._core, call_id, executor_id, attempt_seq)
            if ctx is None:
                return []
            out: list[DispatchCommand] = []
            unbind_attempt(self._core, ctx, now_ms, out)
            return out
        finally:
            self._running = None

    # === attempt events ==================================================================
    # One event or a batch (see .attempts: a batch is its events applied in order).

    def handle_call_waiting(self, call_id: str, attempt_seq: int) -> list[DispatchCommand]:
        """The attempt suspended on IO or a sub-call: RUNNING -> WAITING. Returns ``[]``.

        (``waitKind=function_code`` does not change dispatcher state; do not call.)
        """
        self._enter("handle_call_waiting")
        try:
            suspend_attempts(self._core, ((call_id, attempt_seq),))
            return []
        finally:
            self._running = None

    def handle_calls_waiting(self, waits: Iterable[WaitingCall]) -> list[DispatchCommand]:
        """``handle_call_waiting`` for each ``(call_id, attempt_seq)``, in order. Returns ``[]``."""
        self._enter("handle_calls_waiting")
        try:
            suspend_attempts(self._core, waits)
            return []
        finally:
            self._running = None

    def handle_call_resumed(self, call_id: str, attempt_seq: int) -> list[DispatchCommand]:
        """The ``ResumeCall`` reached the executor: WAITING -> RUNNING. Returns ``[]``."""
        self._enter("handle_call_resumed")
        try:
            resume_attempts(self._core, ((call_id, attempt_seq),))
            return []
        finally:
            self._running = None

    def handle_calls_resumed(self, resumes: Iterable[ResumedCall]) -> list[DispatchCommand]:
        """``handle_call_resumed`` for each ``(call_id, attempt_seq)``, in order. Returns ``[]``."""
        self._enter("handle_calls_resumed")
        try:
            resume_attempts(self._core, resumes)
            return []
        finally:
            self._running = None

    def handle_call_completed(
        self, call_id: str, attempt_seq: int, output_json: bytes, *, budget_used_ms: int = 0
    ) -> list[DispatchCommand]:
        """``CallCompleted``: the call is DONE with ``output_json``.

        Returns ``UnbindCall``, then whatever the end causes: waiters'
        ``CompleteCallFromCache``, ``CancelCallCmd`` for a leftover subtree, a
        sub-call's ``ResumeParentCall``. Stale -> ``[]``.
        """
        self._enter("handle_call_completed")
        try:
            out: list[DispatchCommand] = []
            complete_attempt(self._core, call_id, attempt_seq, output_json, budget_used_ms, out)
            return out
        finally:
            self._running = None

    def handle_calls_completed(self, completions: Iterable[CompletedCall]) -> list[DispatchCommand]:
        """``handle_call_completed`` for each ``(call_id, attempt_seq, output_json,
        budget_used_ms)``, in order; the commands concatenated."""
        self._enter("handle_calls_completed")
        try:
            core = self._core
            out: list[DispatchCommand] = []
            for call_id, attempt_seq, output_json, budget_used_ms in completions:
                complete_attempt(core, call_id, attempt_seq, output_json, budget_used_ms, out)
            return out
        finally:
            self._running = None

    def handle_attempt_failure(
        self,
        call_id: str,
        attempt_seq: int,
        error: CallError,
        now_ms: int,
        *,
        budget_used_ms: int = 0,
    ) -> list[DispatchCommand]:
        """The live attempt failed (``CallFailed``, ``resume_send_failed``, ...).

        Returns ``UnbindCall`` plus ``ArmCallRetry`` (retry) or the end's
        consequences (final failure). Stale -> ``[]``.
        """
        self._enter("handle_attempt_failure")
        try:
            ctx = live_attempt(self._core, call_id, attempt_seq)
            if ctx is None:
                return []
            ctx.budget_used_ms = budget_used_ms
            out: list[DispatchCommand] = []
            fail_attempt(self._core, ctx, error, now_ms, out, budget_used_ms=budget_used_ms)
            return out
        finally:
            self._running = None

    def handle_retry_ready(self, call_id: str) -> list[DispatchCommand]:
        """An ``ArmCallRetry`` timer fired: the call goes back to the head of its queue."""
        self._enter("handle_retry_ready")
        try:
            core = self._core
            ctx = core.calls.get(call_id)
            if ctx is None or ctx.state is not _READY or not ctx.retry_armed:
                core.stats.stale_events += 1
                return []
            ctx.retry_armed = False
            requeue_front(core, ctx)
            return []
        finally:
            self._running = None

    def handle_subcall_request(self, request: SubcallRequest) -> list[DispatchCommand]:
        """A running call asked for a sub-call (see :mod:`.subcalls`).

        Returns ``BindCall`` (child bound next to its parent), ``[]`` (parked,
        waiting on a leader, or a stale request), ``CompleteCallFromCache`` +
        ``ResumeParentCall`` (cache hit), or ``ResumeParentCall`` with an error
        (depth limit, cycle).
        """
        self._enter("handle_subcall_request")
        try:
            out: list[DispatchCommand] = []
            admit_subcall(self._core, request, out)
            return out
        finally:
            self._running = None

    # === executors =======================================================================

    def handle_executor_snapshot_updated(
        self, snapshots: Iterable[ExecutorSnapshot]
    ) -> list[DispatchCommand]:
        """Replace the executor view; returns ``BindCall`` for parked sub-calls it unblocks."""
        self._enter("handle_executor_snapshot_updated")
        try:
            core = self._core
            core.executors.apply_snapshots(snapshots)
            out: list[DispatchCommand] = []
            rebind_parked(core, out)
            return out
        finally:
            self._running = None

    def handle_executor_lost(
        self, executor_id: str, now_ms: int, report: ExecutorLossReport | None = None
    ) -> list[DispatchCommand]:
        """The executor's connection era ended (call after refreshing the snapshot).

        ``report`` says what is known of why (default: a ``transport_lost`` that
        names no call, every bound call counted as started). Its calls are sorted
        by the blame rules (:mod:`.blame`): calls not suspected get their attempt
        back and are dispatched again; suspects get theirs back too and will run
        only in isolation; a suspect that was running alone there spends its
        attempt and fails with the cause once it has none left (at once for
        ``executor_wedged``). No command names the lost executor. Parked
        sub-calls are re-evaluated. The executor is unselectable until a
        snapshot shows it again.
        """
        self._enter("handle_executor_lost")
        try:
            core = self._core
            ex = core.executors.get(executor_id)
            out: list[DispatchCommand] = []
            if ex is not None:
                take_back_calls(core, ex, now_ms, out, report or _UNKNOWN_LOSS)
            rebind_parked(core, out)
            return out
        finally:
            self._running = None

    # === tasks ===========================================================================

    def handle_task_cancelled(self, task_id: str, reason: str) -> list[DispatchCommand]:
        """Cancel a task's call phase (deadline, user): in-flight calls are cancelled too.

        Returns ``CancelCallCmd`` for every bound root call; the next
        ``flush_dirty_tasks`` drains the rest and converges the task with a
        ``CANCELLED`` failure (unless it had already failed). Unknown task -> ``[]``.
        """
        self._enter("handle_task_cancelled")
        try:
            core = self._core
            task = core.tasks.get(task_id)
            if task is None:
                return []
            stop_task(core, task, TaskFailure(kind="CANCELLED", message=reason))
            out: list[DispatchCommand] = []
            for ctx in list(live_roots(task)):
                if ctx.state is _RUNNING or ctx.state is _WAITING:
                    cancel_call(core, ctx, "task_cancelled", out, message=reason)
            mark_dirty(core, task)
            return out
        finally:
            self._running = None

    def flush_dirty_tasks(self) -> list[DispatchCommand]:
        """The convergence epilogue: ``StopCallProduction``, drain, ``BatchSettled``,
        ``ConvergeTaskCalls`` for every dirty task, to a fixed point."""
        self._enter("flush_dirty_tasks")
        try:
            out: list[DispatchCommand] = []
            flush_dirty_tasks(self._core, out)
            return out
        finally:
            self._running = None

    # === introspection (read-only) =========================================================

    @property
    def config(self) -> DispatcherConfig:
        return self._core.config

    @property
    def stats(self) -> DispatcherStats:
        return self._core.stats

    @property
    def has_dirty_tasks(self) -> bool:
        """Whether ``flush_dirty_tasks`` has work."""
        return bool(self._core.dirty)

    def call_context(self, call_id: str) -> DispatchCallContext | None:
        """The live context of a call (do not modify it)."""
        return self._core.calls.get(call_id)

    @property
    def call_contexts(self) -> Mapping[str, DispatchCallContext]:
        """Every live call's context by call id, read-only (do not modify them):
        ``call_contexts.get(id)`` is ``call_context(id)`` without a Python call."""
        return self._core.calls

    def task_state(self, task_id: str) -> TaskDispatchState | None:
        """The state of a live task (do not modify it)."""
        return self._core.tasks.get(task_id)

    def task_ids(self) -> list[str]:
        return list(self._core.tasks)

    def executor_state(self, executor_id: str) -> ExecutorState | None:
        return self._core.executors.get(executor_id)

    def credits_available(self, task_id: str) -> int:
        """Stream batches the producer may commit now (0 for unknown or closed)."""
        task = self._core.tasks.get(task_id)
        if task is None or task.mode is not TaskMode.STREAM or not task.production_open:
            return 0
        return self._core.config.max_outstanding_batches - len(task.batches)

    def check_invariants(self) -> None:
        """Recount everything and raise ``DispatcherInvariantError`` on a mismatch.

        O(calls); for tests and debugging.
        """
        problems = check_core_invariants(self._core)
        if problems:
            raise DispatcherInvariantError("; ".join(problems[:20]))

    def __repr__(self) -> str:
        core = self._core
        return (
            f"<DispatcherCore tasks={len(core.tasks)} calls={len(core.calls)}"
            f" executors={len(core.executors)} dirty={len(core.dirty)}"
            f" {core.scheduler!r}>"
        )

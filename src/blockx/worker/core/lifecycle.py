"""Call lifecycle: the one place where call contexts change state and counters move.

Theory of operation
-------------------
:class:`CoreState` holds every table of the core; the functions here are the
transitions of a call, each keeping the counters that depend on it in step:

* :func:`bind_call` (READY -> RUNNING) charges an attempt and the executor's,
  task's and instance's in-flight counts; :func:`release_executor` gives them
  back (on retry, bind failure and end).
* :func:`set_call_terminal` is the single bookkeeping point of a call's end:
  it moves the call to DONE, counts the outcome into its task (and stream
  batch), records a root's output (a one-shot root's output or failure goes
  into its task's lists, in call order, and its context is forgotten), forgets
  a sub-call, and marks the task dirty. Calling it again for a DONE call
  changes nothing and returns False.
* :func:`finish_call` wraps it with the consequences of an end: fill the call
  cache, hand the result to singleflight waiters (or release them if the
  leader was cancelled), cancel the call's sub-call subtree, answer a
  sub-call's parent (``ResumeParentCall``), and stop a fast-fail task.
* :func:`fail_attempt` is the seed's ``handleAttemptFailure``: retry with
  backoff, or end the call as FAILED.
* :func:`release_wait`: an attempt leaves its IO wait other than by its answer
  (it fails, is cancelled, completes while waiting): the runtime's
  ``wait_handle`` goes back in a ``ReleaseWait`` (the runtime cancels the
  request nobody waits for any more). Called by :func:`fail_attempt`,
  :func:`cancel_call` and ``complete_attempt`` -- the only ways a live attempt
  ends --; a wait answered as usual costs the core only the slot's clearing on
  resume (``resume_attempts``).
* :func:`start_subcall` / :func:`try_bind_subcall` run a new sub-call: cache,
  singleflight, then bind next to the parent or park it.

Every function appends the commands it produces to the ``out`` list it is given
and never raises on a peer's behalf; callers (the ``DispatcherCore`` entry
points) decide which events are stale before calling in. Nothing here reads a
clock: times arrive as ``now_ms`` arguments.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from .commands import (
    ArmCallRetry,
    BindCall,
    CancelCallCmd,
    CancelReason,
    CompleteCallFromCache,
    DispatchCommand,
    ReleaseWait,
    ResumeParentCall,
    UnbindCall,
)
from .config import DispatcherConfig
from .fairness import ReadyScheduler
from .keys import SubcallIdSequence
from .retry import compute_backoff, should_retry
from .selection import ExecutorTable
from .state import (
    ATTEMPT_DENSE_MS,
    DispatchCallContext,
    DispatcherStats,
    EndedRun,
    ExecutorState,
    TaskDispatchState,
    move,
)
from .types import (
    ERR_CANCELLED,
    CallError,
    CallOutcome,
    CallState,
    FailedCall,
    FailurePolicy,
    JitterSource,
    TaskFailure,
    TaskMode,
)

__all__ = [
    "CoreState",
    "add_waiter",
    "bind_call",
    "cancel_call",
    "cancel_subtree",
    "fail_attempt",
    "failed_call_record",
    "finish_call",
    "live_roots",
    "mark_dirty",
    "release_executor",
    "release_wait",
    "requeue_front",
    "set_call_terminal",
    "start_subcall",
    "stop_task",
    "try_bind_subcall",
]

_READY: Final = CallState.READY
_RUNNING: Final = CallState.RUNNING
_WAITING: Final = CallState.WAITING
_DONE: Final = CallState.DONE
_SUCCEEDED: Final = CallOutcome.SUCCEEDED
_FAILED: Final = CallOutcome.FAILED
_CANCELLED: Final = CallOutcome.CANCELLED

Out = list[DispatchCommand]

#: Attempts shorter than this (ms) are counted one slot per ms (``DispatcherStats``).
_DENSE_ATTEMPT_MS: Final = ATTEMPT_DENSE_MS


class CoreState:
    """Every table of one dispatcher core. Written only by the core's entry points."""

    __slots__ = (
        "cache_limit",
        "calls",
        "config",
        "dirty",
        "executors",
        "isolation_queue",
        "jitter",
        "output_limit",
        "scheduler",
        "stats",
        "subcall_ids",
        "tasks",
    )

    def __init__(
        self, config: DispatcherConfig, jitter: JitterSource, subcall_ids: SubcallIdSequence
    ) -> None:
        self.config = config
        self.jitter = jitter
        self.subcall_ids = subcall_ids
        #: Live tasks by id.
        self.tasks: dict[str, TaskDispatchState] = {}
        #: Every call the core can still receive events for: live sub-calls, and
        #: root calls until their task converges (stream: until their batch
        #: settles).
        self.calls: dict[str, DispatchCallContext] = {}
        self.executors = ExecutorTable(config)
        self.scheduler = ReadyScheduler(config)
        #: READY suspects waiting for an executor of their own, oldest first
        #: (:mod:`.isolation`); entries whose ``awaiting_isolation`` is False are stale.
        self.isolation_queue: deque[DispatchCallContext] = deque()
        #: Tasks to settle at the next ``flush_dirty_tasks``, in marking order.
        self.dirty: deque[TaskDispatchState] = deque()
        self.stats = DispatcherStats()
        self.cache_limit = config.call_cache_max_entries
        #: ``max_collected_output_bytes`` (0: no limit), read once per completion; it
        #: applies to one-shot tasks only (a stream's outputs leave batch by batch).
        self.output_limit = config.max_collected_output_bytes


def mark_dirty(core: CoreState, task: TaskDispatchState) -> None:
    """Something that may affect ``task``'s convergence changed."""
    if not task.dirty:
        task.dirty = True
        core.dirty.append(task)


def live_roots(task: TaskDispatchState) -> list[DispatchCallContext]:
    """The task's root calls the core still holds, in call order (one-shot: those that
    have not ended)."""
    if task.mode is TaskMode.ONE_SHOT:
        return list(task.roots.values())
    return [ctx for batch in task.batches for ctx in batch.roots]


def failed_call_record(ctx: DispatchCallContext) -> FailedCall:
    error = ctx.error
    assert error is not None
    return FailedCall(call_id=ctx.call_id, index=ctx.index, error=error, attempts=ctx.attempt_count)


# --- binding ---------------------------------------------------------------------


def bind_call(core: CoreState, ctx: DispatchCallContext, ex: ExecutorState) -> BindCall:
    """READY -> RUNNING on ``ex``: spend an attempt and take a slot there."""
    if ctx.state is not _READY:
        move(ctx, _RUNNING)  # raises InvalidTransitionError, changing nothing
    ctx.state = _RUNNING
    ctx.attempt_count += 1
    ctx.attempt_seq += 1
    ctx.executor = ex
    ctx.bound = False
    core.executors.take_slot(ex, ctx)
    task = ctx.task
    core.stats.binds += 1
    if ctx.is_subcall:
        parent = ctx.parent
        assert parent is not None
        return BindCall(ctx.call_id, task.task_id, ex.executor_id, ctx.attempt_seq, parent.call_id)
    task.inflight_roots += 1
    core.scheduler.note_bind(task)
    ctx.budget_ms = task.call_budget_ms
    task.singleflight.setdefault(ctx.call.call_key, ctx)
    # Positional: one per call (see .records).
    return BindCall(ctx.call_id, task.task_id, ex.executor_id, ctx.attempt_seq)


def release_executor(
    core: CoreState, ctx: DispatchCallContext, completed: bool
) -> ExecutorState | None:
    """Give back the slot ``ctx`` holds (if any); ``completed``: the executor ended it."""
    ex = ctx.executor
    if ex is None:
        return None
    if ctx.bound:  # an attempt that reached its executor ended: count its duration
        stats = core.stats
        elapsed_ms = stats.clock_ms - ctx.attempt_started_ms
        if 0 <= elapsed_ms < _DENSE_ATTEMPT_MS:  # one slot per ms: an index, an increment
            stats.attempt_ms_counts[elapsed_ms] += 1
        else:
            stats.record_slow_attempt(elapsed_ms)
    ctx.executor = None
    ctx.bound = False
    core.executors.release_slot(ex, ctx, completed)
    if not ctx.is_subcall:
        task = ctx.task
        task.inflight_roots -= 1
        scheduler = core.scheduler
        scheduler.note_release(task)
        if task.ready_queue and not task.in_ring:
            scheduler.wake(task)
    return ex


def requeue_front(core: CoreState, ctx: DispatchCallContext) -> None:
    """Put a READY root call at the head of its task's queue (retry, released waiter),
    or, for a suspect, at the end of the isolation queue.

    A stopping task keeps the call READY but unqueued: the drain cancels it.
    """
    task = ctx.task
    if task.stop_dispatching:
        mark_dirty(core, task)
        return
    if ctx.suspect:
        ctx.awaiting_isolation = True
        core.isolation_queue.append(ctx)
        return
    ctx.queued = True
    task.ready_queue.appendleft(ctx)
    core.scheduler.wake(task)


def release_wait(ctx: DispatchCallContext, out: Out) -> None:
    """``ctx``'s attempt leaves its wait unanswered: hand its ``wait_handle`` back.

    Callers test ``ctx.wait_handle is not None`` first (a call that waits on
    nothing, or whose wait was answered, costs one attribute test and no call).
    """
    out.append(ReleaseWait(ctx.call_id, ctx.task.task_id, ctx.wait_handle))
    ctx.wait_handle = None


# --- the end of a call -----------------------------------------------------------


def set_call_terminal(
    core: CoreState,
    ctx: DispatchCallContext,
    outcome: CallOutcome,
    output: bytes | None = None,
    error: CallError | None = None,
    completed: bool = False,
) -> bool:
    """Move ``ctx`` to DONE and count it; False (and no change) if it already was."""
    if ctx.state is _DONE:
        return False
    if ctx.executor is not None:
        release_executor(core, ctx, completed)
    ctx.state = _DONE  # every live state may end (CALL_TRANSITIONS)
    ctx.outcome = outcome
    ctx.retry_armed = False
    ctx.queued = False
    ctx.sf_waiting = False
    ctx.awaiting_isolation = False
    if error is not None:
        ctx.error = error
    task = ctx.task
    stats = core.stats
    if outcome is _SUCCEEDED:
        stats.calls_completed += 1
    elif outcome is _FAILED:
        stats.calls_failed += 1
        failed_with = ctx.error
        kind = failed_with.kind if failed_with is not None else "unknown"
        by_kind = stats.failures_by_kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
    else:
        stats.calls_cancelled += 1
    if ctx.is_subcall:
        if outcome is _SUCCEEDED:
            stats.subcalls_completed += 1
        elif outcome is _FAILED:
            stats.subcalls_failed += 1
        else:
            stats.subcalls_cancelled += 1
        if ctx.parked:
            ctx.parked = False
            del task.pending_bind_subcalls[ctx.call_id]
        parent = ctx.parent
        assert parent is not None
        siblings = parent.children
        if siblings is not None:
            siblings.pop(ctx.call_id, None)
        del core.calls[ctx.call_id]
        task.live_subcalls -= 1
    else:
        task.terminal_roots += 1
        kept: bytes | None = None
        if outcome is _SUCCEEDED:
            task.succeeded += 1
            if output is not None:
                # The limit is on outputs kept for the whole task: a one-shot task's (the
                # core holds them to convergence). A stream's leave with each settled
                # batch (its consumer keeps them or not), so no limit applies here.
                if (core.output_limit and task.mode is TaskMode.ONE_SHOT) or task.outputs_dropped:
                    kept = _record_output(core, task, output)
                else:
                    kept = output  # _record_output without a limit
        elif outcome is _FAILED:
            task.failed += 1
        else:
            task.cancelled += 1
        batch = ctx.batch
        if batch is not None:
            batch.remaining -= 1
            ctx.output = kept
        else:
            _end_one_shot_root(core, task, ctx, kept, outcome is _FAILED)
    mark_dirty(core, task)
    return True


def _end_one_shot_root(
    core: CoreState,
    task: TaskDispatchState,
    ctx: DispatchCallContext,
    output: bytes | None,
    failed: bool,
) -> None:
    """A one-shot root call ended: forget its context, keep its output or failure.

    The call joins the runs of ended calls next to it (:class:`~.state.EndedRun`):
    it extends the run ending just before it, or starts one, and the run starting
    just after it is merged in. Every step is O(1) but the merge, which moves the
    smaller run's references (in C); so when the last call ends, one run holds
    every output and failure in call order and the phase's end hands them over
    as built (``ConvergeTaskCalls``), walking no call.
    """
    index = ctx.index
    del core.calls[ctx.call_id]
    del task.roots[index]
    task.settled_roots += 1
    record = failed_call_record(ctx) if failed else None
    by_start = task.runs_by_start
    by_end = task.runs_by_end
    # Subscripts rather than dict.pop: no method call on the path of every call.
    run: EndedRun | None = None
    if index in by_end:
        run = by_end[index]
        del by_end[index]
    after: EndedRun | None = None
    if index + 1 in by_start:
        after = by_start[index + 1]
        del by_start[index + 1]
    if run is None:
        if after is not None:  # the call goes in front of the run after it
            after.start = index
            by_start[index] = after
            if output is not None:
                after.outputs.appendleft(output)
            if record is not None:
                after.failures.appendleft(record)
            return
        run = by_start[index] = EndedRun(index)
    if output is not None:
        run.outputs.append(output)
    if record is not None:
        run.failures.append(record)
    run.end = index + 1
    if after is not None:
        run.absorb(after)
    by_end[run.end] = run


def _drop_outputs(task: TaskDispatchState) -> None:
    """The task's outputs exceed the limit: let go of every output kept so far."""
    task.outputs_dropped = True
    if task.mode is TaskMode.ONE_SHOT:
        for run in task.runs_by_start.values():
            run.outputs.clear()
    else:
        for root in live_roots(task):
            root.output = None


def _record_output(core: CoreState, task: TaskDispatchState, output: bytes) -> bytes | None:
    """The output to keep for a root that succeeded (None once the outputs are dropped)."""
    if task.outputs_dropped:
        return None
    limit = core.output_limit
    if limit:
        task.output_bytes += len(output)
        if task.output_bytes > limit:
            _drop_outputs(task)
            stop_task(
                core,
                task,
                TaskFailure(
                    kind="OUTPUT_BYTES_EXCEEDED",
                    message=(
                        f"outputs of task {task.task_id!r} exceed"
                        f" max_collected_output_bytes={limit}"
                    ),
                ),
            )
            return None
    return output


def stop_task(core: CoreState, task: TaskDispatchState, failure: TaskFailure) -> None:
    """Stop dispatching ``task`` (the first reason is kept)."""
    if task.stop_dispatching:
        return
    task.stop_dispatching = True
    task.failure = failure
    mark_dirty(core, task)


def finish_call(
    core: CoreState,
    ctx: DispatchCallContext,
    outcome: CallOutcome,
    out: Out,
    output: bytes | None = None,
    error: CallError | None = None,
    budget_used_ms: int = 0,
    completed: bool = False,
) -> None:
    """End ``ctx`` with ``outcome`` and apply every consequence of that end."""
    if not set_call_terminal(core, ctx, outcome, output, error, completed):
        return
    task = ctx.task
    key = ctx.call.call_key
    if outcome is _SUCCEEDED and output is not None and core.cache_limit:
        task.call_cache.put(key, output, core.cache_limit)
    if task.singleflight.get(key) is ctx:
        del task.singleflight[key]
        waiters = ctx.sf_waiters
        ctx.sf_waiters = None
        if waiters:
            if outcome is _CANCELLED:
                _release_waiters(core, waiters, out)
            else:
                _resolve_waiters(core, waiters, outcome, output, error, out)
    if ctx.children:
        cancel_subtree(core, ctx, "parent_ended", out)
    if ctx.is_subcall:
        if outcome is not _CANCELLED:
            _resume_parent(ctx, output, error, budget_used_ms, out)
    elif outcome is _FAILED and task.failure_policy is FailurePolicy.FAST_FAIL:
        assert error is not None
        stop_task(
            core,
            task,
            TaskFailure(
                kind="CALL_FAILED",
                message=f"call {ctx.call_id} failed: {error.kind}: {error.message}",
                call_id=ctx.call_id,
                error=error,
            ),
        )


def _resume_parent(
    child: DispatchCallContext,
    output: bytes | None,
    error: CallError | None,
    budget_used_ms: int,
    out: Out,
) -> None:
    parent = child.parent
    assert parent is not None and child.request_id is not None
    ex = parent.executor
    if ex is None or (parent.state is not _RUNNING and parent.state is not _WAITING):
        return
    out.append(
        ResumeParentCall(
            task_id=parent.task.task_id,
            parent_call_id=parent.call_id,
            executor_id=ex.executor_id,
            request_id=child.request_id,
            call_id=child.call_id,
            output_json=output,
            error=error,
            budget_used_ms=budget_used_ms,
        )
    )


def _resolve_waiters(
    core: CoreState,
    waiters: list[DispatchCallContext],
    outcome: CallOutcome,
    output: bytes | None,
    error: CallError | None,
    out: Out,
) -> None:
    """A leader ended with a result: every live waiter ends with the same one."""
    for waiter in waiters:
        if waiter.state is not _READY or not waiter.sf_waiting:
            continue
        waiter.sf_waiting = False
        task = waiter.task
        task.singleflight_hits += 1
        core.stats.singleflight_hits += 1
        out.append(
            CompleteCallFromCache(
                call_id=waiter.call_id,
                task_id=task.task_id,
                source="singleflight",
                output_json=output if outcome is _SUCCEEDED else None,
                error=None if outcome is _SUCCEEDED else error,
                parent_call_id=waiter.parent_call_id,
            )
        )
        finish_call(core, waiter, outcome, out, output=output, error=error)


def _release_waiters(core: CoreState, waiters: list[DispatchCallContext], out: Out) -> None:
    """A leader was cancelled (it has no result): its waiters contend again.

    Root waiters go back to the head of their queue (in their order); sub-call
    waiters start over unless their own parent is ending too (the subtree
    cancellation in progress will end them).
    """
    subcalls: list[DispatchCallContext] = []
    for waiter in reversed(waiters):
        if waiter.state is not _READY or not waiter.sf_waiting:
            continue
        waiter.sf_waiting = False
        if waiter.is_subcall:
            subcalls.append(waiter)
        else:
            requeue_front(core, waiter)
    for waiter in reversed(subcalls):
        parent = waiter.parent
        assert parent is not None
        if waiter.state is _READY and (parent.state is _RUNNING or parent.state is _WAITING):
            start_subcall(core, waiter, out)


def cancel_call(
    core: CoreState, ctx: DispatchCallContext, reason: CancelReason, out: Out, *, message: str = ""
) -> None:
    """End ``ctx`` as CANCELLED.

    A bound attempt gets a ``CancelCallCmd`` (the executor's terminal frame
    frees its reservation); one reserved but not yet confirmed bound gets an
    ``UnbindCall``; nothing is sent for a lost executor.
    """
    if ctx.state is _DONE:
        return
    if ctx.wait_handle is not None:
        release_wait(ctx, out)
    ex = ctx.executor
    if ex is not None and not ex.lost:
        if ctx.bound:
            out.append(
                CancelCallCmd(
                    call_id=ctx.call_id,
                    task_id=ctx.task.task_id,
                    executor_id=ex.executor_id,
                    attempt_seq=ctx.attempt_seq,
                    reason=reason,
                )
            )
        else:
            # Reserved but never sent: nothing will end it on the executor.
            out.append(
                UnbindCall(
                    call_id=ctx.call_id, task_id=ctx.task.task_id, executor_id=ex.executor_id
                )
            )
    error = CallError(kind=ERR_CANCELLED, message=message or reason, retryable=False)
    finish_call(core, ctx, _CANCELLED, out, error=error)


def cancel_subtree(
    core: CoreState, ctx: DispatchCallContext, reason: CancelReason, out: Out
) -> None:
    """Cancel every live sub-call under ``ctx`` (children first, depth-first)."""
    children = ctx.children
    if not children:
        return
    for child in list(children.values()):
        cancel_call(core, child, reason, out)


# --- failures and retries -----------------------------------------------------------


def fail_attempt(
    core: CoreState,
    ctx: DispatchCallContext,
    error: CallError,
    now_ms: int,
    out: Out,
    *,
    budget_used_ms: int = 0,
    executor_lost: bool = False,
) -> None:
    """The current attempt of a RUNNING/WAITING call failed: retry or end it.

    Retried (READY + ``ArmCallRetry``) when the error is retryable, the call has
    attempts left and its task is still dispatching; sub-calls have one
    attempt. ``executor_lost``: the executor is gone with its reservations, so
    no ``UnbindCall``/``CancelCallCmd`` names it.
    """
    if ctx.wait_handle is not None:
        release_wait(ctx, out)
    task = ctx.task
    ex = ctx.executor
    release = ex is not None and not executor_lost
    ctx.error = error
    if not ctx.is_subcall and should_retry(
        error, ctx.attempt_count, ctx.max_attempts, task.stop_dispatching
    ):
        release_executor(core, ctx, not executor_lost)
        if release:
            assert ex is not None
            out.append(
                UnbindCall(call_id=ctx.call_id, task_id=task.task_id, executor_id=ex.executor_id)
            )
        move(ctx, _READY)
        if ctx.children:
            cancel_subtree(core, ctx, "parent_retrying", out)
        delay = compute_backoff(
            task.base_backoff_ms, ctx.attempt_count, core.jitter, core.config.max_backoff_ms
        )
        ctx.retry_armed = True
        task.retries += 1
        stats = core.stats
        stats.retries += 1
        retried = stats.retries_by_kind
        retried[error.kind] = retried.get(error.kind, 0) + 1
        out.append(
            ArmCallRetry(
                call_id=ctx.call_id,
                task_id=task.task_id,
                due_at_ms=now_ms + delay,
                delay_ms=delay,
                attempt_count=ctx.attempt_count,
            )
        )
        mark_dirty(core, task)
        return
    if release:
        assert ex is not None
        out.append(
            UnbindCall(call_id=ctx.call_id, task_id=task.task_id, executor_id=ex.executor_id)
        )
    finish_call(
        core,
        ctx,
        _FAILED,
        out,
        error=error,
        budget_used_ms=budget_used_ms,
        completed=not executor_lost,
    )


# --- sub-calls ------------------------------------------------------------------------


def start_subcall(core: CoreState, ctx: DispatchCallContext, out: Out) -> None:
    """Run a READY sub-call: from the cache, behind a leader, or on the parent's executor."""
    task = ctx.task
    key = ctx.call.call_key
    if core.cache_limit:
        cached = task.call_cache.get(key)
        if cached is not None:
            task.cache_hits += 1
            core.stats.cache_hits += 1
            out.append(
                CompleteCallFromCache(
                    call_id=ctx.call_id,
                    task_id=task.task_id,
                    source="cache",
                    output_json=cached,
                    error=None,
                    parent_call_id=ctx.parent_call_id,
                )
            )
            finish_call(core, ctx, _SUCCEEDED, out, output=cached)
            return
    leader = task.singleflight.get(key)
    if leader is not None and leader is not ctx:
        add_waiter(leader, ctx)
        return
    task.singleflight[key] = ctx
    try_bind_subcall(core, ctx, out)


def add_waiter(leader: DispatchCallContext, ctx: DispatchCallContext) -> None:
    """``ctx`` (READY, unqueued) waits for ``leader``'s result: the task repeats calls,
    so its call cache grows to its full bound."""
    ctx.sf_waiting = True
    ctx.task.call_cache.grow()
    waiters = leader.sf_waiters
    if waiters is None:
        leader.sf_waiters = [ctx]
    else:
        waiters.append(ctx)


def try_bind_subcall(core: CoreState, ctx: DispatchCallContext, out: Out) -> None:
    """Bind a READY sub-call next to its parent, or park it until that is possible."""
    parent = ctx.parent
    assert parent is not None
    ex = parent.executor
    task = ctx.task
    if (
        parent.bound
        and ex is not None
        and (parent.state is _RUNNING or parent.state is _WAITING)
        and core.executors.can_host_subcall(ex)
    ):
        if ctx.parked:
            ctx.parked = False
            del task.pending_bind_subcalls[ctx.call_id]
        out.append(bind_call(core, ctx, ex))
    elif not ctx.parked:
        ctx.parked = True
        task.pending_bind_subcalls[ctx.call_id] = ctx

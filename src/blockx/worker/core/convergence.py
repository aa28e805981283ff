"""Convergence: the settle pass that ends call phases (``flush_dirty_tasks``).

Theory of operation
-------------------
Convergence happens here and nowhere else. Every entry point that can change
whether a task may converge -- a call ending, an attempt failing, a task
stopping, a batch committed, production finishing, an executor lost --
marks the task dirty (:func:`~.lifecycle.mark_dirty`). :func:`flush_dirty_tasks`
then settles each dirty task, running until no task is dirty (a fixed point).
Settling one task is, in this order:

1. **StopCallProduction** -- a stopping stream (fast-fail, output limit,
   cancellation) that is still producing, or a one-shot phase still being
   registered in chunks, is told to stop; production counts as done from here
   on. A one-shot phase's calls not registered yet are counted cancelled
   (:func:`~.registration.drop_unregistered`), as the drain would have
   cancelled them.
2. **Drain** -- a stopping task with no root call in flight cancels every
   root call that has not ended (queued, backing off, waiting on a
   singleflight leader). In-flight calls are never cut short by a stop; the
   drain waits for them (``handle_task_cancelled`` cancels them explicitly).
3. **BatchSettled** -- a stream's oldest batches whose root calls are all
   ``DONE`` settle in batch order with their outputs; their contexts are
   forgotten, so a stream's memory is bounded by the credit window.
4. **ConvergeTaskCalls** -- once terminal roots == total, production is done
   (for a one-shot phase: every chunk registered) and every batch settled, the
   task converges exactly once and the core forgets it (late frames for its
   calls are then unknown and dropped). A one-shot phase's end is incremental:
   each root call was forgotten as it ended and its output or failure put in
   call order into the run of ended calls it joined
   (``lifecycle._end_one_shot_root``), so converging hands over what is
   already built -- no pass over the calls, however many they were.
"""

from __future__ import annotations

from .commands import BatchSettled, ConvergeTaskCalls, DispatchCommand, StopCallProduction
from .lifecycle import CoreState, cancel_call, failed_call_record, live_roots
from .registration import drop_unregistered
from .state import TaskDispatchState
from .types import CallOutcome, CallState, FailedCall, TaskFailure, TaskMode

__all__ = ["flush_dirty_tasks", "remove_task"]


def flush_dirty_tasks(core: CoreState, out: list[DispatchCommand]) -> None:
    """Settle every dirty task until none is dirty."""
    dirty = core.dirty
    tasks = core.tasks
    while dirty:
        task = dirty.popleft()
        task.dirty = False
        if tasks.get(task.task_id) is task:
            _settle(core, task, out)


def _settle(core: CoreState, task: TaskDispatchState, out: list[DispatchCommand]) -> None:
    if task.stop_dispatching:
        failure = task.failure
        assert failure is not None
        if task.production_open:
            task.production_open = False
            if task.unregistered_roots:
                drop_unregistered(core, task)
            out.append(StopCallProduction(task_id=task.task_id, failure=failure))
        if task.inflight_roots == 0 and task.terminal_roots < task.total_count:
            _drain(core, task, failure, out)
    if task.mode is TaskMode.STREAM:
        _settle_batches(core, task, out)
    if task.terminal_roots == task.total_count and not task.production_open and not task.batches:
        _converge(core, task, out)


def _drain(
    core: CoreState, task: TaskDispatchState, failure: TaskFailure, out: list[DispatchCommand]
) -> None:
    message = f"task stopped: {failure.kind}"
    task.ready_queue.clear()
    for ctx in live_roots(task):
        if ctx.state is CallState.READY:
            cancel_call(core, ctx, "task_cancelled", out, message=message)


def _settle_batches(core: CoreState, task: TaskDispatchState, out: list[DispatchCommand]) -> None:
    batches = task.batches
    registry = core.calls
    succeeded = CallOutcome.SUCCEEDED
    failed = CallOutcome.FAILED
    while batches and batches[0].remaining == 0:
        batch = batches.popleft()
        outputs: list[bytes] = []
        failures = []
        ok = 0
        for ctx in batch.roots:
            outcome = ctx.outcome
            if outcome is succeeded:
                ok += 1
                if ctx.output is not None:
                    outputs.append(ctx.output)
            elif outcome is failed:
                failures.append(failed_call_record(ctx))
            del registry[ctx.call_id]
        count = len(batch.roots)
        # The batch and its calls point at each other (ctx.batch, batch.roots): let go
        # here, so a settled batch is freed by reference counting, not by a GC pass.
        batch.roots = []
        task.settled_roots += count
        out.append(
            BatchSettled(
                task_id=task.task_id,
                batch_idx=batch.batch_idx,
                outputs=() if task.outputs_dropped else tuple(outputs),
                failed_calls=tuple(failures),
                call_count=count,
                succeeded_count=ok,
                cancelled_count=count - ok - len(failures),
            )
        )


def _converge(core: CoreState, task: TaskDispatchState, out: list[DispatchCommand]) -> None:
    outputs: tuple[bytes, ...] = ()
    failed_calls: tuple[FailedCall, ...] = ()
    if task.mode is TaskMode.ONE_SHOT:
        # Built as the calls ended, in call order (lifecycle._end_one_shot_root): every
        # call has ended, so one run holds them all. Handed over as they are (a tuple of
        # the deque: one copy of references in C, no Python step per call); no context
        # is left to walk.
        run = task.runs_by_start.get(0)
        if run is not None:  # none: no call was registered
            if not task.outputs_dropped:
                outputs = tuple(run.outputs)
            failed_calls = tuple(run.failures)
    failure = task.failure
    out.append(
        ConvergeTaskCalls(
            task_id=task.task_id,
            mode=task.mode,
            success=failure is None,
            failure=failure,
            outputs=outputs,
            failed_calls=failed_calls,
            total_count=task.total_count,
            succeeded_count=task.succeeded,
            failed_count=task.failed,
            cancelled_count=task.cancelled,
            retry_count=task.retries,
            cache_hit_count=task.cache_hits,
            singleflight_hit_count=task.singleflight_hits,
        )
    )
    core.stats.tasks_converged += 1
    remove_task(core, task)


def remove_task(core: CoreState, task: TaskDispatchState) -> None:
    """Forget a task whose calls have all ended."""
    del core.tasks[task.task_id]
    core.scheduler.remove_task(task)
    registry = core.calls
    for ctx in live_roots(task):
        registry.pop(ctx.call_id, None)
    task.roots.clear()
    task.runs_by_start.clear()
    task.runs_by_end.clear()
    task.batches.clear()
    task.ready_queue.clear()

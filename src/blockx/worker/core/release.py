"""Releasing root calls to executors, and taking binds back.

Theory of operation
-------------------
:func:`dispatch_one` is one release decision (the seed's ``TryDispatchNext``;
:func:`dispatch_decisions` makes a run of them for ``dispatch_ready``):
the :class:`~.fairness.ReadyScheduler` names the task to serve and the head of
its ready queue is

1. ended at once from the task's **call cache** (``CompleteCallFromCache``), or
2. parked behind the **singleflight** leader computing the same key -- and the
   loop moves on to the next head, so consecutive calls with one key all wait
   on one leader --, or
3. **bound** to the executor :meth:`~.selection.ExecutorTable.select_executor`
   picks (``BindCall``).

It returns False, changing nothing, when no task is dispatchable or no
executor is eligible (the head stays queued).

Suspects waiting to run alone (:mod:`.isolation`) are placed first, before
any task's head is looked at.

A bind can be taken back before it ran: :func:`unbind_attempt` undoes one that
failed (``handle_bind_failed``) or whose executor was lost before the bind was
confirmed; the attempt is given back, a root call is re-armed at once and a
sub-call parked again. Executor loss is :mod:`.blame`'s.
"""

from __future__ import annotations

from typing import Final

from .commands import ArmCallRetry, CompleteCallFromCache, DispatchCommand
from .isolation import place_isolated
from .lifecycle import (
    CoreState,
    add_waiter,
    bind_call,
    cancel_subtree,
    finish_call,
    mark_dirty,
    release_executor,
)
from .state import DispatchCallContext, move
from .types import CallOutcome, CallState

__all__ = ["dispatch_decisions", "dispatch_one", "unbind_attempt"]

_READY: Final = CallState.READY
_RUNNING: Final = CallState.RUNNING
_WAITING: Final = CallState.WAITING


def dispatch_decisions(
    core: CoreState, now_ms: int, out: list[DispatchCommand], limit: int = -1
) -> int:
    """Make up to ``limit`` release decisions (-1: until none is possible); returns how many.

    The loop of ``dispatch_ready`` -- one body for one decision and for a run
    of them, with the tables it reads held in locals (a decision is a few
    hundred nanoseconds of work; attribute lookups per decision showed).
    """
    scheduler = core.scheduler
    pick = scheduler.pick
    served = scheduler.served
    # The current selection policy's method (snapshots, which change it, do not
    # arrive during a run of decisions).
    select = core.executors.select
    cache_limit = core.cache_limit
    stats = core.stats
    decisions = 0
    if core.isolation_queue or core.executors.reserved:
        decisions = place_isolated(core, out)
        if limit != -1 and decisions >= limit:
            return decisions
    while decisions != limit:
        task = pick()
        if task is None:
            return decisions
        queue = task.ready_queue
        ctx = queue[0]
        if not ctx.queued:  # ended while queued: drop the stale entry
            queue.popleft()
            continue
        key = ctx.call.call_key
        if cache_limit:
            cached = task.call_cache.get(key)
            if cached is not None:
                queue.popleft()
                ctx.queued = False
                task.cache_hits += 1
                stats.cache_hits += 1
                out.append(
                    CompleteCallFromCache(
                        call_id=ctx.call_id,
                        task_id=task.task_id,
                        source="cache",
                        output_json=cached,
                        error=None,
                    )
                )
                finish_call(core, ctx, CallOutcome.SUCCEEDED, out, output=cached)
                served(task)
                decisions += 1
                continue
        leader = task.singleflight.get(key)
        if leader is not None and leader is not ctx:
            queue.popleft()
            ctx.queued = False
            add_waiter(leader, ctx)
            continue
        ex = select(now_ms)
        if ex is None:
            return decisions
        queue.popleft()
        ctx.queued = False
        out.append(bind_call(core, ctx, ex))
        served(task)
        decisions += 1
    return decisions


def dispatch_one(core: CoreState, now_ms: int, out: list[DispatchCommand]) -> bool:
    """One release decision; False if nothing can be released now."""
    return dispatch_decisions(core, now_ms, out, 1) == 1


def unbind_attempt(
    core: CoreState, ctx: DispatchCallContext, now_ms: int, out: list[DispatchCommand]
) -> None:
    """A bind that never ran: RUNNING -> READY with the attempt given back."""
    release_executor(core, ctx, False)
    move(ctx, _READY)
    ctx.attempt_count -= 1
    core.stats.bind_failures += 1
    if ctx.children:  # only if a sub-call was requested before the bind was confirmed
        cancel_subtree(core, ctx, "parent_retrying", out)
    task = ctx.task
    if ctx.is_subcall:
        ctx.parked = True
        task.pending_bind_subcalls[ctx.call_id] = ctx
        return
    mark_dirty(core, task)
    if task.stop_dispatching:
        return  # the drain cancels it
    ctx.retry_armed = True
    out.append(
        ArmCallRetry(
            call_id=ctx.call_id,
            task_id=task.task_id,
            due_at_ms=now_ms,
            delay_ms=0,
            attempt_count=ctx.attempt_count,
        )
    )

"""A full recount of the core's state, for tests and debugging.

Theory of operation
-------------------
The core keeps counters instead of scanning (a task's in-flight and terminal
counts, an executor's local inflight, an instance's inflight ...). This module
recomputes every one of them from the contexts and reports each mismatch, plus
the structural invariants the counters rely on: a live sub-call's parent is
running, a READY call is somewhere it will be found again (queued, backing
off, parked, or behind a singleflight leader), a dispatchable task is in a
scheduler ring. ``DispatcherCore.check_invariants`` raises on any problem.
O(calls); never called by the core itself.
"""

from __future__ import annotations

from collections import Counter

from .lifecycle import CoreState, live_roots
from .state import DispatchCallContext, ExecutorState, TaskDispatchState
from .types import CallState, TaskMode

__all__ = ["check_core_invariants"]

_LIVE = (CallState.RUNNING, CallState.WAITING)


def check_core_invariants(core: CoreState) -> list[str]:
    """Every broken invariant, as a sentence; empty when the state is consistent."""
    problems: list[str] = []
    subcalls_by_task: Counter[str] = Counter()
    for call_id, ctx in core.calls.items():
        if ctx.call_id != call_id:
            problems.append(f"{call_id}: registered under another id ({ctx!r})")
        if core.tasks.get(ctx.task.task_id) is not ctx.task:
            problems.append(f"{ctx!r}: its task is not live")
        problems.extend(_check_call(core, ctx))
        if ctx.is_subcall:
            subcalls_by_task[ctx.task.task_id] += 1
    for task in core.tasks.values():
        problems.extend(_check_task(core, task, subcalls_by_task[task.task_id]))
    for ex in core.executors:
        if ex.runnable != max(0, ex.runnable_count - ex.completed_since_snapshot):
            problems.append(f"{ex!r}: compensated runnable count out of step")
        if ex.local_inflight != len(ex.calls):
            problems.append(f"{ex!r}: local_inflight {ex.local_inflight} != {len(ex.calls)} bound")
        for call_id, ctx in ex.calls.items():
            if ctx.executor is not ex or ctx.state not in _LIVE:
                problems.append(f"{ex!r} holds {call_id} which is {ctx!r}")
            if core.calls.get(call_id) is not ctx:
                problems.append(f"{ex!r} holds unregistered call {call_id}")
        problems.extend(_check_isolation(ex))
    inflight_by_instance: Counter[str] = Counter()
    for task in core.tasks.values():
        inflight_by_instance[task.instance.key] += task.inflight_roots
    for inst in core.scheduler.instances():
        expected = inflight_by_instance[inst.key]
        if inst.inflight != expected:
            problems.append(f"{inst!r}: inflight {inst.inflight} != {expected} of its tasks")
    problems.extend(core.scheduler.check_invariants())
    for task in core.dirty:
        if not task.dirty:
            problems.append(f"{task!r} queued dirty without the flag")
    return problems


def _check_call(core: CoreState, ctx: DispatchCallContext) -> list[str]:
    problems: list[str] = []
    state = ctx.state
    if not 0 <= ctx.attempt_count <= ctx.max_attempts:
        problems.append(f"{ctx!r}: attempt_count out of range")
    if state in _LIVE:
        ex = ctx.executor
        if ex is None or ex.calls.get(ctx.call_id) is not ctx:
            problems.append(f"{ctx!r}: live but not held by its executor")
        if state is CallState.WAITING and not ctx.bound:
            problems.append(f"{ctx!r}: waiting before its bind was confirmed")
    elif ctx.executor is not None:
        problems.append(f"{ctx!r}: holds an executor while {state.value}")
    if ctx.wait_handle is not None and state is not CallState.WAITING:
        problems.append(f"{ctx!r}: holds a wait handle while {state.value}")
    places = [ctx.queued, ctx.retry_armed, ctx.parked, ctx.sf_waiting, ctx.awaiting_isolation]
    if state is CallState.READY:
        if sum(places) > 1:
            problems.append(f"{ctx!r}: READY in several places")
        if sum(places) == 0 and not (not ctx.is_subcall and ctx.task.stop_dispatching):
            problems.append(f"{ctx!r}: READY but nowhere to be found again")
    elif any(places):
        problems.append(f"{ctx!r}: {state.value} but flagged queued/backoff/parked/waiter")
    if state is CallState.DONE:
        if ctx.outcome is None:
            problems.append(f"{ctx!r}: DONE without an outcome")
        if ctx.is_subcall:
            problems.append(f"{ctx!r}: DONE sub-call still registered")
    elif ctx.outcome is not None:
        problems.append(f"{ctx!r}: outcome before DONE")
    if ctx.sf_waiting:
        leader = ctx.task.singleflight.get(ctx.call.call_key)
        if leader is None or ctx not in (leader.sf_waiters or ()):
            problems.append(f"{ctx!r}: waits on no singleflight leader")
    if ctx.parked and ctx.task.pending_bind_subcalls.get(ctx.call_id) is not ctx:
        problems.append(f"{ctx!r}: parked but not in pending_bind_subcalls")
    if ctx.is_subcall:
        parent = ctx.parent
        assert parent is not None
        if parent.state not in _LIVE:
            problems.append(f"{ctx!r}: outlives its parent's attempt ({parent!r})")
        if (parent.children or {}).get(ctx.call_id) is not ctx:
            problems.append(f"{ctx!r}: missing from its parent's children")
        if ctx.max_attempts != 1:
            problems.append(f"{ctx!r}: a sub-call with more than one attempt")
    for child in (ctx.children or {}).values():
        if child.parent is not ctx or core.calls.get(child.call_id) is not child:
            problems.append(f"{ctx!r}: stale child {child!r}")
    return problems


def _check_task(core: CoreState, task: TaskDispatchState, subcalls: int) -> list[str]:
    problems: list[str] = []
    roots = live_roots(task)
    # Roots counted with no context: a stream's settled batches, a stopped phase's
    # never-registered calls.
    gone = task.settled_roots + task.dropped_roots
    done = sum(1 for ctx in roots if ctx.state is CallState.DONE) + gone
    live = sum(1 for ctx in roots if ctx.state in _LIVE)
    if task.total_count != len(roots) + gone:
        problems.append(f"{task!r}: total_count != registered roots")
    if task.terminal_roots != done:
        problems.append(f"{task!r}: terminal_roots {task.terminal_roots} != {done} DONE")
    if task.terminal_roots != task.succeeded + task.failed + task.cancelled:
        problems.append(f"{task!r}: outcome counts do not add up")
    if task.inflight_roots != live:
        problems.append(f"{task!r}: inflight_roots {task.inflight_roots} != {live} live")
    if task.inflight_roots > core.config.task_max_inflight_calls:
        problems.append(f"{task!r}: in-flight window exceeded")
    if task.live_subcalls != subcalls:
        problems.append(f"{task!r}: live_subcalls {task.live_subcalls} != {subcalls}")
    if task.mode is TaskMode.ONE_SHOT:
        problems.extend(_check_one_shot(task))
    for batch in task.batches:
        remaining = sum(1 for ctx in batch.roots if ctx.state is not CallState.DONE)
        if batch.remaining != remaining:
            problems.append(f"{task!r} {batch!r}: remaining != {remaining}")
    for key, leader in task.singleflight.items():
        if leader.state is CallState.DONE or leader.call.call_key != key or leader.task is not task:
            problems.append(f"{task!r}: bad singleflight leader {leader!r}")
    for call_id, ctx in task.pending_bind_subcalls.items():
        if not ctx.parked or ctx.state is not CallState.READY or ctx.call_id != call_id:
            problems.append(f"{task!r}: bad parked sub-call {ctx!r}")
    queued = [ctx for ctx in task.ready_queue if ctx.queued]
    if len({id(ctx) for ctx in queued}) != len(queued):
        problems.append(f"{task!r}: a call is queued twice")
    flagged = sum(1 for ctx in roots if ctx.queued)
    if flagged != len(queued):
        problems.append(f"{task!r}: {flagged} calls flagged queued, {len(queued)} in the queue")
    dispatchable = (
        bool(queued)
        and not task.stop_dispatching
        and task.inflight_roots < core.config.task_max_inflight_calls
    )
    if dispatchable and not task.in_ring:
        problems.append(f"{task!r}: dispatchable but in no scheduler ring")
    if task.in_ring and core.scheduler.fair and not task.instance.in_eligible:
        problems.append(f"{task!r}: in its instance's ring but the instance is not eligible")
    if task.mode.value == "stream":
        if task.unregistered_roots or task.dropped_roots:
            problems.append(f"{task!r}: a stream with one-shot registration counts")
    elif task.production_open != (task.unregistered_roots > 0):
        problems.append(
            f"{task!r}: registration open={task.production_open} but"
            f" {task.unregistered_roots} calls unregistered"
        )
    if task.dropped_roots and not task.stop_dispatching:
        problems.append(f"{task!r}: calls dropped but the task is not stopping")
    return problems


def _check_isolation(ex: ExecutorState) -> list[str]:
    """A suspect in isolation is alone on its executor (its own sub-calls aside)."""
    problems: list[str] = []
    if ex.closed_to_roots != (ex.isolating is not None or ex.reserved_for is not None):
        problems.append(f"{ex!r}: closed_to_roots out of step with its isolation marks")
    host = ex.isolating
    if host is None:
        return problems
    if ex.calls.get(host.call_id) is not host:
        problems.append(f"{ex!r} isolates {host!r}, which is not bound there")
    for ctx in ex.calls.values():
        root = ctx
        while root.parent is not None:
            root = root.parent
        if root is not host:
            problems.append(f"{ex!r} isolates {host.call_id} but also runs {ctx!r}")
    return problems


def _check_one_shot(task: TaskDispatchState) -> list[str]:
    """A one-shot phase's roots: live ones held by index, ended ones in runs, in call order."""
    problems: list[str] = []
    for index, ctx in task.roots.items():
        if ctx.index != index or ctx.state is CallState.DONE:
            problems.append(f"{task!r}: root {index} is {ctx!r}")
    runs = task.ended_runs
    if len(task.runs_by_end) != len(runs):
        problems.append(f"{task!r}: runs by start and by end differ")
    previous_end = -1
    ended = 0
    for run in runs:
        if task.runs_by_end.get(run.end) is not run or run.start >= run.end:
            problems.append(f"{task!r}: bad run {run!r}")
        if run.start <= previous_end:
            problems.append(f"{task!r}: {run!r} overlaps or touches the run before it")
        previous_end = run.end
        ended += run.end - run.start
        indexes = [f.index for f in run.failures]
        if indexes != sorted(indexes) or any(not run.start <= i < run.end for i in indexes):
            problems.append(f"{task!r}: {run!r} has failures out of order or out of it")
        if len(run.outputs) + len(indexes) > run.end - run.start:
            problems.append(f"{task!r}: {run!r} holds more than its calls")
        if any(i in task.roots for i in range(run.start, run.end)):
            problems.append(f"{task!r}: a live root inside the ended {run!r}")
    if ended != task.settled_roots:
        problems.append(f"{task!r}: runs hold {ended} calls, {task.settled_roots} ended")
    return problems

"""Attempt events: what an executor did with a bound attempt, one event or a batch at a time.

Theory of operation
-------------------
Four facts arrive once or more per call, from the runtime, for the attempt a
call is bound to: its bind was confirmed (``Bind`` succeeded), it suspended
(``CallWaiting`` io / subcall), it was resumed (the ``ResumeCall`` was
flushed), it completed (``CallCompleted``). Each has a single-event entry point
on :class:`~.dispatcher.DispatcherCore` (``handle_executor_bound``,
``handle_call_waiting``, ``handle_call_resumed``, ``handle_call_completed``) and
a batch one (``handle_executors_bound``, ``handle_calls_waiting``,
``handle_calls_resumed``, ``handle_calls_completed``) for the runtime that
receives them a read at a time. Both run the functions here, once per event
and in order, so a batch is by construction the same as its events applied
one after another (the commands concatenated); the batch only saves the
per-entry-point overhead (re-entrancy guard, list, call).

Staleness is decided here, the same way for all: an event that does not match
the call's live attempt (unknown call, DONE, backing off, another
``attempt_seq`` or executor, a bind not yet confirmed) is dropped and counted
in ``stats.stale_events``. Nothing here raises on a peer's behalf.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .commands import DispatchCallCmd, DispatchCommand, UnbindCall
from .lifecycle import CoreState, finish_call, release_wait
from .state import DispatchCallContext
from .subcalls import bind_parked_children
from .types import CallOutcome, CallState

__all__ = [
    "CompletedCall",
    "ResumedCall",
    "WaitingCall",
    "complete_attempt",
    "confirm_bind",
    "live_attempt",
    "pending_bind",
    "resume_attempts",
    "suspend_attempts",
]

_READY: Final = CallState.READY
_RUNNING: Final = CallState.RUNNING
_WAITING: Final = CallState.WAITING
_SUCCEEDED: Final = CallOutcome.SUCCEEDED

#: One ``CallCompleted``: ``(call_id, attempt_seq, output_json, budget_used_ms)``.
#: A plain tuple: batches hold one per completed call.
CompletedCall = tuple[str, int, bytes, int]
#: One suspension or resume: ``(call_id, attempt_seq)``.
WaitingCall = tuple[str, int]
ResumedCall = tuple[str, int]


def pending_bind(
    core: CoreState, call_id: str, executor_id: str, attempt_seq: int
) -> DispatchCallContext | None:
    """The call if a ``BindCall`` with these fields is its unconfirmed bind, else None (stale)."""
    ctx = core.calls.get(call_id)
    ex = None if ctx is None else ctx.executor
    if (
        ctx is None
        or ctx.state is not _RUNNING
        or ctx.bound
        or ctx.attempt_seq != attempt_seq
        or ex is None
        or ex.executor_id != executor_id
    ):
        core.stats.stale_events += 1
        return None
    return ctx


def live_attempt(core: CoreState, call_id: str, attempt_seq: int) -> DispatchCallContext | None:
    """The call if ``attempt_seq`` is its live attempt, else None (stale).

    Live: RUNNING or WAITING, with the bind confirmed -- an attempt whose
    ``DispatchCallCmd`` was never issued cannot have been reported on.
    """
    ctx = core.calls.get(call_id)
    if (
        ctx is None
        or ctx.attempt_seq != attempt_seq
        or (ctx.state is not _RUNNING and ctx.state is not _WAITING)
        or not ctx.bound
    ):
        core.stats.stale_events += 1
        return None
    return ctx


def confirm_bind(
    core: CoreState, call_id: str, executor_id: str, attempt_seq: int, out: list[DispatchCommand]
) -> None:
    """``Bind`` succeeded: ``DispatchCallCmd``, then binds of sub-calls parked on this call."""
    ctx = pending_bind(core, call_id, executor_id, attempt_seq)
    if ctx is None:
        return
    ctx.bound = True
    ctx.attempt_started_ms = core.stats.clock_ms
    parent = ctx.parent
    # Positional: one per call (see .records).
    out.append(
        DispatchCallCmd(
            call_id,
            ctx.task.task_id,
            executor_id,
            ctx.call,
            None if parent is None else parent.call_id,
            ctx.ancestry,
            ctx.budget_ms,
            ctx.attempt_seq,
            ctx.batch_idx,
        )
    )
    if ctx.children:
        bind_parked_children(core, ctx, out)


def suspend_attempts(core: CoreState, waits: Iterable[WaitingCall]) -> None:
    """``CallWaiting`` (io / subcall) of each ``(call_id, attempt_seq)``, in order:
    RUNNING -> WAITING (one already WAITING stays so); a single event is a batch of one."""
    for call_id, attempt_seq in waits:
        ctx = live_attempt(core, call_id, attempt_seq)
        if ctx is not None and ctx.state is _RUNNING:
            ctx.state = _WAITING  # RUNNING -> WAITING is in CALL_TRANSITIONS


def resume_attempts(core: CoreState, resumes: Iterable[ResumedCall]) -> None:
    """The ``ResumeCall`` of each ``(call_id, attempt_seq)`` was flushed, in order:
    WAITING -> RUNNING (like :func:`suspend_attempts`: one loop, a single event is a
    batch of one)."""
    for call_id, attempt_seq in resumes:
        ctx = live_attempt(core, call_id, attempt_seq)
        if ctx is not None and ctx.state is _WAITING:
            ctx.state = _RUNNING  # WAITING -> RUNNING is in CALL_TRANSITIONS
            ctx.wait_handle = None  # answered: nothing of this wait to release


def complete_attempt(
    core: CoreState,
    call_id: str,
    attempt_seq: int,
    output_json: bytes,
    budget_used_ms: int,
    out: list[DispatchCommand],
) -> None:
    """``CallCompleted``: ``UnbindCall``, then the call ends SUCCEEDED with its output."""
    ctx = live_attempt(core, call_id, attempt_seq)
    if ctx is None:
        return
    if ctx.wait_handle is not None:  # completed while waiting (the resume's note is late)
        release_wait(ctx, out)
    ex = ctx.executor
    assert ex is not None
    ctx.budget_used_ms = budget_used_ms
    out.append(UnbindCall(call_id, ctx.task.task_id, ex.executor_id))
    finish_call(core, ctx, _SUCCEEDED, out, output_json, None, budget_used_ms, True)

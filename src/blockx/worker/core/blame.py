"""Blame: what a lost executor's calls become (docs/security.md, "Blame: a bad call fails alone").

Theory of operation
-------------------
When an executor's connection era ends, the runtime reports what it knows as an
:class:`~.types.ExecutorLossReport` (the cause; the call its black box names as
running, and whether that is certain; the calls that had run user code there)
and :func:`take_back_calls` sorts the root calls bound there:

* **Suspects** (:func:`suspect_ids`): for ``memory_exceeded`` every started call
  (any of them may hold the memory); for any other blaming cause the running
  call when it is known -- none when the box says nothing ran --, else every
  started call. ``shutdown`` makes no suspect. A sub-call's suspicion falls on
  its root call.
* A suspect that was **running alone** there (the executor hosted it in
  isolation, :mod:`.isolation`) is **guilty** -- unless the black box clears it
  (it names another call as running, or none, and the cause is not
  ``memory_exceeded``): with ``executor_wedged`` it fails
  at once (the same code would wedge again); with any other cause it spends an
  attempt and is retried, alone again, while attempts remain, and then fails
  with the cause as its error kind and the loss's message (exit status or
  signal, the memory limit).
* Any other suspect gets its attempt back and is marked ``suspect``: from now
  on it runs only in isolation, so a second loss names it for certain while
  its neighbours go on.
* Every other call (it had not started, or was not suspected) gets its attempt
  back and goes to the head of its task's queue: an innocent call never loses
  an attempt to a neighbour's crash.
* A safety net for losses nobody can attribute (no black box, and the culprit
  sent no frame before it killed the process, so it is not among the started
  calls): a call bound through :data:`UNATTRIBUTED_LOSSES_TO_SUSPECT` such losses
  becomes a suspect -- otherwise such a culprit would take its executor down
  again and again without ever being blamed. It costs an innocent call only a
  run in isolation, never an attempt.

So every loss either spends an attempt of exactly the call it proves guilty,
or spends none: a call ends once (success, its own failure, or cancellation)
and the failure report names the culprit, never a neighbour.

Calls whose bind was never confirmed get their attempt back as a failed bind
would (:func:`~.release.unbind_attempt`). Parents are handled before their
sub-calls (a parent going back to READY cancels its subtree), and no command
names the lost executor.
"""

from __future__ import annotations

from typing import Final

from .commands import DispatchCommand
from .lifecycle import (
    CoreState,
    cancel_subtree,
    fail_attempt,
    mark_dirty,
    release_executor,
    release_wait,
    requeue_front,
)
from .release import unbind_attempt
from .state import DispatchCallContext, ExecutorState, move
from .types import (
    ERR_EXECUTOR_WEDGED,
    ERR_MEMORY_EXCEEDED,
    ERR_TRANSPORT_LOST,
    LOSS_CAUSES_BLAMING,
    CallError,
    CallState,
    ExecutorLossReport,
)

__all__ = ["UNATTRIBUTED_LOSSES_TO_SUSPECT", "suspect_ids", "take_back_calls"]

#: Losses that named no certain running call (a blaming cause) a call may be bound
#: through unsuspected; the next one makes it a suspect.
UNATTRIBUTED_LOSSES_TO_SUSPECT: Final = 2

_READY: Final = CallState.READY
_RUNNING: Final = CallState.RUNNING
_WAITING: Final = CallState.WAITING


def suspect_ids(report: ExecutorLossReport, bound_ids: frozenset[str]) -> frozenset[str]:
    """The call ids the loss makes suspects of (``bound_ids``: every call bound there,
    the started calls when the report does not know them)."""
    if report.cause not in LOSS_CAUSES_BLAMING:
        return frozenset()
    started = bound_ids if report.started_call_ids is None else report.started_call_ids
    if report.cause == ERR_MEMORY_EXCEEDED:
        running = report.running_call_id
        return started if running is None else started | {running}
    if report.running_call_known:
        running = report.running_call_id
        return frozenset() if running is None else frozenset((running,))
    return started


def _root_of(ctx: DispatchCallContext) -> DispatchCallContext:
    while ctx.parent is not None:
        ctx = ctx.parent
    return ctx


def _host_guilty(
    report: ExecutorLossReport,
    host: DispatchCallContext,
    calls: dict[str, DispatchCallContext],
) -> bool:
    """Whether the suspect running alone on the lost executor caused the loss: yes,
    unless the black box names another call (or none) as running -- which does not
    clear it of holding memory."""
    if report.cause == ERR_MEMORY_EXCEEDED or not report.running_call_known:
        return True
    running = report.running_call_id
    ctx = None if running is None else calls.get(running)
    return ctx is not None and _root_of(ctx) is host


def take_back_calls(
    core: CoreState,
    ex: ExecutorState,
    now_ms: int,
    out: list[DispatchCommand],
    report: ExecutorLossReport,
) -> None:
    """``ex`` was lost: sort its calls by the rules above."""
    host = ex.isolating
    core.executors.mark_lost(ex)
    stats = core.stats
    stats.executor_losses += 1
    calls = core.calls
    suspects: set[DispatchCallContext] = set()
    for call_id in suspect_ids(report, frozenset(ex.calls)):
        ctx = calls.get(call_id)
        if ctx is not None:
            suspects.add(_root_of(ctx))
    blaming = report.cause in LOSS_CAUSES_BLAMING
    unattributed = blaming and not report.running_call_known
    host_guilty = host is not None and blaming and _host_guilty(report, host, calls)
    what = report.message or f"executor {ex.executor_id} lost"
    lost = CallError(
        kind=ERR_TRANSPORT_LOST,
        message=f"executor {ex.executor_id} lost ({what}); dispatched again",
        retryable=True,
    )
    innocents: list[DispatchCallContext] = []
    for ctx in sorted(ex.calls.values(), key=lambda c: len(c.ancestry)):
        if ctx.executor is not ex or (ctx.state is not _RUNNING and ctx.state is not _WAITING):
            continue  # ended or moved while an ancestor was handled
        if not ctx.bound:
            unbind_attempt(core, ctx, now_ms, out)
        elif ctx.is_subcall:
            fail_attempt(core, ctx, lost, now_ms, out, executor_lost=True)
        elif ctx is host and host_guilty:
            stats.calls_blamed += 1
            _convict(core, ctx, ex, report, what, now_ms, out)
        elif ctx.suspect or (
            ctx not in suspects
            and not (unattributed and ctx.unattributed_losses + 1 >= UNATTRIBUTED_LOSSES_TO_SUSPECT)
        ):
            if unattributed:
                ctx.unattributed_losses += 1
            _give_back(core, ctx, lost, out)
            if ctx.suspect:
                requeue_front(core, ctx)  # to the isolation queue
            else:
                innocents.append(ctx)
        else:
            stats.suspects += 1
            ctx.suspect = True
            _give_back(core, ctx, lost, out)
            requeue_front(core, ctx)
    # Back to the head of their queues in their bind order.
    for ctx in reversed(innocents):
        requeue_front(core, ctx)
    core.executors.forget_if_idle(ex)


def _give_back(
    core: CoreState, ctx: DispatchCallContext, error: CallError, out: list[DispatchCommand]
) -> None:
    """The attempt never counted: RUNNING/WAITING -> READY with the attempt returned
    (the caller queues the call)."""
    if ctx.wait_handle is not None:
        release_wait(ctx, out)
    release_executor(core, ctx, False)
    move(ctx, _READY)
    ctx.attempt_count -= 1
    ctx.error = error
    core.stats.attempts_given_back += 1
    if ctx.children:
        cancel_subtree(core, ctx, "parent_retrying", out)
    mark_dirty(core, ctx.task)


def _convict(
    core: CoreState,
    ctx: DispatchCallContext,
    ex: ExecutorState,
    report: ExecutorLossReport,
    what: str,
    now_ms: int,
    out: list[DispatchCommand],
) -> None:
    """``ctx`` ran alone on ``ex`` when it died: its attempt is spent, and its error
    names the cause (final for a wedge or when no attempt is left)."""
    kind = report.cause
    retry = kind != ERR_EXECUTOR_WEDGED and ctx.attempt_count < ctx.max_attempts
    error = CallError(
        kind=kind,
        message=(
            f"{what}: executor {ex.executor_id} died running this call alone"
            f" (attempt {ctx.attempt_count} of {ctx.max_attempts})"
        ),
        retryable=retry,
    )
    fail_attempt(core, ctx, error, now_ms, out, executor_lost=True)

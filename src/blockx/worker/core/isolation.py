"""Isolation: a suspect runs alone on an executor, so its next loss names it for sure.

Theory of operation
-------------------
A root call suspected of killing an executor (:mod:`.blame`) gets
``ctx.suspect`` for the rest of its life. Whenever it is READY to run again it
waits in the core's ``isolation_queue`` instead of its task's ready queue, and
:func:`place_isolated` -- run at the start of every ``dispatch_ready`` /
``try_dispatch_next`` -- binds it to an executor where nothing else runs:

1. an executor that drained for it (``reserved_for``) once it is empty;
2. else any open executor that is empty (giving up its reservation, if any);
3. else, unless it holds a reservation already, it *reserves* one: the open
   executor with the fewest calls bound is closed to new root calls
   (``closed_to_roots``) until it drains, and the suspect is bound there at
   the first decision that finds it empty. So a busy pool cannot starve a
   suspect, and at most one executor drains per suspect.

While the suspect's attempt is bound there the executor hosts it
(``isolating``) and stays closed to every other root call; the suspect's own
sub-calls bind next to it as usual. The mark goes with the attempt's slot
(:meth:`~.selection.ExecutorTable.release_slot`). At least one executor stays
open to ordinary calls while the pool has more than one (reservations stop at
``candidates - 1`` closed executors), so suspects and ordinary work both move.

Stale queue entries (the suspect ended, or its task stopped) are dropped here,
and so are the reservations made for them. Nothing here reads a clock.
"""

from __future__ import annotations

from .commands import DispatchCommand
from .lifecycle import CoreState, bind_call, mark_dirty
from .state import DispatchCallContext, ExecutorState

__all__ = ["place_isolated"]


def place_isolated(core: CoreState, out: list[DispatchCommand]) -> int:
    """Bind every waiting suspect that can run alone now; returns how many were bound."""
    table = core.executors
    if table.reserved:
        for draining in list(table.reserved.values()):
            held = draining.reserved_for
            if held is None or not held.awaiting_isolation:
                table.release_reservation(draining)
    queue = core.isolation_queue
    if not queue:
        return 0
    window = core.config.task_max_inflight_calls
    bound = 0
    waiting: list[DispatchCallContext] = []
    while queue:
        ctx = queue.popleft()
        if not ctx.awaiting_isolation:
            continue  # ended, or requeued elsewhere: a stale entry
        task = ctx.task
        if task.stop_dispatching:
            ctx.awaiting_isolation = False  # the drain cancels it
            mark_dirty(core, task)
            continue
        host = None if task.inflight_roots >= window else _host_for(core, ctx)
        if host is None:
            waiting.append(ctx)
            continue
        ctx.awaiting_isolation = False
        out.append(bind_call(core, ctx, host))
        table.host_isolated(host, ctx)
        bound += 1
    queue.extend(waiting)
    return bound


def _host_for(core: CoreState, ctx: DispatchCallContext) -> ExecutorState | None:
    """An empty executor for ``ctx`` now, or None (after reserving one to drain)."""
    table = core.executors
    mine: ExecutorState | None = None
    for ex in table.reserved.values():
        if ex.reserved_for is ctx:
            mine = ex
            break
    if mine is not None:
        if not table.can_isolate(mine):
            table.release_reservation(mine)  # it went bad while draining: pick again
            mine = None
        elif mine.local_inflight == 0 and mine.usable_contexts > 0:
            return mine
    candidates = table.candidates
    closed = 0
    drain: ExecutorState | None = None
    for ex in candidates:
        if ex.closed_to_roots:
            closed += 1
            continue
        if not table.can_isolate(ex) or ex.usable_contexts <= 0:
            continue
        if ex.local_inflight == 0:
            if mine is not None:
                table.release_reservation(mine)  # an empty one turned up first
            return ex
        if drain is None or ex.local_inflight < drain.local_inflight:
            drain = ex
    if (
        mine is None
        and drain is not None
        and (closed + 1 < len(candidates) or len(candidates) == 1)
    ):
        table.reserve_for(drain, ctx)
    return None

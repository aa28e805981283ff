"""CallTimers: when sleeping calls wake, when waits outlast a budget, when the call-timeout
latch fires.

Theory of operation
-------------------
Three heaps of ``(due, seq, ctx)``, in the runtime's monotonic seconds:

* **sleepers** — one entry per cooperative sleep (``SdkBridge.do_sleep`` via
  ``ExecutorRuntime.schedule_sleep``). The entry's ``seq`` is also stored on
  the context as ``sleep_token``: an entry is due only while the context still
  sleeps on that very token;
* **wait_limits** — when the IO wait of a budgeted call must be cut
  off: when its budget runs out (``SdkBridge`` arms one at a call's first wait;
  ``ExecContext.wait_cut_off_at`` says when a wait must end).
  A call has at most one live entry, the one whose due is ``ctx.wait_timer_due``,
  and it is not re-armed per wait (a call may wait thousands of times within
  one budget): when it comes due, the cut-off of the wait in progress is worked
  out afresh; a later one moves the entry there, a due one is handed to the
  runtime. An entry that comes due while its call is not waiting is spent (the
  call's next wait arms a new one). A cut-off only moves later while no wait
  is charged more than it lasted: a worker that charges more is caught when
  the entry comes due (late by the excess) or at the next safe point;
* **timeouts** — one entry per admitted call when the runtime has a
  ``call_timeout_ms`` latch.

It never reads a clock: ``now`` comes in. It never changes a context's state:
it hands the due contexts to the runtime, which queues or ends them.

A call that ends before its timer is due leaves its entry behind (lazy
deletion: cheaper than finding it). Once such entries dominate a heap it is
compacted, so a long latch over a stream of short calls never keeps the
finished contexts (and their arguments) alive; the cost is amortized O(1) per
timer. Scheduler thread only.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Final

from .context import BUDGET_CUT_OFF_STATES, ExecContext, ExecState

__all__ = ["CallTimers"]

#: Entries of ended calls tolerated in a heap beyond twice the resident calls.
_COMPACT_SLACK: Final = 64

_Heap = list[tuple[float, int, ExecContext]]


class CallTimers:
    """The sleep, wait-limit and call-timeout timers of resident calls (see the module doc).

    ``sleepers`` / ``wait_limits`` / ``timeouts`` are the heaps themselves: empty
    means no timer of that kind is pending (the scheduler checks them on every pass).
    """

    __slots__ = ("_seq", "sleepers", "timeouts", "wait_limits")

    def __init__(self) -> None:
        self.sleepers: _Heap = []
        self.wait_limits: _Heap = []
        self.timeouts: _Heap = []
        self._seq = itertools.count(1)

    def __repr__(self) -> str:
        return (
            f"CallTimers(sleeping={self.sleeping()}, wait_limits={len(self.wait_limits)}, "
            f"timeouts={len(self.timeouts)})"
        )

    def add_sleeper(self, ctx: ExecContext, due: float, *, resident: int) -> None:
        """``ctx`` sleeps until ``due``; sets its ``sleep_token``. ``resident``: the
        number of resident calls (bounds what compaction keeps)."""
        token = next(self._seq)
        ctx.sleep_token = token
        self._push(self.sleepers, (due, token, ctx), resident)

    def add_wait_limit(self, ctx: ExecContext, due: float, *, resident: int) -> None:
        """``ctx``'s wait-limit timer, due at ``due``; ``ctx`` has no live one."""
        ctx.wait_timer_due = due
        heap = self.wait_limits
        heapq.heappush(heap, (due, next(self._seq), ctx))
        if len(heap) > 2 * resident + _COMPACT_SLACK:
            # _live_wait_limit, inlined: this runs over every entry.
            heap[:] = [i for i in heap if i[2].wait_timer_due == i[0] and not i[2].finished]
            heapq.heapify(heap)

    def pop_cut_off_waits(self, now: float) -> Iterator[tuple[float, ExecContext]]:
        """``(cut-off time, ctx)`` of every IO wait to cut off by ``now`` (a sub-call's
        wait is never cut off by the budget: ``context.BUDGET_CUT_OFF_STATES``).

        A live entry that comes due while its call is not in such a wait (answered,
        running) is spent; one due before the wait in progress must end
        (``ctx.wait_cut_off_at()``) moves there.
        """
        heap = self.wait_limits
        while heap and heap[0][0] <= now:
            due, _, ctx = heapq.heappop(heap)
            if ctx.wait_timer_due != due or ctx.finished:
                continue  # spent earlier, or the call ended
            ctx.wait_timer_due = 0.0
            if ctx.state not in BUDGET_CUT_OFF_STATES or ctx.queued:
                continue  # not waiting, or its answer is in: the next wait arms again
            cut = ctx.wait_cut_off_at()
            if cut > now:  # a later wait than the one the entry was armed for
                ctx.wait_timer_due = cut
                heapq.heappush(heap, (cut, next(self._seq), ctx))
                continue
            yield cut, ctx

    def add_timeout(self, ctx: ExecContext, due: float, *, resident: int) -> None:
        """``ctx``'s call-timeout latch fires at ``due``."""
        self._push(self.timeouts, (due, next(self._seq), ctx), resident)

    def pop_due_sleepers(self, now: float) -> Iterator[tuple[float, ExecContext]]:
        """``(due, ctx)`` of every sleep due by ``now`` whose context still sleeps on it."""
        heap = self.sleepers
        while heap and heap[0][0] <= now:
            due, token, ctx = heapq.heappop(heap)
            if ctx.sleep_token != token or ctx.finished:
                continue  # ended, or asleep on a later timer
            if ctx.state is ExecState.WAITING_SLEEP:
                yield due, ctx

    def pop_expired_timeouts(self, now: float) -> Iterator[ExecContext]:
        """Every not yet finished context whose call-timeout latch is due by ``now``."""
        heap = self.timeouts
        while heap and heap[0][0] <= now:
            ctx = heapq.heappop(heap)[2]
            if not ctx.finished:
                yield ctx

    def next_due(self) -> float | None:
        """The earliest due time of a live timer, or None."""
        earliest: float | None = None
        for heap in (self.sleepers, self.timeouts):
            while heap and heap[0][2].finished:
                heapq.heappop(heap)
            if heap and (earliest is None or heap[0][0] < earliest):
                earliest = heap[0][0]
        heap = self.wait_limits
        while heap and not _live_wait_limit(heap[0]):
            heapq.heappop(heap)
        if heap and (earliest is None or heap[0][0] < earliest):
            earliest = heap[0][0]
        return earliest

    def sleeping(self) -> int:
        """Sleep timers of calls that have not finished."""
        return sum(1 for entry in self.sleepers if not entry[2].finished)

    @staticmethod
    def _push(heap: _Heap, entry: tuple[float, int, ExecContext], resident: int) -> None:
        heapq.heappush(heap, entry)
        if len(heap) > 2 * resident + _COMPACT_SLACK:
            heap[:] = [item for item in heap if not item[2].finished]
            heapq.heapify(heap)


def _live_wait_limit(entry: tuple[float, int, ExecContext]) -> bool:
    """The entry is its call's live wait-limit timer (not spent, the call not ended)."""
    ctx = entry[2]
    return ctx.wait_timer_due == entry[0] and not ctx.finished

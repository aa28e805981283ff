"""CallTimers: when sleeping calls wake and when the call-timeout latch fires.

Theory of operation
-------------------
Two heaps of ``(due, seq, ctx)``, in the runtime's monotonic seconds:

* **sleepers** — one entry per cooperative sleep (``SdkBridge.do_sleep`` via
  ``ExecutorRuntime.schedule_sleep``). The entry's ``seq`` is also stored on
  the context as ``sleep_token``: an entry is due only while the context still
  sleeps on that very token;
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

from .context import ExecContext, ExecState

__all__ = ["CallTimers"]

#: Entries of ended calls tolerated in a heap beyond twice the resident calls.
_COMPACT_SLACK: Final = 64

_Heap = list[tuple[float, int, ExecContext]]


class CallTimers:
    """The sleep and call-timeout timers of resident calls (see the module doc).

    ``sleepers`` / ``timeouts`` are the heaps themselves: empty means no timer
    of that kind is pending (the scheduler checks them on every pass).
    """

    __slots__ = ("_seq", "sleepers", "timeouts")

    def __init__(self) -> None:
        self.sleepers: _Heap = []
        self.timeouts: _Heap = []
        self._seq = itertools.count(1)

    def __repr__(self) -> str:
        return f"CallTimers(sleeping={self.sleeping()}, timeouts={len(self.timeouts)})"

    def add_sleeper(self, ctx: ExecContext, due: float, *, resident: int) -> None:
        """``ctx`` sleeps until ``due``; sets its ``sleep_token``. ``resident``: the
        number of resident calls (bounds what compaction keeps)."""
        token = next(self._seq)
        ctx.sleep_token = token
        self._push(self.sleepers, (due, token, ctx), resident)

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

"""The executor table and ``select_executor``: where a root call runs.

Theory of operation
-------------------
:class:`ExecutorTable` keeps one :class:`ExecutorState` per executor: the last
:class:`~blockx.worker.core.types.ExecutorSnapshot` the adapter reported
(heartbeat-derived, up to 500 ms old) plus what the core knows better and
sooner -- the calls it bound there itself (``local_inflight``, ``calls``) and
the completions it saw since the heartbeat (``completed_since_snapshot``).

``select_executor(now_ms)`` is the seed's Filter -> Score. An executor is
*eligible* unless

* it is unhealthy (or lost, or missing from the latest snapshot);
* its scheduler is stalled: it reports a running call and its scheduler loop
  has not moved for more than ``stall_timeout_ms`` (a wedged executor; the
  runtime's backstop will kill it, meanwhile it gets no work);
* ``headroom = usable_contexts - local_inflight <= 0``;
* ``runnable_count - completed_since_snapshot >= executor_max_runnable``
  (the heartbeat's runnable count, compensated by completions seen since);
* ``local_inflight >= executor_max_inflight``;
* ``memory_bytes >= executor_memory_high_watermark`` (when that is set).

Among eligible executors the best has the fewest runnable calls, then the
fewest local in-flight calls, then the most headroom, then the smallest
executor id.

With ``executor_selection_sample_size = 0`` the answer is the exact best, as a
full scan would find it. Up to :data:`SCAN_MAX_EXECUTORS` (4)
selectable executors it *is* a full scan: with two executors a scan costs less
than keeping a heap current (two pushes per call, one on bind and one on
release; bench/dispatcher_select.py). With more, it is found without scanning:
the table keeps a heap
of ``(runnable, inflight, -headroom, executor_id)`` entries, pushes a fresh
entry (numbered; the number becomes the executor's ``version``) whenever one
of those values changes, and on selection discards entries that are out of
date or whose executor fails the Filter. A discarded executor gets a new entry with its next
change (only time makes an executor stalled, and only a new snapshot, which
rebuilds the heap, un-stalls it), so every eligible executor always has a
current entry and the heap's first valid entry is the scan's answer:
O(log executors) per change instead of O(executors) per decision. The table
switches between the two whenever the set of selectable executors changes
(a snapshot, a loss), rebuilding the heap when it starts using it.

With ``executor_selection_sample_size = N > 0`` only the first N eligible
executors are scored (power-of-d sampling, the seed's cheap approximation),
scanning from a start that rotates by one executor per decision so that
samples spread over the pool instead of always favouring the lowest ids.
(The seed's "first N eligible" come out of a Go map, whose iteration order is
randomised per range: in effect a moving sample too. The rotation is that
spread made deterministic, as the core takes no randomness of its own.)
N >= the number of executors is the seed's literal full scan.

Sub-calls never go through selection: they run where their parent runs
(:meth:`ExecutorTable.can_host_subcall`).

The table owns the slot accounting: :meth:`ExecutorTable.take_slot` and
:meth:`ExecutorTable.release_slot` (called by :mod:`.lifecycle` on bind and
release) keep ``local_inflight == len(calls)`` and the heap in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from heapq import heapify, heappop, heappush
from itertools import islice
from typing import TYPE_CHECKING

from .config import DispatcherConfig
from .types import ExecutorSnapshot

if TYPE_CHECKING:
    from .state import DispatchCallContext

__all__ = ["SCAN_MAX_EXECUTORS", "ExecutorState", "ExecutorTable"]

#: Stands for "no limit" in comparisons.
_UNLIMITED = 1 << 62
#: ``stalled_after_ms`` of an executor that runs no call.
_NEVER = 1 << 62
#: Exact selection scans up to this many selectable executors, keeps a heap above.
SCAN_MAX_EXECUTORS = 4


class ExecutorState:
    """One executor as the core sees it.

    ``runnable``, ``selectable`` and ``stalled_after_ms`` are derived when a
    snapshot is applied (and ``runnable`` on every completion) so that the
    selection loop reads one attribute per filter.
    """

    __slots__ = (
        "calls",
        "completed_since_snapshot",
        "executor_id",
        "healthy",
        "heartbeat_seq",
        "inflight_count",
        "last_scheduler_active_at_ms",
        "local_inflight",
        "lost",
        "memory_bytes",
        "present",
        "runnable",
        "runnable_count",
        "running_call_id",
        "selectable",
        "stalled_after_ms",
        "usable_contexts",
        "version",
    )

    def __init__(self, executor_id: str) -> None:
        self.executor_id = executor_id
        #: In the latest snapshot.
        self.present = False
        #: Declared lost (``handle_executor_lost``) and not seen in a snapshot since.
        self.lost = False
        self.healthy = False
        self.usable_contexts = 0
        self.runnable_count = 0
        self.inflight_count = 0
        self.heartbeat_seq = -1
        self.running_call_id: str | None = None
        self.last_scheduler_active_at_ms = 0
        self.memory_bytes = 0
        #: Calls the core has bound here (RUNNING or WAITING, roots and sub-calls).
        self.local_inflight = 0
        #: Terminal reports for calls here since the snapshot's heartbeat.
        self.completed_since_snapshot = 0
        #: ``max(0, runnable_count - completed_since_snapshot)``: the heartbeat's
        #: runnable count with completion compensation.
        self.runnable = 0
        #: Healthy and under the memory watermark (the snapshot-time filters).
        self.selectable = False
        #: With a running call, the scheduler counts as stalled once ``now_ms``
        #: passes this; ``_NEVER`` without one.
        self.stalled_after_ms = _NEVER
        #: The bound calls by id (insertion order = bind order).
        self.calls: dict[str, DispatchCallContext] = {}
        #: Set (to a table-wide unique number) on every change of the score or
        #: filter inputs; heap entries carrying another number are out of date.
        self.version = 0

    def apply(self, snap: ExecutorSnapshot, memory_watermark: int, stall_timeout_ms: int) -> None:
        """Take the values of a new snapshot of this executor."""
        if snap.heartbeat_seq != self.heartbeat_seq:
            self.completed_since_snapshot = 0
        self.present = True
        self.lost = False
        self.healthy = snap.healthy
        self.usable_contexts = snap.usable_contexts
        self.runnable_count = snap.runnable_count
        self.inflight_count = snap.inflight_count
        self.heartbeat_seq = snap.heartbeat_seq
        self.running_call_id = snap.running_call_id
        self.last_scheduler_active_at_ms = snap.last_scheduler_active_at_ms
        self.memory_bytes = snap.memory_bytes
        self.runnable = max(0, snap.runnable_count - self.completed_since_snapshot)
        self.selectable = snap.healthy and not (
            memory_watermark and snap.memory_bytes >= memory_watermark
        )
        self.stalled_after_ms = (
            _NEVER
            if snap.running_call_id is None
            else snap.last_scheduler_active_at_ms + stall_timeout_ms
        )

    @property
    def headroom(self) -> int:
        return self.usable_contexts - self.local_inflight

    def __repr__(self) -> str:
        status = "lost" if self.lost else ("healthy" if self.healthy else "unhealthy")
        if not self.present:
            status += ",absent"
        return (
            f"<ExecutorState {self.executor_id} {status} inflight={self.local_inflight}"
            f" headroom={self.headroom} runnable={self.runnable} hb={self.heartbeat_seq}>"
        )


class ExecutorTable:
    """Executors by id, the selectable ones in id order, and the selection policy."""

    __slots__ = (
        "_by_id",
        "_compact_at",
        "_cursor",
        "_heap",
        "_max_inflight",
        "_max_runnable",
        "_order",
        "_order_twice",
        "_push_seq",
        "_sample_size",
        "_stall_timeout_ms",
        "_use_heap",
        "_watermark",
        "scan_max_executors",
        "select",
    )

    def __init__(self, config: DispatcherConfig) -> None:
        self._by_id: dict[str, ExecutorState] = {}
        #: Present, not lost, sorted by id: the candidates of ``select_executor``.
        self._order: list[ExecutorState] = []
        #: ``_order + _order``: a rotated scan is one slice of it.
        self._order_twice: list[ExecutorState] = []
        self._cursor = 0
        self._max_inflight = config.executor_max_inflight or _UNLIMITED
        self._max_runnable = config.executor_max_runnable or _UNLIMITED
        self._sample_size = config.executor_selection_sample_size
        self._watermark = config.executor_memory_high_watermark
        self._stall_timeout_ms = config.stall_timeout_ms
        #: Exact selection scans up to this many selectable executors and keeps
        #: the heap above (tests set it, then apply a snapshot, to force a path).
        self.scan_max_executors = SCAN_MAX_EXECUTORS
        #: Exact selection (sample size 0) over more than ``scan_max_executors``
        #: uses the heap; otherwise a scan. Set by ``_rebuild_order``.
        self._use_heap = False
        self._heap: list[_HeapEntry] = []
        self._compact_at = 64
        #: ``select_executor`` as the current policy's method, chosen when the set of
        #: selectable executors changes (one call less per release decision).
        self.select: Callable[[int], ExecutorState | None] = self._select_exact_scan
        self._choose_select()
        #: Numbers heap entries; an executor's ``version`` is its current one.
        self._push_seq = 0

    # --- lookup --------------------------------------------------------------

    def get(self, executor_id: str) -> ExecutorState | None:
        return self._by_id.get(executor_id)

    def __iter__(self) -> Iterator[ExecutorState]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def can_host_subcall(self, ex: ExecutorState) -> bool:
        """Whether a sub-call may be bound next to its parent on ``ex`` now."""
        return ex.present and ex.healthy and not ex.lost

    # --- slots -------------------------------------------------------------------

    def take_slot(self, ex: ExecutorState, ctx: DispatchCallContext) -> None:
        """``ctx`` is bound on ``ex``."""
        ex.local_inflight += 1
        ex.calls[ctx.call_id] = ctx
        if self._use_heap:
            self._push(ex)

    def release_slot(self, ex: ExecutorState, ctx: DispatchCallContext, completed: bool) -> None:
        """``ctx`` no longer holds a slot on ``ex``; ``completed``: the executor ended it."""
        ex.local_inflight -= 1
        del ex.calls[ctx.call_id]
        if completed:
            ex.completed_since_snapshot += 1
            if ex.runnable > 0:
                ex.runnable -= 1
        if not ex.present:
            self.forget_if_idle(ex)
        elif self._use_heap:
            self._push(ex)

    def _push(self, ex: ExecutorState) -> None:
        # Versions are unique among all entries, so that tuple comparison
        # never reaches the executor objects.
        self._push_seq += 1
        ex.version = self._push_seq
        if ex.lost:
            return
        heap = self._heap
        heappush(
            heap,
            (
                ex.runnable,
                ex.local_inflight,
                ex.local_inflight - ex.usable_contexts,
                ex.executor_id,
                ex.version,
                ex,
            ),
        )
        if len(heap) > self._compact_at:
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        """One current entry per selectable executor (drops every stale one)."""
        heap: list[_HeapEntry] = []
        for ex in self._order:
            self._push_seq += 1
            ex.version = self._push_seq
            heap.append(
                (
                    ex.runnable,
                    ex.local_inflight,
                    ex.local_inflight - ex.usable_contexts,
                    ex.executor_id,
                    ex.version,
                    ex,
                )
            )
        heapify(heap)
        self._heap = heap
        self._compact_at = 4 * len(heap) + 64

    # --- updates ---------------------------------------------------------------

    def apply_snapshots(self, snapshots: Iterable[ExecutorSnapshot]) -> None:
        """Replace the view with ``snapshots`` (executors missing become absent)."""
        by_id = self._by_id
        seen: set[str] = set()
        for snap in snapshots:
            ex = by_id.get(snap.executor_id)
            if ex is None:
                ex = by_id[snap.executor_id] = ExecutorState(snap.executor_id)
            ex.apply(snap, self._watermark, self._stall_timeout_ms)
            seen.add(snap.executor_id)
        for ex in list(by_id.values()):
            if ex.executor_id not in seen:
                ex.present = False
                self.forget_if_idle(ex)
        self._rebuild_order()

    def mark_lost(self, ex: ExecutorState) -> None:
        """Exclude ``ex`` from selection until a snapshot shows it again."""
        ex.lost = True
        self._rebuild_order()

    def forget_if_idle(self, ex: ExecutorState) -> None:
        """Drop the record of an absent executor once no call is bound there."""
        if not ex.present and not ex.calls and self._by_id.get(ex.executor_id) is ex:
            del self._by_id[ex.executor_id]

    def _rebuild_order(self) -> None:
        self._order = sorted(
            (ex for ex in self._by_id.values() if ex.present and not ex.lost),
            key=lambda ex: ex.executor_id,
        )
        self._order_twice = self._order + self._order
        if self._cursor >= len(self._order):
            self._cursor = 0
        self._use_heap = self._sample_size == 0 and len(self._order) > self.scan_max_executors
        if self._use_heap:
            self._rebuild_heap()
        else:
            self._heap = []
        self._choose_select()

    def _choose_select(self) -> None:
        if self._use_heap:
            self.select = self._select_from_heap
        elif self._sample_size == 0:
            self.select = self._select_exact_scan
        else:
            self.select = self._select_by_scan

    # --- Filter -> Score -------------------------------------------------------

    def is_eligible(self, ex: ExecutorState, now_ms: int) -> bool:
        """The Filter step for one executor."""
        inflight = ex.local_inflight
        return (
            ex.present
            and not ex.lost
            and ex.selectable
            and ex.usable_contexts - inflight > 0
            and inflight < self._max_inflight
            and ex.runnable < self._max_runnable
            and now_ms <= ex.stalled_after_ms
        )

    def select_executor(self, now_ms: int) -> ExecutorState | None:
        """The best eligible executor for a root call, or None if none is eligible."""
        return self.select(now_ms)

    def _select_exact_scan(self, now_ms: int) -> ExecutorState | None:
        """The exact best by a full scan in id order (small pools; see the module docstring)."""
        max_inflight = self._max_inflight
        max_runnable = self._max_runnable
        best: ExecutorState | None = None
        best_runnable = best_inflight = best_headroom = 0
        for ex in self._order:
            inflight = ex.local_inflight
            headroom = ex.usable_contexts - inflight
            runnable = ex.runnable
            if (
                headroom <= 0
                or inflight >= max_inflight
                or runnable >= max_runnable
                or not ex.selectable
                or now_ms > ex.stalled_after_ms
            ):
                continue
            # Score: fewer runnable, fewer in flight, more headroom; id order breaks ties.
            if (
                best is None
                or runnable < best_runnable
                or (
                    runnable == best_runnable
                    and (
                        inflight < best_inflight
                        or (inflight == best_inflight and headroom > best_headroom)
                    )
                )
            ):
                best = ex
                best_runnable = runnable
                best_inflight = inflight
                best_headroom = headroom
        return best

    def _select_from_heap(self, now_ms: int) -> ExecutorState | None:
        heap = self._heap
        max_inflight = self._max_inflight
        max_runnable = self._max_runnable
        while heap:
            entry = heap[0]
            ex = entry[5]
            if entry[4] == ex.version:
                inflight = ex.local_inflight
                if (
                    ex.usable_contexts - inflight > 0
                    and inflight < max_inflight
                    and ex.runnable < max_runnable
                    and ex.selectable
                    and now_ms <= ex.stalled_after_ms
                    and not ex.lost
                    and ex.present
                ):
                    return ex
            # Out of date, or filtered: its next change pushes a new entry.
            heappop(heap)
        return None

    def _select_by_scan(self, now_ms: int) -> ExecutorState | None:
        order = self._order
        n = len(order)
        if n == 0:
            return None
        sample = self._sample_size
        rotated = 0 < sample < n
        if rotated:
            start = self._cursor
            self._cursor = start + 1 if start + 1 < n else 0
            candidates: Iterable[ExecutorState] = islice(self._order_twice, start, start + n)
        else:
            sample = n
            candidates = order
        max_inflight = self._max_inflight
        max_runnable = self._max_runnable
        best: ExecutorState | None = None
        best_runnable = best_inflight = best_headroom = 0
        for ex in candidates:
            inflight = ex.local_inflight
            headroom = ex.usable_contexts - inflight
            runnable = ex.runnable
            if (
                headroom <= 0
                or inflight >= max_inflight
                or runnable >= max_runnable
                or not ex.selectable
                or now_ms > ex.stalled_after_ms
            ):
                continue
            # Score: fewer runnable, fewer in flight, more headroom, smaller id.
            # An unrotated scan walks in id order, so keeping the incumbent on a
            # tie already prefers the smaller id.
            if (
                best is None
                or runnable < best_runnable
                or (
                    runnable == best_runnable
                    and (
                        inflight < best_inflight
                        or (
                            inflight == best_inflight
                            and (
                                headroom > best_headroom
                                or (
                                    rotated
                                    and headroom == best_headroom
                                    and ex.executor_id < best.executor_id
                                )
                            )
                        )
                    )
                )
            ):
                best = ex
                best_runnable = runnable
                best_inflight = inflight
                best_headroom = headroom
            sample -= 1
            if sample == 0:
                break
        return best

    def __repr__(self) -> str:
        if self._sample_size:
            mode = f"sample={self._sample_size}"
        else:
            mode = "exact (heap)" if self._use_heap else "exact (scan)"
        return f"<ExecutorTable {list(self._by_id)} selectable={len(self._order)} {mode}>"


#: (runnable, local_inflight, -headroom, executor_id, version, executor)
_HeapEntry = tuple[int, int, int, str, int, ExecutorState]

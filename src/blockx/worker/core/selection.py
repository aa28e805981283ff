"""The executor table and ``select_executor``: where a root call runs.

Theory of operation
-------------------
:class:`ExecutorTable` keeps one :class:`~.state.ExecutorState` per executor: the last
:class:`~blockx.worker.core.types.ExecutorSnapshot` the adapter reported
(heartbeat-derived, up to 500 ms old) plus what the core knows better and
sooner -- the calls it bound there itself (``local_inflight``, ``calls``) and
the completions it saw since the heartbeat (``completed_since_snapshot``).

``select_executor(now_ms)`` is the seed's Filter -> Score, written once each:
:func:`is_eligible` (the Filter) and :func:`score` (the Score key, smaller is
better). An executor is *eligible* unless

* it is unhealthy (or lost, or missing from the latest snapshot);
* it is closed to new root calls: it runs a suspect in isolation, or drains
  to take one (:mod:`.isolation`);
* its scheduler is stalled: its last heartbeat reports the running call past
  its own stall threshold (``config.stall_threshold_ms``: the call's budget +
  a margin). Judged only from what a heartbeat says, never extrapolated from
  silence: a paused executor is not stalled, a silent one is the heartbeat
  timeout's business;
* ``headroom = usable_contexts - local_inflight <= 0``;
* ``runnable_count - completed_since_snapshot >= executor_max_runnable``
  (the heartbeat's runnable count, compensated by completions seen since);
* ``local_inflight >= executor_max_inflight``;
* ``memory_bytes >= executor_memory_high_watermark`` (when that is set).

The score is ``(local_inflight, runnable, -headroom, executor_id)``: the fewest
calls bound there first (exact: the core counts its own binds, running and
queued on the executor alike), so work spreads over every executor from the
first call -- ranking by the heartbeat's runnable count first would send a
burst of calls released between two heartbeats to the one executor whose stale
count looked smallest. The runnable count then breaks ties (it sees calls the
executor queued that the core does not count), then headroom, then the id.

With ``executor_selection_sample_size = 0`` the answer is the exact best, as a
full scan would find it. Up to :data:`SCAN_MAX_EXECUTORS` (4) selectable
executors it *is* a full scan; with more, the table keeps a heap of score keys
(each numbered; the number becomes the executor's ``version``), pushes a fresh
entry whenever an executor's score or filter inputs change, and on selection
discards entries that are out of date or whose executor fails the Filter. A
discarded executor gets a new entry with its next change (its filter inputs
change only with a snapshot, which rebuilds the heap, or with a bind, a release
or an isolation change, which push one), so every eligible executor always has a
current entry and the heap's first valid entry is the scan's answer.

With ``executor_selection_sample_size = N > 0`` only the first N eligible
executors are scored (power-of-d sampling, the seed's cheap approximation),
scanning from a start that rotates by one executor per decision so that
samples spread over the pool instead of always favouring the lowest ids.
N >= the number of executors is the seed's literal full scan.

Sub-calls never go through selection: they run where their parent runs
(:meth:`ExecutorTable.can_host_subcall`), isolation or not.

The table owns the slot accounting: :meth:`ExecutorTable.take_slot` and
:meth:`ExecutorTable.release_slot` (called by :mod:`.lifecycle` on bind and
release) keep ``local_inflight == len(calls)`` and the heap in step; and the
isolation marks (:meth:`ExecutorTable.host_isolated`, :meth:`reserve_for`,
:meth:`release_reservation`), which close an executor to other root calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from heapq import heapify, heappop, heappush
from itertools import islice

from .config import DispatcherConfig
from .state import DispatchCallContext, ExecutorState
from .types import ExecutorSnapshot

__all__ = ["SCAN_MAX_EXECUTORS", "ExecutorTable", "is_eligible", "score"]

#: Stands for "no limit" in comparisons.
_UNLIMITED = 1 << 62
#: Exact selection scans up to this many selectable executors, keeps a heap above.
SCAN_MAX_EXECUTORS = 4


def is_eligible(ex: ExecutorState, max_inflight: int, max_runnable: int) -> bool:
    """The Filter: whether a new root call may be placed on ``ex`` now (the one
    eligibility predicate of every selection strategy)."""
    inflight = ex.local_inflight
    return (
        ex.selectable
        and ex.present
        and not ex.lost
        and not ex.closed_to_roots
        and not ex.stalled
        and ex.usable_contexts - inflight > 0
        and inflight < max_inflight
        and ex.runnable < max_runnable
    )


def score(ex: ExecutorState) -> tuple[int, int, int, str]:
    """The Score key (smaller is better): the fewest calls bound, then the fewest
    runnable, then the most headroom, then the smallest id."""
    inflight = ex.local_inflight
    return (inflight, ex.runnable, inflight - ex.usable_contexts, ex.executor_id)


class ExecutorTable:
    """Executors by id, the selectable ones in id order, and the selection policy."""

    __slots__ = (
        "_by_id",
        "_compact_at",
        "_config",
        "_cursor",
        "_heap",
        "_max_inflight",
        "_max_runnable",
        "_order",
        "_order_twice",
        "_push_seq",
        "_sample_size",
        "_use_heap",
        "reserved",
        "scan_max_executors",
        "select",
    )

    def __init__(self, config: DispatcherConfig) -> None:
        self._config = config
        self._by_id: dict[str, ExecutorState] = {}
        #: Present, not lost, sorted by id: the candidates of ``select_executor``.
        self._order: list[ExecutorState] = []
        #: ``_order + _order``: a rotated scan is one slice of it.
        self._order_twice: list[ExecutorState] = []
        self._cursor = 0
        self._max_inflight = config.executor_max_inflight or _UNLIMITED
        self._max_runnable = config.executor_max_runnable or _UNLIMITED
        self._sample_size = config.executor_selection_sample_size
        #: Exact selection scans up to this many selectable executors and keeps
        #: the heap above (tests set it, then apply a snapshot, to force a path).
        self.scan_max_executors = SCAN_MAX_EXECUTORS
        #: Exact selection (sample size 0) over more than ``scan_max_executors``
        #: uses the heap; otherwise a scan. Set by ``_rebuild_order``.
        self._use_heap = False
        self._heap: list[_HeapEntry] = []
        self._compact_at = 64
        #: Executors draining for a suspect (``reserved_for`` set), by id.
        self.reserved: dict[str, ExecutorState] = {}
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

    @property
    def candidates(self) -> list[ExecutorState]:
        """Present and not lost, in id order (read-only)."""
        return self._order

    def can_host_subcall(self, ex: ExecutorState) -> bool:
        """Whether a sub-call may be bound next to its parent on ``ex`` now."""
        return ex.present and ex.healthy and not ex.lost

    def can_isolate(self, ex: ExecutorState) -> bool:
        """Whether ``ex`` may take (or drain for) a suspect: the Filter without the
        load and isolation tests."""
        return ex.selectable and ex.present and not ex.lost and not ex.stalled

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
        if ex.isolating is ctx:
            ex.isolating = None
            ex.closed_to_roots = ex.reserved_for is not None
        if not ex.present:
            self.forget_if_idle(ex)
        elif self._use_heap:
            self._push(ex)

    # --- isolation marks ---------------------------------------------------------------

    def host_isolated(self, ex: ExecutorState, ctx: DispatchCallContext) -> None:
        """``ctx`` (a suspect, just bound on ``ex``) runs there alone until its attempt ends."""
        if ex.reserved_for is not None:
            self.release_reservation(ex)
        ex.isolating = ctx
        ex.closed_to_roots = True

    def reserve_for(self, ex: ExecutorState, ctx: DispatchCallContext) -> None:
        """Close ``ex`` to new root calls until it drains, then host ``ctx`` there."""
        ex.reserved_for = ctx
        ex.closed_to_roots = True
        self.reserved[ex.executor_id] = ex

    def release_reservation(self, ex: ExecutorState) -> None:
        """``ex`` no longer drains for a suspect (it took it, the suspect ended, or
        ``ex`` was lost)."""
        ex.reserved_for = None
        ex.closed_to_roots = ex.isolating is not None
        self.reserved.pop(ex.executor_id, None)
        if self._use_heap and not ex.closed_to_roots:
            self._push(ex)

    def _push(self, ex: ExecutorState) -> None:
        # Versions are unique among all entries, so that tuple comparison
        # never reaches the executor objects.
        self._push_seq += 1
        ex.version = self._push_seq
        if ex.lost:
            return
        heap = self._heap
        heappush(heap, (score(ex), ex.version, ex))
        if len(heap) > self._compact_at:
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        """One current entry per selectable executor (drops every stale one)."""
        heap: list[_HeapEntry] = []
        for ex in self._order:
            self._push_seq += 1
            ex.version = self._push_seq
            heap.append((score(ex), ex.version, ex))
        heapify(heap)
        self._heap = heap
        self._compact_at = 4 * len(heap) + 64

    # --- updates ---------------------------------------------------------------

    def apply_snapshots(self, snapshots: Iterable[ExecutorSnapshot]) -> None:
        """Replace the view with ``snapshots`` (executors missing become absent)."""
        by_id = self._by_id
        config = self._config
        seen: set[str] = set()
        for snap in snapshots:
            ex = by_id.get(snap.executor_id)
            if ex is None:
                ex = by_id[snap.executor_id] = ExecutorState(snap.executor_id)
            ex.apply(snap, config)
            seen.add(snap.executor_id)
        for ex in list(by_id.values()):
            if ex.executor_id not in seen:
                ex.present = False
                if ex.reserved_for is not None:
                    self.release_reservation(ex)
                self.forget_if_idle(ex)
        self._rebuild_order()

    def mark_lost(self, ex: ExecutorState) -> None:
        """Exclude ``ex`` from selection until a snapshot shows it again."""
        ex.lost = True
        if ex.reserved_for is not None:
            self.release_reservation(ex)
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
        """The Filter step for one executor (``now_ms`` is kept for callers: the
        Filter no longer depends on time)."""
        return is_eligible(ex, self._max_inflight, self._max_runnable)

    def select_executor(self, now_ms: int) -> ExecutorState | None:
        """The best eligible executor for a root call, or None if none is eligible."""
        return self.select(now_ms)

    def _select_exact_scan(self, now_ms: int) -> ExecutorState | None:
        """The exact best by a full scan (small pools; see the module docstring)."""
        max_inflight = self._max_inflight
        max_runnable = self._max_runnable
        best: ExecutorState | None = None
        best_key: tuple[int, int, int, str] | None = None
        for ex in self._order:
            if not is_eligible(ex, max_inflight, max_runnable):
                continue
            key = score(ex)
            if best_key is None or key < best_key:
                best = ex
                best_key = key
        return best

    def _select_from_heap(self, now_ms: int) -> ExecutorState | None:
        heap = self._heap
        max_inflight = self._max_inflight
        max_runnable = self._max_runnable
        while heap:
            _key, version, ex = heap[0]
            if version == ex.version and is_eligible(ex, max_inflight, max_runnable):
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
        if 0 < sample < n:
            start = self._cursor
            self._cursor = start + 1 if start + 1 < n else 0
            candidates: Iterable[ExecutorState] = islice(self._order_twice, start, start + n)
        else:
            sample = n
            candidates = order
        max_inflight = self._max_inflight
        max_runnable = self._max_runnable
        best: ExecutorState | None = None
        best_key: tuple[int, int, int, str] | None = None
        for ex in candidates:
            if not is_eligible(ex, max_inflight, max_runnable):
                continue
            key = score(ex)
            if best_key is None or key < best_key:
                best = ex
                best_key = key
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


#: (score key, version, executor)
_HeapEntry = tuple[tuple[int, int, int, str], int, ExecutorState]

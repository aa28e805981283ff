"""Where a cluster run's calls go: the driver's pure bookkeeping (no Ray, no clock, no IO).

Theory of operation
-------------------
The driver of ``blockx run --ray`` (:mod:`blockx.cluster.driver`) streams a task's
calls to one node worker per Ray node. Every decision it takes is made here, on plain
values, so that it can be tested call by call without a cluster:

* **Nodes** (:class:`NodeSlot`) have a *credit window*: the calls placed on a node and
  not yet settled (buffered + in flight) never exceed it, so a slow node is not flooded
  and the driver's memory stays flat however long the stream.
* **Choice** (:meth:`Placement.place`): a call goes to the node its *call key* ranks
  first by rendezvous hashing (HRW: the highest ``blake2b(node, key)``) -- identical
  calls meet on one node, where the task's call cache and singleflight answer them --
  unless that node's window is full (saturated); then it goes to the node with the
  least outstanding calls that has room. New calls are read only while the calls
  outstanding are under half the windows' sum (:attr:`Placement.budget`), so in the
  steady state no window is full and equal keys always meet; a slow or hot node
  fills its window and sheds the rest. A node that joins takes its share of keys.
* **Batches** (:meth:`Placement.take_batch`): a node's placed calls leave as one batch
  (one actor method call). Batch sizes adapt: a node whose batch left full while it
  had another in flight gets twice the size next time (up to ``max_batch``), so a
  node that keeps its window full is fed in few, large method calls.
* **Results** (:meth:`Placement.settle`) are accepted once per call index: a batch
  answered after it was written off (its node was declared lost) or twice is dropped,
  so every row is written exactly once.
* **Loss** (:meth:`Placement.lose_node`, :meth:`Placement.lose_batch`): the calls of
  the lost batches count one ``node_lost`` attempt each; those still under
  ``max_attempts`` are handed back for placement on other nodes (before any new call
  is read), the others are :class:`LostCall` failures -- as a local call whose
  attempts ran out. Calls buffered and never sent are handed back without an attempt.
  A batch holds calls of one count of ``node_lost`` attempts (:attr:`Batch.lost_attempts`)
  so that the node runs them with what is left of ``max_attempts``.
* **Rows in call order** (:meth:`Placement.take_writable`): every call that ended --
  settled with its output, failed for good (``node_lost``) or cancelled unsent -- closes
  its slot; the outputs of the contiguous prefix of closed slots leave together, so
  rows are written in call order whatever order the nodes answer in. The reorder
  buffer is bounded: the calls read and not yet written (:attr:`Placement.unwritten`)
  stay under ``reorder_windows`` times the windows' sum (:meth:`Placement.has_room`),
  so a straggler stops the reading, not the memory.
* **Fairness** is not the placement's: a driver places one task's calls. Between
  tasks (``blockx serve --ray``) it is the service's admission (round robin over
  ``instance``) and each node's dispatcher, which shares the node's executors
  between the tasks' streams as a local worker shares them (docs/cluster.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, Final

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MIN_BATCH",
    "DEFAULT_REORDER_WINDOWS",
    "Batch",
    "LostCall",
    "NodeSlot",
    "Placed",
    "Placement",
    "hrw_score",
]

#: The first batch sent to a node, in calls.
DEFAULT_MIN_BATCH: Final = 64
#: The largest batch, in calls (a node's stream takes up to 8,192 calls as one batch).
DEFAULT_MAX_BATCH: Final = 4096
#: Calls read and not yet written (the reorder buffer) stay under this many windows' sums.
DEFAULT_REORDER_WINDOWS: Final = 2


_MASK: Final = (1 << 64) - 1


def node_seed(node_id: str) -> int:
    """A node's 64-bit seed for :func:`hrw_score` (computed once per node)."""
    return int.from_bytes(blake2b(node_id.encode(), digest_size=8).digest(), "big")


def _mix(x: int) -> int:
    """splitmix64's finalizer: every bit of ``x`` moves every bit of the result."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def hrw_score(node_id: str | int, key: Hashable) -> int:
    """The rendezvous weight of ``key`` on a node (its id, or its :func:`node_seed`).

    The key's own Python hash (a string or bytes keeps it once computed) mixed with the
    node's seed: only the driver ranks nodes, so the weights need to agree within its
    process only (a blake2b per node per call was ~4 µs of the driver's ~30 µs per
    call; the hash of a ``(node, key)`` tuple is cheaper still but ranks unevenly)."""
    seed = node_seed(node_id) if isinstance(node_id, str) else node_id
    return _mix(seed ^ (hash(key) & _MASK))


@dataclass(frozen=True, slots=True)
class Placed:
    """A call the driver placed: its index in the task, its call key (anything equal for
    equal calls: the driver's is the function id and the canonical JSON of the args),
    its payload."""

    index: int
    key: Hashable
    payload: Any


@dataclass(frozen=True, slots=True)
class Batch:
    """Calls sent to one node with one method call."""

    batch_id: int
    node_id: str
    calls: tuple[Placed, ...]
    #: The ``node_lost`` attempts every call of the batch has had (a batch never mixes
    #: counts: the node runs it with ``max_attempts`` minus this many).
    lost_attempts: int = 0

    def __repr__(self) -> str:
        lost = f", lost={self.lost_attempts}" if self.lost_attempts else ""
        return f"Batch({self.batch_id}, node={self.node_id[:8]}, calls={len(self.calls)}{lost})"


@dataclass(frozen=True, slots=True)
class LostCall:
    """A call whose ``node_lost`` attempts reached ``max_attempts``: a failure."""

    placed: Placed
    attempts: int


@dataclass(slots=True)
class NodeSlot:
    """One node's window, buffer and counters."""

    node_id: str
    window: int
    batch_size: int
    buffered: list[Placed] = field(default_factory=list)
    in_flight: dict[int, Batch] = field(default_factory=dict)
    outstanding: int = 0
    #: Calls settled on this node, batches it answered, calls lost with it.
    settled_calls: int = 0
    batches: int = 0
    lost_calls: int = 0
    alive: bool = True
    #: :func:`node_seed` of ``node_id``.
    seed: int = 0

    def __post_init__(self) -> None:
        self.seed = node_seed(self.node_id)

    def __repr__(self) -> str:
        return (
            f"NodeSlot({self.node_id[:8]}, outstanding={self.outstanding}/{self.window}, "
            f"buffered={len(self.buffered)}, in_flight={len(self.in_flight)}, "
            f"batch={self.batch_size}{'' if self.alive else ', lost'})"
        )

    @property
    def room(self) -> int:
        return self.window - self.outstanding


class Placement:
    """The driver's bookkeeping of one cluster run (see the module docstring)."""

    def __init__(
        self,
        *,
        max_attempts: int,
        min_batch: int = DEFAULT_MIN_BATCH,
        max_batch: int = DEFAULT_MAX_BATCH,
        reorder_windows: int = DEFAULT_REORDER_WINDOWS,
    ) -> None:
        if max_attempts < 1 or min_batch < 1 or max_batch < min_batch or reorder_windows < 1:
            raise ValueError(
                "max_attempts >= 1, reorder_windows >= 1 and 1 <= min_batch <= max_batch expected"
            )
        self.reorder_windows = reorder_windows
        #: The reorder buffer: outputs (None: no row) of ended calls from
        #: :attr:`next_to_write` on, by call index.
        self.ended: dict[int, Any] = {}
        self.next_to_write = 0
        #: One past the highest call index placed (calls are read in index order).
        self.read_count = 0
        #: The most calls read and not written at once.
        self.unwritten_peak = 0
        self.max_attempts = max_attempts
        self.min_batch = min_batch
        self.max_batch = max_batch
        self.nodes: dict[str, NodeSlot] = {}
        #: Calls handed back by a loss, placed before any new call.
        self.retry: deque[Placed] = deque()
        #: ``node_lost`` attempts by call index (calls lost at least once).
        self.lost_attempts: dict[int, int] = {}
        self.done: set[int] = set()
        self.duplicates_dropped = 0
        self._next_batch = 0
        #: Sums over the alive nodes, kept as they change (``has_room`` runs per call).
        self._outstanding = 0
        self._windows = 0
        self._alive: list[NodeSlot] = []

    def __repr__(self) -> str:
        alive = sum(1 for n in self.nodes.values() if n.alive)
        return (
            f"Placement(nodes={alive}/{len(self.nodes)}, outstanding={self.outstanding}, "
            f"retry={len(self.retry)}, done={len(self.done)})"
        )

    # --- nodes -----------------------------------------------------------------------------

    def add_node(self, node_id: str, window: int) -> NodeSlot:
        """A node that can take calls (again, after a loss: a fresh slot)."""
        if window < 1:
            raise ValueError("a node's window is at least one call")
        old = self.nodes.get(node_id)
        if old is not None and old.alive:
            self._forget(old)
        slot = NodeSlot(node_id, window, min(self.min_batch, self._batch_cap(window)))
        self.nodes[node_id] = slot
        self._alive.append(slot)
        self._windows += window
        return slot

    def _forget(self, slot: NodeSlot) -> None:
        """``slot`` leaves the alive nodes' sums (it is lost, or replaced)."""
        slot.alive = False
        self._alive.remove(slot)
        self._windows -= slot.window
        self._outstanding -= slot.outstanding

    def alive_nodes(self) -> list[NodeSlot]:
        return list(self._alive)

    @property
    def outstanding(self) -> int:
        return self._outstanding

    @property
    def budget(self) -> int:
        """New calls are read while fewer than this are outstanding: half the windows'
        sum, so a node's window fills (and its keys overflow to other nodes) only when it
        holds twice its share -- a slow or hot node -- not in the steady state."""
        return max(1, self._windows // 2)

    @property
    def reorder_limit(self) -> int:
        """The most calls read and not yet written: ``reorder_windows`` windows' sums."""
        return max(1, self.reorder_windows * self._windows)

    @property
    def unwritten(self) -> int:
        """Calls read whose rows are not written yet (in flight, or waiting for earlier ones)."""
        return self.read_count - self.next_to_write

    def has_room(self) -> bool:
        """Whether a new call can be placed now (calls handed back by a loss first, and
        the reorder buffer under its limit)."""
        return self.room() > 0

    def room(self) -> int:
        """How many new calls can be placed now: under the budget and the reorder limit
        (``has_room`` for a whole slice)."""
        if self.retry or not self._alive:
            return 0
        return max(
            0,
            min(
                max(1, self._windows // 2) - self._outstanding,
                self.reorder_limit - (self.read_count - self.next_to_write),
            ),
        )

    @staticmethod
    def _batch_cap(window: int) -> int:
        """The largest batch for a node of ``window``: an eighth of it, so that its share
        of the budget (half its window) holds about four batches -- the node works on
        some while others travel -- rather than one it would idle between."""
        return max(1, window // 8)

    # --- placing ------------------------------------------------------------------------

    def choose(self, key: Hashable) -> NodeSlot | None:
        """The node for ``key``: its HRW first unless saturated, else the least loaded
        node with room; None when every window is full."""
        alive = self._alive
        if len(alive) == 1:
            only = alive[0]
            return only if only.room > 0 else None
        best: NodeSlot | None = None
        best_score = 0
        least: NodeSlot | None = None
        h = hash(key) & _MASK
        for slot in alive:
            score = _mix(slot.seed ^ h)  # hrw_score, inlined: it runs per call and node
            if best is None or score > best_score:
                best, best_score = slot, score
            if slot.room > 0 and (least is None or slot.outstanding < least.outstanding):
                least = slot
        if best is not None and best.room > 0:
            return best
        return least

    def place(self, call: Placed) -> NodeSlot | None:
        """Buffer ``call`` on its node; None (nothing changed) when no node has room."""
        slot = self.choose(call.key)
        if slot is None:
            return None
        slot.buffered.append(call)
        slot.outstanding += 1
        self._outstanding += 1
        if call.index >= self.read_count:
            self.read_count = call.index + 1
            unwritten = self.read_count - self.next_to_write
            if unwritten > self.unwritten_peak:
                self.unwritten_peak = unwritten
        return slot

    def place_retries(self) -> int:
        """Place the calls handed back by losses, as far as windows allow; how many."""
        placed = 0
        while self.retry:
            if self.place(self.retry[0]) is None:
                break
            self.retry.popleft()
            placed += 1
        return placed

    def take_batch(self, node_id: str, *, flush: bool) -> Batch | None:
        """The next batch of ``node_id``: its buffered calls, up to its batch size, when
        they fill a batch, or the node has less than a batch in flight (it would soon
        idle), or ``flush`` (the source is exhausted or waiting). None when there is
        nothing to send now: a partial batch waits while the node is busy, so that a
        driver at its budget does not send the few calls each answer frees one by one."""
        slot = self.nodes[node_id]
        if not slot.alive or not slot.buffered:
            return None
        buffered = len(slot.buffered)
        if (
            buffered < slot.batch_size
            and not flush
            and slot.outstanding - buffered >= slot.batch_size
        ):
            return None
        size = slot.batch_size
        lost = self.lost_attempts
        k = lost.get(slot.buffered[0].index, 0) if lost else 0
        if not lost or all(lost.get(c.index, 0) == k for c in slot.buffered[:size]):
            calls = tuple(slot.buffered[:size])
            del slot.buffered[:size]
        else:  # one batch, one count of node_lost attempts (its calls' remaining budget)
            taken: list[Placed] = []
            kept: list[Placed] = []
            for c in slot.buffered:
                (taken if len(taken) < size and lost.get(c.index, 0) == k else kept).append(c)
            calls = tuple(taken)
            slot.buffered = kept
        if len(calls) == size and slot.in_flight:  # kept busy: fewer, larger method calls
            slot.batch_size = min(self.max_batch, size * 2, self._batch_cap(slot.window))
            slot.batch_size = max(slot.batch_size, size)
        self._next_batch += 1
        batch = Batch(self._next_batch, node_id, calls, k)
        slot.in_flight[batch.batch_id] = batch
        return batch

    # --- results and losses ---------------------------------------------------------------

    def settle(
        self, batch_id: int, node_id: str, outputs: Sequence[Any] | None = None
    ) -> Batch | None:
        """A node answered ``batch_id``: its calls are done, their slots closed with
        ``outputs`` (one per call, in batch order; None: none has a row). None (drop the
        answer) when that batch was written off already or its calls were settled before."""
        slot = self.nodes.get(node_id)
        batch = None if slot is None else slot.in_flight.pop(batch_id, None)
        if batch is None or slot is None:
            self.duplicates_dropped += 1
            return None
        slot.outstanding -= len(batch.calls)
        if slot.alive:
            self._outstanding -= len(batch.calls)
        slot.batches += 1
        if any(c.index in self.done for c in batch.calls):
            self.duplicates_dropped += 1
            return None
        if outputs is not None and len(outputs) != len(batch.calls):
            raise ValueError(f"{batch!r} answered with {len(outputs)} outputs")
        ended = self.ended
        for offset, c in enumerate(batch.calls):
            self.done.add(c.index)
            self.lost_attempts.pop(c.index, None)
            ended[c.index] = None if outputs is None else outputs[offset]
        slot.settled_calls += len(batch.calls)
        return batch

    def lose_batch(self, batch_id: int, node_id: str) -> list[LostCall]:
        """One batch's method call failed (its actor died): its calls count a
        ``node_lost`` attempt; returns those out of attempts (the rest go to retry)."""
        slot = self.nodes.get(node_id)
        batch = None if slot is None else slot.in_flight.pop(batch_id, None)
        if batch is None or slot is None:
            return []
        slot.outstanding -= len(batch.calls)
        if slot.alive:
            self._outstanding -= len(batch.calls)
        slot.lost_calls += len(batch.calls)
        return self._hand_back(batch.calls)

    def lose_node(self, node_id: str) -> list[LostCall]:
        """The node (or its actor) is gone: every batch in flight is lost (a ``node_lost``
        attempt each), its buffered calls are placed again without one."""
        slot = self.nodes.get(node_id)
        if slot is None or not slot.alive:
            return []
        self._forget(slot)
        # Handed back in call order, ahead of earlier hand-backs: buffered calls (the
        # newest) first prepended, then the batches in flight, the latest first.
        self.retry.extendleft(reversed(slot.buffered))
        slot.outstanding -= len(slot.buffered)
        slot.buffered = []
        exhausted: list[LostCall] = []
        for batch_id in sorted(slot.in_flight, reverse=True):
            exhausted.extend(self.lose_batch(batch_id, node_id))
        return exhausted

    def _hand_back(self, calls: Iterable[Placed]) -> list[LostCall]:
        exhausted: list[LostCall] = []
        back: list[Placed] = []
        for c in calls:
            if c.index in self.done:
                continue
            attempts = self.lost_attempts.get(c.index, 0) + 1
            self.lost_attempts[c.index] = attempts
            if attempts >= self.max_attempts:
                self.done.add(c.index)
                self.ended[c.index] = None
                exhausted.append(LostCall(c, attempts))
            else:
                back.append(c)
        self.retry.extendleft(reversed(back))
        return exhausted

    # --- the reorder buffer ----------------------------------------------------------------

    def cancel_unsent(self) -> int:
        """The run stops: the calls buffered on the nodes and those handed back by losses
        are never sent; their slots close without a row. Returns how many."""
        dropped = 0
        for slot in self._alive:
            for c in slot.buffered:
                self.ended[c.index] = None
            n = len(slot.buffered)
            dropped += n
            slot.outstanding -= n
            self._outstanding -= n
            slot.buffered = []
        for c in self.retry:
            self.ended[c.index] = None
        dropped += len(self.retry)
        self.retry.clear()
        return dropped

    def take_writable(self) -> list[Any]:
        """The outputs of the contiguous run of ended calls from :attr:`next_to_write` on,
        in call order (the calls without a row left out); the pointer moves past them."""
        ended = self.ended
        index = self.next_to_write
        out: list[Any] = []
        while index in ended:
            output = ended.pop(index)
            if output is not None:
                out.append(output)
            index += 1
        self.next_to_write = index
        return out

    def take_rest(self) -> list[Any]:
        """At the very end: whatever is left in the reorder buffer, in call order (empty
        when every call read ended, the normal case)."""
        out = [self.ended[i] for i in sorted(self.ended) if self.ended[i] is not None]
        if self.ended:
            self.next_to_write = max(self.next_to_write, max(self.ended) + 1)
        self.ended.clear()
        return out

"""ReadyScheduler: which task the next dispatch decision serves.

Theory of operation
-------------------
A task is *dispatchable* when its ready queue is non-empty, it is not stopping
and fewer than ``task_max_inflight_calls`` of its root calls are in flight.
The scheduler keeps rings of tasks that may be dispatchable; a task leaves a
ring lazily, when a pick finds it not dispatchable, and comes back through
:meth:`ReadyScheduler.wake`, which the core calls whenever a task may have
become dispatchable again (a call queued, an in-flight call released). Waking
is O(1) and idempotent (``TaskDispatchState.in_ring``).

Two policies:

* **Task round-robin** (default): one ring of tasks; every decision serves the
  ring's head and then rotates it.
* **Instance fairness** (``instance_fairness``): max-min fair across
  instances (tenants). Each instance has its own ring of tasks (served
  round-robin); a pick serves the *eligible* instance (one whose ring is not
  empty) with the fewest in-flight root calls -- ties go to the one whose last
  bind is oldest, then to the smaller key -- i.e. water-filling.

  The minimum is kept in a heap of ``(inflight, last_served, key)`` entries: the
  core reports every bind and release (:meth:`ReadyScheduler.note_bind`,
  :meth:`ReadyScheduler.note_release`), each pushes a fresh entry for an
  eligible instance and bumps its ``version``, and a pick discards entries that
  are out of date or whose instance turned out to have nothing dispatchable
  (it is pushed again when one of its tasks wakes). A pick is O(log instances).

  An instance keeps the turn for ``fairness_quantum`` binds before the next
  pick (quantum 0 and 1: every call re-picks). A turn that has bound nothing
  yet is not held: a decision that found no executor does not keep it. A
  larger quantum saves picks at the price of coarser fairness.

A task without an instance name is its own instance (keyed by its task id).
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush

from .config import DispatcherConfig
from .state import InstanceState, TaskDispatchState

__all__ = ["ReadyScheduler"]

#: (inflight, last_served, key, unique push number = the instance's version, instance)
_InstanceEntry = tuple[int, int, str, int, InstanceState]


class ReadyScheduler:
    """Rings of possibly-dispatchable tasks and the fairness policy over them."""

    __slots__ = (
        "_compact_at",
        "_current",
        "_eligible",
        "_fair",
        "_heap",
        "_instances",
        "_push_seq",
        "_quantum",
        "_quantum_left",
        "_ring",
        "_serve_seq",
        "_window",
    )

    def __init__(self, config: DispatcherConfig) -> None:
        self._fair = config.instance_fairness
        self._quantum = config.fairness_quantum
        self._window = config.task_max_inflight_calls
        #: Task round-robin ring (unfair mode).
        self._ring: deque[TaskDispatchState] = deque()
        #: Every instance with a live task.
        self._instances: dict[str, InstanceState] = {}
        #: Fair mode: instances whose task ring is non-empty.
        self._eligible: dict[str, InstanceState] = {}
        #: Fair mode: candidate entries of eligible instances (some out of date).
        self._heap: list[_InstanceEntry] = []
        self._compact_at = 64
        #: Numbers heap entries (see ``_touch``).
        self._push_seq = 0
        #: Fair mode: the instance holding the turn, and binds left in it.
        self._current: InstanceState | None = None
        self._quantum_left = 0
        self._serve_seq = 0

    @property
    def fair(self) -> bool:
        return self._fair

    # --- instances -------------------------------------------------------------

    def acquire_instance(self, key: str) -> InstanceState:
        """The instance record for a new task (created on first use)."""
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances[key] = InstanceState(key)
        inst.task_count += 1
        return inst

    def instance(self, key: str) -> InstanceState | None:
        return self._instances.get(key)

    def instances(self) -> list[InstanceState]:
        return list(self._instances.values())

    def note_bind(self, task: TaskDispatchState) -> None:
        """A root call of ``task`` was bound."""
        inst = task.instance
        inst.inflight += 1
        if self._fair:
            self._quantum_left -= 1
            self._serve_seq += 1
            inst.last_served = self._serve_seq
            self._touch(inst)

    def note_release(self, task: TaskDispatchState) -> None:
        """A root call of ``task`` left its executor (ended, retrying, bind failed)."""
        inst = task.instance
        inst.inflight -= 1
        if self._fair:
            self._touch(inst)

    def _touch(self, inst: InstanceState) -> None:
        """``inst``'s key changed (or it became eligible): a fresh heap entry.

        Entries carry a sequence number unique among all pushes: it marks the
        instance's current entry (``inst.version``) and keeps tuple comparison
        from ever reaching the instance objects (an instance dropped and
        re-created under the same key could otherwise tie).
        """
        self._push_seq += 1
        inst.version = self._push_seq
        if not inst.in_eligible:
            return
        heap = self._heap
        heappush(heap, (inst.inflight, inst.last_served, inst.key, inst.version, inst))
        if len(heap) > self._compact_at:
            heap = [
                (i.inflight, i.last_served, i.key, i.version, i) for i in self._eligible.values()
            ]
            heapify(heap)
            self._heap = heap
            self._compact_at = 4 * len(heap) + 64

    # --- ring membership ---------------------------------------------------------

    def wake(self, task: TaskDispatchState) -> None:
        """``task`` may be dispatchable now; make sure a pick will look at it."""
        if task.in_ring:
            return
        task.in_ring = True
        if self._fair:
            inst = task.instance
            inst.tasks.append(task)
            if not inst.in_eligible:
                inst.in_eligible = True
                self._eligible[inst.key] = inst
                self._touch(inst)
        else:
            self._ring.append(task)

    def remove_task(self, task: TaskDispatchState) -> None:
        """Forget ``task`` (it converged or was removed)."""
        inst = task.instance
        if task.in_ring:
            task.in_ring = False
            ring = inst.tasks if self._fair else self._ring
            ring.remove(task)
        if self._fair and inst.in_eligible and not inst.tasks:
            self._drop_eligible(inst)
        inst.task_count -= 1
        if inst.task_count == 0:
            if self._current is inst:
                self._current = None
            del self._instances[inst.key]

    def _drop_eligible(self, inst: InstanceState) -> None:
        inst.in_eligible = False
        self._push_seq += 1
        inst.version = self._push_seq  # its heap entries are now out of date
        del self._eligible[inst.key]

    # --- picking -------------------------------------------------------------------

    def pick(self) -> TaskDispatchState | None:
        """The task the next decision serves, or None if no task is dispatchable."""
        if not self._fair:
            return self._pick_from(self._ring)
        current = self._current
        if current is not None and 0 < self._quantum_left < self._quantum:
            task = self._pick_from(current.tasks)
            if task is not None:
                return task
        self._current = None
        heap = self._heap
        while heap:
            entry = heap[0]
            inst = entry[4]
            if entry[3] == inst.version:
                task = self._pick_from(inst.tasks)
                if task is not None:
                    self._current = inst
                    self._quantum_left = self._quantum
                    return task
                self._drop_eligible(inst)
            heappop(heap)
        return None

    def _pick_from(self, ring: deque[TaskDispatchState]) -> TaskDispatchState | None:
        window = self._window
        while ring:
            task = ring[0]
            if task.ready_queue and not task.stop_dispatching and task.inflight_roots < window:
                return task
            ring.popleft()
            task.in_ring = False
        return None

    def served(self, task: TaskDispatchState) -> None:
        """A decision served ``task``'s queue head: rotate its ring (round-robin)."""
        ring = task.instance.tasks if self._fair else self._ring
        if len(ring) > 1 and ring[0] is task:
            ring.rotate(-1)

    def check_invariants(self) -> list[str]:
        """Problems with the rings and the heap (for ``DispatcherCore.check_invariants``)."""
        problems: list[str] = []
        if not self._fair:
            return problems
        current = {(entry[4].key, entry[3]) for entry in self._heap}
        for inst in self._instances.values():
            if inst.in_eligible != (self._eligible.get(inst.key) is inst):
                problems.append(f"{inst!r}: eligible flag out of step")
            if inst.in_eligible and (inst.key, inst.version) not in current:
                problems.append(f"{inst!r}: eligible without a current heap entry")
            if inst.tasks and not inst.in_eligible:
                problems.append(f"{inst!r}: has a task ring but is not eligible")
        return problems

    def __repr__(self) -> str:
        if self._fair:
            current = self._current.key if self._current is not None else None
            return (
                f"<ReadyScheduler fair quantum={self._quantum} instances={len(self._instances)}"
                f" eligible={len(self._eligible)} current={current!r}>"
            )
        return f"<ReadyScheduler round-robin ring={len(self._ring)}>"

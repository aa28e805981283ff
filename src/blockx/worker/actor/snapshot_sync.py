"""Snapshot sync: the adapter's view of its executors fed to the core.

Theory of operation
-------------------
The core decides where calls go from :class:`~blockx.worker.core.ExecutorSnapshot`\\ s
(usable contexts, health, runnable counts, the running call). The adapter keeps
the live numbers; :meth:`SnapshotSync.sync` copies them into the core
(``handle_executor_snapshot_updated``) and runs what that releases (parked
sub-calls may bind). The orchestrator syncs when an executor attaches or is
lost and when a bind is refused for capacity; the tick
(:class:`~blockx.worker.actor.tick.Tick`) on every tick.

A cancelled call's reservation keeps its executor context while its terminal
frame is pending (*draining*); the snapshot the core gets counts those contexts
as used (:func:`core_snapshot`). :class:`SnapshotSync` remembers which executors
were synced with draining reservations; :meth:`SnapshotSync.resync_if_drained`,
called by :class:`~blockx.worker.actor.attempts.AttemptEnds` before a read's
frames of such an executor are applied, syncs again once some were released, so
the freed contexts are used before the next tick.

Owned by the orchestrator; shared with the parts named above. Actor only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from blockx.worker.core import DispatchCommand, DispatcherCore, ExecutorSnapshot

if TYPE_CHECKING:
    from blockx.worker.link.adapter import ExecutorAdapter

__all__ = ["SnapshotSync", "core_snapshot"]


def core_snapshot(snap: Any) -> ExecutorSnapshot:
    """The core's snapshot from the adapter's (same field names, a subset).

    Draining reservations (cancelled calls whose terminal frame is pending) hold a
    context on the executor but no slot in the core, which lets go of a call when
    it cancels it: they come off the usable contexts, so the core's headroom
    matches what the adapter will accept (seed: the capacity view is derived from
    reservations *and* draining).
    """
    return ExecutorSnapshot(
        executor_id=snap.executor_id,
        usable_contexts=max(snap.usable_contexts - snap.draining, 0),
        healthy=snap.healthy,
        runnable_count=snap.runnable_count,
        inflight_count=snap.inflight_count,
        heartbeat_seq=snap.heartbeat_seq,
        running_call_id=snap.running_call_id,
        last_scheduler_active_at_ms=snap.last_scheduler_active_at_ms,
        memory_bytes=snap.memory_bytes,
        running_for_ms=snap.running_for_ms,
        running_call_budget_ms=snap.running_call_budget_ms,
    )


class SnapshotSync:
    """Copies the adapter's executor snapshots into the core (see the module docstring).

    ``run`` executes the commands the core answers with (the orchestrator's).
    """

    def __init__(
        self,
        core: DispatcherCore,
        adapter: ExecutorAdapter,
        run: Callable[[list[DispatchCommand]], None],
    ) -> None:
        self._core = core
        self._adapter = adapter
        self._run = run
        #: Executor id -> draining reservations its last synced snapshot counted: when
        #: its terminal frames release some, the snapshot is synced again.
        self._drain_synced: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"SnapshotSync(draining={self._drain_synced})"

    def sync(self) -> list[Any]:
        """Feed the adapter's snapshots to the core; returns them (the adapter's form)."""
        snaps = self._adapter.snapshots()
        self._drain_synced = {s.executor_id: s.draining for s in snaps if s.draining}
        self._run(self._core.handle_executor_snapshot_updated([core_snapshot(s) for s in snaps]))
        return snaps

    def resync_if_drained(self, executor_id: str) -> None:
        """Sync the snapshots if ``executor_id`` was synced while draining and released
        a draining reservation since (a cancelled call's context may be free)."""
        synced = self._drain_synced
        if not synced or executor_id not in synced:
            return
        snap = self._adapter.snapshot(executor_id)
        if snap is None or snap.draining < synced[executor_id]:
            self.sync()

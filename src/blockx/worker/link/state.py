"""ExecutorState: what the adapter knows about one executor id, and the snapshot derived from it.

One :class:`ExecutorState` per executor id ever attached, kept across eras (a
reconnect increments :attr:`ExecutorState.era` and replaces the reservations).
The adapter keeps them in one table (``dict[str, ExecutorState]``) that its
parts share: the inbound handlers attach and update them, the outbound sends
read their connection and reservations, :class:`~blockx.worker.link.eras.Eras`
ends their eras.

A state holds its current connection; the connection knows only the executor
id it attached as (:func:`attached_state` goes back from one to the other). So
this module imports :mod:`.connection` and never the reverse.

:func:`build_snapshot` is the one place the dispatcher's capacity view is
computed; see :class:`~blockx.worker.link.snapshot.ExecutorSnapshot` for
what each field means.
"""

from __future__ import annotations

from collections.abc import Mapping

from blockx.wire import keys
from blockx.wire.schema import HeartbeatPayload
from blockx.worker.errors import ExecutorUnavailableError
from blockx.worker.link.connection import ExecutorConnection
from blockx.worker.link.reservations import Reservations
from blockx.worker.link.snapshot import ExecutorSnapshot

__all__ = [
    "ExecutorState",
    "attached_state",
    "build_snapshot",
    "unavailable_error",
    "usable_contexts",
]


class ExecutorState:
    """One executor id: its current connection, reservations and latest heartbeat."""

    __slots__ = (
        "attached_at",
        "capacity",
        "completions_since_heartbeat",
        "connection",
        "era",
        "executor_id",
        "generation",
        "heartbeat",
        "heartbeat_at",
        "lost_reason",
        "reservations",
    )

    def __init__(self, executor_id: str) -> None:
        self.executor_id = executor_id
        #: 0 before the first attach; +1 per attach.
        self.era = 0
        #: The attached connection of the current era; None once the era ended.
        self.connection: ExecutorConnection | None = None
        self.reservations = Reservations(executor_id, 0)
        #: Latest heartbeat (kept after the era ends, for the unhealthy snapshot).
        self.heartbeat: HeartbeatPayload | None = None
        self.heartbeat_at = 0.0  # worker monotonic seconds
        self.attached_at = 0.0
        #: Terminal frames since the latest heartbeat (completion compensation).
        self.completions_since_heartbeat = 0
        #: ``usable_contexts(heartbeat)``, kept current for ``bind``.
        self.capacity = 0
        self.lost_reason: str | None = None
        #: The pool's process generation that attached this era (the adapter's exit
        #: source, :meth:`ExecutorAdapter.set_exit_source`); None: no pool to ask.
        self.generation: int | None = None

    def __repr__(self) -> str:
        status = "attached" if self.connection is not None else f"lost({self.lost_reason})"
        seq = self.heartbeat.heartbeatSeq if self.heartbeat is not None else None
        return (
            f"ExecutorState({self.executor_id!r}, era={self.era}, {status}, "
            f"reserved={len(self.reservations)}, hb#{seq})"
        )

    def start_era(
        self, connection: ExecutorConnection, heartbeat: HeartbeatPayload, now: float
    ) -> None:
        """Attach ``connection`` as a new era (the previous one must have ended)."""
        self.era += 1
        self.reservations = Reservations(self.executor_id, self.era)
        self.connection = connection
        connection.executor_id = self.executor_id
        self.lost_reason = None
        self.attached_at = now
        self.record_heartbeat(heartbeat, now)

    def record_heartbeat(self, heartbeat: HeartbeatPayload, now: float) -> None:
        self.heartbeat = heartbeat
        self.heartbeat_at = now
        self.completions_since_heartbeat = 0
        self.capacity = usable_contexts(heartbeat)


def attached_state(
    executors: Mapping[str, ExecutorState], conn: ExecutorConnection
) -> ExecutorState | None:
    """The state whose current era ``conn`` is, or None (not attached, or its era ended)."""
    executor_id = conn.executor_id
    if executor_id is None:
        return None
    state = executors.get(executor_id)
    return state if state is not None and state.connection is conn else None


def unavailable_error(
    state: ExecutorState | None, executor_id: str, call_id: str | None
) -> ExecutorUnavailableError:
    """The error for a call on an executor with no live connection (``state``: its entry)."""
    if state is None:
        reason = "never attached"
    else:
        reason = state.lost_reason or "not attached"
    return ExecutorUnavailableError(executor_id, call_id=call_id, reason=reason)


def usable_contexts(heartbeat: HeartbeatPayload | None) -> int:
    """Contexts the executor can hold: ``availableContexts + inflightCount``.

    The executor reports ``available = max(0, maxInflight - inflight)``, so the
    sum is its capacity. The dispatcher's headroom is this minus the adapter's
    reservations, which already include every call the executor counted.
    """
    if heartbeat is None:
        return 0
    available = heartbeat.availableContexts
    if available >= keys.UNLIMITED_CONTEXTS:
        return keys.UNLIMITED_CONTEXTS
    return max(available, 0) + max(heartbeat.inflightCount, 0)


def build_snapshot(state: ExecutorState, now: float, heartbeat_timeout_ms: int) -> ExecutorSnapshot:
    """The snapshot of ``state`` at monotonic time ``now``; the state must have a heartbeat."""
    heartbeat = state.heartbeat
    assert heartbeat is not None, "no snapshot before the first heartbeat"
    age_ms = max(round((now - state.heartbeat_at) * 1000), 0)
    conn = state.connection
    reservations = state.reservations
    return ExecutorSnapshot(
        executor_id=state.executor_id,
        healthy=conn is not None and not conn.closed and age_ms <= heartbeat_timeout_ms,
        runnable_count=heartbeat.runnableCount,
        local_inflight=len(reservations),
        usable_contexts=usable_contexts(heartbeat),
        memory_bytes=heartbeat.memoryBytes,
        heartbeat_seq=heartbeat.heartbeatSeq,
        running_call_id=heartbeat.runningCallId,
        last_scheduler_active_at_ms=heartbeat.lastSchedulerActiveAtMs,
        completions_since_heartbeat=state.completions_since_heartbeat,
        draining=reservations.draining_count,
        inflight_count=heartbeat.inflightCount,
        heartbeat_age_ms=age_ms,
        era=state.era,
        running_for_ms=heartbeat.runningForMs,
        running_call_budget_ms=heartbeat.runningCallBudgetMs,
    )

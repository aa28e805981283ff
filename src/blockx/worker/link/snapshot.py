"""ExecutorSnapshot: the adapter's view of one executor's capacity, for the dispatcher.

Derived on demand from the executor's latest ``Heartbeat`` and the adapter's
own reservations (seed: ``executor.Adapter.Snapshots``). The orchestrator feeds
these to the dispatcher core on its tick and after an executor is lost.

It is a superset of ``blockx.worker.core.types.ExecutorSnapshot``: every field
of the core's snapshot exists here under the same name and meaning, so the
orchestrator converts with
``core.ExecutorSnapshot(**{f.name: getattr(s, f.name) for f in fields(core.ExecutorSnapshot)})``.
The extra fields (``local_inflight``, ``completions_since_heartbeat``, ...)
are the adapter's exact local counts, for logs, tests and the wedge check.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExecutorSnapshot"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorSnapshot:
    """One executor at one instant. Immutable; take a new one to see changes."""

    executor_id: str
    #: Attached, connection alive, heartbeat within the timeout.
    healthy: bool
    #: ``Heartbeat.runnableCount`` (sampled by the executor).
    runnable_count: int
    #: Local reservations (root calls + sub-calls, draining included): the
    #: seed's ``localInflight``. Exact, not sampled.
    local_inflight: int
    #: Contexts the executor can hold: ``availableContexts + inflightCount`` of
    #: the latest heartbeat, i.e. its ``--executor-max-inflight`` (or
    #: ``UNLIMITED_CONTEXTS``). The seed's headroom is
    #: ``usable_contexts - local_inflight``: reservations already include every call
    #: the executor counted, so adding the heartbeat's own count back avoids
    #: counting those calls twice.
    usable_contexts: int
    memory_bytes: int
    heartbeat_seq: int
    #: The call the executor's scheduler was running at the heartbeat, if any.
    running_call_id: str | None
    #: Executor wall clock (ms) when its scheduler last made progress.
    last_scheduler_active_at_ms: int
    #: Terminal frames received since that heartbeat: the core subtracts them
    #: from ``runnable_count`` ("completion compensation").
    completions_since_heartbeat: int
    #: Reservations marked draining (cancelled, terminal frame pending).
    draining: int
    #: ``Heartbeat.inflightCount`` as the executor reported it (sampled).
    inflight_count: int
    #: Milliseconds since that heartbeat arrived (worker monotonic clock).
    heartbeat_age_ms: int
    #: Connection era of this executor id (1 on first attach, +1 per reconnect).
    era: int
    #: ``Heartbeat.runningForMs``: how long the running call had run since it was last
    #: switched into (0: none runs, or an executor that does not say).
    running_for_ms: int = 0
    #: ``Heartbeat.runningCallBudgetMs``: that call's budget then (0: unlimited / none).
    running_call_budget_ms: int = 0

    @property
    def headroom(self) -> int:
        """``usable_contexts - local_inflight``: contexts a new root call could still take."""
        return self.usable_contexts - self.local_inflight

    def __repr__(self) -> str:
        state = "healthy" if self.healthy else "UNHEALTHY"
        return (
            f"ExecutorSnapshot({self.executor_id!r}, {state}, era={self.era}, "
            f"inflight={self.local_inflight}/{self.usable_contexts}, runnable={self.runnable_count}"
            f"-{self.completions_since_heartbeat}, hb#{self.heartbeat_seq} "
            f"{self.heartbeat_age_ms}ms ago, running={self.running_call_id!r})"
        )

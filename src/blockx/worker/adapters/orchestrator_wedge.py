"""The 500 ms tick: snapshot sync, the wedge backstop, heartbeat timeouts.

(seed: ``orchestrator_wedge.go``.)

Theory of operation
-------------------
A timer posts :class:`TickElapsed` every ``tick_interval_ms``; the actor then

1. **syncs snapshots** — ``adapter.snapshots()`` into
   ``handle_executor_snapshot_updated`` (capacity, runnable counts, health;
   parked sub-calls may bind);
2. **checks for wedged executors** — an executor whose heartbeat names a
   running call while its scheduler loop has not moved for longer than the
   stall timeout (``SchedulerStallTimeoutMs``, at least the call budget +
   1 s) is running user code that ignores its deadline (e.g. a loop that
   catches ``BaseException``). The executor cannot recover by itself: the
   running call fails as ``executor_wedged`` (not retryable: the same code
   would wedge again) and the process is SIGKILLed (``pool.kill_executor``).
   Its other calls then fail as ``transport_lost`` (retryable) through the
   normal executor-lost path, and the pool restarts the slot. Each
   connection era is killed at most once;
3. **checks heartbeat timeouts** — ``adapter.check_heartbeat_timeouts``:
   an executor silent for longer than the heartbeat timeout is lost (its
   heartbeat thread is stuck too), and its process is killed so that it
   cannot linger. A tick that fires late because the event loop stalled
   skips this check, so heartbeats that queued up meanwhile are read first.

The tick keeps no per-call timer: call budgets are enforced by the executors;
the wedge backstop is the worker's only wall-clock guard on a running call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from blockx.worker.core import CallError, CallState

from .mypyc_markers import trait
from .orchestrator_events import TickElapsed

if TYPE_CHECKING:
    from blockx.worker.core import DispatchCommand, DispatcherCore

    from .executor_adapter import ExecutorAdapter
    from .orchestrator import OrchestratorStats
    from .pool import PoolManager

__all__ = ["ERR_EXECUTOR_WEDGED", "TickChecks"]

_log = logging.getLogger("blockx.worker.orchestrator")

#: Error kind of a call that wedged its executor (an addition to PROTOCOL.md's kinds).
ERR_EXECUTOR_WEDGED: Final = "executor_wedged"

_LIVE: Final = (CallState.RUNNING, CallState.WAITING)


@trait
class TickChecks:
    """Mixin of :class:`~blockx.worker.adapters.orchestrator.Orchestrator`: the tick."""

    # Provided by Orchestrator.
    _core: DispatcherCore
    _adapter: ExecutorAdapter
    _pool: PoolManager | None
    _tick_interval_s: float
    _now_ms: int
    _killed_eras: dict[str, int]
    stats: OrchestratorStats

    def _run(self, commands: list[DispatchCommand]) -> None:
        raise NotImplementedError

    def _sync_snapshots(self) -> list[Any]:
        raise NotImplementedError

    # --- the checks ---------------------------------------------------------------------------

    #: The last tick deferred its heartbeat check (the loop had stalled).
    _heartbeat_check_deferred: bool

    def _apply_tick(self, event: TickElapsed) -> None:
        snaps = self._sync_snapshots()
        self._check_wedged(snaps)
        if event.late_ms > self._tick_interval_s * 1000 and not self._heartbeat_check_deferred:
            # Heartbeats that arrived during the stall may still be unread (timers run
            # before the sockets are polled): judge silence at the next tick. Only once in
            # a row: by then the sockets have had their turn, and a loop that stays
            # overloaded must not stop noticing silent executors.
            self._heartbeat_check_deferred = True
            _log.warning("event loop stalled %d ms; heartbeat check deferred", event.late_ms)
            return
        self._heartbeat_check_deferred = False
        for executor_id in self._adapter.check_heartbeat_timeouts():
            # The era ended (its calls are reported lost through the adapter's callback);
            # a process whose heartbeat thread is stuck will not exit by itself.
            self._kill(executor_id, "no heartbeat within the heartbeat timeout")

    def _check_wedged(self, snaps: list[Any]) -> None:
        """Kill executors whose scheduler is stalled on a running call."""
        core = self._core
        stall_ms = core.config.stall_timeout_ms
        now_ms = self._now_ms
        for snap in snaps:
            running = snap.running_call_id
            if not snap.healthy or running is None:
                continue
            stalled_ms = now_ms - snap.last_scheduler_active_at_ms
            if stalled_ms <= stall_ms:
                continue
            executor_id = snap.executor_id
            if self._killed_eras.get(executor_id) == snap.era:
                continue
            self._killed_eras[executor_id] = snap.era
            self.stats.wedged_calls += 1
            _log.error(
                "executor %s is wedged: its scheduler has not moved for %d ms (limit %d ms) "
                "running %s; killing it",
                executor_id,
                stalled_ms,
                stall_ms,
                running,
                extra={"executorId": executor_id, "callId": running},
            )
            ctx = core.call_context(running)
            ex = None if ctx is None else ctx.executor
            if (
                ctx is not None
                and ex is not None
                and ex.executor_id == executor_id
                and ctx.state in _LIVE
                and ctx.bound
            ):
                error = CallError(
                    kind=ERR_EXECUTOR_WEDGED,
                    message=(
                        f"the call kept executor {executor_id} busy for {stalled_ms} ms without "
                        f"yielding (stall limit {stall_ms} ms; it ignored its deadline, e.g. by "
                        "catching BaseException); the executor was killed"
                    ),
                    retryable=False,
                )
                self._run(core.handle_attempt_failure(running, ctx.attempt_seq, error, now_ms))
            self._kill(executor_id, f"wedged on {running}")

    def _kill(self, executor_id: str, why: str) -> None:
        pool = self._pool
        killed = False
        if pool is not None:
            try:
                killed = pool.kill_executor(executor_id)
            except KeyError:
                killed = False
        if killed:
            self.stats.executors_killed += 1
        else:
            # No process of ours (a test peer, an external executor): drop the connection.
            self._adapter.disconnect(executor_id, why)

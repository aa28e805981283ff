"""The 500 ms tick: snapshot sync, the wedge backstop, heartbeat timeouts; and blame.

(seed: ``orchestrator_wedge.go``.)

Theory of operation
-------------------
A timer posts :class:`TickElapsed` every ``tick_interval_ms``; the actor then

1. **syncs snapshots** — ``adapter.snapshots()`` into
   ``handle_executor_snapshot_updated`` (capacity, runnable counts, health;
   parked sub-calls may bind);
2. **checks for wedged executors** — the backstop judges a running call by its
   *own* budget: its stall threshold is ``runningCallBudgetMs`` + a margin
   (:func:`~blockx.worker.core.config.stall_threshold_ms`; an explicit
   ``SCHEDULER_STALL_TIMEOUT_MS`` overrides; an unlimited budget is never
   judged). An executor is wedged when two successive heartbeats (two
   ``heartbeat_seq``) name the same running call with ``runningForMs`` past that
   threshold: the executor cuts a call off at its budget itself, so a call still
   running a margin later ignores its deadline (e.g. a loop that catches
   ``BaseException``). Only what heartbeats report counts — silence is never
   extrapolated, so an executor paused from outside (SIGSTOP) is not judged
   while it is paused, and the second heartbeat after it resumes gives its own
   deadline a chance first. The process is SIGKILLed (``pool.kill_executor``,
   or the connection dropped when there is no pool) and the era's loss is
   attributed to that call (:class:`_WedgeVerdict`): it becomes a suspect (or,
   running alone already, fails at once as ``executor_wedged``). Each
   connection era is killed at most once (``_killed_eras``);
3. **checks heartbeat timeouts** — ``adapter.check_heartbeat_timeouts``: an
   executor silent past the heartbeat timeout is lost and killed so that it
   cannot linger. If its last heartbeat named a running call whose
   ``runningForMs`` + the silence since exceeds that call's threshold, the loss
   is a wedge by that call (a call stuck in C code holds the GIL, so the
   heartbeat thread stops too: ``sum(range(10**12))``); otherwise it stays a
   retryable ``transport_lost`` that blames a call only by the black box. A
   tick that fires late because the event loop stalled skips this check, so
   heartbeats that queued up meanwhile are read first.

**Blame.** :meth:`Tick.loss_report` turns the adapter's
:class:`~blockx.worker.link.loss.ExecutorLoss` (plus a verdict of ours, if
we killed that era) into the core's
:class:`~blockx.worker.core.ExecutorLossReport`; the core applies the rules of
docs/security.md (:mod:`blockx.worker.core.blame`).

The tick keeps no per-call timer: call budgets are enforced by the executors;
the wedge backstop is the worker's only wall-clock guard on a running call.

**Who owns what.** The :class:`~blockx.worker.actor.orchestrator.Orchestrator`
owns the timer and builds :class:`Tick` with the core (thresholds, a call's
granted budget), the adapter (snapshots, heartbeat timeouts, a dropped
connection), the :class:`~blockx.worker.actor.snapshot_sync.SnapshotSync`, the
counters and the pool (to kill). :class:`Tick` owns the backstop's state -- eras
killed, wedge verdicts, stall sightings, silences -- which only it reads and
writes: the orchestrator calls :meth:`Tick.apply_tick` for :class:`TickElapsed`
and :meth:`Tick.loss_report` when it applies an :class:`ExecutorLost`. It
issues no core command itself (the snapshot sync does). Actor only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from blockx.wire import keys
from blockx.worker.actor.events import ExecutorLost, TickElapsed
from blockx.worker.core import ExecutorLossReport
from blockx.worker.core.config import stall_threshold_ms

if TYPE_CHECKING:
    from blockx.worker.actor.snapshot_sync import SnapshotSync
    from blockx.worker.actor.stats import OrchestratorStats
    from blockx.worker.core import DispatcherCore
    from blockx.worker.link.adapter import ExecutorAdapter
    from blockx.worker.link.loss import ExecutorLoss
    from blockx.worker.pool.manager import PoolManager

__all__ = ["ERR_EXECUTOR_WEDGED", "Tick"]

_log = logging.getLogger("blockx.worker.orchestrator")

#: Error kind of a call that wedged its executor (``blockx.wire.keys``).
ERR_EXECUTOR_WEDGED: Final = keys.ERR_EXECUTOR_WEDGED


@dataclass(frozen=True, slots=True, kw_only=True)
class _WedgeVerdict:
    """The backstop's finding on an era it ended: the call that wedged it."""

    era: int
    call_id: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _Silence:
    """An era ended by the heartbeat timeout, and its last heartbeat's running call."""

    era: int
    silent_ms: int
    running_call_id: str | None
    running_for_ms: int
    running_call_budget_ms: int


class Tick:
    """The tick's checks and the blame of lost eras (see the module docstring); a
    part of the :class:`~blockx.worker.actor.orchestrator.Orchestrator`, which
    builds it and owns the timer that posts :class:`TickElapsed`."""

    def __init__(
        self,
        core: DispatcherCore,
        adapter: ExecutorAdapter,
        snapshots: SnapshotSync,
        stats: OrchestratorStats,
        *,
        pool: PoolManager | None,
        tick_interval_s: float,
    ) -> None:
        self._core = core
        self._adapter = adapter
        self._snapshots = snapshots
        self._stats = stats
        self._pool = pool
        self._tick_interval_s = tick_interval_s
        #: The last tick deferred its heartbeat check (the loop had stalled).
        self._heartbeat_check_deferred = False
        #: Executor id -> era the backstop killed (kill each era once).
        self._killed_eras: dict[str, int] = {}
        #: Executor id -> the wedge found in its current era, until its loss is applied.
        self._wedge_verdicts: dict[str, _WedgeVerdict] = {}
        #: Executor id -> (era, call id, heartbeat seq) of the first heartbeat that showed
        #: its running call past its threshold (the second one, later, convicts).
        self._stall_sightings: dict[str, tuple[int, str, int]] = {}
        #: Executor id -> its era the heartbeat timeout ended, until its loss is applied.
        self._silences: dict[str, _Silence] = {}

    def __repr__(self) -> str:
        return (
            f"Tick(killed_eras={self._killed_eras}, verdicts={len(self._wedge_verdicts)}, "
            f"sightings={len(self._stall_sightings)}, silences={len(self._silences)})"
        )

    def set_pool(self, pool: PoolManager) -> None:
        """Kill executors through ``pool`` from now on (without one: drop the connection)."""
        self._pool = pool

    # --- the checks ---------------------------------------------------------------------------

    def apply_tick(self, event: TickElapsed) -> None:
        snaps = self._snapshots.sync()
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
        by_id = {snap.executor_id: snap for snap in snaps}
        for executor_id in self._adapter.check_heartbeat_timeouts():
            # The era ended (its calls are reported lost through the adapter's callback,
            # applied after this); a process whose heartbeat thread is stuck will not exit
            # by itself.
            snap = by_id.get(executor_id)
            if snap is not None:
                self._judge_silence(snap)
            self._kill(executor_id, "no heartbeat within the heartbeat timeout")

    def _threshold_ms(self, budget_ms: int) -> int | None:
        return stall_threshold_ms(self._core.config, budget_ms)

    def _check_wedged(self, snaps: list[Any]) -> None:
        """Kill executors whose heartbeats keep showing a call past its own threshold."""
        sightings = self._stall_sightings
        for snap in snaps:
            executor_id = snap.executor_id
            running = snap.running_call_id
            running_for = snap.running_for_ms
            threshold = self._threshold_ms(snap.running_call_budget_ms)
            if not snap.healthy or running is None or threshold is None or running_for <= threshold:
                sightings.pop(executor_id, None)
                continue
            if self._killed_eras.get(executor_id) == snap.era:
                continue
            seen = sightings.get(executor_id)
            if seen is None or seen[0] != snap.era or seen[1] != running:
                sightings[executor_id] = (snap.era, running, snap.heartbeat_seq)
                continue
            if seen[2] == snap.heartbeat_seq:
                continue  # no new heartbeat since the first sighting: wait for one
            del sightings[executor_id]
            message = (
                f"the call ran {running_for} ms without yielding on executor {executor_id}"
                f" (its stall limit is {threshold} ms: its budget + margin); it ignored its"
                " deadline, e.g. by catching BaseException; the executor was killed"
            )
            self._convict_wedge(executor_id, snap.era, running, message)

    def _judge_silence(self, snap: Any) -> None:
        """A heartbeat timeout ended ``snap``'s era: remember the silence and what the
        last heartbeat said, for :meth:`loss_report` to judge with the link's loss."""
        self._silences[snap.executor_id] = _Silence(
            era=snap.era,
            silent_ms=snap.heartbeat_age_ms,
            running_call_id=snap.running_call_id,
            running_for_ms=snap.running_for_ms,
            running_call_budget_ms=snap.running_call_budget_ms,
        )

    def _convict_wedge(self, executor_id: str, era: int, call_id: str, message: str) -> None:
        if self._killed_eras.get(executor_id) == era:
            return
        self._killed_eras[executor_id] = era
        self._wedge_verdicts[executor_id] = _WedgeVerdict(era=era, call_id=call_id, message=message)
        self._stats.wedged_calls += 1
        _log.error(
            "executor %s is wedged by %s: %s; killing it",
            executor_id,
            call_id,
            message,
            extra={"executorId": executor_id, "callId": call_id},
        )
        self._kill(executor_id, f"wedged on {call_id}")

    def _kill(self, executor_id: str, why: str) -> None:
        pool = self._pool
        killed = False
        if pool is not None:
            try:
                killed = pool.kill_executor(executor_id)
            except KeyError:
                killed = False
        if killed:
            self._stats.executors_killed += 1
        else:
            # No process of ours (a test peer, an external executor): drop the connection.
            self._adapter.disconnect(executor_id, why)

    # --- blame ------------------------------------------------------------------------------

    def loss_report(self, event: ExecutorLost) -> ExecutorLossReport:
        """The core's view of why ``event``'s era ended: the link's loss, corrected by
        what the tick found (a wedge it killed; a silence past a call's budget)."""
        executor_id = event.executor_id
        loss = event.loss
        started = None if loss is None else loss.started_call_ids
        snap = self._adapter.snapshot(executor_id)
        era = None if snap is None else snap.era
        verdict = self._wedge_verdicts.pop(executor_id, None)
        if verdict is not None and era not in (None, verdict.era):
            verdict = None  # a verdict on an older era (its loss never came): stale
        silence = self._silences.pop(executor_id, None)
        if silence is not None and era not in (None, silence.era):
            silence = None
        if verdict is None and silence is not None:
            verdict = self._silence_verdict(executor_id, silence, loss)
        if verdict is not None:
            return ExecutorLossReport(
                cause=keys.ERR_EXECUTOR_WEDGED,
                message=verdict.message,
                running_call_id=verdict.call_id,
                running_call_known=True,
                started_call_ids=started,
            )
        if loss is None:
            return ExecutorLossReport(cause=keys.ERR_TRANSPORT_LOST, message=event.reason)
        cause: str = loss.cause
        if cause == keys.ERR_EXECUTOR_WEDGED:
            # The pool reports every kill of ours as a wedge; with no verdict of ours the
            # kill was for silence with no call past its budget: a transport loss.
            cause = keys.ERR_TRANSPORT_LOST
        return ExecutorLossReport(
            cause=cause,
            message=loss.message or event.reason,
            running_call_id=loss.running_call_id,
            running_call_known=loss.running_call_known,
            started_call_ids=loss.started_call_ids,
        )

    def _silence_verdict(
        self, executor_id: str, silence: _Silence, loss: ExecutorLoss | None
    ) -> _WedgeVerdict | None:
        """A wedge if the silent executor's running call, counting the silence, is past
        its stall threshold (the C-code case); None: a plain transport loss."""
        running = silence.running_call_id
        running_for = silence.running_for_ms
        budget = silence.running_call_budget_ms
        if loss is not None:
            if loss.running_call_known and loss.running_call_id != running:
                # The black box names another call than the last heartbeat did: the
                # silence began before (or as) that call was switched into.
                running, running_for, budget = loss.running_call_id, 0, 0
            running = running or loss.running_call_id
            running_for = max(running_for, loss.running_for_ms)
            budget = budget or loss.running_call_budget_ms
        if running is not None and not budget:
            # No heartbeat carried its budget: the budget its attempt was granted.
            ctx = self._core.call_context(running)
            if ctx is not None:
                budget = ctx.budget_ms
        threshold = self._threshold_ms(budget)
        if running is None or threshold is None:
            return None
        total = running_for + silence.silent_ms
        if total <= threshold:
            return None
        self._stats.wedged_calls += 1
        return _WedgeVerdict(
            era=silence.era,
            call_id=running,
            message=(
                f"executor {executor_id} fell silent for {silence.silent_ms} ms while running"
                f" this call ({total} ms in all, past its stall limit of {threshold} ms:"
                " stuck in code that holds the GIL, e.g. a long computation in C); the"
                " executor was killed"
            ),
        )

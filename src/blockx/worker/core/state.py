"""Mutable records of the dispatcher core: calls, executors, tasks, stream batches, instances.

Theory of operation
-------------------
Plain ``__slots__`` classes, owned and written only by the core (the runtime may
read them through ``DispatcherCore.call_context`` / ``task_state`` but must not
write them -- with one exception: :attr:`DispatchCallContext.wait_handle`, the
runtime's own slot, which the core only clears or hands back). One
:class:`DispatchCallContext` exists per call for its whole life: a retry
reuses it, bumping ``attempt_count`` and ``attempt_seq``. Its ``state`` moves
only along :data:`CALL_TRANSITIONS`, through :func:`move`; everything that
counts calls (a task's terminal, in-flight and outcome
counters, a batch's remaining count, an executor's local inflight) is updated in
:mod:`.lifecycle`, next to the transition that changes it.

The state table (the seed's diagram)::

    READY   -> RUNNING  BindCall issued (attempt_count += 1, attempt_seq += 1)
    READY   -> DONE     cache hit / singleflight leader's result / drained
    RUNNING -> READY    bind failed (attempt rolled back) or retryable failure
    RUNNING -> WAITING  handle_call_waiting (io / subcall)
    RUNNING -> DONE     completed, final failure, cancelled
    WAITING -> RUNNING  handle_call_resumed
    WAITING -> READY    retryable failure while waiting (resume_send_failed,
                        executor lost)
    WAITING -> DONE     completed, final failure, cancelled (subtree)
    DONE    -> (none)   the only terminal state

A root call of a one-shot phase is forgotten as it ends (its task's ``roots``
and the core's registry let go of it, as they do of a sub-call): its output
or failure record is kept on the task, in call order, in an
:class:`EndedRun` of consecutive ended calls, so the phase's end has nothing
left to walk.

A call and the executor it is bound to point at each other
(``DispatchCallContext.executor``, ``ExecutorState.calls``), so both records
live here; :mod:`.selection` owns the table of executors and how one is chosen.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from .call_cache import CallCache
from .config import DispatcherConfig, stall_threshold_ms
from .errors import InvalidTransitionError
from .types import (
    CallError,
    CallOutcome,
    CallState,
    ExecutorSnapshot,
    FailedCall,
    FailurePolicy,
    PreparedCall,
    TaskFailure,
    TaskMode,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "ATTEMPT_BUCKETS_MS",
    "ATTEMPT_DENSE_MS",
    "CALL_TRANSITIONS",
    "DispatchCallContext",
    "DispatcherStats",
    "EndedRun",
    "ExecutorState",
    "InstanceState",
    "StreamBatch",
    "TaskDispatchState",
    "is_stalled",
    "move",
]

_READY: Final = CallState.READY
_RUNNING: Final = CallState.RUNNING
_WAITING: Final = CallState.WAITING
_DONE: Final = CallState.DONE

#: Allowed ``state`` edges of a call context.
CALL_TRANSITIONS: Final[Mapping[CallState, frozenset[CallState]]] = {
    _READY: frozenset({_RUNNING, _DONE}),
    _RUNNING: frozenset({_READY, _WAITING, _DONE}),
    _WAITING: frozenset({_RUNNING, _READY, _DONE}),
    _DONE: frozenset(),
}


def move(ctx: DispatchCallContext, target: CallState) -> None:
    """Move ``ctx`` to ``target``; raise (changing nothing) if the edge is missing."""
    if target not in CALL_TRANSITIONS[ctx.state]:
        raise InvalidTransitionError(ctx.call_id, ctx.state.value, target.value)
    ctx.state = target


class DispatchCallContext:
    """Everything the core knows about one call, root or sub-call."""

    __slots__ = (
        "ancestry",
        "attempt_count",
        "attempt_seq",
        "attempt_started_ms",
        "awaiting_isolation",
        "batch",
        "batch_idx",
        "bound",
        "budget_ms",
        "budget_used_ms",
        "call",
        "call_id",
        "children",
        "error",
        "executor",
        "index",
        "is_subcall",
        "max_attempts",
        "outcome",
        "output",
        "parent",
        "parked",
        "queued",
        "request_id",
        "retry_armed",
        "sf_waiters",
        "sf_waiting",
        "state",
        "suspect",
        "task",
        "unattributed_losses",
        "wait_handle",
    )

    def __init__(
        self,
        call_id: str,
        task: TaskDispatchState,
        call: PreparedCall,
        index: int,
        batch: StreamBatch | None,
        batch_idx: int,
        max_attempts: int,
        budget_ms: int,
        parent: DispatchCallContext | None = None,
        ancestry: tuple[str, ...] = (),
        request_id: str | None = None,
    ) -> None:
        self.call_id = call_id
        self.task = task
        #: Function, digest, args and call key; shared by every attempt.
        self.call = call
        #: Position in the task's call list / stream; -1 for a sub-call.
        self.index = index
        #: Stream root calls: the batch that settles with this call.
        self.batch = batch
        #: The stream batch index (a sub-call inherits its parent's); 0 for one-shot.
        self.batch_idx = batch_idx
        self.is_subcall = parent is not None
        self.parent = parent
        #: Call keys from the root down to the parent.
        self.ancestry = ancestry
        #: Sub-calls only: the parent's pending requestId.
        self.request_id = request_id
        self.state = _READY
        #: The executor the current attempt is bound to (RUNNING / WAITING).
        self.executor: ExecutorState | None = None
        #: True once ``handle_executor_bound`` confirmed the reservation.
        self.bound = False
        #: Attempts spent (a failed bind gives its attempt back).
        self.attempt_count = 0
        #: Increases with every bind; failures of older attempts are stale.
        self.attempt_seq = 0
        #: ``DispatcherStats.clock_ms`` when the current attempt's bind
        #: was confirmed: its duration is measured from here (metrics only).
        self.attempt_started_ms = 0
        self.max_attempts = max_attempts
        self.budget_ms = budget_ms
        self.budget_used_ms = 0
        #: READY and backing off: an ``ArmCallRetry`` timer is pending.
        self.retry_armed = False
        #: READY and in the task's ready queue.
        self.queued = False
        #: READY sub-call in the task's ``pending_bind_subcalls``.
        self.parked = False
        #: Root call suspected of killing an executor (docs/security.md, "Blame"):
        #: every later attempt runs alone on an executor (:mod:`.isolation`).
        self.suspect = False
        #: READY suspect in the core's isolation queue (not in the task's ready queue).
        self.awaiting_isolation = False
        #: Executor losses this call was bound through that named no certain culprit
        #: (:data:`~.blame.UNATTRIBUTED_LOSSES_TO_SUSPECT` of them make it a suspect).
        self.unattributed_losses = 0
        #: Leader only: calls waiting for this call's result.
        self.sf_waiters: list[DispatchCallContext] | None = None
        #: READY and waiting on a singleflight leader.
        self.sf_waiting = False
        #: Live sub-calls of the current attempt, by id.
        self.children: dict[str, DispatchCallContext] | None = None
        self.outcome: CallOutcome | None = None
        self.output: bytes | None = None
        #: The last attempt's error (the final one once DONE and FAILED).
        self.error: CallError | None = None
        #: The runtime's slot, opaque to the core: what the runtime holds for the
        #: current wait while its answer is outstanding (the IO handler's future). Set
        #: by the runtime only while the call is WAITING; the core clears it when the
        #: wait is answered (``handle_calls_resumed``) and hands it back in a
        #: ``ReleaseWait`` when the attempt leaves the wait any other way.
        self.wait_handle: object | None = None

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def call_key(self) -> str:
        return self.call.call_key

    @property
    def executor_id(self) -> str | None:
        ex = self.executor
        return None if ex is None else ex.executor_id

    @property
    def parent_call_id(self) -> str | None:
        parent = self.parent
        return None if parent is None else parent.call_id

    def __repr__(self) -> str:
        where = ""
        if self.executor is not None:
            where = f" on {self.executor.executor_id}" + ("" if self.bound else " (binding)")
        flags = [
            name
            for name, on in (
                ("queued", self.queued),
                ("backoff", self.retry_armed),
                ("parked", self.parked),
                ("suspect", self.suspect),
                ("awaiting-isolation", self.awaiting_isolation),
                ("sf-waiter", self.sf_waiting),
                ("io-wait", self.wait_handle is not None),
            )
            if on
        ]
        extra = f" [{','.join(flags)}]" if flags else ""
        outcome = f" {self.outcome.value}" if self.outcome is not None else ""
        kind = "sub-call" if self.is_subcall else "call"
        return (
            f"<{kind} {self.call_id} {self.state.value}{outcome}{where}"
            f" attempt={self.attempt_count}/{self.max_attempts} seq={self.attempt_seq}{extra}>"
        )


class ExecutorState:
    """One executor as the core sees it.

    ``runnable``, ``selectable`` and ``stalled`` are derived when a snapshot is
    applied (and ``runnable`` on every completion) so that the Filter reads one
    attribute per test.
    """

    __slots__ = (
        "calls",
        "closed_to_roots",
        "completed_since_snapshot",
        "executor_id",
        "healthy",
        "heartbeat_seq",
        "inflight_count",
        "isolating",
        "last_scheduler_active_at_ms",
        "local_inflight",
        "lost",
        "memory_bytes",
        "present",
        "reserved_for",
        "runnable",
        "runnable_count",
        "running_call_budget_ms",
        "running_call_id",
        "running_for_ms",
        "selectable",
        "stalled",
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
        self.running_for_ms = 0
        self.running_call_budget_ms = 0
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
        #: The last heartbeat reported its running call past that call's stall
        #: threshold (a wedged executor: no new work; the backstop kills it).
        self.stalled = False
        #: The suspect running here in isolation (:mod:`.isolation`), if any.
        self.isolating: DispatchCallContext | None = None
        #: The suspect this executor drains for: no new root call until it is empty.
        self.reserved_for: DispatchCallContext | None = None
        #: ``isolating`` or ``reserved_for`` is set: no root call may be placed here.
        #: Invariant: ``closed_to_roots == (isolating is not None or reserved_for is not None)``.
        self.closed_to_roots = False
        #: The bound calls by id (insertion order = bind order).
        self.calls: dict[str, DispatchCallContext] = {}
        #: Set (to a table-wide unique number) on every change of the score or
        #: filter inputs; heap entries carrying another number are out of date.
        self.version = 0

    def apply(self, snap: ExecutorSnapshot, config: DispatcherConfig) -> None:
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
        self.running_for_ms = snap.running_for_ms
        self.running_call_budget_ms = snap.running_call_budget_ms
        self.last_scheduler_active_at_ms = snap.last_scheduler_active_at_ms
        self.memory_bytes = snap.memory_bytes
        self.runnable = max(0, snap.runnable_count - self.completed_since_snapshot)
        watermark = config.executor_memory_high_watermark
        self.selectable = snap.healthy and not (watermark and snap.memory_bytes >= watermark)
        self.stalled = is_stalled(snap, config)

    @property
    def headroom(self) -> int:
        return self.usable_contexts - self.local_inflight

    def __repr__(self) -> str:
        status = "lost" if self.lost else ("healthy" if self.healthy else "unhealthy")
        if not self.present:
            status += ",absent"
        if self.stalled:
            status += ",stalled"
        if self.isolating is not None:
            status += f",isolating {self.isolating.call_id}"
        elif self.reserved_for is not None:
            status += f",draining for {self.reserved_for.call_id}"
        return (
            f"<ExecutorState {self.executor_id} {status} inflight={self.local_inflight}"
            f" headroom={self.headroom} runnable={self.runnable} hb={self.heartbeat_seq}>"
        )


def is_stalled(snap: ExecutorSnapshot, config: DispatcherConfig) -> bool:
    """Whether ``snap`` reports its running call past that call's stall threshold.

    Only what the heartbeat says counts (``running_for_ms``): silence is never
    extrapolated into a stall.
    """
    if snap.running_call_id is None:
        return False
    threshold = stall_threshold_ms(config, snap.running_call_budget_ms)
    return threshold is not None and snap.running_for_ms > threshold


class StreamBatch:
    """One committed batch of a stream; settles when ``remaining`` reaches 0."""

    __slots__ = ("batch_idx", "remaining", "roots")

    def __init__(self, batch_idx: int) -> None:
        self.batch_idx = batch_idx
        #: Root calls in call order.
        self.roots: list[DispatchCallContext] = []
        #: Roots not yet DONE.
        self.remaining = 0

    def __repr__(self) -> str:
        return f"<StreamBatch #{self.batch_idx} calls={len(self.roots)} remaining={self.remaining}>"


class EndedRun:
    """One-shot: consecutive root calls ``start .. end - 1`` that have all ended, with
    their outputs and failure records in call order (see :class:`TaskDispatchState`).

    Deques: a call ending right before the run goes in front, right after it at the
    back; two runs a call joins are merged by moving the smaller's references (C).
    """

    __slots__ = ("end", "failures", "outputs", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        #: One past the last call (exclusive); ``start`` while the run is being made.
        self.end = start
        self.outputs: deque[bytes] = deque()
        self.failures: deque[FailedCall] = deque()

    def absorb(self, after: EndedRun) -> None:
        """Append the run that starts where this one ends."""
        if len(after.outputs) > len(self.outputs):
            after.outputs.extendleft(reversed(self.outputs))
            self.outputs = after.outputs
        else:
            self.outputs.extend(after.outputs)
        if after.failures:
            if len(after.failures) > len(self.failures):
                after.failures.extendleft(reversed(self.failures))
                self.failures = after.failures
            else:
                self.failures.extend(after.failures)
        self.end = after.end

    def __repr__(self) -> str:
        return (
            f"<EndedRun {self.start}..{self.end - 1} outputs={len(self.outputs)}"
            f" failures={len(self.failures)}>"
        )


class InstanceState:
    """A fairness unit (tenant): its in-flight root calls and dispatchable tasks."""

    __slots__ = ("in_eligible", "inflight", "key", "last_served", "task_count", "tasks", "version")

    def __init__(self, key: str) -> None:
        self.key = key
        #: Root calls of this instance's tasks bound to executors.
        self.inflight = 0
        #: Round-robin ring of this instance's tasks that may have work.
        self.tasks: deque[TaskDispatchState] = deque()
        #: Registered in the scheduler's eligible set.
        self.in_eligible = False
        #: Sequence number of the instance's last bind (ties go to the least
        #: recently served).
        self.last_served = 0
        #: Live tasks of the instance (the record is dropped at 0).
        self.task_count = 0
        #: The number of its current scheduler heap entry (others are out of date).
        self.version = 0

    def __repr__(self) -> str:
        return (
            f"<InstanceState {self.key!r} inflight={self.inflight} tasks={self.task_count}"
            f" ring={len(self.tasks)}>"
        )


class TaskDispatchState:
    """Per-task dispatch state: queues, counters, caches, stream production."""

    __slots__ = (
        "base_backoff_ms",
        "batches",
        "cache_hits",
        "call_budget_ms",
        "call_cache",
        "cancelled",
        "dirty",
        "dropped_roots",
        "failed",
        "failure",
        "failure_policy",
        "in_ring",
        "inflight_roots",
        "instance",
        "live_subcalls",
        "max_attempts",
        "mode",
        "next_batch_idx",
        "next_index",
        "output_bytes",
        "outputs_dropped",
        "pending_bind_subcalls",
        "production_open",
        "ready_queue",
        "retries",
        "roots",
        "runs_by_end",
        "runs_by_start",
        "settled_roots",
        "singleflight",
        "singleflight_hits",
        "stop_dispatching",
        "succeeded",
        "task_id",
        "terminal_roots",
        "total_count",
        "unregistered_roots",
    )

    def __init__(
        self,
        *,
        task_id: str,
        mode: TaskMode,
        instance: InstanceState,
        max_attempts: int,
        base_backoff_ms: int,
        call_budget_ms: int,
        failure_policy: FailurePolicy,
    ) -> None:
        self.task_id = task_id
        self.mode = mode
        self.instance = instance
        # The task's resolved policy.
        self.max_attempts = max_attempts
        self.base_backoff_ms = base_backoff_ms
        self.call_budget_ms = call_budget_ms
        self.failure_policy = failure_policy
        #: Root calls to dispatch, in order (retries and released singleflight
        #: waiters go to the front). Entries whose ``queued`` is False are stale.
        self.ready_queue: deque[DispatchCallContext] = deque()
        #: One-shot: the root calls that have not ended, by index (so in call order).
        #: A root is forgotten as it ends (here and in the core's registry); what the
        #: phase's end needs of it is kept below, already in call order.
        self.roots: dict[int, DispatchCallContext] = {}
        #: One-shot: the ended calls as runs of consecutive indexes, each with its
        #: successful outputs and failures in call order, by first index and by end
        #: (exclusive). A call that ends extends, starts or joins runs (O(1) but for
        #: a join: the smaller run's references moved, in C); once every call has
        #: ended, one run ``0 .. total - 1`` holds what ``ConvergeTaskCalls`` hands
        #: over, built as the calls ended (``lifecycle._end_one_shot_root``).
        self.runs_by_start: dict[int, EndedRun] = {}
        self.runs_by_end: dict[int, EndedRun] = {}
        #: Stream: committed batches not yet settled, oldest first.
        self.batches: deque[StreamBatch] = deque()
        self.next_batch_idx = 0
        #: Index of the next root call registered.
        self.next_index = 0
        # Invariant: terminal_roots == succeeded + failed + cancelled <= total_count.
        self.total_count = 0
        self.terminal_roots = 0
        self.succeeded = 0
        self.failed = 0
        self.cancelled = 0
        #: Root calls RUNNING or WAITING (the TaskMaxInflightCalls window).
        self.inflight_roots = 0
        #: Root calls ended and forgotten (no context): a stream's settled batches'
        #: calls, a one-shot phase's ended calls.
        self.settled_roots = 0
        #: Stream: the producer may still commit batches. One-shot: chunks of the
        #: phase are still to come (``unregistered_roots`` > 0). The task cannot
        #: converge while it is open.
        self.production_open = mode is TaskMode.STREAM
        #: One-shot: calls of the phase not committed yet (``commit_call_chunk``).
        self.unregistered_roots = 0
        #: One-shot: calls of the phase never registered because the task stopped
        #: first; counted cancelled (in ``total_count``, ``terminal_roots`` and
        #: ``cancelled``) with no context, as the drain would have cancelled them.
        self.dropped_roots = 0
        #: Successful outputs by call key, the oldest dropped first (bounded).
        self.call_cache = CallCache()
        #: The call currently computing each key.
        self.singleflight: dict[str, DispatchCallContext] = {}
        #: Sub-calls waiting until their parent's executor can take them.
        self.pending_bind_subcalls: dict[str, DispatchCallContext] = {}
        self.live_subcalls = 0
        #: No more dispatching; once nothing is in flight the rest is cancelled.
        self.stop_dispatching = False
        #: Why the task failed (first reason wins); None while it may succeed.
        self.failure: TaskFailure | None = None
        self.output_bytes = 0
        self.outputs_dropped = False
        #: In the scheduler's ring (or its instance's).
        self.in_ring = False
        #: Queued for the next ``flush_dirty_tasks``.
        self.dirty = False
        self.retries = 0
        self.cache_hits = 0
        self.singleflight_hits = 0

    @property
    def production_done(self) -> bool:
        """No batch (stream) or chunk (one-shot) is to come."""
        return not self.production_open

    @property
    def ended_runs(self) -> list[EndedRun]:
        """One-shot: the runs of ended calls, in call order (for tests and reports)."""
        return [self.runs_by_start[start] for start in sorted(self.runs_by_start)]

    @property
    def outstanding_batches(self) -> int:
        """Stream: committed batches not yet settled (credits in use)."""
        return len(self.batches)

    def __repr__(self) -> str:
        stop = " stopping" if self.stop_dispatching else ""
        prod = " producing" if self.production_open else ""
        return (
            f"<TaskDispatchState {self.task_id!r} {self.mode.value}{stop}{prod}"
            f" done={self.terminal_roots}/{self.total_count} inflight={self.inflight_roots}"
            f" ready={len(self.ready_queue)} ok={self.succeeded} failed={self.failed}"
            f" cancelled={self.cancelled}>"
        )


#: The counters of :class:`DispatcherStats`, by name (a class compiled by mypyc
#: keeps no ``__slots__`` to list them from).
_STAT_COUNTERS: Final = (
    "attempts_given_back",
    "bind_failures",
    "binds",
    "cache_hits",
    "calls_blamed",
    "calls_cancelled",
    "calls_completed",
    "calls_failed",
    "executor_losses",
    "retries",
    "singleflight_hits",
    "stale_events",
    "subcalls_cancelled",
    "subcalls_completed",
    "subcalls_created",
    "subcalls_failed",
    "subcalls_rejected",
    "suspects",
    "tasks_converged",
)


#: Upper bounds (ms, inclusive) of the attempt-duration histogram's buckets: 1 ms, 2 ms,
#: 4 ms ... 2^18 ms (~262 s), powers of two so that an attempt's bucket is a
#: ``bit_length`` (``lifecycle.release_executor``), not a search; one more bucket holds
#: the slower attempts (``DispatcherStats.attempt_buckets``).
ATTEMPT_BUCKETS_MS: Final = tuple(1 << power for power in range(19))
#: Attempts shorter than this (ms) are counted in one list slot per millisecond: the
#: common case costs one index and one increment per attempt (no arithmetic, no sum);
#: the buckets and the sum are folded from the slots when read.
ATTEMPT_DENSE_MS: Final = 1024


class DispatcherStats:
    """Counters since the core was built (monotonic; read-only for callers).

    Besides the integer counters of :meth:`as_dict`, for metrics (read at scrape
    time, ``blockx.observability``): final failures and retries by error kind, and a
    histogram of attempt durations (bind confirmed to executor released, on
    :attr:`clock_ms`), counted by ``lifecycle.release_executor``.

    :attr:`clock_ms` is the one field written from outside: the actor sets it once per
    run (ms since it started: a small int). Statistics only -- no decision of the core
    reads it (those take ``now_ms`` arguments), so the core stays clock-free.
    """

    __slots__ = (
        *_STAT_COUNTERS,
        "attempt_ms_counts",
        "attempt_slow_buckets",
        "attempt_slow_ms_total",
        "clock_ms",
        "failures_by_kind",
        "retries_by_kind",
    )

    def __init__(self) -> None:
        self.binds = 0
        self.bind_failures = 0
        self.retries = 0
        self.cache_hits = 0
        self.singleflight_hits = 0
        #: Events dropped as late, duplicate or from a replaced attempt.
        self.stale_events = 0
        self.subcalls_created = 0
        self.subcalls_rejected = 0
        self.executor_losses = 0
        self.calls_completed = 0
        self.calls_failed = 0
        self.calls_cancelled = 0
        self.tasks_converged = 0
        #: Attempts returned to calls an executor loss did not blame.
        self.attempts_given_back = 0
        #: Calls made suspects by a loss (each then runs in isolation).
        self.suspects = 0
        #: Losses of an executor running a suspect alone (its attempt spent).
        self.calls_blamed = 0
        #: The sub-calls among ``calls_completed`` / ``calls_failed`` / ``calls_cancelled``.
        self.subcalls_completed = 0
        self.subcalls_failed = 0
        self.subcalls_cancelled = 0
        #: Calls that ended FAILED, by their error's kind.
        self.failures_by_kind: dict[str, int] = {}
        #: Retries armed, by the kind of the error that failed the attempt.
        self.retries_by_kind: dict[str, int] = {}
        #: Attempts by duration (:meth:`attempt_histogram` reads them): slot i counts
        #: those of i ms (< ``ATTEMPT_DENSE_MS``; a negative one -- the wall clock stepped
        #: back -- counts as 0 ms) ...
        self.attempt_ms_counts: list[int] = [0] * ATTEMPT_DENSE_MS
        #: ... and the slower ones by bucket (``ATTEMPT_BUCKETS_MS``, then slower), with
        #: their durations added up (ms).
        self.attempt_slow_buckets: list[int] = [0] * (len(ATTEMPT_BUCKETS_MS) + 1)
        self.attempt_slow_ms_total = 0
        #: What attempt durations are measured on (ms; set by the actor each run).
        self.clock_ms = 0

    def record_slow_attempt(self, elapsed_ms: int) -> None:
        """An attempt that took ``elapsed_ms`` outside ``0 .. ATTEMPT_DENSE_MS - 1``."""
        if elapsed_ms < 0:
            self.attempt_ms_counts[0] += 1
            return
        bucket = (elapsed_ms - 1).bit_length()  # the bounds are powers of two
        last = len(ATTEMPT_BUCKETS_MS)
        self.attempt_slow_buckets[bucket if bucket < last else last] += 1
        self.attempt_slow_ms_total += elapsed_ms

    def attempt_histogram(self) -> tuple[list[int], int]:
        """``(counts, total ms)``: the attempts by bucket -- ``counts[i]`` those of at most
        ``ATTEMPT_BUCKETS_MS[i]`` ms and more than the bound before, the last the slower
        ones -- and their durations added up. For metrics, at read time."""
        counts = list(self.attempt_slow_buckets)
        total = self.attempt_slow_ms_total
        for ms, count in enumerate(self.attempt_ms_counts):
            if count:
                counts[(ms - 1).bit_length() if ms > 1 else 0] += count
                total += ms * count
        return counts, total

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _STAT_COUNTERS}

    def __repr__(self) -> str:
        body = " ".join(f"{k}={v}" for k, v in self.as_dict().items() if v)
        return f"<DispatcherStats {body}>"

"""Orchestrator: the dispatch actor, the only code that touches the DispatcherCore.

Theory of operation
-------------------
(seed: ``orchestrator_actor.go`` + ``orchestrator_dispatch.go``.)

**Events in.** The executor adapter's callbacks, timers (retries, the 500 ms
tick) and the worker's task API never call the core. Each turns what happened
into one event (:mod:`.events`) and :meth:`Orchestrator.post`\\ s it:
an append to a plain ``deque`` plus, if the actor is not already due, one
``loop.call_soon``. No ``asyncio.Queue``, no future and no task per event: a
whole read's worth of frames, from every connection that was readable in the
same loop turn, is applied in one actor run (docs/operations.md, "The
figures the design is built on": a Task + Future per call costs ~9 µs). The
adapter delivers a read's call frames as one event (:class:`CallFramesReceived`) and a
flush's control frames as one (:class:`ControlsDelivered`); the actor hands
runs of completions, waits and resumes to the core's batch entry points
(``handle_calls_completed``, ``handle_calls_waiting``, ``handle_calls_resumed``).

**The actor run** (:meth:`Orchestrator._run_actor`)::

    now_ms = wall clock
    repeat:
        apply every queued event           # core.handle_*  -> commands, executed at once
        epilogue: flush_dirty_tasks, dispatch_ready, flush_dirty_tasks (while dirty)
    until no event was posted meanwhile
    adapter.flush()                        # this run's frames go out in one write each

**Commands out** (:meth:`Orchestrator._run`, a table by command type):

==========================  ==============================================================
``BindCall``                ``adapter.bind`` / ``bind_subcall`` on the actor, answered at
                            once with ``handle_executor_bound`` or ``handle_bind_failed``
                            (a run of consecutive binds: every ``bind`` first, then the
                            accepted ones in one ``handle_executors_bound``)
``DispatchCallCmd``         the ExecuteCall envelope (entry selector from the task's code
                            view; pre-encoded, :mod:`.execute`) queued with
                            ``send_execute_call_encoded`` — a non-blocking
                            enqueue, written at the end of the run; a send error is a
                            failed attempt (retryable as the adapter says); a function
                            that does not compile fails the attempt as ``user_error``
``UnbindCall``              ``adapter.unbind``
``CancelCallCmd``           ``mark_draining`` + best-effort ``send_cancel_call``
``ArmCallRetry``            ``loop.call_later`` posting :class:`RetryDue`
``ResumeParentCall``        ``ResumeCall(subcall)`` to the parent (:class:`~.waits.Waits`)
``ReleaseWait``             cancel the IO handler's future of a wait left unanswered
                            (:class:`~.waits.Waits`)
``StopCallProduction``,     reported to the task's :class:`~blockx.worker.actor.task_run.TaskRun`
``BatchSettled``,           (:class:`~.tasks.Tasks`)
``ConvergeTaskCalls``
==========================  ==============================================================

**Parts, by composition.** The orchestrator owns the event queue, the actor
run, the command table, the dispatch path (binds, ExecuteCalls, unbinds,
cancels, retry timers), the tick timer and executor attach/loss. The rest is
in parts it builds in ``__init__``, each an object holding exactly what it
needs (the way h11's ``Connection`` holds a ``ConnectionState``)::

    stats     = OrchestratorStats()                     # stats.py: counters
    runs      = TaskRuns()                              # runs.py: the live tasks table
    snapshots = SnapshotSync(core, adapter, run)        # snapshot_sync.py
    waits     = Waits(core, adapter, runs, stats, run, post, fail_attempt)      # waits.py
    attempts  = AttemptEnds(core, runs, stats, waits, snapshots, run, fail_attempt)
    tasks     = Tasks(core, code_view, runs, run)       # tasks.py
    tick      = Tick(core, adapter, snapshots, stats, pool, tick_interval_s)  # tick.py

``run`` (execute commands), ``post`` (queue an event) and ``fail_attempt`` (at
this run's ``now_ms``) are the orchestrator's bound methods: no part holds the
orchestrator, and none imports this module. The event and command tables map
each type straight to the part's bound method (no forwarding method between);
parts call each other through typed attributes (native calls when compiled).
State each part owns: ``Waits`` the released IO waits; ``Tick`` the wedge
backstop's eras, verdicts, sightings and silences; ``SnapshotSync`` which
executors were synced while draining; ``TaskRuns`` the runs, written only by
``Tasks``. The parts are attributes of the same names, for inspection (tests);
only the actor calls into them.

Ownership: :attr:`Orchestrator.in_actor` is true exactly while the actor runs,
on the event loop thread that started it; tests wrap the core in a proxy that
checks it on every call (``tests/worker/e2e/test_actor_ownership.py``).

Errors: an exception while applying one event is logged with the event and
does not stop the actor (the core's own errors leave it consistent); a bug
must not strand every other task.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from blockx.wire import EncodeError, keys
from blockx.worker.actor.attempts import AttemptEnds
from blockx.worker.actor.events import (
    ActorEvent,
    AttemptCompleted,
    AttemptFailed,
    CallChunkPrepared,
    CallFramesReceived,
    CallSuspended,
    ControlDelivered,
    ControlsDelivered,
    ControlUndelivered,
    ExecutorAttached,
    ExecutorLost,
    ResumeNotQueued,
    RetryDue,
    StreamBatchProduced,
    StreamFinished,
    StreamOpened,
    TaskCancelRequested,
    TaskSubmitted,
    TickElapsed,
)
from blockx.worker.actor.execute import execute_body, execute_prefix
from blockx.worker.actor.runs import TaskRuns
from blockx.worker.actor.snapshot_sync import SnapshotSync
from blockx.worker.actor.stats import OrchestratorStats
from blockx.worker.actor.tasks import Tasks
from blockx.worker.actor.tick import Tick
from blockx.worker.actor.waits import Waits
from blockx.worker.core import (
    ArmCallRetry,
    BatchSettled,
    BindCall,
    CallError,
    CancelCallCmd,
    CompleteCallFromCache,
    ConvergeTaskCalls,
    DispatchCallCmd,
    DispatchCommand,
    DispatcherCore,
    ReleaseWait,
    ResumeParentCall,
    StopCallProduction,
    UnbindCall,
)
from blockx.worker.errors import (
    BindError,
    ExecutorCapacityError,
    ExecutorUnavailableError,
    SendError,
)
from blockx.worker.io import IOHandler, no_io_handler
from blockx.worker.link.callbacks import AdapterCallbacks, CallFrame
from blockx.worker.link.connection import ControlSend
from blockx.worker.link.loss import ExecutorLoss
from blockx.worker.link.reservations import LostCall

if TYPE_CHECKING:
    from blockx.observability.tracing import CallTracer
    from blockx.worker.actor.task_run import TaskRun
    from blockx.worker.code import FunctionCodeView
    from blockx.worker.link.adapter import ExecutorAdapter
    from blockx.worker.pool.manager import PoolManager

__all__ = [
    "ATTACH_GRACE_MS",
    "DEFAULT_TICK_INTERVAL_MS",
    "Orchestrator",
    "OrchestratorStats",
    "wall_clock_ms",
]

_log = logging.getLogger("blockx.worker.orchestrator")

#: The seed's tick: snapshot sync, wedge check, heartbeat timeouts.
DEFAULT_TICK_INTERVAL_MS: Final = 500
#: Event-apply rounds in one actor run before yielding to the event loop.
_MAX_ROUNDS: Final = 16
#: Longest the first dispatch waits for the pool's executors to attach (ms).
ATTACH_GRACE_MS: Final = 2000
#: Shortest retry timer (a bind refused for capacity is re-armed "now": do not spin).
_MIN_RETRY_DELAY_S: Final = 0.001


def wall_clock_ms() -> int:
    """Epoch milliseconds: the core's ``now_ms`` (executors stamp their scheduler
    activity with the same clock)."""
    return time.time_ns() // 1_000_000


class Orchestrator:
    """The dispatch actor (see the module docstring).

    Build it, install :meth:`callbacks` on the adapter and :meth:`resolve_code`
    as its function-code resolver, then :meth:`start` it on the event loop.
    """

    def __init__(
        self,
        core: DispatcherCore,
        adapter: ExecutorAdapter,
        code_view: FunctionCodeView,
        *,
        pool: PoolManager | None = None,
        default_io_handler: IOHandler = no_io_handler,
        tick_interval_ms: int = DEFAULT_TICK_INTERVAL_MS,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._core = core
        self._adapter = adapter
        self._code_view = code_view
        self._pool = pool
        self.default_io_handler = default_io_handler
        self._tick_interval_s = tick_interval_ms / 1000.0
        self._clock_ms = clock_ms
        self._clock_origin_ms = clock_ms()
        self._core_stats = core.stats
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: deque[ActorEvent] = deque()
        # True while an actor run is scheduled or running: posting then only appends.
        self._wake_pending = False
        self._in_actor = False
        self._actor_thread: int | None = None
        self._now_ms = 0
        self._closed = False
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tick_due = 0.0
        #: Dispatch waits for the pool's executors to attach until this time (ms), so the
        #: first calls spread over all of them (0: not waiting).
        self._attach_hold_until_ms = 0
        self.stats = OrchestratorStats()
        #: The span recorder (None: tracing off, the default; :meth:`set_tracer`).
        self.tracer: CallTracer | None = None
        #: Live tasks by the task id the core and executors see (written by ``tasks``).
        self.runs = TaskRuns()
        # The parts: each holds what it needs; none holds the orchestrator, only the
        # bound methods it is given (run commands, post an event, fail an attempt).
        self.snapshots = SnapshotSync(core, adapter, self._run)
        self.waits = Waits(
            core,
            adapter,
            self.runs,
            self.stats,
            run=self._run,
            post=self.post,
            fail_attempt=self._fail_attempt,
        )
        self.attempts = AttemptEnds(
            core,
            self.runs,
            self.stats,
            self.waits,
            self.snapshots,
            run=self._run,
            fail_attempt=self._fail_attempt,
        )
        self.tasks = Tasks(core, code_view, self.runs, run=self._run, stats=self.stats)
        self.tick = Tick(
            core,
            adapter,
            self.snapshots,
            self.stats,
            pool=pool,
            tick_interval_s=self._tick_interval_s,
        )
        waits, attempts, tasks = self.waits, self.attempts, self.tasks
        self._appliers: dict[type[Any], Callable[[Any], None]] = {
            AttemptCompleted: attempts.apply_attempt_completed,
            AttemptFailed: attempts.apply_attempt_failed,
            CallFramesReceived: attempts.apply_call_frames,
            CallSuspended: waits.apply_call_suspended,
            ControlDelivered: waits.apply_control_delivered,
            ControlsDelivered: waits.apply_controls_delivered,
            ControlUndelivered: waits.apply_control_undelivered,
            ResumeNotQueued: waits.apply_resume_not_queued,
            ExecutorAttached: self._apply_executor_attached,
            ExecutorLost: self._apply_executor_lost,
            RetryDue: attempts.apply_retry_due,
            TickElapsed: self.tick.apply_tick,
            TaskSubmitted: tasks.apply_task_submitted,
            CallChunkPrepared: tasks.apply_call_chunk,
            StreamOpened: tasks.apply_stream_opened,
            StreamBatchProduced: tasks.apply_stream_batch,
            StreamFinished: tasks.apply_stream_finished,
            TaskCancelRequested: tasks.apply_task_cancel,
        }
        self._executors: dict[type[Any], Callable[[Any], None]] = {
            BindCall: self._execute_bind,  # _run batches runs of binds itself
            DispatchCallCmd: self._execute_dispatch,
            UnbindCall: self._execute_unbind,
            CancelCallCmd: self._execute_cancel,
            ArmCallRetry: self._execute_arm_retry,
            CompleteCallFromCache: self._execute_complete_from_cache,
            ResumeParentCall: waits.execute_resume_parent,
            ReleaseWait: waits.execute_release_wait,
            StopCallProduction: tasks.execute_stop_production,
            BatchSettled: tasks.execute_batch_settled,
            ConvergeTaskCalls: tasks.execute_converge,
        }

    def __repr__(self) -> str:
        return (
            f"Orchestrator(tasks={len(self.runs.by_id)}, queued={len(self._events)}, "
            f"runs={self.stats.actor_runs}, {self._core!r})"
        )

    # --- wiring ------------------------------------------------------------------------------

    def callbacks(self) -> AdapterCallbacks:
        """The adapter callbacks: each posts one event (bound methods: no extra frame).

        Call frames and flushed control frames come in batches (one event per read
        and per flush); the per-frame forms stay wired for adapters that use them.
        """
        return AdapterCallbacks(
            on_executor_attached=self._on_executor_attached,
            on_call_completed=self._on_call_completed,
            on_call_failed=self._on_call_failed,
            on_call_waiting=self._on_call_waiting,
            on_executor_lost=self._on_executor_lost,
            # The flushed note is itself the fact: posted as is (ControlDelivered).
            on_control_sent=self.post,
            on_control_failed=self._on_control_failed,
            on_call_frames=self._on_call_frames,
            on_controls_sent=self._on_controls_sent,
        )

    def _on_call_frames(self, executor_id: str, frames: list[CallFrame]) -> None:
        self.post(CallFramesReceived(executor_id, frames))

    def _on_controls_sent(self, notes: list[ControlSend]) -> None:
        self.post(ControlsDelivered(notes))

    def _on_executor_attached(self, executor_id: str, _snapshot: Any) -> None:
        self.post(ExecutorAttached(executor_id=executor_id))

    def _on_call_completed(self, executor_id: str, call_id: str, payload: dict[str, Any]) -> None:
        self.post(AttemptCompleted(executor_id, call_id, payload))

    def _on_call_failed(self, executor_id: str, call_id: str, payload: dict[str, Any]) -> None:
        self.post(AttemptFailed(executor_id, call_id, payload))

    def _on_call_waiting(
        self,
        executor_id: str,
        call_id: str,
        request_id: str,
        payload: dict[str, Any],
        sidecar: bytes | None,
    ) -> None:
        self.post(CallSuspended(executor_id, call_id, request_id, payload, sidecar))

    def _on_executor_lost(
        self,
        executor_id: str,
        lost: tuple[LostCall, ...],
        reason: str,
        loss: ExecutorLoss | None = None,
    ) -> None:
        self.post(
            ExecutorLost(executor_id=executor_id, reason=reason, lost_calls=len(lost), loss=loss)
        )

    def _on_control_failed(self, note: ControlSend, error: ExecutorUnavailableError) -> None:
        self.post(ControlUndelivered(note, error.reason or str(error)))

    def resolve_code(self, task_id: str, function_id: str, digest: str) -> Any:
        """The adapter's function-code resolver (answers from the pinned views)."""
        return self._code_view.resolve(task_id, function_id, digest)

    def set_pool(self, pool: PoolManager) -> None:
        """Use ``pool`` to kill executors; and hold the first dispatch until its
        executors have attached (at most :data:`ATTACH_GRACE_MS`), so that the first
        calls of a run spread over all of them instead of piling onto the first."""
        self._pool = pool
        self.tick.set_pool(pool)
        self._attach_hold_until_ms = self._clock_ms() + ATTACH_GRACE_MS

    def set_tracer(self, tracer: CallTracer | None) -> None:
        """Record spans with ``tracer`` (blockx/observability/tracing.py); None: off.
        Each part that records spans holds it too (one attribute test per hook)."""
        self.tracer = tracer
        self.waits.tracer = tracer
        self.attempts.tracer = tracer
        self.tasks.tracer = tracer

    @property
    def core(self) -> DispatcherCore:
        """The core, for read-only inspection (tests). Only the actor may call into it."""
        return self._core

    @property
    def in_actor(self) -> bool:
        """True while the actor runs, on the thread that runs it (the ownership check)."""
        return self._in_actor and threading.get_ident() == self._actor_thread

    @property
    def live_task_ids(self) -> list[str]:
        return list(self.runs.by_id)

    def task_run(self, task_id: str) -> TaskRun | None:
        return self.runs.by_id.get(task_id)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind to the running loop and start the 500 ms tick."""
        self._loop = asyncio.get_running_loop()
        self._actor_thread = threading.get_ident()
        self._schedule_tick()

    def close(self) -> None:
        """Stop the tick; events posted from now on are dropped."""
        self._closed = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None

    # --- the tick timer (the checks are :class:`~.tick.Tick`'s) -------------------------------

    def _schedule_tick(self) -> None:
        loop = self._loop
        assert loop is not None
        self._tick_due = time.monotonic() + self._tick_interval_s
        self._tick_handle = loop.call_later(self._tick_interval_s, self._on_tick_timer)

    def _on_tick_timer(self) -> None:
        self._tick_handle = None
        if self._closed:
            return
        late_ms = int((time.monotonic() - self._tick_due) * 1000)
        self.post(TickElapsed(late_ms=max(late_ms, 0)))
        self._schedule_tick()

    # --- posting ------------------------------------------------------------------------------

    def post(self, event: ActorEvent) -> None:
        """Queue ``event`` for the actor; wake it once per loop turn. Event loop thread only."""
        if self._closed:
            return
        self._events.append(event)
        if not self._wake_pending:
            self._wake_pending = True
            loop = self._loop
            assert loop is not None, "Orchestrator.start() was not called"
            loop.call_soon(self._run_actor)

    # --- the actor ----------------------------------------------------------------------------

    def _run_actor(self) -> None:
        events = self._events
        appliers = self._appliers
        self._in_actor = True
        self.stats.actor_runs += 1
        try:
            self._now_ms = now_ms = self._clock_ms()
            # The clock of the attempt durations (statistics): small ints, one store.
            self._core_stats.clock_ms = now_ms - self._clock_origin_ms
            for _round in range(_MAX_ROUNDS):
                while events:
                    event = events.popleft()
                    self.stats.events += 1
                    try:
                        appliers[type(event)](event)
                    except Exception:
                        self.stats.handler_errors += 1
                        _log.exception("dispatch actor: applying %r failed", event)
                self._epilogue()
                if not events:
                    break
        finally:
            self._in_actor = False
            self._wake_pending = False
            if events and not self._closed:
                self._wake_pending = True
                assert self._loop is not None
                self._loop.call_soon(self._run_actor)
        self._adapter.flush()

    def _epilogue(self) -> None:
        """Convergence and release, to quiescence (dispatcher.py's actor loop)."""
        core = self._core
        run = self._run
        try:
            while True:
                run(core.flush_dirty_tasks())
                if not self._attach_hold_until_ms or not self._holding_dispatch():
                    run(core.dispatch_ready(self._now_ms))
                run(core.flush_dirty_tasks())
                if not core.has_dirty_tasks:
                    return
        except Exception:
            self.stats.handler_errors += 1
            _log.exception("dispatch actor: epilogue failed")

    def _holding_dispatch(self) -> bool:
        """Whether the first dispatch still waits for the pool's executors to attach
        (until every slot attached or the grace ran out; the tick re-checks) -- unless
        every call there is to place gets an attached executor of its own: there is
        nothing to spread then, and a one-call run waited ~50 ms for its second
        executor (the hold stays for the calls that come later)."""
        pool = self._pool
        if pool is not None and self._now_ms < self._attach_hold_until_ms:
            expected = len(pool.executor_ids)
            attached_ids = self._adapter.attached_executor_ids()
            attached = len(attached_ids)
            if attached < expected:
                return not attached or self._calls_to_place(attached_ids) > attached
        self._attach_hold_until_ms = 0
        return False

    def _calls_to_place(self, attached_ids: list[str]) -> int:
        """The calls ready to dispatch and those on the attached executors already (an
        upper bound: a ready queue may hold calls taken off it lazily). Read while the
        first dispatch is held only."""
        core = self._core
        count = 0
        for task_id in core.task_ids():
            task = core.task_state(task_id)
            if task is not None:
                count += len(task.ready_queue)
        for executor_id in attached_ids:
            executor = core.executor_state(executor_id)
            if executor is not None:
                count += executor.inflight_count
        return count

    def _run(self, commands: list[DispatchCommand]) -> None:
        """Execute ``commands`` in order (some answer back into the core at once).

        A run of consecutive ``BindCall``\\ s is executed together
        (:meth:`_execute_binds`): the same reservations and answers, in the same
        order, with one core call for the accepted binds.
        """
        if not commands:
            return
        executors = self._executors
        self.stats.commands += len(commands)
        binds: list[BindCall] | None = None
        for command in commands:
            kind = type(command)
            if kind is BindCall:
                if binds is None:
                    binds = [command]  # type: ignore[list-item]
                else:
                    binds.append(command)  # type: ignore[arg-type]
                continue
            if binds is not None:
                self._execute_binds(binds)
                binds = None
            executors[kind](command)
        if binds is not None:
            self._execute_binds(binds)

    # --- commands -----------------------------------------------------------------------------

    def _execute_bind(self, cmd: BindCall) -> None:
        self._execute_binds([cmd])

    def _execute_binds(self, binds: list[BindCall]) -> None:
        """Reserve every bind in order; confirm the accepted ones in one core call.

        A refused bind is answered (``handle_bind_failed``) after the accepted
        ones before it have been confirmed, so the core sees the answers in the
        binds' order -- as if each had been executed and answered on its own.
        """
        adapter = self._adapter
        bind = adapter.bind
        accepted: list[BindCall] = []
        for cmd in binds:
            try:
                if cmd.parent_call_id is None:
                    bind(cmd.call_id, cmd.executor_id)
                else:
                    adapter.bind_subcall(cmd.call_id, cmd.parent_call_id, cmd.executor_id)
            except BindError as exc:
                if accepted:
                    self._dispatch_bound(accepted)
                    accepted = []
                self.stats.bind_failures += 1
                if isinstance(exc, ExecutorCapacityError):
                    # The core's view is behind (a cancelled call still drains there):
                    # catch it up first, or the retry would pick this executor again.
                    self.snapshots.sync()
                _log.debug("bind of %s on %s refused: %s", cmd.call_id, cmd.executor_id, exc)
                self._run(
                    self._core.handle_bind_failed(
                        cmd.call_id, cmd.executor_id, cmd.attempt_seq, self._now_ms
                    )
                )
                continue
            accepted.append(cmd)
        if accepted:
            self._dispatch_bound(accepted)

    def _dispatch_bound(self, accepted: list[BindCall]) -> None:
        commands = self._core.handle_executors_bound(accepted)
        dispatch = self._execute_dispatch
        for index, command in enumerate(commands):
            if type(command) is DispatchCallCmd:
                dispatch(command)  # the common case, without the table
            else:
                self._run(commands[index:])  # parked sub-calls' binds and the rest
                return

    def _execute_dispatch(self, cmd: DispatchCallCmd) -> None:
        run = self.runs.by_id.get(cmd.task_id)
        call = cmd.call
        if run is None:  # cannot happen: the core forgets a task only after its calls
            self._fail_dispatch(
                cmd,
                keys.ERR_INTERNAL_ERROR,
                f"no runtime for task {cmd.task_id!r}",
                retryable=False,
            )
            return
        prefix_key = (call.function_id, call.function_code_digest)
        prefix = run.execute_prefixes.get(prefix_key)
        if prefix is None:  # the function's first dispatch in this task
            code = run.code.resolve_for_dispatch(call.function_id, call.function_code_digest)
            error = code.error
            if error is not None:
                self._fail_dispatch(
                    cmd,
                    error.kind,
                    error.message,
                    retryable=False,
                    stack=error.stack,
                )
                return
            prefix = run.execute_prefixes[prefix_key] = execute_prefix(
                cmd.task_id,
                call.function_id,
                call.function_code_digest,
                code.entry_selector,
                code.audit,
                run.debug,
            )
        body = execute_body(prefix, cmd)
        tracer = self.tracer
        if tracer is not None:  # tracing on: the call span, and its context in the envelope
            body = tracer.traced_body(cmd, body)
        try:
            self._adapter.send_execute_call_encoded(
                cmd.executor_id, cmd.call_id, cmd.attempt_seq, body
            )
        except SendError as exc:
            self.stats.send_failures += 1
            self._fail_dispatch(cmd, exc.error_kind, str(exc), retryable=exc.retryable)
        except EncodeError as encode_error:  # own name: mypyc types a name once
            self.stats.send_failures += 1
            self._fail_dispatch(cmd, encode_error.error_kind, str(encode_error), retryable=False)

    def _fail_dispatch(
        self,
        cmd: DispatchCallCmd,
        kind: str,
        message: str,
        *,
        retryable: bool,
        stack: str | None = None,
    ) -> None:
        """The attempt ``cmd`` dispatches failed before it reached the executor."""
        error = CallError(kind=kind, message=message, retryable=retryable, stack=stack)
        self._fail_attempt(cmd.call_id, cmd.attempt_seq, error, 0)

    def _fail_attempt(
        self, call_id: str, attempt_seq: int, error: CallError, budget_used_ms: int
    ) -> None:
        """Fail the live attempt at this actor run's time (given to the parts)."""
        tracer = self.tracer
        if tracer is not None:
            tracer.call_ended(call_id, attempt_seq, "failed", error.kind, None)
        self._run(
            self._core.handle_attempt_failure(
                call_id, attempt_seq, error, self._now_ms, budget_used_ms=budget_used_ms
            )
        )

    def _execute_unbind(self, cmd: UnbindCall) -> None:
        self._adapter.unbind(cmd.call_id, cmd.executor_id)

    def _execute_cancel(self, cmd: CancelCallCmd) -> None:
        adapter = self._adapter
        if not adapter.mark_draining(cmd.call_id, cmd.executor_id):
            return  # no reservation: the executor already ended the attempt (or is gone)
        try:
            adapter.send_cancel_call(
                cmd.executor_id, cmd.call_id, attempt_seq=cmd.attempt_seq, reason=cmd.reason
            )
        except SendError as exc:  # best-effort: the connection is going away anyway
            _log.debug("CancelCall for %s not sent: %s", cmd.call_id, exc)

    def _execute_arm_retry(self, cmd: ArmCallRetry) -> None:
        loop = self._loop
        assert loop is not None
        delay_s = max((cmd.due_at_ms - self._now_ms) / 1000.0, _MIN_RETRY_DELAY_S)
        loop.call_later(delay_s, self._retry_due, cmd.call_id)

    def _retry_due(self, call_id: str) -> None:
        self.post(RetryDue(call_id=call_id))

    def _execute_complete_from_cache(self, cmd: CompleteCallFromCache) -> None:
        return None  # recorded by the core; counted in ConvergeTaskCalls

    # --- events: executors --------------------------------------------------------------------

    def _apply_executor_attached(self, event: ExecutorAttached) -> None:
        _log.debug("executor %s attached", event.executor_id)
        self.snapshots.sync()

    def _apply_executor_lost(self, event: ExecutorLost) -> None:
        """An era ended: its calls go by the blame rules (:meth:`.Tick.loss_report`,
        :mod:`blockx.worker.core.blame`)."""
        if event.lost_calls:
            loss = event.loss
            _log.info(
                "executor %s lost with %d call(s): %s (%s)",
                event.executor_id,
                event.lost_calls,
                event.reason,
                "no cause known" if loss is None else f"{loss.cause}: {loss.message}",
            )
        self.snapshots.sync()
        report = self.tick.loss_report(event)
        self._run(self._core.handle_executor_lost(event.executor_id, self._now_ms, report))

"""Worker: the worker runtime assembled, and the Python API that runs tasks on it.

Theory of operation
-------------------
(seed: ``internal/worker/app``.) :class:`Worker` wires one of each, on the
running event loop (use :func:`run` or :func:`run_task_sync` to get uvloop
when it is installed)::

    ExecutorAdapter   UDS listener in a private socket directory
    DispatcherCore    the scheduler, DispatcherConfig from WorkerConfig.dispatcher_kwargs()
    Orchestrator      the dispatch actor + the 500 ms tick; the adapter's callbacks
                      and function-code resolver (the pinned code views)
    PoolManager       EXECUTOR_COUNT executor processes (process spawn mode)

A task goes through :meth:`Worker.submit`:

1. **off the actor** — its sources are checked and pinned
   (:func:`~blockx.worker.code.build_task_code_view`), and a one-shot task's
   calls checked, encoded canonically and prepared (``prepare_*_with_digests``,
   pure) chunk by chunk, one chunk per loop turn (:mod:`blockx.worker.actor.one_shot`):
   the first chunk in ``submit``, the others by the task's driver;
2. **admission** — at most ``EXECUTOR_TASK_SLOTS`` tasks are in their executor
   phase at once; the others wait for a slot;
3. **on the actor** — the prepared phase is committed (a long list chunk by
   chunk, one per loop turn; or the stream opened and fed batch by batch under
   the credit window), and the task runs until the core converges it;
4. the :class:`TaskHandle` turns the convergence into a
   :class:`~blockx.worker.api.TaskResult`.

Cancelling ``run_task`` (or :meth:`TaskHandle.cancel`) cancels the task in the
core: its in-flight calls get ``CancelCall`` on their executors, the rest are
drained, and the task converges ``CANCELLED``.

Shutdown (:meth:`Worker.close`, ``async with``): live tasks are cancelled and
given a moment to converge, the pool terminates every executor (SIGTERM, then
SIGKILL) and reaps them, and the adapter closes its connections and removes
its socket directory. No executor outlives the worker.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
from collections.abc import AsyncIterable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from blockx.portability import check_platform
from blockx.worker.actor.events import (
    StreamBatchProduced,
    StreamFinished,
    StreamOpened,
    TaskCancelRequested,
    TaskSubmitted,
)
from blockx.worker.actor.one_shot import OneShotCalls, as_call, encode_call_args, pair_specs
from blockx.worker.actor.orchestrator import DEFAULT_TICK_INTERVAL_MS, Orchestrator
from blockx.worker.actor.task_run import TaskRun
from blockx.worker.api import (
    FLUSH,
    Call,
    CallBatch,
    Task,
    TaskFailureInfo,
    TaskResult,
    TaskSpecError,
    TaskStats,
)
from blockx.worker.audit_gate import audit_task_code
from blockx.worker.code import MISSING_FUNCTION_DIGEST, FunctionCodeView, build_task_code_view
from blockx.worker.config import WorkerConfig, load_config
from blockx.worker.core import (
    CallSpec,
    DispatcherConfig,
    DispatcherCore,
    TaskMode,
)
from blockx.worker.handle import TaskHandle
from blockx.worker.io import BackendRouter, IOHandler, no_io_handler
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.loop import GC_GEN0_THRESHOLD, run, tune_gc
from blockx.worker.pool.manager import PoolManager
from blockx.worker.pool.spawner import ExecutorSpawner

if TYPE_CHECKING:
    from blockx.observability.tracing import CallTracer, Tracing
    from blockx.worker.pool.early import EarlyExecutors

__all__ = ["GC_GEN0_THRESHOLD", "TaskHandle", "Worker", "run", "run_task_sync", "tune_gc"]

_log = logging.getLogger("blockx.worker")

#: How long shutdown waits for cancelled tasks to converge before stopping the pool.
_SHUTDOWN_CONVERGE_S: Final = 5.0
#: How long a cancelled ``run_task`` waits for its task to converge before re-raising.
_CANCEL_CONVERGE_S: Final = 5.0

_task_seq = itertools.count(1)
#: The final states of a task (``Worker.task_counts``).
_ENDED_STATES: Final = ("succeeded", "failed", "cancelled")


def _io_handler(io_handlers: IOHandler | Mapping[str, IOHandler] | None) -> IOHandler:
    if io_handlers is None:
        return no_io_handler
    if isinstance(io_handlers, Mapping):
        return BackendRouter(io_handlers)
    return io_handlers


class Worker:
    """A BlockX worker: executor pool, dispatcher and the task API (see the module docstring).

    ``io_handlers`` answers the tasks' IO waits: one :class:`~blockx.worker.io.IOHandler`,
    or a mapping ``{backend: handler}`` (routed by ``payload["backend"]``). A task may
    bring its own (``Task.io_handler``).

    ``tracing`` (a :class:`blockx.observability.tracing.Tracing`, e.g. from
    ``Tracing.from_env(trace_file)``) records spans; None (the default) is off.
    ``metrics_port``: serve Prometheus metrics at ``http://127.0.0.1:PORT/metrics``
    while the worker runs (0: a free port, see :attr:`metrics_port`); the series are
    docs/observability.md's, read from the worker's counters at each scrape.

    ``early``: executors already starting for this ``config``
    (:class:`~blockx.worker.pool.early.EarlyExecutors`, ``blockx run``'s): the worker
    serves their socket and adopts their pool instead of spawning its own.

    Testing hooks: ``spawner`` replaces the process spawner; ``core_wrapper`` wraps the
    dispatcher core (an ownership-checking proxy); ``tick_interval_ms`` the tick.
    """

    def __init__(
        self,
        config: WorkerConfig | None = None,
        *,
        io_handlers: IOHandler | Mapping[str, IOHandler] | None = None,
        spawner: ExecutorSpawner | None = None,
        core_wrapper: Callable[[DispatcherCore], Any] | None = None,
        tick_interval_ms: int = DEFAULT_TICK_INTERVAL_MS,
        seed: int | None = None,
        tracing: Tracing | None = None,
        metrics_port: int | None = None,
        early: EarlyExecutors | None = None,
    ) -> None:
        self.config = config if config is not None else load_config()
        if early is not None and early.config != self.config:
            raise ValueError("early executors were started for another configuration")
        self._early = early
        self.tracing = tracing
        self._tracer: CallTracer | None = None
        if tracing is not None:
            from blockx.observability.tracing import CallTracer

            self._tracer = CallTracer(tracing)
        self._metrics_port = metrics_port
        self._metrics_server: Any = None
        #: IO subsystems whose statistics the metrics report (:meth:`observe_io`).
        self._io_systems: list[Any] = []
        #: Tasks ended, by final state (succeeded / failed / cancelled): for metrics.
        self._tasks_ended: dict[str, int] = dict.fromkeys(_ENDED_STATES, 0)
        self._default_io = _io_handler(io_handlers)
        self._spawner = spawner
        self._core_wrapper = core_wrapper
        self._tick_interval_ms = tick_interval_ms
        self._rng = random.Random(seed)
        self._adapter: ExecutorAdapter | None = None
        self._pool: PoolManager | None = None
        self._orchestrator: Orchestrator | None = None
        self._core: DispatcherCore | None = None
        self._admission: asyncio.Semaphore | None = None
        self._handles: set[TaskHandle] = set()
        self._started = False
        self._closed = False
        self.observe_io(self._default_io)

    def __repr__(self) -> str:
        status = "closed" if self._closed else ("running" if self._started else "new")
        return f"Worker({status}, tasks={len(self._handles)}, {self._pool!r})"

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, build the dispatcher, start the executor pool. Returns once every
        executor process exists (see :meth:`wait_ready` for attached)."""
        if self._started:
            raise RuntimeError("Worker.start() called twice")
        check_platform()  # Windows: UnsupportedPlatformError, a clear message (README)
        self._started = True
        cfg = self.config
        adapter = ExecutorAdapter(
            heartbeat_timeout_ms=cfg.heartbeat_timeout_ms,
            heartbeat_check_interval_ms=None,  # the orchestrator's tick checks
            outbox_depth=cfg.adapter.outbox_depth,
            frames_per_write=cfg.adapter.frames_per_write,
            socket_dir=cfg.adapter.socket_dir,
            max_unattached=cfg.adapter.max_unattached_connections,
            attach_timeout_ms=cfg.adapter.attach_timeout_ms,
            exit_wait_ms=cfg.adapter.exit_wait_ms,
            listener=None if self._early is None else self._early.listener,
        )
        if self._early is None:
            await adapter.start()
        self._adapter = adapter
        try:
            core = DispatcherCore(DispatcherConfig(**cfg.dispatcher_kwargs()), rng=self._rng)
            self._core = core
            wrapped = core if self._core_wrapper is None else self._core_wrapper(core)
            orchestrator = Orchestrator(
                wrapped,
                adapter,
                FunctionCodeView(),
                default_io_handler=self._default_io,
                tick_interval_ms=self._tick_interval_ms,
            )
            adapter.set_callbacks(orchestrator.callbacks())
            adapter.set_function_code_resolver(orchestrator.resolve_code)
            if self._tracer is not None:
                orchestrator.set_tracer(self._tracer)
            orchestrator.start()
            self._orchestrator = orchestrator
            pool = (
                PoolManager.from_config(cfg, adapter.socket_path, spawner=self._spawner)
                if self._early is None
                else self._early.take()
            )
            adapter.set_peer_check(pool.check_peer)
            adapter.set_exit_source(pool)
            orchestrator.set_pool(pool)
            self._pool = pool
            self._admission = asyncio.Semaphore(cfg.admission.executor_task_slots)
            await pool.start()
            if self._early is not None:
                # Early executors may be waiting in the socket's backlog: it is served only
                # now, once their processes are registered and every callback is set.
                await adapter.start()
            if self._metrics_port is not None:
                from blockx.observability.metrics import MetricsServer

                self._metrics_server = MetricsServer.for_worker(self, port=self._metrics_port)
                await self._metrics_server.start()
        except BaseException:
            await self.close()
            raise
        _log.info(
            "worker started: %d executor(s) on %s", cfg.pool.executor_count, adapter.socket_path
        )

    async def wait_ready(self, timeout: float = 60.0, count: int | None = None) -> None:
        """Wait until ``count`` executors (default: every slot) have attached."""
        adapter = self._adapter
        if adapter is None:
            raise RuntimeError("the worker is not started")
        want = self.config.pool.executor_count if count is None else count
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(adapter.attached_executor_ids()) < want:
            if loop.time() > deadline:
                raise TimeoutError(
                    f"{len(adapter.attached_executor_ids())}/{want} executors attached "
                    f"after {timeout}s"
                )
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Cancel live tasks, terminate the executors, close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        handles = list(self._handles)
        for handle in handles:
            handle.cancel("worker shutting down")
        drivers = [h._driver for h in handles if not h._driver.done()]
        if drivers:
            await asyncio.wait(drivers, timeout=_SHUTDOWN_CONVERGE_S)
            for driver in drivers:
                if not driver.done():
                    driver.cancel()
        if self._adapter is not None:
            self._adapter.expect_disconnects()
        if self._pool is not None:
            await self._pool.stop()
        if self._orchestrator is not None:
            self._orchestrator.close()
        if self._tracer is not None:
            self._tracer.close()  # what is still open ends "unfinished"; sinks flushed
        if self._adapter is not None:
            await self._adapter.close()
        if self._early is not None:
            self._early.discard()  # not taken: start() failed before the pool
            self._early.remove_socket()  # the adapter's, unless start() failed before it
        if drivers:
            await asyncio.gather(*drivers, return_exceptions=True)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        _log.info("worker stopped")

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # --- views --------------------------------------------------------------------------------

    @property
    def pool(self) -> PoolManager:
        if self._pool is None:
            raise RuntimeError("the worker is not started")
        return self._pool

    @property
    def adapter(self) -> ExecutorAdapter:
        if self._adapter is None:
            raise RuntimeError("the worker is not started")
        return self._adapter

    @property
    def orchestrator(self) -> Orchestrator:
        if self._orchestrator is None:
            raise RuntimeError("the worker is not started")
        return self._orchestrator

    @property
    def socket_path(self) -> str:
        return self.adapter.socket_path

    @property
    def metrics_port(self) -> int | None:
        """The port the metrics server listens on (127.0.0.1), once started; None without."""
        server = self._metrics_server
        return None if server is None else server.port

    @property
    def io_subsystems(self) -> list[Any]:
        """The IO subsystems whose statistics the metrics report (:meth:`observe_io`)."""
        return list(self._io_systems)

    def observe_io(self, io: Any) -> None:
        """Report ``io``'s statistics (an :class:`~blockx.worker.io.registry.IOSubsystem`,
        or anything with an ``IOStats`` ``stats`` whose scopes roll up into it) in the
        worker's metrics. The worker's own IO handler, and a task's that is a subsystem,
        are observed already; ``blockx run`` and ``blockx serve`` give the subsystem
        whose task scopes they hand to tasks. Idempotent; anything without stats is
        ignored."""
        if getattr(io, "stats", None) is None or not hasattr(io, "task_scope"):
            return
        if all(known is not io for known in self._io_systems):
            self._io_systems.append(io)

    def task_counts(self) -> dict[str, int]:
        """Tasks by state: ``queued`` (waiting for an admission slot or still being
        checked), ``running``, and the ended ones by final state (since the start)."""
        running = sum(1 for h in self._handles if h.registered and not h.done())
        queued = sum(1 for h in self._handles if not h.registered and not h.done())
        return {"queued": queued, "running": running, **self._tasks_ended}

    def _task_ended(self, run: TaskRun, driver: asyncio.Task[None]) -> None:
        converged = run.converged_with
        if converged is not None and converged.success and not run.output_limit_hit:
            state = "succeeded"
        elif (converged is not None and converged.failure is not None) and (
            converged.failure.kind == "CANCELLED"
        ):
            state = "cancelled"
        elif converged is None and driver.cancelled():
            state = "cancelled"
        else:
            state = "failed"
        self._tasks_ended[state] += 1

    def _orchestrator_post(self, event: Any) -> None:
        if self._orchestrator is not None:
            self._orchestrator.post(event)

    # --- tasks --------------------------------------------------------------------------------

    async def run_task(self, task: Task) -> TaskResult:
        """Run ``task`` to its end and return its result (rows collected).

        Cancelling this coroutine cancels the task on the worker (its calls are
        cancelled on their executors) before ``CancelledError`` propagates.
        """
        handle = self.submit(task)
        try:
            return await handle.result()
        except asyncio.CancelledError:
            handle.cancel("run_task was cancelled")
            try:
                await asyncio.wait_for(asyncio.shield(handle._driver), _CANCEL_CONVERGE_S)
            except BaseException:
                pass
            raise

    def submit(self, task: Task, *, collect: bool = True) -> TaskHandle:
        """Start ``task`` and return its handle at once.

        ``collect=False``: rows are not kept for the result; iterate
        :meth:`TaskHandle.rows` instead (flat memory for long streams).
        Raises :class:`~blockx.worker.api.TaskSpecError` for a malformed task.
        A one-shot list longer than one registration chunk
        (:data:`~blockx.worker.actor.one_shot.ONE_SHOT_CHUNK_CALLS` calls) is checked
        chunk by chunk after ``submit`` returns: a bad call past the first chunk
        raises the same ``TaskSpecError`` from :meth:`TaskHandle.result` (and so
        from ``run_task``), and none of the task's calls is registered.
        """
        if not self._started or self._closed or self._orchestrator is None:
            raise RuntimeError("the worker is not running (use `async with Worker(...)`)")
        if not isinstance(task.functions, Mapping) or not task.functions:
            raise TaskSpecError("a task needs at least one function: functions={id: source}")
        try:
            code = build_task_code_view(task.functions)
        except (TypeError, ValueError) as exc:
            raise TaskSpecError(str(exc)) from None
        if task.audit:
            code = audit_task_code(code)  # verdicts before any call is registered
        policy = task.policy
        core_policy = policy.core_policy()
        internal_id = f"{task.task_id}#{next(_task_seq)}"
        loop = asyncio.get_running_loop()
        stream = task.is_stream
        calls: list[Call] | None = None
        one_shot = None
        if not stream:
            assert isinstance(task.calls, (list, tuple))
            assert self._core is not None
            one_shot = OneShotCalls(  # its first chunk: raises TaskSpecError for a bad call
                internal_id,
                task.calls,
                code.digests(),
                self._core,
                instance=task.instance,
                policy=core_policy,
            )
            calls = one_shot.calls
        io_handler = task.io_handler if task.io_handler is not None else self._default_io
        own_scope: Any = None
        # An IO subsystem (the task's or the worker's) gives each run a scope of its own
        # (its read cache and singleflight), closed when the run ends: runs never see each
        # other's cached reads, even under one task id, and a finished run's cache is freed.
        new_scope = getattr(io_handler, "task_scope", None)
        if callable(new_scope):
            self.observe_io(io_handler)
            io_handler = own_scope = new_scope(task.task_id)
        run = TaskRun(
            task_id=internal_id,
            user_task_id=task.task_id,
            code=code,
            io_handler=io_handler,
            policy=core_policy,
            instance=task.instance,
            mode=TaskMode.STREAM if stream else TaskMode.ONE_SHOT,
            calls=calls,
            debug=policy.debug,
            # A collected stream keeps every row for the result: the worker's
            # max_collected_output_bytes applies to it here (the core limits one-shot
            # tasks only; a stream handed out batch by batch has no such limit).
            max_output_bytes=(
                policy.max_output_bytes
                if policy.max_output_bytes is not None or not (stream and collect)
                else self.config.dispatcher.max_collected_output_bytes or None
            ),
            deadline_ms=policy.deadline_ms,
            collect=collect,
            window=self.config.stream_build.max_outstanding_batches,
            started_at=loop.time(),
        )
        handle_box: list[TaskHandle] = []
        if stream:
            coro = self._drive_stream(run, task.calls, handle_box)
        else:
            assert one_shot is not None
            coro = self._drive_one_shot(run, one_shot, handle_box)
        driver = loop.create_task(coro, name=f"blockx-task-{task.task_id}")
        total = 0 if one_shot is None else one_shot.first.total_count
        handle = TaskHandle(self, run, driver, calls=total)
        handle_box.append(handle)
        self._handles.add(handle)
        driver.add_done_callback(lambda _d: self._handles.discard(handle))
        # A driver that ends without the run converging (a bad call found after submit,
        # a cancel before admission) must wake a rows() iteration waiting for a change.
        driver.add_done_callback(lambda _d: run.changed.set())
        driver.add_done_callback(functools.partial(self._task_ended, run))
        if own_scope is not None:
            # The run is over: its backend calls still running are nobody's.
            driver.add_done_callback(lambda _d: own_scope.close(cancel_running=True))
        return handle

    async def _admitted(
        self,
        run: TaskRun,
        handle_box: list[TaskHandle],
        first_event: Any,
        feed: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        """Post the task's first event once it holds an admission slot, then ``feed()``
        the rest of its calls (a long one-shot list's chunks), then wait for its end."""
        handle = handle_box[0]
        self._orchestrator_post(first_event)
        handle.registered = True
        deadline: asyncio.TimerHandle | None = None
        if run.deadline_ms is not None:
            deadline = asyncio.get_running_loop().call_later(
                run.deadline_ms / 1000.0,
                self._orchestrator_post,
                TaskCancelRequested(
                    task_id=run.task_id, reason=f"task deadline of {run.deadline_ms} ms passed"
                ),
            )
        try:
            if feed is not None:
                await feed()
            await asyncio.shield(run.done)
        except asyncio.CancelledError:
            # The worker is closing (or run_task's cancellation reached us): make sure the
            # core lets go of the task before the admission slot is returned.
            if not run.done.done():
                self._orchestrator_post(
                    TaskCancelRequested(task_id=run.task_id, reason="task driver cancelled")
                )
                try:
                    await asyncio.wait_for(asyncio.shield(run.done), _CANCEL_CONVERGE_S)
                except BaseException:
                    pass
            raise
        finally:
            if deadline is not None:
                deadline.cancel()

    async def _drive_one_shot(
        self, run: TaskRun, one_shot: OneShotCalls, handle_box: list[TaskHandle]
    ) -> None:
        """Prepare the list's other chunks (a ``TaskSpecError`` ends the task here,
        nothing registered), then commit the phase and feed it chunk by chunk."""
        assert self._admission is not None
        feed: Callable[[], Coroutine[Any, Any, None]] | None = None
        if one_shot.chunked:
            await one_shot.prepare_rest()
            feed = functools.partial(one_shot.feed, run, self._orchestrator_post)
        async with self._admission:
            first = TaskSubmitted(run=run, prepared=one_shot.first)
            await self._admitted(run, handle_box, first, feed)

    async def _drive_stream(
        self,
        run: TaskRun,
        calls: Iterable[Any] | AsyncIterable[Any],
        handle_box: list[TaskHandle],
    ) -> None:
        assert self._admission is not None
        async with self._admission:
            producer = asyncio.get_running_loop().create_task(
                self._produce(run, calls, handle_box), name=f"blockx-producer-{run.user_task_id}"
            )
            try:
                await self._admitted(run, handle_box, StreamOpened(run=run))
            finally:
                if not producer.done():
                    producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

    async def _produce(
        self,
        run: TaskRun,
        calls: Iterable[Any] | AsyncIterable[Any],
        handle_box: list[TaskHandle],
    ) -> None:
        """Feed a stream's batches under the credit window (see task_run.py)."""
        cfg = self.config.stream_build
        max_rows = cfg.batch_max_rows
        max_bytes = cfg.batch_max_args_bytes
        digests = dict(run.code.digests())
        batch_calls: list[Call | tuple[str, Any]] = []  # pairs from CallBatch items
        specs: list[CallSpec] = []
        size = 0
        index = 0
        first_index = 0
        assert self._core is not None
        core = self._core

        async def commit() -> bool:
            nonlocal batch_calls, specs, size, first_index
            while run.credits <= 0 and run.stopped is None and not run.done.done():
                await run.wait_changed()
            if run.stopped is not None or run.done.done():
                return False
            prepared = core.prepare_call_batch_with_digests(run.task_id, specs, digests)
            run.batch_starts[run.committed_batches] = (first_index, batch_calls)
            run.committed_batches += 1
            run.stream_calls += len(specs)
            self._orchestrator_post(StreamBatchProduced(run=run, prepared=prepared))
            first_index += len(specs)
            batch_calls, specs, size = [], [], 0
            await asyncio.sleep(0)  # let the actor and the readers run between batches
            return True

        def add(item: Any) -> None:
            nonlocal size, index
            call = as_call(item, index)
            if call.function_id not in digests:
                digests[call.function_id] = MISSING_FUNCTION_DIGEST
            args = encode_call_args(call, index)
            batch_calls.append(call)
            specs.append(CallSpec(call.function_id, args))
            size += len(args)
            index += 1

        async def add_batch(pairs: list[tuple[str, Any]]) -> bool:
            # A CallBatch: its calls in one loop, cut into batches as single items are.
            nonlocal size, index
            position = 0
            while position < len(pairs):
                end = min(len(pairs), position + max_rows - len(specs))
                stop, size = pair_specs(
                    pairs, position, end, index, specs, size, max_bytes, digests
                )
                batch_calls.extend(pairs[position:stop])
                index += stop - position
                position = stop
                if len(specs) >= max_rows or size >= max_bytes:
                    if not await commit():
                        return False
            return True

        try:
            if isinstance(calls, AsyncIterable):
                async for item in calls:
                    if item is FLUSH:  # the source is about to wait: send what it gave
                        if specs and not await commit():
                            return
                        continue
                    if type(item) is CallBatch:
                        if not await add_batch(item.pairs):
                            return
                        continue
                    add(item)
                    if len(specs) >= max_rows or size >= max_bytes:
                        if not await commit():
                            return
            else:
                for item in calls:
                    if item is FLUSH:
                        if specs and not await commit():
                            return
                        continue
                    if type(item) is CallBatch:
                        if not await add_batch(item.pairs):
                            return
                        continue
                    add(item)
                    if len(specs) >= max_rows or size >= max_bytes:
                        if not await commit():
                            return
            if specs and not await commit():
                return
            self._orchestrator_post(StreamFinished(run=run))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            _log.error("task %s: its call stream failed: %r", run.user_task_id, exc)
            if handle_box:
                handle_box[0].producer_error = exc
            self._orchestrator_post(
                TaskCancelRequested(task_id=run.task_id, reason=f"the call stream raised {exc!r}")
            )

    # --- results ------------------------------------------------------------------------------

    def _result(self, run: TaskRun) -> TaskResult:
        converged = run.converged_with
        assert converged is not None, "the task has not converged"
        failure = None
        if converged.failure is not None:
            f = converged.failure
            kind = "OUTPUT_BYTES_EXCEEDED" if run.output_limit_hit else f.kind
            index = None
            if f.call_id is not None:
                index = _call_index(f.call_id)
            failure = TaskFailureInfo(
                kind=kind,
                message=f.message,
                call_index=index,
                error_kind=f.error.kind if f.error is not None else None,
            )
        loop = asyncio.get_running_loop()
        stats = TaskStats(
            calls=converged.total_count,
            succeeded=converged.succeeded_count,
            failed=converged.failed_count,
            cancelled=converged.cancelled_count,
            retries=converged.retry_count,
            cache_hits=converged.cache_hit_count,
            singleflight_hits=converged.singleflight_hit_count,
            subcalls=run.subcalls,
            io_calls=run.io_calls,
            wall_time_s=loop.time() - run.started_at,
        )
        outputs = run.rows if (run.collect and not run.output_limit_hit) else []
        debug_output = {}
        for call_id, text in run.debug_output.items():
            index = _call_index(call_id)
            if index is not None:
                debug_output[index] = text
        return TaskResult(
            task_id=run.user_task_id,
            success=converged.success and not run.output_limit_hit,
            failure=failure,
            outputs=outputs,
            errors=sorted(run.failures, key=lambda e: e.index),
            stats=stats,
            code_errors={fid: e.message for fid, e in run.code.errors().items()},
            debug_output=debug_output,
        )


def _call_index(call_id: str) -> int | None:
    """The index of a root call id ``{task}/c{index}`` (None for a sub-call)."""
    _, sep, tail = call_id.rpartition("/c")
    if not sep or not tail.isdigit():
        return None
    return int(tail)


def run_task_sync(
    task: Task, config: WorkerConfig | None = None, **worker_kwargs: Any
) -> TaskResult:
    """Start a worker, run one task, stop the worker (a script's one-liner)."""

    async def main() -> TaskResult:
        async with Worker(config, **worker_kwargs) as worker:
            return await worker.run_task(task)

    return run(main())

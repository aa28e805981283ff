"""The task manager of ``blockx serve``: stored tasks run on one worker, persisted as they go.

Theory of operation
-------------------
Every task the API accepts is written to the :class:`~blockx.serve.store.TaskStore`
first (its spec and its calls, one transaction) and only then answered 201. The
manager then owns it as a :class:`LiveTask` until it ends:

* **queued** -- waiting for a run slot. At most ``slots`` tasks run at once (the
  worker's ``admission.executor_task_slots``); a freed slot goes to the next
  waiting task of the *instance* whose turn it is (round robin over instances,
  FIFO within one), so one tenant's hundred tasks do not keep another's one
  waiting. Inside the worker, running tasks share the executors max-min fairly
  by instance (the core's fairness).
* **running** -- submitted to the :class:`~blockx.worker.app.Worker` as a *stream*
  whatever its shape: the calls are read back from the store from the first call
  whose outcome is not stored yet (``done``), so a task resumed after a crash runs
  only what was not settled. Every settled batch (its call range, rows, failures,
  counts: :class:`~blockx.worker.actor.task_run.SettledRows`) is persisted in one
  transaction (:meth:`TaskStore.settle_batch`) before the next is taken, then the
  task's followers (``GET .../rows``) are woken. The store's counters are the
  truth the API reports.
* **succeeded / failed / cancelled** -- the end, with its summary, persisted.

The store is used from one thread (:class:`StoreThread`): SQLite commits never
block the event loop, and the calls of the store are serialised.

Guarantees (``docs/serve.md``): rows exactly once -- a batch's rows and its
outcome are one transaction, and a resumed task starts after the last stored
batch; execution at least once -- a call whose batch was not stored when the
server died runs again.

Draining (SIGTERM): no new task is accepted and no queued task starts; running
tasks go on for the drain timeout; then they are cut: their runs are cancelled
*without* storing anything more (the cancelled calls are not outcomes), so the
next start resumes them where their stored batches end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import orjson

from blockx.serve.store import NewTask, SettledBatch, TaskClosed, TaskRecord, TaskStore

__all__ = [
    "FINISHED_STATES",
    "STREAM_WINDOW_CALLS",
    "LiveTask",
    "QueueFull",
    "ServerDraining",
    "StoreThread",
    "TaskManager",
    "new_task_id",
    "public_fields",
]

_log = logging.getLogger("blockx.serve")
_T = TypeVar("_T")

FINISHED_STATES: Final = frozenset({"succeeded", "failed", "cancelled"})
#: Calls of a streamed task stored and not yet settled before ``POST .../calls`` waits.
STREAM_WINDOW_CALLS: Final = 65_536
#: Rows read from the store per follower step.
ROWS_PER_READ: Final = 65_536


def public_fields(r: TaskRecord) -> dict[str, Any]:
    """What a client sees of a task (``GET /v1/tasks/{id}``, the dashboard), times as Unix
    seconds: its ids, state, shape and counters."""
    return {
        "id": r.id,
        "task_id": r.task_id,
        "instance": r.instance,
        "state": r.state,
        "streamed": r.streamed,
        "closed": r.closed or not r.streamed,
        "calls": r.calls,
        "done": r.done,
        "succeeded": r.succeeded,
        "failed": r.failed,
        "cancelled": r.cancelled,
        "rows": r.rows,
        "created_at": r.created_at,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
    }


def new_task_id() -> str:
    """A server task id: ``t-`` and 16 hex digits."""
    return f"t-{secrets.token_hex(8)}"


class QueueFull(Exception):
    """Too many tasks wait for a run slot (the API answers 429)."""


class ServerDraining(Exception):
    """The server is shutting down (the API answers 503)."""


class StoreThread:
    """The store, called from one thread of its own (see the module docstring)."""

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blockx-store")

    def __repr__(self) -> str:
        return f"StoreThread({self.store!r})"

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.store.close()


class LiveTask:
    """A task the manager holds: its stored record and, while it runs, its handle."""

    __slots__ = (
        "cancel_reason",
        "changed",
        "functions",
        "handle",
        "instance",
        "record",
        "runner",
        "spec",
    )

    def __init__(self, record: TaskRecord) -> None:
        self.record = record
        self.spec: dict[str, Any] = orjson.loads(record.spec)
        self.functions: frozenset[str] = frozenset(self.spec.get("functions") or ())
        self.instance = record.instance or ""
        self.handle: Any = None
        self.runner: asyncio.Task[None] | None = None
        self.cancel_reason: str | None = None
        #: Set on every change a follower or a calls poster may wait for.
        self.changed = asyncio.Event()

    def __repr__(self) -> str:
        r = self.record
        return f"LiveTask({r.id}, {r.state}, done={r.done}/{r.calls}, rows={r.rows})"

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_changed(self, timeout: float | None = None) -> None:
        await wait_event(self.changed, timeout)


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait for ``event`` (taken *before* checking the condition: a change made after the
    check sets it), at most ``timeout`` seconds."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


class TaskManager:
    """Runs the stored tasks on one worker (see the module docstring)."""

    def __init__(
        self,
        worker: Any,
        io: Any,
        store: StoreThread,
        *,
        slots: int,
        queue_limit: int = 64,
        retention_s: float = 7 * 86400.0,
        stream_window: int = STREAM_WINDOW_CALLS,
        task_factory: Callable[[bytes, Any], Any],
    ) -> None:
        self.worker = worker
        self.io = io
        self.store = store
        self.slots = slots
        self.queue_limit = queue_limit
        self.retention_s = retention_s
        self.stream_window = stream_window
        self._task_factory = task_factory
        self.live: dict[str, LiveTask] = {}
        #: Waiting tasks by instance (FIFO), and the instances in round-robin order.
        self._waiting: dict[str, collections.deque[LiveTask]] = {}
        self._turns: collections.deque[str] = collections.deque()
        self.running = 0
        self.draining = False
        #: Set when the drain cuts the running tasks: nothing more is stored.
        self.cutting = False
        self._expiry: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return (
            f"TaskManager(running={self.running}/{self.slots}, waiting={self.waiting}, "
            f"live={len(self.live)}{', draining' if self.draining else ''})"
        )

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    # --- start and stop --------------------------------------------------------------------

    async def start(self) -> int:
        """Take back every unfinished task of the store (oldest first); returns how many."""
        records = await self.store.call(self.store.store.requeue_unfinished)
        for record in records:
            live = LiveTask(record)
            if record.cancel_reason is not None:  # cancelled before the restart: end it
                self.live[record.id] = live
                live.cancel_reason = record.cancel_reason
                await self._finish(
                    live, "cancelled", None, {"kind": "CANCELLED", "message": record.cancel_reason}
                )
                continue
            self._enqueue(live)
        self._schedule()
        self._expiry = asyncio.get_running_loop().create_task(
            self._expire_forever(), name="blockx-serve-expiry"
        )
        return len(records)

    async def drain(self, timeout_s: float) -> int:
        """Stop starting tasks; give the running ones ``timeout_s``; cut the rest (their
        stored batches stay; they resume at the next start). Returns how many were cut."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            runners = [t.runner for t in self.live.values() if t.runner is not None]
            if not runners:
                break
            await asyncio.wait(runners, timeout=max(0.0, deadline - time.monotonic()))
        self.cutting = True
        cut = [t for t in self.live.values() if t.runner is not None and not t.runner.done()]
        for live in cut:
            if live.handle is not None:
                live.handle.cancel("the server is shutting down")
        for live in cut:
            assert live.runner is not None
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(live.runner), 10.0)
        if self._expiry is not None:
            self._expiry.cancel()
        return len(cut)

    # --- the API's operations -------------------------------------------------------------

    async def create(
        self,
        *,
        task_id: str,
        instance: str | None,
        spec_json: bytes,
        streamed: bool,
        calls_lines: bytes | None,
        calls_count: int,
    ) -> TaskRecord:
        """Store a new task (before the caller answers 201) and queue it."""
        if self.draining:
            raise ServerDraining("the server is shutting down")
        if self.waiting >= self.queue_limit:
            raise QueueFull(f"{self.waiting} tasks are waiting for a run slot")
        record_id = new_task_id()
        await self.store.call(
            self.store.store.create_task,
            NewTask(
                id=record_id,
                task_id=task_id,
                instance=instance,
                spec=spec_json,
                streamed=streamed,
                calls_body=calls_lines,
                calls_count=calls_count,
                created_at=time.time(),
            ),
        )
        record = await self.get(record_id)
        assert record is not None
        live = LiveTask(record)
        self._enqueue(live)
        self._schedule()
        return live.record

    async def get(self, record_id: str) -> TaskRecord | None:
        live = self.live.get(record_id)
        if live is not None:
            return live.record
        return await self.store.call(self.store.store.get, record_id)

    async def list(self, state: str | None) -> list[TaskRecord]:
        """Every stored task (in ``state``), oldest first: the store is the truth (a live
        task's record is refreshed from it after every change)."""
        return await self.store.call(self.store.store.list, state)

    async def append_calls(self, record_id: str, lines: bytes, count: int) -> TaskRecord:
        """Store more calls of a streamed task (waiting while its window is full)."""
        live = self.live.get(record_id)
        if live is None:
            raise TaskClosed("the task has finished")
        while (
            live.record.calls - live.record.done >= self.stream_window
            and live.record.state not in FINISHED_STATES
            and not self.draining
        ):
            await live.wait_changed(1.0)  # a settled batch refreshes the record
        if self.draining:
            raise ServerDraining("the server is shutting down")
        await self.store.call(self.store.store.append_calls, record_id, lines, count)
        await self._refresh(live)
        return live.record

    async def close_calls(self, record_id: str) -> TaskRecord:
        live = self.live.get(record_id)
        if live is None:
            raise TaskClosed("the task has finished")
        await self.store.call(self.store.store.close_calls, record_id)
        await self._refresh(live)
        return live.record

    async def cancel(self, record_id: str, reason: str = "cancelled through the API") -> bool:
        """Cancel a task; False when it had finished already."""
        live = self.live.get(record_id)
        if live is None:
            return False
        # Stored first: a server that dies before the run converges ends the task
        # cancelled when it starts again, instead of running it.
        await self.store.call(self.store.store.request_cancel, record_id, reason)
        live.cancel_reason = reason
        if live.runner is None:  # still waiting for a slot: it ends here
            self._unqueue(live)
            await self._finish(live, "cancelled", None, {"kind": "CANCELLED", "message": reason})
            return True
        if live.handle is not None:
            live.handle.cancel(reason)
        live.notify()  # a run still reading its calls sees the reason
        return True

    async def purge(self, record_id: str) -> bool:
        return await self.store.call(self.store.store.purge, record_id)

    async def rows(self, record_id: str, after: int) -> AsyncIterator[bytes]:
        """The task's stored rows from ``after`` on; while it runs, more as they are stored,
        until it ends."""
        position = after
        while True:
            # Taken before reading: a task that ends (or a batch stored) after the read is
            # seen at the next turn, so no row is lost and no change is slept through.
            live = self.live.get(record_id)
            event = live.changed if live is not None else None
            body, count = await self.store.call(
                self.store.store.rows_after, record_id, position, ROWS_PER_READ
            )
            if count:
                position += count
                yield body
                continue
            if live is None or event is None or self.cutting:
                return  # ended (or the server is going down: the client resumes with ?after)
            await wait_event(event, 5.0)

    # --- scheduling -------------------------------------------------------------------------

    def _enqueue(self, live: LiveTask) -> None:
        self.live[live.record.id] = live
        queue = self._waiting.get(live.instance)
        if queue is None:
            queue = self._waiting[live.instance] = collections.deque()
            self._turns.append(live.instance)
        queue.append(live)

    def _unqueue(self, live: LiveTask) -> None:
        queue = self._waiting.get(live.instance)
        if queue is not None and live in queue:
            queue.remove(live)

    def _next_waiting(self) -> LiveTask | None:
        for _ in range(len(self._turns)):
            instance = self._turns[0]
            self._turns.rotate(-1)
            queue = self._waiting.get(instance)
            if queue:
                return queue.popleft()
            self._waiting.pop(instance, None)
            self._turns.remove(instance)
        return None

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.draining and self.running < self.slots:
            live = self._next_waiting()
            if live is None:
                return
            self.running += 1
            live.runner = loop.create_task(self._run(live), name=f"blockx-serve-{live.record.id}")

    async def _refresh(self, live: LiveTask) -> None:
        record = await self.store.call(self.store.store.get, live.record.id)
        if record is not None:
            live.record = record
        live.notify()

    # --- one run -----------------------------------------------------------------------------

    async def _calls(self, live: LiveTask, start: int) -> AsyncIterator[Any]:
        """The task's stored calls from ``start`` on; a streamed task's as they arrive,
        until it is closed."""
        from blockx.worker.api import FLUSH, CallBatch

        position = start
        store = self.store.store
        missing = 0
        while True:
            event = live.changed
            chunks = await self.store.call(store.call_chunks, live.record.id, position)
            for first, count, body in chunks:
                lines = body.split(b"\n")
                if lines and not lines[-1]:
                    lines.pop()
                skip = position - first
                decoded = orjson.loads(b"[" + b",".join(lines[skip:] if skip else lines) + b"]")
                if decoded:  # one item for the chunk: the worker takes its calls in one loop
                    yield CallBatch([(item["function"], item.get("args")) for item in decoded])
                position = first + count
            record = live.record
            if not record.streamed or record.closed:
                if position >= record.calls:
                    return
                # The record was refreshed after the read: look again once; calls the
                # store says it holds and cannot give are a broken store.
                missing = missing + 1 if not chunks else 0
                if missing > 1:
                    raise RuntimeError(
                        f"calls {position}..{record.calls} of task {record.id} are missing "
                        "from the store"
                    )
                await self._refresh(live)
                continue
            if live.cancel_reason is not None:
                return
            yield FLUSH  # the calls read so far run now, not once a batch fills
            await wait_event(event, 5.0)
            await self._refresh(live)

    async def _run(self, live: LiveTask) -> None:
        try:
            await self._run_inner(live)
        except Exception as exc:
            _log.exception("task %s: the run broke down", live.record.id)
            if not self.cutting:
                with contextlib.suppress(Exception):
                    await self._finish(
                        live, "failed", None, {"kind": "INTERNAL", "message": repr(exc)}
                    )
        finally:
            self.running -= 1
            if live.record.state in FINISHED_STATES:
                self.live.pop(live.record.id, None)
            live.notify()
            self._schedule()

    async def _run_inner(self, live: LiveTask) -> None:
        from blockx.cli.output import encode_outputs, encode_rows

        record = live.record
        start = record.done
        store = self.store.store
        await self.store.call(store.mark_started, record.id, time.time())
        await self._refresh(live)
        task = self._task_factory(record.spec, self._calls(live, start))
        scope = self.io.task_scope(task.task_id)
        task.io_handler = scope
        handle = self.worker.submit(task, collect=False)
        live.handle = handle
        if live.cancel_reason is not None:
            handle.cancel(live.cancel_reason)
        async for settled in handle.settled_batches():
            if self.cutting:
                continue  # the drain cut the run: a cancelled call is no outcome
            failures = tuple((start + f.index, _failure_record(f, start)) for f in settled.failures)
            if settled.outputs and not settled.decoded:  # most often the rows' JSON as is
                rows_body, row_count = encode_outputs(settled.outputs)
            else:
                rows = settled.rows
                rows_body, row_count = (encode_rows(rows) if rows else b""), len(rows)
            batch = SettledBatch(
                first_call=start + settled.first_call,
                call_count=settled.call_count,
                rows_body=rows_body,
                row_count=row_count,
                failures=failures,
                succeeded=settled.succeeded,
                failed=len(settled.failures),
                cancelled=settled.cancelled,
            )
            await self.store.call(store.settle_batch, record.id, batch)
            await self._refresh(live)
        try:
            result = await handle.result()
        except Exception as exc:  # a call source that broke (the store): the task failed
            if self.cutting:
                return
            await self._finish(live, "failed", None, {"kind": "INTERNAL", "message": repr(exc)})
            return
        if self.cutting:
            return
        failure = None
        if result.failure is not None:
            f = result.failure
            failure = {
                "kind": f.kind,
                "message": f.message,
                # The call that stopped the task (fast_fail), by its index in the task.
                "call_index": None if f.call_index is None else start + f.call_index,
                "error_kind": f.error_kind,
            }
        if result.success:
            state = "succeeded"
        elif result.failure is not None and result.failure.kind == "CANCELLED":
            state = "cancelled"
        else:
            state = "failed"
        await self._refresh(live)
        summary = await self._summary(live, result, scope, state)
        await self._finish(live, state, summary, failure)

    async def _summary(self, live: LiveTask, result: Any, scope: Any, state: str) -> dict[str, Any]:
        """The figures ``blockx run --summary-json`` gives, from the stored counters (every
        run of the task) and this run's result (its retries, caches, IO)."""
        record = live.record
        failure_records = await self.store.call(self.store.store.failures, record.id)
        kinds = collections.Counter(orjson.loads(f)["kind"] for f in failure_records)
        stats = result.stats
        cancelled = record.cancelled
        if state == "cancelled":  # calls stored and never run count as cancelled
            cancelled = max(cancelled, record.calls - record.succeeded - record.failed)
        all_ok = state == "succeeded" and record.failed == 0 and cancelled == 0
        started = record.started_at or record.created_at
        wall = max(time.time() - started, 1e-9)
        summary: dict[str, Any] = {
            "task_id": record.task_id,
            "success": result.success,
            "failure": None if result.failure is None else result.failure.kind,
            "calls": record.calls,
            "succeeded": record.succeeded,
            "failed": record.failed,
            "cancelled": cancelled,
            "retries": stats.retries,
            "subcalls": stats.subcalls,
            "cache_hits": stats.cache_hits,
            "singleflight_hits": stats.singleflight_hits,
            "io_calls": stats.io_calls,
            "task_wall_time_s": round(wall, 4),
            "calls_per_s": round(record.calls / wall, 1),
            "failures_by_kind": dict(kinds),
            "output_rows": record.rows,
            "exit_code": 0 if all_ok else 1,
        }
        stats_of_io = getattr(scope, "stats", None)
        if stats_of_io is not None:
            summary["io"] = stats_of_io.as_dict()
        cluster = getattr(live.handle, "summary_extra", None)  # --ray: nodes, node_lost, io
        if cluster is not None:
            summary.update(cluster())
        return summary

    async def _finish(
        self,
        live: LiveTask,
        state: str,
        summary: dict[str, Any] | None,
        failure: dict[str, Any] | None,
    ) -> None:
        if summary is None:
            record = live.record
            summary = {
                "task_id": record.task_id,
                "success": False,
                "failure": None if failure is None else failure.get("kind"),
                "calls": record.calls,
                "succeeded": record.succeeded,
                "failed": record.failed,
                "cancelled": record.calls - record.succeeded - record.failed,
                "output_rows": record.rows,
                "exit_code": 1,
            }
        await self.store.call(
            self.store.store.finish, live.record.id, state, time.time(), summary, failure
        )
        await self._refresh(live)
        if live.runner is None:
            self.live.pop(live.record.id, None)

    async def _expire_forever(self) -> None:
        """Purge finished tasks past the retention, hourly (and once at start)."""
        while True:
            try:
                n = await self.store.call(self.store.store.expire, time.time() - self.retention_s)
                if n:
                    _log.info("purged %d finished task(s) past the retention", n)
            except Exception:
                _log.exception("purging expired tasks failed")
            await asyncio.sleep(min(3600.0, max(1.0, self.retention_s / 4)))


def _failure_record(failure: Any, start: int) -> bytes:
    """A finally failed call as ``blockx run --errors`` writes it (its index in the task)."""
    return orjson.dumps(
        {
            "index": start + failure.index,
            "function": failure.function_id,
            "args": failure.args,
            "kind": failure.kind,
            "message": failure.message,
            "stack": failure.stack,
            "attempts": failure.attempts,
            "retryable": failure.retryable,
        },
        default=repr,
    )


def data_dir_default() -> str:
    """``$BLOCKX_SERVE_DATA_DIR``, else ``.blockx-serve`` in the working directory."""
    return os.environ.get("BLOCKX_SERVE_DATA_DIR") or ".blockx-serve"

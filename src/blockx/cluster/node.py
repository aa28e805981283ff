"""The node worker: a Ray actor hosting one :class:`~blockx.worker.app.Worker` on its node.

Theory of operation
-------------------
The driver (:mod:`blockx.cluster.driver`) creates one :class:`NodeWorker` per Ray
node, pinned there (``NodeAffinitySchedulingStrategy(node_id, soft=False)``). It is an
*async* actor: its methods run on one event loop, many at once, and the worker's own
machinery (dispatch actor, executor pool, IO backends) runs on that loop too. The
worker's executors are child processes of the actor, sized to the node's CPUs (or
``--executors-per-node``).

A driver task is *one streamed task* on the node (:class:`_NodeTask`): its first batch
submits a :class:`~blockx.worker.api.Task` whose calls come from a queue the later
batches feed, so the task's call cache and singleflight live across every batch the
node gets, and sub-calls (made inside the node's executors) stay on the node by
construction. :meth:`NodeWorker.run_batch` queues a batch's calls and then ``FLUSH``
(the stream commits them at once, and no stream batch ever spans two driver batches)
-- in the driver's order of the batches (their ``seq``), not the order Ray runs the
method calls in: an async actor runs them out of order, and as a stream has two
batches committed and unsettled at most, a later batch of long-waiting calls queued
first held an earlier batch back (its calls did not start, and the driver's rows,
written in call order, waited for them) -- then waits for the settled batches that cover them
(:meth:`~blockx.worker.handle.TaskHandle.settled_batches`, in call order) and returns
one entry per call of the batch, in batch order -- its raw JSON output, or None for a
call that failed or was cancelled (:func:`outputs_per_call`, which checks that the
outputs match the succeeded calls) -- with the failures and counts, in one reply: the
driver decodes the outputs when it writes them, in call order across nodes.
:meth:`NodeWorker.finish` ends the stream and returns the task's statistics.

Every reply also carries the node task's *figures so far* (:meth:`_NodeTask.figures`:
its cumulative retries, cache and singleflight hits, sub-calls, IO calls and IO
counters -- counters only, a few hundred bytes), so that a node lost mid-task has
reported what it did up to its last reply. Cumulative counters only grow: the driver
keeps their elementwise maximum over the replies and ``finish`` (:func:`merge_figures`),
whatever order they arrive in, and counts nothing twice.

The node's task runs with ``failure: continue`` whatever the driver's policy: the
driver applies ``fast_fail`` itself (a failure on one node stops the whole run), and a
node never stops a stream other nodes still feed.

The executors see ``BLOCKX_RAY_NODE_ID`` (the Ray node id) in their environment.
"""

from __future__ import annotations

import asyncio
import os
import pickle
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

__all__ = [
    "NODE_ID_ENV",
    "BatchReply",
    "NodeTaskSpec",
    "NodeWorker",
    "OutputsMisaligned",
    "io_operations",
    "merge_figures",
    "merge_io",
    "node_worker_class",
    "outputs_per_call",
    "total_figures",
]

#: The executors' environment variable holding the node's Ray node id.
NODE_ID_ENV: Final = "BLOCKX_RAY_NODE_ID"
_END: Final = object()


@dataclass(frozen=True, slots=True)
class NodeTaskSpec:
    """What a node needs to run a driver task's calls (functions, policy, ids)."""

    key: str
    task_id: str
    functions: dict[str, str]
    instance: str | None
    policy: Any  # blockx.worker.api.TaskPolicy
    audit: bool


@dataclass(frozen=True, slots=True)
class BatchReply:
    """What a node answers for one batch: one entry per call in batch order (its raw JSON
    output, None for a call that failed or was cancelled), the failures by the batch's
    call offset (``(offset, kind, message, stack, attempts, retryable)``), counts."""

    batch_id: int
    outputs: list[bytes | None]
    failures: list[tuple[int, str, str, str | None, int, bool]]
    succeeded: int
    cancelled: int
    #: The node task's cumulative figures when it answered (:meth:`_NodeTask.figures`);
    #: None from a node that sends none.
    figures: dict[str, Any] | None = None


class OutputsMisaligned(RuntimeError):
    """A settled batch's outputs do not match its succeeded calls (a broken invariant:
    the run must stop, not guess which row belongs to which call)."""


def outputs_per_call(
    first_call: int,
    call_count: int,
    outputs: Sequence[bytes],
    failed: Iterable[int],
    cancelled: int,
) -> list[bytes | None]:
    """One entry per call of a settled stream batch ``[first_call, first_call +
    call_count)``: its output, or None for a failed (``failed``: stream indices) or
    cancelled call.

    ``outputs`` are the succeeded calls' outputs in call order, so they must number
    ``call_count - len(failed) - cancelled`` (else :class:`OutputsMisaligned`). Which
    calls were cancelled is not reported (only while the stream is cancelled): their
    None entries are put last, after the succeeded calls' outputs in call order --
    the rows' order is kept either way.
    """
    failed_at = {i - first_call for i in failed}
    expected = call_count - len(failed_at) - cancelled
    if len(outputs) != expected or any(not 0 <= i < call_count for i in failed_at):
        raise OutputsMisaligned(
            f"calls {first_call}..{first_call + call_count}: {len(outputs)} outputs for "
            f"{call_count} calls, {len(failed_at)} failed and {cancelled} cancelled "
            f"({expected} expected)"
        )
    if not failed_at and not cancelled:
        return list(outputs)
    entries: list[bytes | None] = []
    it = iter(outputs)
    for offset in range(call_count):
        entries.append(None if offset in failed_at else next(it, None))
    return entries


class _Pending:
    __slots__ = (
        "bid",
        "cancelled",
        "count",
        "failures",
        "future",
        "outputs",
        "start",
        "succeeded",
    )

    def __init__(self, bid: int, start: int, count: int, future: asyncio.Future[BatchReply]):
        self.bid = bid
        self.start = start
        self.count = count
        self.future = future
        self.outputs: list[bytes | None] = []
        self.failures: list[tuple[int, str, str, str | None, int, bool]] = []
        self.succeeded = 0
        self.cancelled = 0

    def __repr__(self) -> str:
        return f"_Pending(batch {self.bid}, calls {self.start}+{self.count})"

    def reply(self, figures: dict[str, Any] | None = None) -> BatchReply:
        # Calls the stream never took (it ended first) were cancelled: None entries.
        outputs = self.outputs
        rest = self.count - len(outputs)
        if rest > 0:
            outputs.extend([None] * rest)
            self.cancelled += self.count - self.succeeded - len(self.failures) - self.cancelled
        return BatchReply(self.bid, outputs, self.failures, self.succeeded, self.cancelled, figures)


class _NodeTask:
    """One driver task's stream on this node."""

    def __init__(self, worker: Any, io: Any, spec: NodeTaskSpec) -> None:
        from blockx.worker.api import Task

        self.spec = spec
        self.worker = worker
        #: The core's counters as last read (the core forgets the task when it ends).
        self.core_counts: dict[str, int] = dict.fromkeys(CORE_COUNTERS, 0)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.position = 0
        self.pending: deque[_Pending] = deque()
        #: The driver's number of the next batch to queue, and the batches that came
        #: before their turn, by number (None: a batch whose calls could not be read):
        #: an async actor runs method calls out of order (Ray's rule), and a stream
        #: has two batches committed and unsettled at most, so a later batch of
        #: long-waiting calls queued first would hold an earlier one back.
        self.next_seq = 0
        self.held: dict[int, tuple[int, list[tuple[str, Any]] | None, asyncio.Future[Any]]] = {}
        #: The stream ended (cancelled, or its source closed): a batch is answered at once.
        self.ended = False
        policy = replace(spec.policy, failure="continue")
        task = Task(
            functions=spec.functions,
            calls=self._calls(),
            task_id=spec.task_id,
            instance=spec.instance,
            policy=policy,
            audit=spec.audit,
        )
        self.scope = io.task_scope(task.task_id)
        task.io_handler = self.scope
        self.handle = worker.submit(task, collect=False)
        self.consumer = asyncio.get_running_loop().create_task(self._consume())

    def __repr__(self) -> str:
        return f"_NodeTask({self.spec.key}, position={self.position}, pending={len(self.pending)})"

    async def _calls(self) -> Any:
        from blockx.worker.api import FLUSH, Call

        while True:
            item = await self.queue.get()
            if item is _END:
                return
            for function_id, args in item:
                yield Call(function_id, args)
            yield FLUSH

    def add(
        self, bid: int, calls: list[tuple[str, Any]], seq: int | None = None
    ) -> asyncio.Future[BatchReply]:
        """Queue batch ``bid`` on the stream; its reply, once its calls settled.
        ``seq``: the driver's number of the batch on this node task (0, 1, ...): the
        batches are queued in that order whatever order they come in (None: now)."""
        future: asyncio.Future[BatchReply] = asyncio.get_running_loop().create_future()
        if seq is None:
            self._queue(bid, calls, future)
        else:
            self._hold(seq, bid, calls, future)
        return future

    def skip(self, seq: int) -> None:
        """Batch ``seq`` will not be queued (its calls could not be read): the batches
        after it do not wait for it."""
        if seq >= self.next_seq and seq not in self.held:  # a number seen is not skipped
            self._hold(seq, -1, None, asyncio.get_running_loop().create_future())

    def _hold(
        self,
        seq: int,
        bid: int,
        calls: list[tuple[str, Any]] | None,
        future: asyncio.Future[Any],
    ) -> None:
        if seq < self.next_seq or seq in self.held:
            future.set_exception(ValueError(f"batch {bid}: its number {seq} came twice"))
            return
        self.held[seq] = (bid, calls, future)
        while self.next_seq in self.held:
            bid, calls, future = self.held.pop(self.next_seq)
            self.next_seq += 1
            if calls is not None:
                self._queue(bid, calls, future)

    def _queue(
        self, bid: int, calls: list[tuple[str, Any]], future: asyncio.Future[BatchReply]
    ) -> None:
        if not calls:
            future.set_result(BatchReply(bid, [], [], 0, 0))
            return
        pending = _Pending(bid, self.position, len(calls), future)
        if self.ended:  # the stream will take no more calls: all cancelled
            future.set_result(pending.reply(self.figures()))
            return
        self.pending.append(pending)
        self.position += len(calls)
        self.queue.put_nowait(calls)

    async def _consume(self) -> None:
        try:
            async for settled in self.handle.settled_batches():
                # A stream batch never spans two driver batches (each ends with FLUSH).
                owner = self.pending[0] if self.pending else None
                if owner is None or not (
                    owner.start <= settled.first_call
                    and settled.first_call + settled.call_count <= owner.start + owner.count
                ):
                    raise OutputsMisaligned(f"{settled!r} is not within {owner!r}")
                owner.outputs.extend(
                    outputs_per_call(
                        settled.first_call,
                        settled.call_count,
                        settled.outputs,
                        [f.index for f in settled.failures],
                        settled.cancelled,
                    )
                )
                for f in settled.failures:
                    owner.failures.append(
                        (
                            f.index - owner.start,
                            f.kind,
                            f.message,
                            f.stack,
                            f.attempts,
                            f.retryable,
                        )
                    )
                owner.succeeded += settled.succeeded
                owner.cancelled += settled.cancelled
                if len(owner.outputs) >= owner.count:
                    self.pending.popleft()
                    if not owner.future.done():
                        owner.future.set_result(owner.reply(self.figures()))
            # The stream ended (cancelled, or its source closed): calls it never took
            # are cancelled, and their batches answered as such (those held for their
            # turn too).
            self.ended = True
            while self.pending:
                p = self.pending.popleft()
                if not p.future.done():
                    p.future.set_result(p.reply(self.figures()))
            for bid, calls, future in self.held.values():
                if calls is not None and not future.done():
                    future.set_result(_Pending(bid, 0, len(calls), future).reply(self.figures()))
            self.held.clear()
        except BaseException as exc:
            self.ended = True
            held = [_Pending(b, 0, len(c), f) for b, c, f in self.held.values() if c is not None]
            for p in [*self.pending, *held]:
                if not p.future.done():
                    if isinstance(exc, OutputsMisaligned):
                        p.future.set_exception(exc)
                    else:
                        p.future.set_exception(RuntimeError(f"the node's task broke down: {exc!r}"))
            raise

    def figures(self) -> dict[str, Any]:
        """The task's cumulative figures on this node so far: ``{"key", "stats": {name:
        count} (:data:`FIGURES`), "io": io_operations}`` -- read from the core's live
        counters of the task (the last read once it has ended) and the task's IO scope."""
        counts = self.core_counts
        try:
            state = self.worker.orchestrator.core.task_state(self.handle.run_state.task_id)
        except Exception:  # the worker is closing
            state = None
        if state is not None:
            counts["retries"] = int(state.retries)
            counts["cache_hits"] = int(state.cache_hits)
            counts["singleflight_hits"] = int(state.singleflight_hits)
        run = self.handle.run_state
        stats = dict(counts)
        stats["subcalls"] = int(run.subcalls)
        stats["io_calls"] = int(run.io_calls)
        return {
            "key": self.spec.key,
            "stats": stats,
            "io": io_operations(getattr(self.scope, "stats", None)),
        }

    async def finish(self) -> dict[str, Any]:
        self.queue.put_nowait(_END)
        await self.consumer
        result = await self.handle.result()
        s = result.stats
        stats = {
            "calls": s.calls,
            "succeeded": s.succeeded,
            "failed": s.failed,
            "cancelled": s.cancelled,
            "retries": s.retries,
            "cache_hits": s.cache_hits,
            "singleflight_hits": s.singleflight_hits,
            "subcalls": s.subcalls,
            "io_calls": s.io_calls,
            "wall_time_s": s.wall_time_s,
        }
        return {
            "key": self.spec.key,
            "stats": stats,
            "io": io_operations(getattr(self.scope, "stats", None)),
        }


#: The core's live counters of a task that a node reports with every reply.
CORE_COUNTERS: Final = ("retries", "cache_hits", "singleflight_hits")
#: The figures a node reports (:meth:`_NodeTask.figures`), summed over nodes by the driver.
FIGURES: Final = (*CORE_COUNTERS, "subcalls", "io_calls")


def merge_figures(last: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The later of two cumulative figures of one node task (:meth:`_NodeTask.figures`
    or ``finish``'s), whatever order they arrived in: every counter only grows, so the
    elementwise maximum (of the stats, of every IO operation's counters and latency
    histogram) is the latest."""
    if last is None:
        return {"key": new.get("key"), "stats": dict(new["stats"]), "io": list(new["io"])}
    stats = dict(last["stats"])
    for name, value in new["stats"].items():
        old = stats.get(name)
        stats[name] = value if old is None else max(old, value)
    ops: dict[tuple[str, str], tuple[dict[str, float], list[int]]] = {
        (backend, operation): (dict(counters), list(hist))
        for backend, operation, counters, hist in last["io"]
    }
    for backend, operation, counters, hist in new["io"]:
        mine = ops.get((backend, operation))
        if mine is None:
            ops[(backend, operation)] = (dict(counters), list(hist))
            continue
        for name, value in counters.items():
            mine[0][name] = max(mine[0].get(name, value), value)
        longest, other = (mine[1], hist) if len(mine[1]) >= len(hist) else (list(hist), mine[1])
        for i, n in enumerate(other):
            longest[i] = max(longest[i], n)
        ops[(backend, operation)] = (mine[0], longest)
    return {
        "key": last.get("key"),
        "stats": stats,
        "io": [(b, o, c, h) for (b, o), (c, h) in ops.items()],
    }


#: The additive counters of an IO operation's statistics (``max_ms``: the largest).
IO_COUNTERS: Final = (
    "requests",
    "backend_calls",
    "errors",
    "rejected",
    "cache_hits",
    "singleflight_joins",
    "abandoned",
    "local_hits",
    "total_ms",
    "max_ms",
)


def total_figures(
    node_figures: dict[str, dict[str, dict[str, Any]]],
    nodes: dict[str, dict[str, Any]],
    io: Any,
) -> dict[str, int]:
    """A run's totals of :data:`FIGURES` over every node task's latest figures
    (``node_figures``: ``{node_id: {task key: figures}}``, lost nodes included, as
    :func:`merge_figures` kept them); each node's own sums are added to its entry in
    ``nodes`` (the summary's ``"nodes"``) and its IO counters merged into ``io`` (an
    ``IOStats``)."""
    totals = dict.fromkeys(FIGURES, 0)
    for node_id, by_key in node_figures.items():
        figures = nodes.setdefault(node_id, {})
        for known in by_key.values():
            stats = known["stats"]
            for name in totals:
                value = int(stats.get(name, 0))
                totals[name] += value
                figures[name] = figures.get(name, 0) + value
            merge_io(io, known["io"])
    return totals


def io_operations(stats: Any) -> list[tuple[str, str, dict[str, float], list[int]]]:
    """A task scope's IO statistics as plain values (``(backend, operation, counters,
    latency histogram)``), for the driver to add up (:func:`merge_io`)."""
    if stats is None:
        return []
    return [
        (
            s.backend,
            s.operation,
            {name: getattr(s, name) for name in IO_COUNTERS},
            list(getattr(s, "_histogram", None) or ()),
        )
        for s in stats
    ]


def merge_io(into: Any, operations: list[tuple[str, str, dict[str, float], list[int]]]) -> None:
    """Add a node's :func:`io_operations` to ``into`` (an ``IOStats``)."""
    for backend, operation, counters, histogram in operations:
        target = into.operation(backend, operation)
        for name, value in counters.items():
            if name == "max_ms":
                target.max_ms = max(target.max_ms, value)
            else:
                setattr(target, name, getattr(target, name) + value)
        if histogram:
            mine = target._histogram
            if mine is None:
                target._histogram = list(histogram)
            else:
                for i, n in enumerate(histogram):
                    if i < len(mine):
                        mine[i] += n


class NodeWorker:
    """The actor's class (wrapped by ``ray.remote`` in :func:`node_worker_class`)."""

    def __init__(self, node_id: str, worker_config: Any, io_config: Any) -> None:
        self.node_id = node_id
        self.worker_config = worker_config
        self.io_config = io_config
        self.worker: Any = None
        self.io: Any = None
        self.tasks: dict[str, _NodeTask] = {}

    def __repr__(self) -> str:
        return f"NodeWorker({self.node_id[:8]}, tasks={list(self.tasks)})"

    async def start(self) -> dict[str, Any]:
        """Start the worker and its executors; returns the node's id, executors, pid."""
        from blockx.worker.app import Worker, tune_gc
        from blockx.worker.io.registry import IOSubsystem

        os.environ[NODE_ID_ENV] = self.node_id  # the executors inherit it
        # The actor's process is the node's worker process: the GC setting `blockx run`
        # gives its own (at CPython's default a collection every few dozen calls).
        tune_gc()
        self.io = IOSubsystem(self.io_config)
        self.worker = Worker(self.worker_config)
        self.worker.observe_io(self.io)
        await self.worker.start()
        return {
            "node_id": self.node_id,
            "executors": self.worker_config.pool.executor_count,
            "pid": os.getpid(),
        }

    async def run_batch(
        self,
        spec: NodeTaskSpec,
        bid: int,
        calls: list[tuple[str, Any]] | bytes,
        seq: int | None = None,
    ) -> BatchReply:
        """Run one batch of the driver task ``spec.key``; its outputs once all settled.
        ``calls``: ``(function_id, args)`` pairs, or the driver's pickle of them (trusted:
        the driver is the process that placed this actor). ``seq``: the batch's number
        among the driver's batches of ``spec.key`` to this node (0, 1, ...): they join
        the stream in that order, whatever order Ray runs the method calls in."""
        task = self.tasks.get(spec.key)
        if task is None:
            task = self.tasks[spec.key] = _NodeTask(self.worker, self.io, spec)
        try:
            pairs: list[tuple[str, Any]] = (
                pickle.loads(calls)  # the driver's own bytes
                if isinstance(calls, bytes)
                else calls
            )
        except BaseException:
            if seq is not None:
                task.skip(seq)
            raise
        return await task.add(bid, pairs, seq)

    async def cancel(self, key: str, reason: str) -> None:
        task = self.tasks.get(key)
        if task is not None:
            task.handle.cancel(reason)

    async def drop(self, key: str) -> None:
        """Forget the driver task ``key`` (its driver is gone): its stream is cancelled."""
        task = self.tasks.pop(key, None)
        if task is not None:
            task.handle.cancel("its driver ended")
            task.queue.put_nowait(_END)

    async def finish(self, key: str) -> dict[str, Any] | None:
        """End the driver task's stream; its statistics (None: it never ran here)."""
        task = self.tasks.pop(key, None)
        if task is None:
            return None
        return await task.finish()

    async def close(self) -> None:
        for key in list(self.tasks):
            task = self.tasks.pop(key)
            task.handle.cancel("the node worker is closing")
        if self.worker is not None:
            await self.worker.close()
        if self.io is not None:
            await self.io.close(grace_s=1.0)

    def ping(self) -> str:
        return self.node_id

    async def metrics(self) -> dict[str, Any]:
        """This node worker's own metric values, read on its event loop (where they are
        written): ``node_id``, ``pid`` (a new actor on the node: a new pid) and
        ``snapshot`` (:func:`~blockx.observability.snapshot.worker_snapshot`, empty before
        the worker started). Summed over the nodes by :mod:`blockx.cluster.metrics`."""
        from blockx.observability.snapshot import worker_snapshot

        snapshot = worker_snapshot(self.worker) if self.worker is not None else {}
        return {"node_id": self.node_id, "pid": os.getpid(), "snapshot": snapshot}


def node_worker_class() -> Any:
    """The Ray actor class (``ray`` imported here, at run time only)."""
    import ray

    return ray.remote(NodeWorker)

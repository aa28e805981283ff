"""The cluster driver: one node worker per Ray node, a task's calls streamed to them.

Theory of operation
-------------------
:func:`run_on_cluster` runs one task (a :class:`~blockx.worker.api.Task`: functions,
policy, calls -- a list or any iterable) on a Ray cluster and returns its
:class:`~blockx.worker.api.TaskResult`, handing rows to ``on_rows`` in call order::

    driver (this loop)                          Ray node k
    ray.nodes() -> Placement.add_node  ------>  NodeWorker actor (pinned, node affinity)
    read calls under Placement.budget           +-- blockx Worker, N executors
    Placement.place (HRW / least loaded)        +-- one streamed task per driver task
    Placement.take_batch -> run_batch.remote -> settles the batch, replies outputs
    settle / lose_batch / lose_node  <-------   (RayActorError: the node is lost)

Every decision is :class:`~blockx.cluster.placement.Placement`'s (pure); this module
does the Ray calls and the waiting. The loop:

0. the node workers are a :class:`~blockx.cluster.nodes.NodePool`'s: the run's own
   (``blockx run --ray``, stopped at its end) or a service's, shared by its runs
   (``blockx serve --ray``, :mod:`blockx.cluster.service`);
1. place the calls handed back by a loss, then read new calls while the budget
   allows (the calls: a list, an iterable, or an async iterable with ``FLUSH``
   markers -- read ahead by :class:`~blockx.cluster.source.AsyncSource`, a ``FLUSH``
   sends what the nodes buffered at once); a call's key is
   :func:`~blockx.worker.core.keys.call_key` of its function, the function's source
   digest and its arguments' JSON;
2. send each node its batch (all it buffered once reading stops);
3. wait for a reply (or :data:`NODE_POLL_S`): a reply's outputs (one per call) close
   their calls' slots in the placement's reorder buffer and its failures go to the
   result (indices mapped back to the task's); the rows of the contiguous prefix of
   ended calls go to ``on_rows``, decoded in one call -- rows come in call order, as
   with ``blockx run``, and reading waits while too many calls are unwritten (a
   straggler); a method call
   that raised loses its node (every batch in flight there: a ``node_lost``
   attempt each, re-dispatched or failed when out of attempts);
4. every :data:`NODE_POLL_S`, look at ``ray.nodes()``: a node gone is lost, a node
   that joined gets an actor (its first batch once it started).

``fast_fail``: nodes run ``continue``; the driver stops reading at the first final
failure, cancels the nodes' tasks and waits for what is in flight. Cancellation (a
signal cancels the coroutine): the same, the result ``CANCELLED``.

At the end every live node's task is finished and the actors are killed; a Ray
instance the driver started (``auto``) is shut down. The statistics (retries, cache
and singleflight hits, sub-calls, IO) are the sums over the nodes of each node task's
last-known cumulative figures: every reply carries them (a node lost mid-task has
reported what it did up to its last reply), ``finish`` gives a live node's final ones,
and :func:`~blockx.cluster.node.merge_figures` keeps the latest of each.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from blockx.cluster.node import (
    BatchReply,
    NodeTaskSpec,
    OutputsMisaligned,
    merge_figures,
    total_figures,
)
from blockx.cluster.nodes import (
    NodePool,
    RayMissing,
    init_ray,
    is_node_error,
    ray_available,
)
from blockx.cluster.placement import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MIN_BATCH,
    DEFAULT_REORDER_WINDOWS,
    LostCall,
    Placed,
    Placement,
)
from blockx.cluster.source import EMPTY, AsyncSource, each_call

__all__ = [
    "NODE_POLL_S",
    "ClusterOptions",
    "ClusterRun",
    "RayMissing",
    "ray_available",
    "run_on_cluster",
]

_log = logging.getLogger("blockx.cluster")

#: How often the driver looks at ``ray.nodes()`` for joins and removals (s).
NODE_POLL_S: Final = 0.5
#: Calls read from the source between two looks at the replies.
READ_SLICE: Final = 4096
#: A node's credit window per executor (calls placed and not settled).
WINDOW_PER_EXECUTOR: Final = 8192
#: The smallest window of a node whatever its executors: room for batches of 4,096 calls
#: (an eighth of it) on a node of one or two executors. Fewer, larger method calls cost
#: less: the trivial bench's steady state measured 0.50-0.52 CPU s of the driver and
#: 2.00-2.12 of the node per 100,000 calls, against 0.72-0.76 and 2.26-2.28 with the
#: window of 8,192 and batches of 1,024.
MIN_NODE_WINDOW: Final = 32_768
#: How long the driver waits for a node when none is alive (s) before it gives up.
NO_NODE_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterOptions:
    """``--ray ADDRESS`` (``auto``: a local Ray instance) and its knobs."""

    address: str = "auto"
    #: Executors per node (None: the node's CPUs).
    executors_per_node: int | None = None
    #: A node's credit window in calls (None: WINDOW_PER_EXECUTOR per executor, at
    #: least MIN_NODE_WINDOW).
    window_per_node: int | None = None
    min_batch: int = DEFAULT_MIN_BATCH
    max_batch: int = DEFAULT_MAX_BATCH
    #: Calls read and not yet written stay under this many windows' sums.
    reorder_windows: int = DEFAULT_REORDER_WINDOWS


@dataclass(slots=True)
class ClusterRun:
    """What a cluster run leaves besides its result: per-node figures, IO statistics."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_lost: int = 0
    batches: int = 0
    io_stats: Any = None
    #: The reorder buffer (rows written in call order): calls read and not written now,
    #: the most at once, its limit then, and the turns reading waited for a write.
    unwritten: int = 0
    unwritten_peak: int = 0
    reorder_limit: int = 0
    reorder_stalls: int = 0
    #: The run's driver while it runs (:meth:`cancel` reaches it).
    driver: Any = None
    #: Why the run was cancelled (:meth:`cancel`; before it started: at its start).
    cancel_requested: str | None = None

    def cancel(self, reason: str) -> None:
        """Cancel the task with ``reason`` (as a signal cancels it): no more calls are
        read, what is in flight ends, the result is ``CANCELLED``."""
        if self.cancel_requested is None:
            self.cancel_requested = reason
        if self.driver is not None:
            self.driver.cancel(reason)

    def __repr__(self) -> str:
        return (
            f"ClusterRun(nodes={len(self.nodes)}, batches={self.batches}, "
            f"lost={self.node_lost}, unwritten={self.unwritten}/{self.reorder_limit})"
        )


class _LoopState:
    __slots__ = ("cancelled_by", "last_watch", "no_node_since")

    def __init__(self, last_watch: float) -> None:
        self.last_watch = last_watch
        self.no_node_since: float | None = None
        self.cancelled_by: str | None = None

    def __repr__(self) -> str:
        return f"_LoopState(cancelled_by={self.cancelled_by!r})"


async def run_on_cluster(
    task: Any,
    worker_config: Any,
    io_config: Any,
    options: ClusterOptions,
    on_rows: Callable[[list[Any]], Awaitable[None]] | None,
    cluster_run: ClusterRun,
    *,
    on_settled: Callable[[Any], Awaitable[None]] | None = None,
    keep_ray: bool = False,
    pool: NodePool | None = None,
) -> Any:
    """Run ``task`` on the cluster (see the module docstring); its ``TaskResult``.

    ``on_rows`` takes the rows in call order; or ``on_settled`` takes contiguous call
    ranges as :class:`~blockx.worker.actor.task_run.SettledRows` (rows, failures with
    the task's call indices, counts: what ``blockx serve`` stores in one transaction).
    ``task.calls`` may be a list, an iterable or an async iterable (with ``FLUSH``
    markers). ``keep_ray``: a Ray instance this call starts is left running. ``pool``:
    node workers shared with other runs (a service's; default: the run's own, stopped
    at its end)."""
    if not ray_available():
        raise RayMissing("ray is not installed: pip install 'blockx[ray]'")
    started_ray = init_ray(options.address)  # on the loop's thread: Ray's signal handlers
    driver = _Driver(task, worker_config, io_config, options, on_rows, cluster_run, pool)
    driver.on_settled = on_settled
    cluster_run.driver = driver
    try:
        return await driver.run()
    finally:
        cluster_run.driver = None
        await driver.close()
        if started_ray and not keep_ray:
            import ray

            await asyncio.to_thread(ray.shutdown)


class _Driver:
    def __init__(
        self,
        task: Any,
        worker_config: Any,
        io_config: Any,
        options: ClusterOptions,
        on_rows: Callable[[list[Any]], Awaitable[None]] | None,
        cluster_run: ClusterRun,
        pool: NodePool | None = None,
    ) -> None:
        import secrets

        from blockx.worker.config import load_config

        self.task = task
        self.worker_config = worker_config if worker_config is not None else load_config()
        self.io_config = io_config
        self.options = options
        self.on_rows = on_rows
        self.on_settled: Callable[[Any], Awaitable[None]] | None = None
        self.out = cluster_run
        #: Failures of calls not written yet, by call index (handed over with their range).
        self.unwritten_failures: dict[int, Any] = {}
        #: Why the run is cancelled (:meth:`cancel`), and the task running it.
        self.cancel_reason: str | None = None
        self.running: asyncio.Task[Any] | None = None
        #: A FLUSH of an async source was read: send what the nodes buffered now.
        self.flush_now = False
        self.async_source: AsyncSource | None = None
        self.looping = False
        policy = task.policy
        max_attempts = policy.max_attempts or self.worker_config.dispatcher.default_max_attempts
        self.placement = Placement(
            max_attempts=max_attempts,
            min_batch=options.min_batch,
            max_batch=options.max_batch,
            reorder_windows=options.reorder_windows,
        )
        self.fast_fail = policy.failure == "fast_fail"
        self.spec = NodeTaskSpec(
            # Unique on the node: a shared node worker may run other tasks of the same id.
            key=f"{task.task_id}@{secrets.token_hex(4)}",
            task_id=task.task_id,
            functions=dict(task.functions),
            instance=task.instance,
            policy=policy,
            audit=bool(getattr(task, "audit", False)),
        )
        #: The node tasks' specs by node_lost attempts already had (0: the task's own).
        self.specs: dict[int, NodeTaskSpec] = {0: self.spec}
        #: The node task keys each node was sent batches of.
        self.keys_used: dict[str, set[str]] = {}
        #: The next batch's ``seq`` per node and node task key (``NodeWorker.run_batch``).
        self.sent: dict[tuple[str, str], int] = {}
        #: Each node task's last-known cumulative figures: ``{node_id: {key: figures}}``.
        self.node_figures: dict[str, dict[str, dict[str, Any]]] = {}
        self.own_pool = pool is None
        self.pool = (
            pool
            if pool is not None
            else NodePool(self.worker_config, io_config, options.executors_per_node)
        )
        #: The node workers (the pool's), by node id.
        self.nodes = self.pool.nodes
        self.in_flight: dict[asyncio.Future[Any], tuple[str, int]] = {}
        self.errors: list[Any] = []
        self.failure: Any = None
        self.read = 0
        self.succeeded = 0
        self.cancelled = 0
        self.stop_reading = False
        self.exhausted = False
        self.t0 = time.monotonic()

    def __repr__(self) -> str:
        return f"_Driver({self.task.task_id}, read={self.read}, {self.placement!r})"

    # --- nodes --------------------------------------------------------------------------

    def _window(self, executors: int) -> int:
        return self.options.window_per_node or max(
            MIN_NODE_WINDOW, WINDOW_PER_EXECUTOR * max(1, executors)
        )

    async def _watch_nodes(self) -> None:
        """Look at the Ray nodes (through the pool): a node gone is lost, a node whose
        worker started joins the placement."""
        alive = await self.pool.watch()
        for node_id, slot in list(self.placement.nodes.items()):
            if slot.alive and node_id not in alive:
                self._lose_node(node_id, "the Ray node was removed")
        for node in self.pool.ready():
            if node.node_id not in self.placement.nodes:
                self.placement.add_node(node.node_id, self._window(node.executors))
                self.out.nodes[node.node_id] = {
                    "calls": 0,
                    "executors": node.executors,
                    "alive": True,
                }

    def _lose_node(self, node_id: str, why: str) -> None:
        slot = self.placement.nodes.get(node_id)
        if slot is None or not slot.alive:
            return
        _log.warning("node %s lost (%s): its unfinished calls are dispatched again", node_id, why)
        lost_before = slot.lost_calls
        exhausted = self.placement.lose_node(node_id)
        # Its method calls in flight are written off: not waited for (a dead node's may
        # never answer), an answer that comes anyway is dropped by the placement.
        for future, (owner, _bid) in list(self.in_flight.items()):
            if owner == node_id:
                del self.in_flight[future]
                future.cancel()
        self.out.node_lost += slot.lost_calls - lost_before
        self._fail_lost(exhausted)
        self.pool.forget(node_id)
        self.out.nodes.setdefault(node_id, {})["alive"] = False

    def _fail_lost(self, exhausted: list[LostCall]) -> None:
        from blockx.worker.api import CallFailure

        for lost in exhausted:
            function_id, args = lost.placed.payload
            self._add_error(
                CallFailure(
                    index=lost.placed.index,
                    call_id=f"{self.task.task_id}/{lost.placed.index}",
                    function_id=function_id,
                    args=args,
                    kind="node_lost",
                    message=f"its node was lost {lost.attempts} time(s) (max_attempts reached)",
                    stack=None,
                    attempts=lost.attempts,
                    retryable=True,
                )
            )

    def cancel(self, reason: str) -> None:
        """Cancel the run (its result: ``CANCELLED`` with ``reason``)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        # Before its loop (nodes starting) the run sees the reason when the loop starts.
        if self.looping and self.running is not None and not self.running.done():
            self.running.cancel()

    def _add_error(self, failure: Any) -> None:
        from blockx.worker.api import TaskFailureInfo

        self.errors.append(failure)
        if self.on_settled is not None:  # handed over with its range
            self.unwritten_failures[failure.index] = failure
        if self.fast_fail and self.failure is None:
            self.failure = TaskFailureInfo(
                kind="CALL_FAILED",
                message=f"call {failure.index} ({failure.function_id}) failed: "
                f"{failure.kind}: {failure.message}",
                call_index=failure.index,
                error_kind=failure.kind,
            )
            self._stop("a call failed (fast_fail)")

    def _stop(self, reason: str) -> None:
        if self.stop_reading:
            return
        self.stop_reading = True
        # Calls not sent yet are not run: the calls read count them cancelled.
        self.cancelled += self.placement.cancel_unsent()
        for node in self.nodes.values():
            if node.actor is not None:
                for key in self.keys_used.get(node.node_id, ()):
                    node.actor.cancel.remote(key, reason)

    def _spec(self, lost_attempts: int) -> NodeTaskSpec:
        """The node task of calls that had ``lost_attempts`` node_lost attempts: its own
        stream on the node, run with what is left of ``max_attempts``."""
        spec = self.specs.get(lost_attempts)
        if spec is None:
            from dataclasses import replace

            left = max(1, self.placement.max_attempts - lost_attempts)
            spec = self.specs[lost_attempts] = replace(
                self.spec,
                key=f"{self.spec.key}#lost{lost_attempts}",
                task_id=f"{self.spec.task_id}.lost{lost_attempts}"[-128:],
                policy=replace(self.spec.policy, max_attempts=left),
            )
        return spec

    # --- the loop -------------------------------------------------------------------------

    def _key(self, function_id: str, args: Any) -> bytes:
        """Equal for equal calls (the function and the canonical JSON of its args, as the
        call cache keys them); bytes keep their hash, which the rendezvous ranking reads
        once per node (no digest: only this process compares keys)."""
        try:
            data = orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            data = repr(args).encode()
        return function_id.encode() + b"\0" + data

    def _read(self, source: Any) -> None:
        from blockx.worker.api import FLUSH

        placement = self.placement
        pending = self.async_source
        room = 0  # calls that can be placed before the placement is asked again
        for _ in range(READ_SLICE):
            if room <= 0:
                room = 0 if self.stop_reading else placement.room()
                if room <= 0:
                    if placement.unwritten >= placement.reorder_limit:
                        self.out.reorder_stalls += 1
                    return
            if pending is not None:
                call = pending.take()
                if call is EMPTY:
                    if pending.ended:
                        if pending.error is not None:
                            raise pending.error
                        self.exhausted = True
                    return
                if call is FLUSH:
                    self.flush_now = True
                    continue
            else:
                try:
                    call = next(source)
                except StopIteration:
                    self.exhausted = True
                    return
            if isinstance(call, tuple):
                function_id, args = call
            else:
                function_id, args = call.function_id, call.args
            index = self.read
            self.read += 1
            placement.place(Placed(index, self._key(function_id, args), (function_id, args)))
            room -= 1

    def _send(self) -> None:
        flush = (
            self.exhausted or self.stop_reading or self.flush_now or not self.placement.has_room()
        )
        self.flush_now = False
        for slot in self.placement.alive_nodes():
            while True:
                batch = self.placement.take_batch(slot.node_id, flush=flush)
                if batch is None:
                    break
                node = self.nodes[slot.node_id]
                # One pickle of the whole batch: Ray would msgpack the list and pickle each
                # (function_id, args) tuple on its own (~5 µs a call in the driver).
                calls = pickle.dumps([c.payload for c in batch.calls], protocol=5)
                spec = self._spec(batch.lost_attempts)
                self.keys_used.setdefault(slot.node_id, set()).add(spec.key)
                seq = self.sent.get((slot.node_id, spec.key), 0)
                self.sent[slot.node_id, spec.key] = seq + 1
                ref = node.actor.run_batch.remote(spec, batch.batch_id, calls, seq)
                future = asyncio.ensure_future(ref)
                self.in_flight[future] = (slot.node_id, batch.batch_id)
                self.out.batches += 1

    def _note_figures(self, node_id: str, figures: dict[str, Any]) -> None:
        """A node task's cumulative figures (a reply's or ``finish``'s): the latest kept."""
        key = str(figures.get("key"))
        known = self.node_figures.setdefault(node_id, {})
        known[key] = merge_figures(known.get(key), figures)

    def _settled(self, node_id: str, reply: BatchReply) -> None:
        from blockx.worker.api import CallFailure

        batch = self.placement.settle(reply.batch_id, node_id, reply.outputs)
        if batch is None:
            return
        self.succeeded += reply.succeeded
        self.cancelled += reply.cancelled
        self.out.nodes[node_id]["calls"] = self.out.nodes[node_id].get("calls", 0) + len(
            batch.calls
        )
        for offset, kind, message, stack, attempts, retryable in reply.failures:
            placed = batch.calls[offset]
            function_id, args = placed.payload
            lost = self.placement.lost_attempts.get(placed.index, 0)
            self._add_error(
                CallFailure(
                    index=placed.index,
                    call_id=f"{self.task.task_id}/{placed.index}",
                    function_id=function_id,
                    args=args,
                    kind=kind,
                    message=message,
                    stack=stack,
                    attempts=attempts + lost,
                    retryable=retryable,
                )
            )

    async def _write(self) -> None:
        """Hand the rows of the calls that ended, in call order, to ``on_rows``: the
        contiguous prefix of the reorder buffer, decoded in one call."""

        placement = self.placement
        first = placement.next_to_write
        outputs = placement.take_writable()
        out = self.out
        out.unwritten = placement.unwritten
        out.unwritten_peak = placement.unwritten_peak
        out.reorder_limit = max(out.reorder_limit, placement.reorder_limit)
        await self._hand_over(first, placement.next_to_write, outputs)

    async def _hand_over(self, first: int, end: int, outputs: list[Any]) -> None:
        """The rows of calls ``first..end`` (their outputs, in call order) to the caller."""
        from blockx.worker.json_values import rows_from_outputs

        if self.on_settled is None:
            if outputs and self.on_rows is not None:
                await self.on_rows(rows_from_outputs(outputs))
            return
        if end <= first:
            return
        from blockx.worker.actor.task_run import SettledRows

        pending = self.unwritten_failures
        failures = [pending.pop(i) for i in range(first, end) if i in pending] if pending else []
        await self.on_settled(
            SettledRows(
                first_call=first,
                call_count=end - first,
                outputs=outputs,
                failures=failures,
                succeeded=len(outputs),
                cancelled=end - first - len(outputs) - len(failures),
            )
        )

    async def run(self) -> Any:
        self.running = asyncio.current_task()
        calls = self.task.calls
        source: Any = None
        if hasattr(calls, "__aiter__"):
            self.async_source = AsyncSource(calls, READ_SLICE)
        else:
            source = each_call(calls)
        loop = asyncio.get_running_loop()
        # The nodes alive at the start all start before the first call is placed (the
        # first one up would take the first windows' worth of calls alone).
        await self._watch_nodes()
        last_watch = loop.time()
        if self.pool.starting:
            await self.pool.wait_started(NO_NODE_TIMEOUT_S)
            await self._watch_nodes()
        self.t0 = time.monotonic()  # the task's time: from its first call placed
        state = _LoopState(last_watch)
        reason = self.cancel_reason or self.out.cancel_requested
        if reason is not None:  # cancelled before it ran
            state.cancelled_by = self.cancel_reason = reason
            self._stop(reason)
        self.looping = True
        while True:
            try:
                if await self._step(source, state):
                    break
            except asyncio.CancelledError:
                # A signal (or the caller): stop reading, cancel the nodes' tasks, wait
                # for what is in flight (it ends cancelled), report CANCELLED.
                state.cancelled_by = (
                    state.cancelled_by or self.cancel_reason or "cancelled by the caller"
                )
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                self._stop(state.cancelled_by)
        await self._write()
        rest = self.placement.take_rest()
        if rest or self.placement.next_to_write < self.placement.read_count:
            _log.warning(
                "calls %d..%d never ended: their rows are missing",
                self.placement.next_to_write,
                self.placement.read_count,
            )
        if rest:
            await self._hand_over(self.placement.read_count, self.placement.read_count, rest)
        if self.async_source is not None:
            self.async_source.close()
        return await self._result(state.cancelled_by)

    async def _step(self, source: Any, state: _LoopState) -> bool:
        """One turn of the loop (see the module docstring); True once the task is over."""
        now = asyncio.get_running_loop().time()
        if now - state.last_watch >= NODE_POLL_S:
            state.last_watch = now
            await self._watch_nodes()
        if not self.placement.alive_nodes():
            state.no_node_since = state.no_node_since if state.no_node_since is not None else now
            if now - state.no_node_since > NO_NODE_TIMEOUT_S:
                error = self.pool.start_error
                why = f" (last start failure: {error})" if error else ""
                raise RuntimeError(
                    f"no Ray node could run the task for {NO_NODE_TIMEOUT_S:.0f} s{why}"
                )
        else:
            state.no_node_since = None
        self.placement.place_retries()
        if not self.stop_reading and not self.exhausted:
            self._read(source)
        self._send()
        await self._write()
        if (
            (self.exhausted or self.stop_reading)
            and not self.in_flight
            and not self.placement.retry
            and self.placement.outstanding == 0
        ):
            return True
        source = self.async_source
        waiting_for_calls = (
            source is not None
            and not source.ended
            and not source.items
            and not self.stop_reading
            and self.placement.has_room()
        )
        if not self.in_flight and not waiting_for_calls:
            await asyncio.sleep(0 if self.placement.has_room() else NODE_POLL_S / 5)
            return False
        waiters: set[asyncio.Future[Any]] = set(self.in_flight)
        ready: asyncio.Future[Any] | None = None
        if waiting_for_calls and source is not None:
            ready = asyncio.ensure_future(source.ready.wait())
            waiters.add(ready)
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=NODE_POLL_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if ready is not None and not ready.done():
                ready.cancel()
        done.discard(ready)
        for future in done:
            exc = None if future.cancelled() else future.exception()
            entry = self.in_flight.pop(future, None)
            if entry is None:  # written off with its node by an earlier one of `done`
                continue
            node_id, batch_id = entry
            if exc is None:
                reply = future.result()
                figures = getattr(reply, "figures", None)  # None from an older node
                if figures is not None:
                    self._note_figures(node_id, figures)
                self._settled(node_id, reply)
            elif isinstance(exc, OutputsMisaligned):
                raise exc
            elif is_node_error(exc):
                self._lose_node(node_id, type(exc).__name__)
            else:
                # The node's task broke down: the batch's calls are lost with it.
                slot = self.placement.nodes[node_id]
                before = slot.lost_calls
                self._fail_lost(self.placement.lose_batch(batch_id, node_id))
                self.out.node_lost += slot.lost_calls - before
                _log.warning("node %s: batch %d failed: %r", node_id[:8], batch_id, exc)
        await self._write()
        return False

    async def _result(self, cancelled_by: str | None) -> Any:
        from blockx.worker.api import TaskFailureInfo, TaskResult, TaskStats
        from blockx.worker.io.stats import IOStats

        io = IOStats()
        for node_id, node in list(self.nodes.items()):
            slot = self.placement.nodes.get(node_id)
            if node.actor is None or slot is None or not slot.alive:
                continue
            for key in sorted(self.keys_used.get(node_id, ())):
                try:
                    done = await node.actor.finish.remote(key)
                except Exception as exc:
                    _log.warning("node %s: no final statistics: %r", node_id[:8], exc)
                    continue
                if done is not None:
                    self._note_figures(node_id, {**done, "key": key})
        # Lost nodes included: what they reported up to their last reply.
        totals = total_figures(self.node_figures, self.out.nodes, io)
        for node_id, slot in self.placement.nodes.items():
            figures = self.out.nodes.setdefault(node_id, {})
            figures["batches"] = slot.batches
            figures["lost_calls"] = slot.lost_calls
            figures["alive"] = slot.alive
        self.out.io_stats = io
        failure = self.failure
        if cancelled_by is not None and failure is None:
            failure = TaskFailureInfo(kind="CANCELLED", message=cancelled_by)
        errors = sorted(self.errors, key=lambda e: e.index)
        stats = TaskStats(
            calls=self.read,
            succeeded=self.succeeded,
            failed=len(errors),
            cancelled=self.cancelled,
            retries=totals["retries"] + self.out.node_lost,
            cache_hits=totals["cache_hits"],
            singleflight_hits=totals["singleflight_hits"],
            subcalls=totals["subcalls"],
            io_calls=totals["io_calls"],
            wall_time_s=time.monotonic() - self.t0,
        )
        return TaskResult(
            task_id=self.task.task_id,
            success=failure is None,
            failure=failure,
            outputs=[],
            errors=errors,
            stats=stats,
        )

    async def close(self) -> None:
        if self.async_source is not None:
            self.async_source.close()
        for future in self.in_flight:
            future.cancel()
        if self.own_pool:
            await self.pool.close()
            return
        # A shared pool's node workers stay: this run's streams on them are dropped
        # (those finished by the result are gone already).
        drops = [
            node.actor.drop.remote(key)
            for node_id, keys in self.keys_used.items()
            if (node := self.nodes.get(node_id)) is not None and node.actor is not None
            for key in keys
        ]
        if drops:
            await asyncio.wait([asyncio.ensure_future(d) for d in drops], timeout=10.0)

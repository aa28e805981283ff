"""``blockx serve --ray``: the service's tasks run on a Ray cluster instead of a local worker.

Theory of operation
-------------------
``blockx serve``'s :class:`~blockx.serve.runner.TaskManager` runs a stored task by
``worker.submit(task, collect=False)`` -- its calls an async iterable read from the
store (``FLUSH`` markers included), from the first call whose outcome is not stored
(``done``) -- and stores every :class:`~blockx.worker.actor.task_run.SettledRows` of
``handle.settled_batches()`` in one transaction, then ``await handle.result()``;
``handle.cancel(reason)`` cancels it. :class:`ClusterWorker` stands in for the local
:class:`~blockx.worker.app.Worker` behind that same interface:

* :meth:`ClusterWorker.submit` starts the cluster driver on the task
  (:func:`~blockx.cluster.driver.run_on_cluster`, ``docs/cluster.md``) and returns a
  :class:`ClusterTaskHandle`. The driver writes in call order (its reorder buffer),
  so what it hands over are contiguous call ranges -- rows, failures with the task's
  call indices, counts -- exactly the ``SettledRows`` a local stream settles; the
  handle queues them (a few at a time: a slow store slows the driver down, which
  stops reading) for ``settled_batches()``.
* Ray is joined (or started: ``auto``) once, at :meth:`ClusterWorker.start`, and left
  at :meth:`ClusterWorker.close`. The node workers (one per Ray node, with its
  executors: :class:`~blockx.cluster.nodes.NodePool`) are started there too and shared
  by every task: each task is one stream of its own on every node worker, so the
  call cache and executors are warm from one task to the next.
* While the service runs -- idle or not -- a watcher looks at the Ray nodes every
  :data:`WATCH_S` (:meth:`NodePool.watch <blockx.cluster.nodes.NodePool.watch>`): a
  node that joins gets its node worker at once, so ``/readyz``
  (:meth:`ClusterWorker.ready_executors`: the node workers' executors) and
  ``/metrics`` see it and the next task starts there from its first batch (a running
  task's driver adds it as it looks at the nodes itself). The same turn refreshes
  the metrics, asking every node worker: one whose actor died (its node alive or
  not) is forgotten, and the next turn starts a new one on a node still alive.
* ``/metrics``' worker series (and the dashboard's counters) are the cluster's: the
  node workers' own snapshots, summed (:class:`~blockx.cluster.metrics.ClusterMetrics`,
  fetched again at each scrape: :meth:`ClusterWorker.refresh_metrics`), with
  ``blockx_cluster_*`` series per node (docs/observability.md).
* ``--trace-file`` (and OTLP): each task's driver spans, a ``task`` span and a
  ``node`` span per node it used (:class:`~blockx.cluster.spans.DriverSpans`); the
  calls' spans happen on the nodes and are not written.
* :meth:`ClusterWorker.task_problem`: a task whose functions use ``Table`` while the
  blockdb backend is SQLite (node-local) is refused when it is submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from blockx.cluster.driver import (
    NO_NODE_TIMEOUT_S,
    ClusterOptions,
    ClusterRun,
    run_on_cluster,
)
from blockx.cluster.metrics import ClusterMetrics
from blockx.cluster.nodes import NodePool, init_ray
from blockx.cluster.spans import DriverSpans

__all__ = ["SETTLED_QUEUE", "WATCH_S", "ClusterTaskHandle", "ClusterWorker"]

_log = logging.getLogger("blockx.cluster")

#: Settled ranges a handle holds before the driver waits for its consumer.
SETTLED_QUEUE: Final = 8
_END: Final = object()
#: How often the service looks at the Ray nodes (and refreshes the metrics), in s.
WATCH_S: Final = 2.0


class ClusterTaskHandle:
    """One task on the cluster, as ``blockx serve`` drives a ``TaskHandle``."""

    def __init__(self, service: ClusterWorker, task: Any) -> None:
        self.task = task
        self.run = ClusterRun()
        self._queue: asyncio.Queue[Any] = asyncio.Queue(SETTLED_QUEUE)
        loop = asyncio.get_running_loop()
        self._result: asyncio.Future[Any] = loop.create_future()
        self._runner = loop.create_task(self._drive(service), name=f"blockx-ray-{task.task_id}")

    def __repr__(self) -> str:
        state = "done" if self._result.done() else "running"
        return f"ClusterTaskHandle({self.task.task_id!r}, {state}, {self.run!r})"

    async def _drive(self, service: ClusterWorker) -> None:
        spans = DriverSpans(service.tracing, self.task.task_id) if service.tracing else None
        on_settled: Callable[[Any], Awaitable[None]] = self._queue.put
        if spans is not None:

            async def on_settled(settled: Any) -> None:
                spans.look(self.run.nodes)
                await self._queue.put(settled)

        result: Any = None
        try:
            result = await run_on_cluster(
                self.task,
                service.worker_config,
                service.io_config,
                service.options,
                None,
                self.run,
                on_settled=on_settled,
                keep_ray=True,
                pool=service.node_pool,
            )
        except BaseException as exc:
            if not self._result.done():
                self._result.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self._result.set_result(result)
        finally:
            if spans is not None:
                spans.finish(result, self.run.nodes)
            try:
                self._queue.put_nowait(_END)
            except asyncio.QueueFull:
                await self._queue.put(_END)

    async def settled_batches(self) -> AsyncIterator[Any]:
        """The task's settled call ranges, in call order, until it ends."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            yield item

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel the task: no more calls are read, what is in flight ends; ``CANCELLED``."""
        self.run.cancel(reason)

    async def result(self) -> Any:
        """The task's ``TaskResult`` (raises what broke the run)."""
        return await asyncio.shield(self._result)

    def summary_extra(self) -> dict[str, Any]:
        """What the task's summary adds on a cluster (as ``blockx run --ray``'s
        ``--summary-json``): per-node counts, ``node_lost``, the nodes' IO figures."""
        extra: dict[str, Any] = {"nodes": self.run.nodes, "node_lost": self.run.node_lost}
        if self.run.io_stats is not None:
            extra["io"] = self.run.io_stats.as_dict()
        return extra


class ClusterWorker:
    """Stands in for the local ``Worker`` of ``blockx serve`` (module docstring)."""

    def __init__(
        self, worker_config: Any, io_config: Any, options: ClusterOptions, *, tracing: Any = None
    ) -> None:
        self.worker_config = worker_config
        #: ``--trace-file`` / OTLP: each task's driver spans (:mod:`blockx.cluster.spans`).
        self.tracing = tracing
        self.io_config = io_config
        self.options = options
        self.io_subsystems: list[Any] = []
        self.handles: set[ClusterTaskHandle] = set()
        self._started_ray = False
        #: The node workers every task uses (started at :meth:`start`).
        self.node_pool = NodePool(worker_config, io_config, options.executors_per_node)
        #: The node workers' metric values, summed (``/metrics``, the dashboard).
        self.metrics = ClusterMetrics(self.node_pool)
        self._watcher: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"ClusterWorker({self.options.address!r}, tasks={len(self.handles)})"

    async def start(self) -> None:
        """Join Ray (or start it: ``auto``); on the loop's thread (Ray's signal handlers)."""
        self._started_ray = init_ray(self.options.address)
        await self.node_pool.watch()
        await self.node_pool.wait_started(NO_NODE_TIMEOUT_S)
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(), name="blockx-ray-watch"
        )

    async def _watch(self) -> None:
        """Every :data:`WATCH_S`: look at the Ray nodes (a node that joined gets its node
        worker, idle or not), then refresh the metrics."""
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                await self.node_pool.watch()
                await self.metrics.refresh()
            except Exception as exc:  # Ray's GCS busy, a node going: the next turn
                _log.warning("looking at the Ray nodes failed: %r", exc)

    def metrics_snapshot(self) -> dict[str, Any]:
        """The cluster's worker series as of the latest refresh (the node workers'
        snapshots summed: :mod:`blockx.cluster.metrics`)."""
        return self.metrics.current()

    async def refresh_metrics(self) -> dict[str, Any]:
        """Fetch every node worker's snapshot now (a scrape of ``/metrics``)."""
        return await self.metrics.refresh()

    def submit(self, task: Any, *, collect: bool = False) -> ClusterTaskHandle:
        if collect:
            raise ValueError("a cluster task hands its rows over as they settle (collect=False)")
        handle = ClusterTaskHandle(self, task)
        self.handles.add(handle)
        handle._runner.add_done_callback(lambda _t: self.handles.discard(handle))
        return handle

    def task_problem(self, functions: dict[str, str]) -> str | None:
        """Why a task with these functions (id -> source) cannot run on the cluster."""
        from blockx.cluster.tables import functions_using_table

        users = functions_using_table(functions)
        if not users or self.io_config.blockdb.effective_engine != "sqlite":
            return None
        return (
            f"function{'s' if len(users) > 1 else ''} {', '.join(map(repr, users))} "
            "use Table, and this server runs its tasks on a Ray cluster with the SQLite "
            "blockdb backend, which is local to one machine. Start the server with a "
            "PostgreSQL server all nodes reach: io.blockdb.engine: postgres and "
            "io.blockdb.postgres_dsn (docs/cluster.md)"
        )

    def ready_executors(self) -> int:
        """The executors of the node workers started on alive nodes (as last seen, at
        most :data:`WATCH_S` ago): 0 means not ready."""
        return sum(node.executors for node in self.node_pool.ready())

    def observe_io(self, io: Any) -> None:
        self.io_subsystems.append(io)

    # What a local worker has: nothing here (the metrics read the nodes': metrics_snapshot).
    @property
    def orchestrator(self) -> Any:
        raise RuntimeError("a cluster service has no local worker")

    @property
    def pool(self) -> Any:
        raise RuntimeError("a cluster service has no local worker")

    @property
    def adapter(self) -> Any:
        raise RuntimeError("a cluster service has no local worker")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        self.metrics.close()
        for handle in list(self.handles):
            handle.cancel("the server is closing")
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(handle._runner), 15.0)
        await self.node_pool.close()
        if self.tracing is not None:
            DriverSpans(self.tracing, None).close()
        if self._started_ray:
            import ray

            await asyncio.to_thread(ray.shutdown)

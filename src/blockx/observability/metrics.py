"""Prometheus metrics of a worker: one collector that reads the counters at scrape time.

Theory of operation
-------------------
Calls pay nothing for metrics: the counters they bump exist anyway (or are plain
integers and bucket lists next to them, see :mod:`blockx.observability.snapshot`),
and no ``prometheus_client`` object is touched on any call's path. A scrape builds
every series afresh from one :func:`~blockx.observability.snapshot.worker_snapshot`
(:class:`WorkerCollector`, a ``prometheus_client`` custom collector) on a registry of
its own, never the process-wide default one. Every label set that is known in
advance -- outcomes, call kinds, wait kinds, error kinds, cache kinds, executor and
task states, the pool's executor ids -- is present from the start with 0; the IO
series get a label set per (backend, operation) as each is first used.

The series (docs/observability.md has them with their meaning):

===========================================  =================================================
``blockx_calls_total``                       counter; ``outcome``, ``kind`` (root, subcall)
``blockx_call_failures_total``               counter; ``error_kind`` (calls that ended failed)
``blockx_call_retries_total``                counter; ``reason`` (the failed attempt's kind)
``blockx_call_duration_seconds``             histogram, per attempt (bind to release)
``blockx_calls_inflight``                    gauge: calls holding an executor context
``blockx_calls_suspended``                   gauge; ``wait`` (from the executors' heartbeats)
``blockx_cache_hits_total``                  counter; ``cache`` (call, io)
``blockx_singleflight_joins_total``          counter; ``cache`` (call, io)
``blockx_io_requests_total``                 counter; ``backend``, ``operation``, ``result``
``blockx_io_backend_seconds``                histogram; ``backend``, ``operation``
``blockx_executors``                         gauge; ``state`` (the pool's slots)
``blockx_executor_rss_bytes``                gauge; ``executor``
``blockx_executor_cpu_seconds_total``        counter; ``executor``
``blockx_executor_contexts``                 gauge; ``executor``, ``state``
``blockx_executor_restarts_total``           counter; ``executor``
``blockx_executor_wedge_kills_total``        counter
``blockx_executor_heartbeat_age_seconds``    gauge; ``executor``
``blockx_tasks``                             gauge; ``state``
``blockx_rows_total``                        counter
``blockx_cluster_nodes``                     gauge (cluster mode only: node workers started)
``blockx_cluster_node_calls_total``          counter; ``node`` (cluster mode only)
``blockx_cluster_batches_total``             counter (``blockx run --ray`` only)
``blockx_cluster_node_lost_total``           counter (``blockx run --ray`` only)
===========================================  =================================================

Cluster mode (``blockx serve --ray``, ``blockx run --ray --metrics-port``): there is no
local worker; the collector is given ``snapshot=`` instead, a callable returning the
node workers' snapshots summed (:mod:`blockx.cluster.metrics`), which adds a
``cluster`` key read by the two ``blockx_cluster_*`` series. A server whose snapshot
must be fetched first (from the nodes) is given ``refresh=``, awaited before a scrape
is rendered.

Serving: ``blockx serve`` answers ``GET /metrics`` with :func:`render` (its collector
counts tasks from its store: ``tasks=``); ``Worker(metrics_port=PORT)`` (``blockx run
--metrics-port``) starts a :class:`MetricsServer`, an aiohttp site on the worker's
event loop bound to 127.0.0.1, so a scrape reads the counters on the thread that writes
them. It is started with the worker and stopped with it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Final

from aiohttp import web
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from blockx.observability.snapshot import (
    CALL_KINDS,
    CONTEXT_STATES,
    ERROR_KINDS,
    EXECUTOR_STATES,
    OUTCOMES,
    TASK_STATES,
    WAIT_KINDS,
    worker_snapshot,
)

__all__ = [
    "IO_RESULTS",
    "METRICS_HOST",
    "MetricsServer",
    "WorkerCollector",
    "make_registry",
    "render",
]

#: Where ``--metrics-port`` listens: this machine only (docs/security.md).
METRICS_HOST: Final = "127.0.0.1"
#: ``blockx_io_requests_total``'s ``result``: how each request was answered.
IO_RESULTS: Final = ("ok", "error", "cached", "joined", "abandoned", "local")
_CACHES: Final = ("call", "io")

TaskCounts = Callable[[], Mapping[str, int]]
Snapshot = Callable[[], dict[str, Any]]
Refresh = Callable[[], Awaitable[Any]]


def _le(bound: float) -> str:
    return repr(float(bound))


class WorkerCollector(Collector):
    """Every series, built from one :func:`worker_snapshot` per scrape.

    ``tasks``: where ``blockx_tasks`` comes from (default: ``worker.task_counts()``);
    ``blockx serve`` gives its store's counts. ``snapshot``: where the counters come
    from (default: :func:`worker_snapshot` of ``worker``; cluster mode: the nodes').
    """

    def __init__(
        self, worker: Any, *, tasks: TaskCounts | None = None, snapshot: Snapshot | None = None
    ) -> None:
        self._worker = worker
        self._tasks = tasks
        self._snapshot = snapshot

    def __repr__(self) -> str:
        return f"WorkerCollector({self._worker!r})"

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked: the series are built at scrape time

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot() if self._snapshot is not None else worker_snapshot(self._worker)
        calls = snap["calls"]
        yield from self._calls(calls, snap["attempts"])
        yield from self._caches(snap["cache"])
        yield from self._io(snap["io"])
        yield from self._executors(snap["executors"], snap["pool"])
        tasks = dict.fromkeys(TASK_STATES, 0)
        tasks.update(self._tasks() if self._tasks is not None else snap["tasks"])
        family = GaugeMetricFamily("blockx_tasks", "Tasks by state.", labels=["state"])
        for state, count in tasks.items():
            family.add_metric([state], count)
        yield family
        yield CounterMetricFamily(
            "blockx_rows_total", "Rows (successful root calls' outputs) produced.", snap["rows"]
        )
        cluster = snap.get("cluster")
        if cluster is not None:
            yield from self._cluster(cluster)

    @staticmethod
    def _cluster(cluster: dict[str, Any]) -> Iterator[Metric]:
        nodes: dict[str, dict[str, Any]] = cluster.get("nodes", {})
        yield GaugeMetricFamily(
            "blockx_cluster_nodes",
            "Node workers started on alive Ray nodes.",
            sum(1 for node in nodes.values() if node.get("alive")),
        )
        calls = CounterMetricFamily(
            "blockx_cluster_node_calls_total",
            "Root calls ended on each Ray node (its node worker's, since it started).",
            labels=["node"],
        )
        for node_id, node in sorted(nodes.items()):
            calls.add_metric([node_id], node.get("calls", 0))
        yield calls
        # blockx run --ray's driver (absent under blockx serve --ray: per task there)
        if "batches" in cluster:
            yield CounterMetricFamily(
                "blockx_cluster_batches_total",
                "Batches of calls sent to the node workers (actor method calls).",
                cluster["batches"],
            )
        if "node_lost" in cluster:
            yield CounterMetricFamily(
                "blockx_cluster_node_lost_total",
                "Calls dispatched again because their node (or its worker) was lost.",
                cluster["node_lost"],
            )

    @staticmethod
    def _calls(calls: dict[str, Any], attempts: dict[str, Any]) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "blockx_calls_total", "Calls ended, by outcome and kind.", labels=["outcome", "kind"]
        )
        for kind in CALL_KINDS:
            for outcome in OUTCOMES:
                family.add_metric([outcome, kind], calls["by_kind"][kind][outcome])
        yield family
        for name, help_text, label, counts in (
            (
                "blockx_call_failures_total",
                "Calls that ended failed, by error kind.",
                "error_kind",
                calls["failures"],
            ),
            (
                "blockx_call_retries_total",
                "Attempts retried, by the error kind that failed them.",
                "reason",
                calls["retries"],
            ),
        ):
            family = CounterMetricFamily(name, help_text, labels=[label])
            for kind in sorted(set(ERROR_KINDS) | set(counts)):
                family.add_metric([kind], counts.get(kind, 0))
            yield family
        buckets = [(_le(bound), count) for bound, count in attempts["buckets"]]
        buckets.append(("+Inf", attempts["count"]))
        yield HistogramMetricFamily(
            "blockx_call_duration_seconds",
            "Call attempts by duration (bind confirmed to executor released).",
            buckets=buckets,
            sum_value=attempts["sum_s"],
        )
        yield GaugeMetricFamily(
            "blockx_calls_inflight", "Calls holding an executor context.", calls["inflight"]
        )
        suspended = GaugeMetricFamily(
            "blockx_calls_suspended",
            "Calls suspended in their executor, by what they wait for (heartbeats).",
            labels=["wait"],
        )
        for wait in WAIT_KINDS:
            suspended.add_metric([wait], calls["suspended"][wait])
        yield suspended

    @staticmethod
    def _caches(cache: dict[str, Any]) -> Iterator[Metric]:
        hits = CounterMetricFamily(
            "blockx_cache_hits_total", "Answers taken from a cache.", labels=["cache"]
        )
        joins = CounterMetricFamily(
            "blockx_singleflight_joins_total",
            "Calls or reads that joined an identical one in flight.",
            labels=["cache"],
        )
        for name in _CACHES:
            hits.add_metric([name], cache[name]["hits"])
            joins.add_metric([name], cache[name]["joins"])
        yield hits
        yield joins

    @staticmethod
    def _io(operations: list[dict[str, Any]]) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "blockx_io_requests_total",
            "IO requests, by how they were answered.",
            labels=["backend", "operation", "result"],
        )
        latency = HistogramMetricFamily(
            "blockx_io_backend_seconds",
            "IO backend calls by latency.",
            labels=["backend", "operation"],
        )
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for op in operations:  # several observed subsystems may serve one operation
            key = (op["backend"], op["operation"])
            into = merged.get(key)
            if into is None:
                merged[key] = {**op, "buckets": list(op["buckets"])}
                continue
            for field in ("requests", "failed", "rejected", "cache_hits", "joins"):
                into[field] += op[field]
            for field in ("abandoned", "local_hits", "backend_calls", "sum_s"):
                into[field] += op[field]
            into["buckets"] = [
                (bound, a + b)
                for (bound, a), (_, b) in zip(into["buckets"], op["buckets"], strict=True)
            ]
        for (backend, operation), op in sorted(merged.items()):
            backend_errors = op["failed"] - op["rejected"]
            results = {
                "ok": op["backend_calls"] - backend_errors,
                "error": op["failed"],
                "cached": op["cache_hits"],
                "joined": op["joins"],
                "abandoned": op["abandoned"],
                "local": op["local_hits"],
            }
            for result in IO_RESULTS:
                requests.add_metric([backend, operation, result], results[result])
            buckets = [(_le(bound), count) for bound, count in op["buckets"] if bound != math.inf]
            buckets.append(("+Inf", op["backend_calls"]))
            latency.add_metric([backend, operation], buckets, op["sum_s"])
        yield requests
        yield latency

    @staticmethod
    def _executors(executors: list[dict[str, Any]], pool: dict[str, Any]) -> Iterator[Metric]:
        states = dict.fromkeys(EXECUTOR_STATES, 0)
        for executor in executors:
            states[executor["state"]] = states.get(executor["state"], 0) + 1
        family = GaugeMetricFamily("blockx_executors", "Executor slots by state.", labels=["state"])
        for state, count in states.items():
            family.add_metric([state], count)
        yield family
        rss = GaugeMetricFamily(
            "blockx_executor_rss_bytes",
            "Executor resident memory (latest heartbeat).",
            labels=["executor"],
        )
        cpu = CounterMetricFamily(
            "blockx_executor_cpu_seconds_total",
            "Executor CPU time (latest heartbeat; restarts from 0 with the process).",
            labels=["executor"],
        )
        contexts = GaugeMetricFamily(
            "blockx_executor_contexts",
            "Executor call contexts by state (latest heartbeat).",
            labels=["executor", "state"],
        )
        restarts = CounterMetricFamily(
            "blockx_executor_restarts_total", "Executor restarts.", labels=["executor"]
        )
        age = GaugeMetricFamily(
            "blockx_executor_heartbeat_age_seconds",
            "Seconds since the executor's latest heartbeat.",
            labels=["executor"],
        )
        for executor in executors:
            name = executor["executor"]
            rss.add_metric([name], executor["rss_bytes"] or 0)
            cpu.add_metric([name], executor["cpu_seconds"] or 0.0)
            for state in CONTEXT_STATES:
                contexts.add_metric([name, state.lower()], executor["contexts"][state])
            restarts.add_metric([name], executor["restarts"])
            heartbeat_age = executor["heartbeat_age_s"]
            age.add_metric([name], heartbeat_age if heartbeat_age is not None else 0.0)
        yield rss
        yield cpu
        yield contexts
        yield restarts
        yield age
        yield CounterMetricFamily(
            "blockx_executor_wedge_kills_total",
            "Executors killed by the wedge backstop.",
            pool["wedge_kills"],
        )


def make_registry(
    worker: Any, *, tasks: TaskCounts | None = None, snapshot: Snapshot | None = None
) -> CollectorRegistry:
    """A registry of its own holding one :class:`WorkerCollector` of ``worker``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker, tasks=tasks, snapshot=snapshot))
    return registry


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """``(body, content type)`` of a scrape; ``accept``: the request's Accept header
    (OpenMetrics when it asks for it, else Prometheus text)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def metrics_response(registry: CollectorRegistry, request: web.Request) -> web.Response:
    """The ``GET /metrics`` answer for ``request``."""
    body, content_type = render(registry, request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


class MetricsServer:
    """``GET /metrics`` on ``127.0.0.1:port`` (0: a free port), an aiohttp site on the
    running event loop (a scrape reads the counters on the loop's thread). ``refresh``:
    awaited before each scrape is rendered (cluster mode: the nodes' figures fetched)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        port: int,
        host: str = METRICS_HOST,
        refresh: Refresh | None = None,
    ):
        self._registry = registry
        self._refresh = refresh
        self._host = host
        self._requested_port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    @classmethod
    def for_worker(cls, worker: Any, *, port: int) -> MetricsServer:
        return cls(make_registry(worker), port=port)

    def __repr__(self) -> str:
        status = f"{self._host}:{self.port}" if self.port is not None else "stopped"
        return f"MetricsServer({status})"

    async def start(self) -> None:
        """Listen (raises ``OSError`` when the port cannot be bound)."""

        async def metrics(request: web.Request) -> web.Response:
            if self._refresh is not None:
                await self._refresh()
            return metrics_response(self._registry, request)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server  # the bound port, when 0 was asked for
        sockets = getattr(server, "sockets", None) or ()
        self.port = sockets[0].getsockname()[1] if sockets else self._requested_port

    async def stop(self) -> None:
        """Stop listening. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self.port = None

"""The worker series of a cluster: every node worker's snapshot, summed.

Theory of operation
-------------------
In cluster mode (``blockx serve --ray``, ``blockx run --ray --metrics-port``) no local
worker runs calls: each Ray node's :class:`~blockx.cluster.node.NodeWorker` hosts one.
:meth:`ClusterMetrics.refresh` asks every started node worker of a
:class:`~blockx.cluster.nodes.NodePool` for its own
:func:`~blockx.observability.snapshot.worker_snapshot` (``NodeWorker.metrics``: read
on the actor's event loop, where its counters are written), all at once, and keeps
the latest of each; :func:`merge_snapshots` (pure) adds them up into one snapshot of
the same shape, which the Prometheus collector
(:class:`~blockx.observability.metrics.WorkerCollector`, ``snapshot=``) and the
dashboard read as they read a local worker's:

* counters (calls by outcome and kind, failures and retries by kind, the attempt
  histogram, cache hits, rows, IO, restarts, wedge kills) are summed over every node
  worker ever seen -- a node worker that is gone (its node removed, or a new actor
  on the node: another pid) keeps its last figures, so no counter ever goes back;
* gauges (calls in flight, suspended calls, executors) are the live node workers'
  only; an executor is named ``<node id's first 8 hex digits>/<its id>`` (the ids
  repeat from node to node);
* ``cluster`` (new key): per Ray node, its root calls ended, executors and whether
  its worker is live -- the ``blockx_cluster_*`` series.

A node that does not answer within :data:`NODE_METRICS_TIMEOUT_S` keeps its last
snapshot. Refreshes are single-flight: a scrape during one joins it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from blockx.cluster.nodes import NodePool, is_node_error
from blockx.observability.snapshot import CALL_KINDS, OUTCOMES, WAIT_KINDS

__all__ = ["NODE_METRICS_TIMEOUT_S", "ClusterMetrics", "merge_snapshots"]

_log = logging.getLogger("blockx.cluster")

#: How long a refresh waits for the node workers' answers (s).
NODE_METRICS_TIMEOUT_S: Final = 5.0


def _add_counts(into: dict[str, int], counts: dict[str, Any]) -> None:
    for name, value in counts.items():
        into[name] = into.get(name, 0) + int(value)


def _add_attempts(into: dict[str, Any], attempts: dict[str, Any]) -> None:
    buckets = attempts.get("buckets") or []
    if not into["buckets"]:
        into["buckets"] = [(bound, int(count)) for bound, count in buckets]
    elif len(buckets) == len(into["buckets"]):
        into["buckets"] = [
            (bound, mine + int(count))
            for (bound, mine), (_, count) in zip(into["buckets"], buckets, strict=True)
        ]
    into["count"] += int(attempts.get("count", 0))
    into["sum_s"] += float(attempts.get("sum_s", 0.0))


def _root_calls(snap: dict[str, Any]) -> int:
    root = snap.get("calls", {}).get("by_kind", {}).get("root", {})
    return sum(int(root.get(outcome, 0)) for outcome in OUTCOMES)


def merge_snapshots(
    live: dict[str, dict[str, Any]],
    gone: list[tuple[str, dict[str, Any]]],
    executors: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One snapshot of the cluster (module docstring): ``live`` -- the live node workers'
    latest snapshots by Ray node id; ``gone`` -- ``(node id, last snapshot)`` of node
    workers gone; ``executors`` -- each live node's executor count (for ``cluster``)."""
    by_kind = {kind: dict.fromkeys(OUTCOMES, 0) for kind in CALL_KINDS}
    retries: dict[str, int] = {}
    failures: dict[str, int] = {}
    cache = {"call": {"hits": 0, "joins": 0}, "io": {"hits": 0, "joins": 0}}
    pool = {"restarts": 0, "wedge_kills": 0}
    attempts: dict[str, Any] = {"buckets": [], "count": 0, "sum_s": 0.0}
    io: list[dict[str, Any]] = []
    rows = 0
    nodes: dict[str, dict[str, Any]] = {}
    everything = [(node_id, snap, True) for node_id, snap in sorted(live.items())]
    everything += [(node_id, snap, False) for node_id, snap in gone]
    for node_id, snap, alive in everything:
        calls = snap.get("calls", {})
        for kind in CALL_KINDS:
            _add_counts(by_kind[kind], calls.get("by_kind", {}).get(kind, {}))
        _add_counts(retries, calls.get("retries", {}))
        _add_counts(failures, calls.get("failures", {}))
        for name in cache:
            _add_counts(cache[name], snap.get("cache", {}).get(name, {}))
        _add_counts(pool, snap.get("pool", {}))
        _add_attempts(attempts, snap.get("attempts", {}))
        io.extend(snap.get("io", ()))
        rows += int(snap.get("rows", 0))
        node = nodes.setdefault(node_id, {"calls": 0, "executors": 0, "alive": False})
        node["calls"] += _root_calls(snap)
        if alive:
            node["alive"] = True
            node["executors"] = (executors or {}).get(node_id, len(snap.get("executors", ())))
    live_executors: list[dict[str, Any]] = []
    suspended = dict.fromkeys(WAIT_KINDS, 0)
    inflight = 0
    for node_id, snap in sorted(live.items()):
        calls = snap.get("calls", {})
        inflight += int(calls.get("inflight", 0))
        _add_counts(suspended, calls.get("suspended", {}))
        for executor in snap.get("executors", ()):
            named = dict(executor)
            named["executor"] = f"{node_id[:8]}/{executor['executor']}"
            named["node"] = node_id
            live_executors.append(named)
    root = by_kind["root"]
    return {
        "calls": {
            **root,
            "by_kind": by_kind,
            "inflight": inflight,
            "suspended": suspended,
            "retries": retries,
            "failures": failures,
        },
        "cache": cache,
        "executors": live_executors,
        "pool": pool,
        "rows": rows,
        "tasks": {},
        "attempts": attempts,
        "io": io,
        "cluster": {"nodes": nodes},
    }


class ClusterMetrics:
    """The latest node worker snapshots of a pool, and their sum (module docstring)."""

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool
        #: The live node workers' latest answers by node id: ``(pid, snapshot)``.
        self.live: dict[str, tuple[int, dict[str, Any]]] = {}
        #: The last snapshots of node workers gone, by ``(node id, pid)``.
        self.gone: dict[tuple[str, int], dict[str, Any]] = {}
        self.snapshot: dict[str, Any] = merge_snapshots({}, [])
        self.refreshes = 0
        self._running: asyncio.Future[dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return f"ClusterMetrics(live={len(self.live)}, gone={len(self.gone)})"

    def current(self) -> dict[str, Any]:
        """The sum as of the latest refresh (no await: for a collector's scrape)."""
        return self.snapshot

    def close(self) -> None:
        """Stop a refresh under way (the node workers are going)."""
        if self._running is not None and not self._running.done():
            self._running.cancel()

    async def refresh(self) -> dict[str, Any]:
        """Ask every started node worker for its snapshot; the new sum."""
        running = self._running
        if running is None or running.done():
            running = self._running = asyncio.ensure_future(self._refresh())
        return await asyncio.shield(running)

    async def _refresh(self) -> dict[str, Any]:
        ready = {node.node_id: node for node in self.pool.ready()}
        asks: dict[str, asyncio.Future[Any]] = {}
        for node_id, node in ready.items():
            try:
                asks[node_id] = asyncio.ensure_future(node.actor.metrics.remote())
            except Exception as failed:  # Ray going away: its last snapshot stays
                _log.debug("node %s: no metrics: %r", node_id[:8], failed)
        if asks:
            await asyncio.wait(list(asks.values()), timeout=NODE_METRICS_TIMEOUT_S)
        for node_id, ask in asks.items():
            if not ask.done():
                ask.cancel()
                continue
            error = None if ask.cancelled() else ask.exception()
            if error is not None or ask.cancelled():
                _log.debug("node %s: no metrics: %r", node_id[:8], error)
                if error is not None and is_node_error(error):
                    # Its actor died (its node may live on): the pool's next watch starts
                    # a new node worker there, idle or not, rather than the next task's
                    # driver finding it dead.
                    _log.warning("node %s: its node worker is gone: %r", node_id[:8], error)
                    self.pool.forget(node_id)
                continue
            answer = ask.result()
            pid, snap = int(answer.get("pid", 0)), answer.get("snapshot") or {}
            previous = self.live.get(node_id)
            if previous is not None and previous[0] != pid:  # a new actor on the node
                self.gone[(node_id, previous[0])] = previous[1]
            self.gone.pop((node_id, pid), None)  # back (its node was not seen for a while)
            self.live[node_id] = (pid, snap)
        for node_id in [n for n in self.live if n not in ready]:
            pid, snap = self.live.pop(node_id)
            self.gone[(node_id, pid)] = snap
        executors = {node_id: node.executors for node_id, node in ready.items()}
        self.snapshot = merge_snapshots(
            {node_id: snap for node_id, (_pid, snap) in self.live.items()},
            [(node_id, snap) for (node_id, _pid), snap in self.gone.items()],
            executors,
        )
        self.refreshes += 1
        return self.snapshot

"""The cluster's worker series (issue #21, leftover 2): the node workers' snapshots summed
by :func:`blockx.cluster.metrics.merge_snapshots` (pure), and rendered by the same
Prometheus collector as a local worker's, plus the ``blockx_cluster_*`` series."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from blockx.cluster.metrics import merge_snapshots
from blockx.observability.metrics import make_registry, render


def _node(succeeded: int, *, sub: int = 0, inflight: int = 0, executors: int = 1) -> dict[str, Any]:
    return {
        "calls": {
            "by_kind": {
                "root": {"succeeded": succeeded, "failed": 1, "cancelled": 0},
                "subcall": {"succeeded": sub, "failed": 0, "cancelled": 0},
            },
            "inflight": inflight,
            "suspended": {"io": inflight, "subcall": 0, "sleep": 0, "function_code": 0},
            "retries": {"timeout": 2},
            "failures": {"user_error": 1},
        },
        "cache": {"call": {"hits": 3, "joins": 1}, "io": {"hits": 0, "joins": 0}},
        "executors": [
            {
                "executor": f"e{i}",
                "state": "running",
                "rss_bytes": 1000,
                "cpu_seconds": 1.5,
                "contexts": {
                    "RUNNABLE": 0,
                    "RUNNING": 0,
                    "WAITING_IO": 0,
                    "WAITING_SUBCALL": 0,
                    "WAITING_SLEEP": 0,
                    "WAITING_FUNCTION_CODE": 0,
                },
                "restarts": 0,
                "heartbeat_age_s": 0.1,
            }
            for i in range(executors)
        ],
        "pool": {"restarts": 1, "wedge_kills": 0},
        "rows": succeeded,
        "tasks": {"running": 1},
        "attempts": {
            "buckets": [(0.001, succeeded), (0.01, succeeded + 1)],
            "count": succeeded + 1,
            "sum_s": 0.5,
        },
        "io": [],
    }


def test_counters_are_summed_over_every_node_worker_gauges_over_the_live_ones() -> None:
    live = {"aaaaaaaa11": _node(10, sub=4, inflight=2, executors=2), "bbbbbbbb22": _node(5)}
    gone = [("cccccccc33", _node(7, inflight=9, executors=3))]
    snap = merge_snapshots(live, gone, {"aaaaaaaa11": 2, "bbbbbbbb22": 1})
    calls = snap["calls"]
    assert calls["succeeded"] == 22 and calls["failed"] == 3  # the root calls, every node
    assert calls["by_kind"]["subcall"]["succeeded"] == 4
    assert calls["retries"] == {"timeout": 6} and calls["failures"] == {"user_error": 3}
    assert calls["inflight"] == 2 and calls["suspended"]["io"] == 2  # live nodes only
    assert snap["rows"] == 22 and snap["cache"]["call"] == {"hits": 9, "joins": 3}
    assert snap["pool"]["restarts"] == 3
    assert snap["attempts"]["count"] == 25
    assert snap["attempts"]["buckets"] == [(0.001, 22), (0.01, 25)]
    # executor ids repeat from node to node: named by node
    assert [e["executor"] for e in snap["executors"]] == [
        "aaaaaaaa/e0",
        "aaaaaaaa/e1",
        "bbbbbbbb/e0",
    ]
    assert snap["cluster"]["nodes"] == {
        "aaaaaaaa11": {"calls": 11, "executors": 2, "alive": True},
        "bbbbbbbb22": {"calls": 6, "executors": 1, "alive": True},
        "cccccccc33": {"calls": 8, "executors": 0, "alive": False},
    }


def test_the_collector_renders_a_cluster_snapshot_with_its_node_series() -> None:
    snap = merge_snapshots({"aaaaaaaa11": _node(10, executors=2), "bbbbbbbb22": _node(5)}, [])
    body, _ = render(make_registry(None, tasks=lambda: {"running": 1}, snapshot=lambda: snap))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("blockx_calls_total", (("kind", "root"), ("outcome", "succeeded")))] == 15
    assert samples[("blockx_rows_total", ())] == 15
    assert samples[("blockx_executors", (("state", "running"),))] == 3
    assert samples[("blockx_cluster_nodes", ())] == 2
    assert samples[("blockx_cluster_node_calls_total", (("node", "aaaaaaaa11"),))] == 11
    assert samples[("blockx_executor_rss_bytes", (("executor", "bbbbbbbb/e0"),))] == 1000
    assert samples[("blockx_tasks", (("state", "running"),))] == 1


def test_no_node_yet_reads_zeros() -> None:
    body, _ = render(make_registry(None, snapshot=lambda: merge_snapshots({}, [])))
    text = body.decode()
    assert "blockx_cluster_nodes 0.0" in text
    assert 'blockx_calls_total{kind="root",outcome="succeeded"} 0.0' in text


class _Actor:
    """Answers ``metrics.remote()`` as a node worker does (an awaitable of its dict)."""

    def __init__(self, node_id: str, pid: int, snap: dict[str, Any]) -> None:
        self.node_id, self.pid, self.snap = node_id, pid, snap
        self.metrics = self

    def remote(self) -> Any:
        async def answer() -> dict[str, Any]:
            return {"node_id": self.node_id, "pid": self.pid, "snapshot": self.snap}

        return answer()


def test_a_node_worker_gone_or_replaced_keeps_its_counters_not_its_gauges() -> None:
    import asyncio

    from blockx.cluster.metrics import ClusterMetrics
    from blockx.cluster.nodes import NodePool, PooledNode

    pool = NodePool(None, None, None)

    def node(node_id: str, pid: int, snap: dict[str, Any]) -> None:
        pool.nodes[node_id] = PooledNode(node_id, _Actor(node_id, pid, snap), 1)
        pool.alive[node_id] = 1

    async def scenario() -> None:
        metrics = ClusterMetrics(pool)
        node("aaaaaaaa11", 100, _node(10, inflight=1))
        node("bbbbbbbb22", 200, _node(5, inflight=1))
        snap = await metrics.refresh()
        assert snap["calls"]["succeeded"] == 15 and snap["calls"]["inflight"] == 2
        # a new actor on node a (another pid, counters from 0); node b removed
        node("aaaaaaaa11", 101, _node(1))
        del pool.alive["bbbbbbbb22"]
        snap = await metrics.refresh()
        assert snap["calls"]["succeeded"] == 16  # 10 (a's old worker) + 1 + 5 (b's last)
        assert snap["calls"]["inflight"] == 0  # gauges: the live node workers only
        assert [e["executor"] for e in snap["executors"]] == ["aaaaaaaa/e0"]
        assert snap["cluster"]["nodes"]["bbbbbbbb22"]["alive"] is False
        assert metrics.current() is snap

    asyncio.run(scenario())

"""``blockx serve --ray`` operations (issue #21, leftovers 2 and 3): a node that joins
the cluster while the service is idle gets its node worker at once (``/readyz``'s
executors grow with no task running), and ``/metrics``' worker series are the
cluster's -- every node worker's figures summed, a ``blockx_cluster_*`` series per
node -- consistent with the task that ran (root calls succeeded == rows); ``--trace-file``
gets each task's driver spans.

A simulated cluster of its own (one raylet, ``num_cpus=1``; a second one added by the
test); the server is a real ``blockx serve`` process joining it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")

from prometheus_client.parser import text_string_to_metric_families
from tests.cluster.conftest import SimCluster
from tests.serve.server import Server, wait_for

from blockx.cluster.node import NODE_ID_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

WORK = f"""
import os
def _(i):
    return {{"i": i, "twice": function.call("twice", i), "node": os.environ["{NODE_ID_ENV}"]}}
"""
TWICE = "def twice(x):\n    return 2 * x\n"


def _run_work(server: Server, task_id: str, calls: int) -> tuple[dict[str, Any], list[Any]]:
    """Submit ``calls`` calls of WORK (each with a sub-call), wait for the task to
    succeed; its final status and its rows."""
    submitted = server.submit(
        {
            "task_id": task_id,
            "functions": {"work": {"source": WORK}, "twice": {"source": TWICE}},
            "calls": [{"function": "work", "args": i} for i in range(calls)],
        }
    )
    status = server.wait_finished(submitted, timeout=240)
    assert status["state"] == "succeeded", status
    return status, server.rows(submitted)


def _ready_executors(server: Server) -> int:
    reply = server.request("GET", "/readyz")
    return int(reply.json()["executors"]) if reply.status == 200 else 0


def _metrics(server: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = server.request("GET", "/metrics")
    assert reply.status == 200, reply
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.body.decode())
        for s in family.samples
    }


def _calls(metrics: dict[Any, float], kind: str, outcome: str = "succeeded") -> float:
    return metrics.get(("blockx_calls_total", (("kind", kind), ("outcome", outcome))), -1.0)


def _node_calls(metrics: dict[Any, float]) -> dict[str, float]:
    return {
        dict(labels)["node"]: value
        for (name, labels), value in metrics.items()
        if name == "blockx_cluster_node_calls_total"
    }


def test_an_idle_service_takes_a_new_node_and_its_metrics_are_the_clusters(
    cluster1: SimCluster, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    with Server(
        tmp_path / "data",
        "--ray",
        cluster1.address,
        "--executors-per-node",
        "1",
        "--trace-file",
        str(trace),
    ) as server:
        assert _ready_executors(server) == 1
        idle = _metrics(server)
        assert idle[("blockx_cluster_nodes", ())] == 1
        assert _calls(idle, "root") == 0

        # A node joins while no task runs: its worker starts, its executor is ready.
        cluster1.add_node()
        wait_for(lambda: _ready_executors(server) == 2, 180, "the new node's executor")
        wait_for(
            lambda: _metrics(server)[("blockx_cluster_nodes", ())] == 2, 60, "two node workers"
        )
        assert server.request("GET", "/v1/tasks").json().get("tasks", []) == []

        calls = 2000
        _status, rows = _run_work(server, "ops-watched", calls)
        assert [r["twice"] for r in rows] == [2 * i for i in range(calls)]
        used = {r["node"] for r in rows}
        assert len(used) == 2  # the node that joined while idle ran calls from the start

        metrics = _metrics(server)  # fetched from the nodes at the scrape
        assert _calls(metrics, "root") == calls == len(rows)
        assert _calls(metrics, "subcall") == calls
        assert metrics[("blockx_rows_total", ())] == calls
        assert metrics[("blockx_executors", (("state", "running"),))] == 2
        per_node = _node_calls(metrics)
        assert set(per_node) == used and sum(per_node.values()) == calls
        assert all(count > 0 for count in per_node.values())
        assert metrics[("blockx_tasks", (("state", "succeeded"),))] == 1

        # --trace-file: the task's driver spans (a task span, a node span per node)
        spans = [json.loads(line) for line in trace.read_text().splitlines()]
        (task,) = [s for s in spans if s["name"] == "task"]
        assert task["attributes"]["blockx.task_id"] == "ops-watched"  # the task's own id
        assert task["attributes"]["blockx.outcome"] == "succeeded"
        assert task["attributes"]["blockx.calls"] == calls
        nodes = {
            s["attributes"]["blockx.ray_node_id"]: s["attributes"]["blockx.calls"]
            for s in spans
            if s["name"] == "node" and s["parent_span_id"] == task["span_id"]
        }
        assert set(nodes) == used and sum(nodes.values()) == calls


def _node_worker_pids(node_id: str) -> set[int]:
    """The node worker actors (the parents of the executors) of one Ray node, by pid."""
    parents: set[int] = set()
    marker = f"{NODE_ID_ENV}={node_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"blockx.executor" not in cmdline or marker not in (entry / "environ").read_bytes():
                continue
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        parents.add(int(stat.rsplit(")", 1)[1].split()[1]))
    return parents


def test_an_idle_services_dead_node_worker_is_replaced_before_a_task_needs_it(
    cluster1: SimCluster, tmp_path: Path
) -> None:
    """A node worker's actor killed (its Ray node alive) while no task runs: the service
    notices it at its next look and starts another on that node, so the next task runs
    on every node with no node lost (without it, the task's driver found the actor dead,
    wrote the node off for the task and ran it on the others)."""
    import os
    import signal

    import ray

    if len([n for n in ray.nodes() if n["Alive"]]) < 2:
        cluster1.add_node()
    with Server(
        tmp_path / "data", "--ray", cluster1.address, "--executors-per-node", "1"
    ) as server:
        wait_for(lambda: _ready_executors(server) >= 2, 180, "two node workers")
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        victim = next(n for n in nodes if _node_worker_pids(n))
        (old_pid,) = _node_worker_pids(victim)
        os.kill(old_pid, signal.SIGKILL)
        wait_for(
            lambda: (pids := _node_worker_pids(victim)) and old_pid not in pids,
            180,
            "a new node worker on the node whose worker was killed",
        )
        wait_for(lambda: _ready_executors(server) == len(nodes), 120, "every node ready")

        calls = 400
        status, rows = _run_work(server, "after-a-dead-worker", calls)
        assert [r["i"] for r in rows] == list(range(calls))
        served = {r["node"] for r in rows}
        # On failure, what each node served and the run's summary (its node figures).
        assert victim in served, (victim, served, status["summary"])
        assert status["summary"]["node_lost"] == 0, status["summary"]

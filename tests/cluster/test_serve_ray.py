"""``blockx serve --ray ADDRESS`` (issue #21): the service's tasks run on a Ray cluster,
one BlockX worker per node, stored batch by batch as on one machine -- every row
exactly once and in call order across the nodes, a streamed task fed over HTTP, a node
removed mid-task, a ``kill -9`` of the server then a restart that resumes; a task
using ``Table`` on SQLite refused with a 422 problem.

One simulated 2-raylet cluster for the module (``num_cpus=1`` each); the servers are
real ``blockx serve`` processes joining it. The tests run in file order: the node
removal comes last (it leaves one node).
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")

from tests.cluster.conftest import SimCluster
from tests.serve.server import Server, wait_for

from blockx.cluster.node import NODE_ID_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

WORK = f"""
import os, time
def _(i):
    if i % 11 == 3:
        raise ValueError(f"no {{i}}")
    if i % 89 == 0:
        time.sleep(0.03)  # uneven: calls end out of order across the nodes
    return {{"i": i, "node": os.environ["{NODE_ID_ENV}"], "pid": os.getpid()}}
"""


def _gate_source(gate: Path, gate_at: int) -> str:
    return (
        "import os, time\n"
        "def _(i):\n"
        f"    if i >= {gate_at}:\n"
        f"        while not os.path.exists({str(gate)!r}):\n"
        "            time.sleep(0.01)\n"
        f"    return {{'i': i, 'node': os.environ[{NODE_ID_ENV!r}]}}\n"
    )


def _first_rows(server: Server, task_id: str, count: int) -> list[Any]:
    """The first ``count`` rows of a running task (its rows endpoint follows it)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    try:
        conn.request("GET", f"/v1/tasks/{task_id}/rows")
        response = conn.getresponse()
        return [json.loads(response.readline()) for _ in range(count)]
    finally:
        conn.close()


def _server(data: Path, cluster: SimCluster, *args: str) -> Server:
    return Server(data, "--ray", cluster.address, "--executors-per-node", "2", *args)


def test_a_task_runs_on_both_nodes_every_row_once_in_call_order(
    cluster2: SimCluster, tmp_path: Path
) -> None:
    with _server(tmp_path / "data", cluster2) as server:
        task = {
            "functions": {"work": {"source": WORK}},
            "calls": [{"function": "work", "args": i} for i in range(4000)],
            "policy": {"failure": "continue", "max_attempts": 1},
        }
        task_id = server.submit(task)
        status = server.wait_finished(task_id, timeout=240)
        assert status["state"] == "succeeded", status
        ok = [i for i in range(4000) if i % 11 != 3]
        assert (status["done"], status["succeeded"], status["failed"]) == (
            4000,
            len(ok),
            4000 - len(ok),
        )
        rows = server.rows(task_id)
        assert [r["i"] for r in rows] == ok  # each once, in call order
        assert len({r["node"] for r in rows}) == 2  # both nodes ran calls
        nodes = status["summary"]["nodes"]  # per-node counts, as blockx run --ray's summary
        assert set(nodes) == {r["node"] for r in rows}
        assert sum(n["calls"] for n in nodes.values()) == 4000
        assert all(n["executors"] == 2 and n["alive"] for n in nodes.values())
        assert status["summary"]["node_lost"] == 0
        failures = server.request("GET", f"/v1/tasks/{task_id}/failures").lines()
        assert [f["index"] for f in failures] == [i for i in range(4000) if i % 11 == 3]
        assert all(f["kind"] == "user_error" and f["args"] == f["index"] for f in failures)

        # A streamed task fed over HTTP: the driver reads the store's calls as they come.
        reply = server.request(
            "POST",
            "/v1/tasks",
            {
                "functions": {"work": {"source": WORK}},
                "calls_stream": True,
                "policy": {"failure": "continue"},
            },
        )
        assert reply.status == 201, reply
        streamed = reply.json()["id"]
        for part in range(5):
            body = "".join(
                json.dumps({"function": "work", "args": part * 300 + i}) + "\n" for i in range(300)
            ).encode()
            sent = server.request(
                "POST", f"/v1/tasks/{streamed}/calls", body, content_type="application/x-ndjson"
            )
            assert sent.status == 200, sent
        # The calls sent so far run before the stream closes (FLUSH reaches the nodes).
        wait_for(lambda: server.status(streamed)["done"] >= 1200, 120, "the first calls")
        assert server.request("POST", f"/v1/tasks/{streamed}/close").status == 200
        status = server.wait_finished(streamed, timeout=240)
        assert status["state"] == "succeeded", status
        streamed_rows = server.rows(streamed)
        assert [r["i"] for r in streamed_rows] == [i for i in range(1500) if i % 11 != 3]
        # The node workers are the service's, shared by its tasks: the same executors.
        assert {r["pid"] for r in streamed_rows} <= {r["pid"] for r in rows}


def test_table_on_sqlite_is_refused_per_task_with_a_422(
    cluster2: SimCluster, tmp_path: Path
) -> None:
    with _server(tmp_path / "data", cluster2, "--set", "io.blockdb.engine=sqlite") as server:
        task = {
            "functions": {
                "w": {"source": "def w(i):\n    Table('t').upsert_row({'key': i})\n"},
                "plain": {"source": "def plain(i):\n    return i\n"},
            },
            "calls": [{"function": "w", "args": 1}],
        }
        reply = server.request("POST", "/v1/tasks", task)
        assert reply.status == 422, reply
        detail = reply.json()["detail"]
        assert "'w'" in detail and "'plain'" not in detail
        assert "io.blockdb.engine: postgres" in detail and "postgres_dsn" in detail
        # A task that never touches Table runs.
        ok = server.submit(
            {
                "functions": {"plain": {"source": "def plain(i):\n    return i\n"}},
                "calls": [{"function": "plain", "args": i} for i in range(10)],
            }
        )
        assert server.wait_finished(ok, timeout=240)["state"] == "succeeded"
        assert server.rows(ok) == list(range(10))


def test_kill_9_of_the_server_mid_task_then_restart_resumes(
    cluster2: SimCluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    data = tmp_path / "data"
    task = {
        "functions": {"g": {"source": _gate_source(gate, 600)}},
        "calls": [{"function": "g", "args": i} for i in range(1200)],
        "policy": {"call_budget_ms": 0},
    }
    server = _server(data, cluster2).start()
    try:
        task_id = server.submit(task)
        # The first batch of each node (64 calls) is under the gate: stored for sure.
        wait_for(lambda: server.status(task_id)["done"] >= 100, 240, "the calls before the gate")
        seen = _first_rows(server, task_id, 100)
    finally:
        server.kill()
    assert [r["i"] for r in seen] == list(range(100))
    gate.touch()
    with _server(data, cluster2) as again:
        status = again.wait_finished(task_id, timeout=240)
        assert status["state"] == "succeeded", status
        assert (status["done"], status["rows"]) == (1200, 1200)
        assert [r["i"] for r in again.rows(task_id)] == list(range(1200))  # each once, in order


def test_a_node_removed_mid_task_every_row_once_in_order(
    cluster2: SimCluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    victim = cluster2.extra[0]
    task = {
        "functions": {"g": {"source": _gate_source(gate, 1000)}},
        "calls": [{"function": "g", "args": i} for i in range(3000)],
        "policy": {"failure": "continue", "max_attempts": 3, "call_budget_ms": 0},
    }
    with _server(tmp_path / "data", cluster2) as server:
        task_id = server.submit(task)
        # Calls from 1000 on wait at the gate: both nodes hold some of them in flight.
        # (A node settles its batches whole: the first ones, 64 calls each, for sure.)
        wait_for(lambda: server.status(task_id)["done"] >= 100, 240, "the calls before the gate")
        assert [r["i"] for r in _first_rows(server, task_id, 100)] == list(range(100))
        cluster2.remove_node(victim)
        gate.touch()
        status = server.wait_finished(task_id, timeout=300)
        assert status["state"] == "succeeded", status
        rows = server.rows(task_id)
        assert [r["i"] for r in rows] == list(range(3000))  # each once, in call order
        assert status["summary"]["retries"] > 0  # the lost node's calls ran again

"""A cluster run's figures (issue #21 leftovers 5 and 6), on a simulated 3-node cluster.

* A node lost mid-task has reported its cache, retry and IO figures with every reply
  (cumulative counters): the run's totals and the lost node's entry in ``nodes``
  include what it did up to its last reply, and nothing is counted twice.
* ``dispatcher.max_collected_output_bytes`` limits outputs kept for a whole task; a
  node's task hands its outputs to the driver batch by batch, so a tiny limit does not
  touch it: every output comes back.

No assertion races a clock: the source stops once the condition it waits for was
*seen* in the rows (with a hard cap of calls).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'blockx[ray]'")

from blockx.cluster.driver import ClusterOptions, ClusterRun, run_on_cluster
from blockx.cluster.node import FIGURES, NODE_ID_ENV
from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.config import load_config
from blockx.worker.io.config import BlockDBConfig, IOConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

READ = f"""
import os, time
def read(p):
    time.sleep(0.01)
    got = Table("figs").get_row(p["i"] % 50)
    return {{"i": p["i"], "got": got, "node": os.environ["{NODE_ID_ENV}"]}}
"""
SAME = f"""
import os, time
def same(p):
    time.sleep(0.01)
    return {{"k": p["k"], "node": os.environ["{NODE_ID_ENV}"]}}
"""
ECHO = f"""
import os
def echo(p):
    return {{"i": p["i"], "pad": "x" * 200, "node": os.environ["{NODE_ID_ENV}"]}}
"""


def _calls(removed: threading.Event, cap: int) -> Iterator[Call]:
    """``read`` calls, every other one a ``same`` call of 12 keys (call-cache hits),
    until ``removed`` is set, then 600 more (at most ``cap``)."""
    stop_at = cap
    for i in range(cap):
        if removed.is_set() and stop_at == cap:
            stop_at = min(cap, i + 600)
        if i >= stop_at:
            return
        yield Call("same", {"k": i % 12}) if i % 2 else Call("read", {"i": i})


def test_a_lost_nodes_cache_and_io_figures_are_in_the_totals(sim_cluster: Any, pg_dsn: str) -> None:
    victim = sim_cluster.extra[0]
    victim_id = victim.node_id
    seen_keys: dict[int, int] = {}
    victim_busy = threading.Event()
    removed = threading.Event()
    rows: list[Any] = []
    cluster_run = ClusterRun()
    outcome: list[Any] = []
    errors: list[BaseException] = []

    async def on_rows(batch: list[Any]) -> None:
        rows.extend(batch)
        # Once the victim answered an identical call twice (a cache or singleflight
        # hit there) and some reads (IO there), it is removed.
        for r in batch:
            if r["node"] == victim_id and "k" in r:
                seen_keys[r["k"]] = seen_keys.get(r["k"], 0) + 1
        victim_reads = any(r["node"] == victim_id and "i" in r for r in rows[-len(batch) :])
        if victim_reads and any(n >= 3 for n in seen_keys.values()):
            victim_busy.set()

    task = Task(
        functions={"read": READ, "same": SAME},
        calls=_calls(removed, 40_000),
        # Not about budgets: a loaded machine's slow PostgreSQL reads must not fail calls.
        policy=TaskPolicy(failure="continue", max_attempts=3, call_budget_ms=600_000),
    )
    io = IOConfig(
        blockdb=BlockDBConfig(engine="postgres", postgres_dsn=pg_dsn, table_prefix="figs_")
    )
    options = ClusterOptions(address=sim_cluster.address, window_per_node=256, min_batch=16)

    def run() -> None:
        try:
            outcome.append(
                asyncio.run(run_on_cluster(task, None, io, options, on_rows, cluster_run))
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert victim_busy.wait(timeout=240)
    sim_cluster.remove_node(victim)
    removed.set()
    thread.join(timeout=280)
    assert not thread.is_alive(), "the run did not end"
    if errors:
        raise errors[0]
    (result,) = outcome

    assert result.success, result.errors[:3]
    assert cluster_run.nodes[victim_id]["alive"] is False
    lost = cluster_run.nodes[victim_id]
    # What the lost node reported up to its last reply.
    assert lost["io_calls"] > 0, lost
    assert lost["cache_hits"] + lost["singleflight_hits"] > 0, lost
    # The totals are the sums over every node, the lost one included (each once).
    stats = result.stats
    for name in FIGURES:
        total = sum(int(n.get(name, 0)) for n in cluster_run.nodes.values())
        expected = total + (cluster_run.node_lost if name == "retries" else 0)
        assert getattr(stats, name) == expected, name
    assert stats.io_calls >= sum(1 for r in rows if "i" in r)
    assert cluster_run.io_stats.totals()["requests"] >= lost["io_calls"]


def test_a_tiny_max_collected_output_bytes_does_not_touch_a_nodes_outputs(
    sim_cluster: Any,
) -> None:
    config = load_config()
    config = replace(config, dispatcher=replace(config.dispatcher, max_collected_output_bytes=500))
    task = Task(
        functions={"echo": ECHO},
        calls=[Call("echo", {"i": i}) for i in range(3_000)],
        policy=TaskPolicy(failure="continue", call_budget_ms=600_000),  # not about budgets
    )
    rows: list[Any] = []

    async def collect(batch: list[Any]) -> None:
        rows.extend(batch)

    options = ClusterOptions(address=sim_cluster.address, min_batch=16)
    result = asyncio.run(run_on_cluster(task, config, IOConfig(), options, collect, ClusterRun()))
    assert result.success, (result.failure, result.errors[:3])
    assert result.stats.succeeded == 3_000
    assert [r["i"] for r in rows] == list(range(3_000))
    assert len({r["node"] for r in rows}) > 1

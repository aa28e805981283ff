"""The parts of ``blockx run --ray``'s watching that need no cluster (issue #21,
leftover 4): the progress line's counts read from a cluster run's driver, and the
driver's spans (``task`` + one ``node`` span per node) written to a trace file."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from blockx.cli.run_cluster import driver_counts
from blockx.cluster.driver import ClusterRun
from blockx.cluster.spans import DriverSpans
from blockx.observability.tracing import JsonLinesSink, Tracing
from blockx.worker.api import TaskFailureInfo, TaskResult, TaskStats


def _result(success: bool) -> TaskResult:
    stats = TaskStats(
        calls=10,
        succeeded=9,
        failed=1,
        cancelled=0,
        retries=0,
        cache_hits=0,
        singleflight_hits=0,
        subcalls=0,
        io_calls=0,
        wall_time_s=1.0,
    )
    failure = None if success else TaskFailureInfo(kind="CANCELLED", message="stop")
    return TaskResult(
        task_id="t1", success=success, failure=failure, outputs=[], errors=[], stats=stats
    )


def test_progress_counts_come_from_the_running_driver() -> None:
    run = ClusterRun()
    assert driver_counts(run) is None  # no driver (yet, or any more)
    # The nodes' figures as their latest batch replies carried them (per node task key).
    figures = {
        "a": {"k1": {"stats": {"retries": 4}}, "k2": {"stats": {"retries": 1}}},
        "b": {"k1": {"stats": {}}},
    }
    run.driver = SimpleNamespace(
        succeeded=40, cancelled=2, errors=[object()] * 3, node_figures=figures
    )
    run.node_lost = 5
    # ended; node_lost + the nodes' retries so far; failed
    assert driver_counts(run) == (45, 10, 3)


def _spans(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_driver_writes_a_task_span_and_a_node_span_per_node(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    spans = DriverSpans(Tracing([JsonLinesSink(path)]), None)
    spans.look({"n1": {}})
    nodes = {
        "n1": {"calls": 6, "executors": 2, "batches": 3, "lost_calls": 0, "alive": True},
        "n2": {"calls": 4, "executors": 2, "batches": 1, "lost_calls": 2, "alive": False},
    }
    assert spans.finish(_result(True), nodes) == 3
    spans.close()
    written = _spans(path)
    task = written[-1]  # children first, as the worker writes them
    assert task["name"] == "task" and task["parent_span_id"] is None
    assert task["attributes"] == {
        "blockx.task_id": "t1",
        "blockx.outcome": "succeeded",
        "blockx.calls": 10,
        "blockx.cluster_nodes": 2,
    }
    children = {s["attributes"]["blockx.ray_node_id"]: s for s in written[:-1]}
    assert set(children) == {"n1", "n2"}
    assert all(
        s["name"] == "node" and s["parent_span_id"] == task["span_id"] for s in children.values()
    )
    assert children["n2"]["attributes"]["blockx.lost_calls"] == 2


def test_a_cancelled_run_and_a_zero_sample_ratio(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    cancelled = DriverSpans(Tracing([JsonLinesSink(path)]), "t1")
    cancelled.finish(_result(False), {})
    cancelled.close()
    assert [s["attributes"]["blockx.outcome"] for s in _spans(path)] == ["cancelled"]
    off = tmp_path / "off.jsonl"
    unsampled = DriverSpans(Tracing([JsonLinesSink(off)], sample_ratio=0.0), "t1")
    assert unsampled.finish(None, {}) == 0
    unsampled.close()
    assert off.read_text() == ""

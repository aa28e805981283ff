"""blockx.cluster.node.merge_figures / total_figures: a node task's cumulative figures, as every reply
and ``finish`` carry them, merged into the latest whatever order they arrive in, each
counted once. No Ray needed."""

from __future__ import annotations

from typing import Any

from blockx.cluster.node import merge_figures, total_figures
from blockx.worker.io.stats import IOStats


def _figures(retries: int, hits: int, io_calls: int, requests: int, hist: list[int]) -> Any:
    counters = {"requests": requests, "cache_hits": 0, "max_ms": float(requests)}
    return {
        "key": "t@1",
        "stats": {"retries": retries, "cache_hits": hits, "io_calls": io_calls},
        "io": [("blockdb", "get_row", counters, hist)],
    }


def test_the_latest_figures_win_in_any_order() -> None:
    early = _figures(1, 5, 10, 10, [3, 7])
    late = _figures(2, 9, 30, 30, [8, 20, 2])
    for first, second in ((early, late), (late, early)):
        merged = merge_figures(merge_figures(None, first), second)
        assert merged["stats"] == late["stats"]
        ((backend, operation, counters, hist),) = merged["io"]
        assert (backend, operation) == ("blockdb", "get_row")
        assert counters == late["io"][0][2]
        assert hist == [8, 20, 2]


def test_merging_the_same_report_twice_counts_it_once() -> None:
    once = merge_figures(None, _figures(1, 5, 10, 10, [3]))
    assert merge_figures(once, _figures(1, 5, 10, 10, [3])) == once


def test_finish_stats_add_names_and_new_operations_join() -> None:
    live = merge_figures(None, _figures(1, 5, 10, 10, [3]))
    final = {
        "key": "t@1",
        "stats": {"retries": 1, "cache_hits": 6, "io_calls": 11, "calls": 100},
        "io": [("rpc", "eth_call", {"requests": 4}, [4])],
    }
    merged = merge_figures(live, final)
    assert merged["stats"] == {"retries": 1, "cache_hits": 6, "io_calls": 11, "calls": 100}
    assert {(b, o) for b, o, _c, _h in merged["io"]} == {
        ("blockdb", "get_row"),
        ("rpc", "eth_call"),
    }
    # The inputs are not changed.
    assert live["stats"]["cache_hits"] == 5


def test_totals_sum_every_node_task_lost_nodes_included_and_fill_each_nodes_entry() -> None:
    node_figures = {
        "alive": {"t@1": merge_figures(None, _figures(2, 5, 10, 10, [3]))},
        # a node lost mid-task: its last reply's figures, two task keys (node_lost attempts)
        "lost": {
            "t@1": merge_figures(None, _figures(1, 4, 7, 7, [1])),
            "t@2": merge_figures(None, _figures(0, 1, 2, 2, [2])),
        },
    }
    nodes: dict[str, dict[str, Any]] = {"alive": {"calls": 30}, "lost": {"calls": 12}}
    io = IOStats()
    totals = total_figures(node_figures, nodes, io)
    assert totals["retries"] == 3 and totals["cache_hits"] == 10 and totals["io_calls"] == 19
    alive = nodes["alive"]
    assert (alive["retries"], alive["cache_hits"], alive["io_calls"]) == (2, 5, 10)
    assert nodes["lost"]["cache_hits"] == 5 and nodes["lost"]["io_calls"] == 9
    assert nodes["lost"]["calls"] == 12  # the entry's own figures stay
    assert io.operation("blockdb", "get_row").requests == 19

"""blockx.cluster.node.merge_figures: a node task's cumulative figures, as every reply
and ``finish`` carry them, merged into the latest whatever order they arrive in, each
counted once. No Ray needed."""

from __future__ import annotations

from typing import Any

from blockx.cluster.node import merge_figures


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

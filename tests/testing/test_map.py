"""``blockx.map``: a synchronous iterator of results in input order, on a worker of its own.

Real worker, real executor processes (one), no mocks.
"""

from __future__ import annotations

import itertools
import pathlib
import threading

import pytest
from tests.helpers.processes import process_is_gone

import blockx
from blockx.mapping import MapCallError, MapError
from blockx.worker.api import CallFailure

pytestmark = pytest.mark.slow

SQUARE = "def _(x):\n    return x * x\n"
INVERSE = "def _(x):\n    return 1 / x\n"


def _map_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "blockx-map"]


def _live_children() -> set[int]:
    """This process's children that are still running (Linux /proc)."""
    children: set[int] = set()
    for task in pathlib.Path("/proc/self/task").iterdir():
        try:
            text = (task / "children").read_text()
        except FileNotFoundError:  # a thread that ended since the listing
            continue
        children.update(int(pid) for pid in text.split())
    return {pid for pid in children if not process_is_gone(pid)}


def test_results_come_in_input_order_one_per_item_whatever_the_output(tmp_path):
    path = tmp_path / "shape.py"
    path.write_text(
        "import time\n"
        "def _(x):\n"
        "    time.sleep(0.01 * (5 - x))  # later items finish first\n"
        "    return None if x == 0 else [x] * x\n"
    )
    assert list(blockx.map(str(path), range(5), executors=1)) == [
        None,
        [1],
        [2, 2],
        [3, 3, 3],
        [4, 4, 4, 4],
    ]
    assert _map_threads() == []  # the worker's thread is gone


def test_args_follow_the_wire_rule_and_sub_calls_reach_functions(tmp_path):
    (tmp_path / "add.py").write_text("def _(a, b):\n    return function.call('sq', a) + b\n")
    out = blockx.map(tmp_path / "add.py", [[1, 2], [3, 4]], functions={"sq": SQUARE}, executors=1)
    assert list(out) == [3, 13]


def test_a_failed_call_raises_a_clear_error_naming_the_call():
    results = blockx.map(INVERSE, [1, 2, 0, 4], executors=1, max_attempts=1)
    assert next(results) == 1.0
    assert next(results) == 0.5
    with pytest.raises(MapCallError) as raised:
        next(results)
    error = raised.value
    assert error.index == 2 and error.call_args == 0 and error.kind == "user_error"
    assert "call #2 function(0) failed" in str(error)
    assert "ZeroDivisionError" in str(error)
    with pytest.raises(StopIteration):
        next(results)  # the map stopped there
    assert _map_threads() == []


def test_errors_return_yields_the_failure_in_its_place():
    out = list(
        blockx.map(
            INVERSE, [2, 0, 4], executors=1, max_attempts=1, errors="return", function_id="inverse"
        )
    )
    assert out[0] == 0.5 and out[2] == 0.25
    failure = out[1]
    assert isinstance(failure, CallFailure)
    assert failure.index == 1 and failure.function_id == "inverse"
    assert "ZeroDivisionError" in failure.message


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_closing_early_stops_the_worker_and_the_endless_source():
    before = _live_children()
    taken = []
    source = itertools.count()
    results = blockx.map(SQUARE, source, executors=1)
    for value in results:
        taken.append(value)
        if len(taken) == 3:
            assert _live_children() - before  # the executor runs meanwhile
            break
    results.close()
    assert taken == [0, 1, 4]
    assert _map_threads() == []
    assert _live_children() - before == set()  # the executor was terminated


def test_bad_functions_and_options_fail_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="no such function file"):
        blockx.map(str(tmp_path / "missing.py"), [1])
    with pytest.raises(MapError, match="does not compile"):
        blockx.map("def _(:\n  pass\n", [1])
    with pytest.raises(MapError, match="no entry function"):
        blockx.map("x = 1\ny = 2\n", [1])
    with pytest.raises(MapError, match="errors must be"):
        blockx.map(SQUARE, [1], errors="ignore")  # type: ignore[arg-type]
    assert _map_threads() == []


def test_map_is_exported_but_never_shadows_the_builtin():
    import blockx.mapping

    assert blockx.map is blockx.mapping.map
    assert "map" not in blockx.__all__
    namespace: dict = {}
    exec("from blockx import *", namespace)
    assert "map" not in namespace

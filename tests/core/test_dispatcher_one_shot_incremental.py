"""The end of a one-shot phase is incremental: calls are folded in as they end.

Each root call of a one-shot phase is forgotten as it ends, its output (or
failure) put in call order into the run of consecutive ended calls it joins
(``EndedRun``). ``ConvergeTaskCalls`` then hands over the one run left as
built: whatever the order the calls ended in, the outputs come in call order,
the failures too, and the counts add up; and neither the end of the last call
nor the converging step walks the calls (checked by state, and by counting
the Python-level calls they make, which must not grow with the number of
calls -- also when the first call ends last).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from dispatcher_harness import Runtime, make_runtime, output_for, specs

from blockx.worker.core import (
    CallRetryPolicy,
    ConvergeTaskCalls,
    DispatcherConfig,
    FailurePolicy,
    TaskMode,
)

CONTINUE = CallRetryPolicy(failure=FailurePolicy.CONTINUE, max_attempts=1)


def _out(i: int) -> bytes:
    return output_for("f", str(i).encode())


def _started(n: int) -> Runtime:
    """A phase of ``n`` calls, every one of them running."""
    config = DispatcherConfig(executor_max_inflight=n, task_max_inflight_calls=n)
    rt = make_runtime(config, usable_contexts=n)
    rt.register("t", specs(n), policy=CONTINUE)
    rt.pump()
    assert len(rt.running) == n
    return rt


def _end(rt: Runtime, i: int) -> None:
    """Call #i fails when i % 7 == 3, else completes."""
    if i % 7 == 3:
        rt.fail(f"t/c{i}", kind="user_error", retryable=False, message=f"no {i}")
    else:
        rt.complete(f"t/c{i}")


def _converge_in_order(order: list[int], n: int) -> ConvergeTaskCalls:
    rt = _started(n)
    for i in order:
        _end(rt, i)
        rt.core.check_invariants()
    rt.settle()
    rt.core.check_invariants()
    return rt.converged["t"]


def test_calls_ending_out_of_order_converge_as_in_call_order() -> None:
    n = 60
    expected_outputs = tuple(_out(i) for i in range(n) if i % 7 != 3)
    expected_failed = [f"t/c{i}" for i in range(n) if i % 7 == 3]
    shuffled = list(range(n))
    random.Random(5).shuffle(shuffled)
    orders = {
        "in order": list(range(n)),
        "reversed": list(reversed(range(n))),
        "shuffled": shuffled,
        "first last": [*range(1, n), 0],
    }
    results = {name: _converge_in_order(order, n) for name, order in orders.items()}
    for name, conv in results.items():
        assert conv.mode is TaskMode.ONE_SHOT and conv.success, name
        assert conv.outputs == expected_outputs, name
        assert [f.call_id for f in conv.failed_calls] == expected_failed, name
        assert [f.index for f in conv.failed_calls] == [i for i in range(n) if i % 7 == 3]
        assert conv.failed_calls[0].error.message == "no 3"
        assert (conv.total_count, conv.succeeded_count, conv.failed_count) == (n, 51, 9), name
        assert conv.cancelled_count == 0
    assert len({repr(conv) for conv in results.values()}) == 1  # the same command each time


def test_a_cancelled_phase_ended_out_of_order_reports_its_calls_and_counts() -> None:
    rt = make_runtime(executors=1, usable_contexts=6)
    rt.register("t", specs(20), policy=CONTINUE)
    rt.pump()
    assert sorted(rt.running) == [f"t/c{i}" for i in range(6)]
    for i in (5, 3, 4):  # out of order, #3 fails; 0, 1 and 2 stay in flight
        _end(rt, i)
    rt.pump()  # three more start: 6, 7, 8
    assert sorted(rt.running) == [f"t/c{i}" for i in (0, 1, 2, 6, 7, 8)]
    rt.complete("t/c7")
    rt.core.check_invariants()
    cancels = rt.run(rt.core.handle_task_cancelled("t", "the caller cancelled"))
    assert len(cancels) == 5  # the five in flight
    rt.settle()
    rt.core.check_invariants()
    conv = rt.converged["t"]
    assert not conv.success and conv.failure is not None and conv.failure.kind == "CANCELLED"
    assert conv.outputs == (_out(4), _out(5), _out(7))
    assert [f.call_id for f in conv.failed_calls] == ["t/c3"]
    assert (conv.succeeded_count, conv.failed_count, conv.cancelled_count) == (3, 1, 16)
    assert rt.core.task_ids() == [] and rt.core.call_contexts == {}


def _runs(rt: Runtime) -> list[tuple[int, int, int, list[int]]]:
    """``(first, last, outputs, failed indexes)`` of each run of ended calls of task t."""
    state = rt.core.task_state("t")
    assert state is not None
    return [
        (run.start, run.end - 1, len(run.outputs), [f.index for f in run.failures])
        for run in state.ended_runs
    ]


def test_ended_calls_gather_into_runs_in_call_order_whatever_the_order() -> None:
    rt = _started(12)
    for i in (9, 3, 8):
        _end(rt, i)
    assert _runs(rt) == [(3, 3, 0, [3]), (8, 9, 2, [])]
    _end(rt, 7)  # in front of a run
    _end(rt, 4)  # behind one
    assert _runs(rt) == [(3, 4, 1, [3]), (7, 9, 3, [])]
    for i in (5, 6):  # 6 joins the two runs
        _end(rt, i)
    assert _runs(rt) == [(3, 9, 6, [3])]
    for i in (11, 1, 2, 10):
        _end(rt, i)
    assert _runs(rt) == [(1, 11, 9, [3, 10])]
    # The contexts are gone as the calls ended; only the straggler's is left.
    assert [c for c in rt.core.call_contexts if c.startswith("t/")] == ["t/c0"]
    rt.core.check_invariants()
    rt.fail("t/c0", kind="user_error", retryable=False)
    assert _runs(rt) == [(0, 11, 9, [0, 3, 10])]
    rt.settle()
    conv = rt.converged["t"]
    assert [f.index for f in conv.failed_calls] == [0, 3, 10]
    assert conv.outputs == tuple(_out(i) for i in range(12) if i not in (0, 3, 10))


def test_outputs_dropped_over_the_limit_drop_those_waiting_out_of_order_too() -> None:
    config = DispatcherConfig(max_collected_output_bytes=len(_out(1)) * 3)
    rt = make_runtime(config, usable_contexts=8)
    rt.register("t", specs(8), policy=CONTINUE)
    rt.pump()
    for i in (3, 2, 1):  # waiting behind #0, then the fourth output is one too many
        rt.complete(f"t/c{i}")
    state = rt.core.task_state("t")
    assert state is not None and _runs(rt) == [(1, 3, 3, [])]
    rt.complete("t/c4")
    assert state.outputs_dropped and _runs(rt) == [(1, 4, 0, [])]
    rt.complete("t/c0")
    for i in (7, 5, 6):  # the stop waits for the calls in flight
        rt.complete(f"t/c{i}")
    assert _runs(rt) == [(0, 7, 0, [])]
    rt.settle()
    conv = rt.converged["t"]
    assert conv.failure is not None and conv.failure.kind == "OUTPUT_BYTES_EXCEEDED"
    assert conv.outputs == ()
    assert conv.succeeded_count == 8 and conv.cancelled_count == 0


# --- the end is incremental ---------------------------------------------------------------------


def test_ended_calls_are_forgotten_and_their_outputs_folded_as_they_end() -> None:
    n = 50
    rt = _started(n)
    state = rt.core.task_state("t")
    assert state is not None
    for i in range(n):
        rt.complete(f"t/c{i}")
        # Each end folds its call in: the core holds only the calls still running, and
        # the outputs handed over at the end are already there, in call order.
        assert len(rt.core.call_contexts) == n - i - 1
        assert len(state.roots) == n - i - 1
        (run,) = state.ended_runs
        assert (run.start, run.end) == (0, i + 1)
        assert list(run.outputs) == [_out(k) for k in range(i + 1)]
    built = state.runs_by_start[0].outputs
    assert "t" not in rt.converged
    rt.settle()
    assert rt.converged["t"].outputs == tuple(built)


def _python_calls_of(step: Callable[[], Any]) -> int:
    """Python-level function calls (and C calls) ``step`` makes, counted by a profile hook."""
    count = 0

    def hook(_frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(hook)
    try:
        step()
    finally:
        sys.setprofile(None)
    return count


def _converge_cost(n: int, order: str) -> tuple[int, int]:
    """(calls made ending the last call and converging, outputs handed over)."""
    rt = _started(n)
    if order == "in order":
        ids = [f"t/c{i}" for i in range(n)]
    elif order == "first last":
        ids = [*(f"t/c{i}" for i in range(1, n)), "t/c0"]
    else:  # reversed: every call goes in front of the run after it
        ids = [f"t/c{i}" for i in reversed(range(n))]
    for call_id in ids[:-1]:
        rt.complete(call_id)
    rt.settle()
    last = ids[-1]
    cmd = rt.running.pop(last)
    core = rt.core
    out: list[Any] = []

    def step() -> None:
        output = output_for(cmd.function_id, cmd.args_json)
        out.extend(core.handle_call_completed(last, cmd.attempt_seq, output))
        out.extend(core.flush_dirty_tasks())

    calls = _python_calls_of(step)
    (conv,) = [c for c in out if isinstance(c, ConvergeTaskCalls)]
    return calls, len(conv.outputs)


def test_the_converging_step_does_not_grow_with_the_number_of_calls() -> None:
    # The turn in which the last call ends and the phase converges: the same number of
    # calls for 20 calls as for 2000 (it used to walk every call's context three times),
    # also when that last call is the first (every other call waited behind it).
    for order in ("in order", "first last", "reversed"):
        small, small_outputs = _converge_cost(20, order)
        large, large_outputs = _converge_cost(2000, order)
        assert (small_outputs, large_outputs) == (20, 2000)
        assert small == large, (order, small, large)

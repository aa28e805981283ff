"""select_executor: exact selection (heap or small-pool scan) equals a brute-force full scan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.worker.core import DispatcherConfig, ExecutorSnapshot
from blockx.worker.core.selection import ExecutorTable
from blockx.worker.core.state import (
    DispatchCallContext,
    ExecutorState,
    InstanceState,
    TaskDispatchState,
)
from blockx.worker.core.types import FailurePolicy, PreparedCall, TaskMode

#: The task the selection tests' calls belong to (a compiled core takes only real contexts).
_TASK = TaskDispatchState(
    task_id="t",
    mode=TaskMode.ONE_SHOT,
    instance=InstanceState("i"),
    max_attempts=1,
    base_backoff_ms=0,
    call_budget_ms=0,
    failure_policy=FailurePolicy.CONTINUE,
)


def _context(seq: int) -> DispatchCallContext:
    call = PreparedCall("f", "d", b"[]", f"k{seq}")
    return DispatchCallContext(f"c{seq}", _TASK, call, seq, None, 0, 1, 0)


IDS = [f"exec-{i}" for i in range(6)]


def brute_force(
    table: ExecutorTable, config: DispatcherConfig, now_ms: int
) -> ExecutorState | None:
    """The seed's Filter -> Score as a plain scan, from the raw snapshot values."""

    def runnable(ex: ExecutorState) -> int:
        return max(0, ex.runnable_count - ex.completed_since_snapshot)

    def eligible(ex: ExecutorState) -> bool:
        inflight = ex.local_inflight
        return (
            ex.present
            and not ex.lost
            and ex.healthy
            and ex.usable_contexts - inflight > 0
            and (config.executor_max_inflight == 0 or inflight < config.executor_max_inflight)
            and (config.executor_max_runnable == 0 or runnable(ex) < config.executor_max_runnable)
            and not (
                config.executor_memory_high_watermark
                and ex.memory_bytes >= config.executor_memory_high_watermark
            )
            and not (
                ex.running_call_id is not None
                and ex.running_call_budget_ms > 0
                and ex.running_for_ms
                > max(config.scheduler_stall_timeout_ms or 0, ex.running_call_budget_ms + 1000)
            )
            and ex.reserved_for is None
            and ex.isolating is None
        )

    candidates = [ex for ex in table if eligible(ex)]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda ex: (
            ex.local_inflight,
            runnable(ex),
            ex.local_inflight - ex.usable_contexts,
            ex.executor_id,
        ),
    )


snapshots = st.lists(
    st.builds(
        ExecutorSnapshot,
        executor_id=st.sampled_from(IDS),
        usable_contexts=st.integers(0, 6),
        healthy=st.sampled_from([True, True, True, False]),
        runnable_count=st.integers(0, 6),
        heartbeat_seq=st.integers(0, 3),
        running_call_id=st.sampled_from([None, None, "x"]),
        running_for_ms=st.integers(0, 9000),
        running_call_budget_ms=st.sampled_from([0, 1000, 3000]),
        memory_bytes=st.integers(0, 10),
    ),
    max_size=6,
)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("snapshot"), snapshots),
        st.tuples(st.just("bind_best"), st.none()),
        st.tuples(st.just("bind_any"), st.sampled_from(IDS)),  # sub-calls ignore the Filter
        st.tuples(st.just("release"), st.tuples(st.integers(0, 50), st.booleans())),
        st.tuples(st.just("tick"), st.integers(0, 10)),
        st.tuples(st.just("lose"), st.sampled_from(IDS)),
        st.tuples(st.just("reserve"), st.sampled_from(IDS)),  # drain it for a suspect
        st.tuples(st.just("unreserve"), st.sampled_from(IDS)),
    ),
    max_size=60,
)


@pytest.mark.parametrize("scan_max", [0, 100], ids=["heap", "scan"])
@settings(max_examples=400, deadline=None)
@given(
    ops=operations,
    max_inflight=st.integers(0, 4),
    max_runnable=st.integers(0, 5),
    watermark=st.integers(0, 8),
)
def test_exact_selection_matches_a_full_scan(
    scan_max: int,
    ops: list[tuple[str, object]],
    max_inflight: int,
    max_runnable: int,
    watermark: int,
) -> None:
    """Exact selection -- through the heap, or through the small-pool scan -- is the
    seed's Filter -> Score over the raw values."""
    config = DispatcherConfig(
        executor_max_inflight=max_inflight,
        executor_max_runnable=max_runnable,
        executor_memory_high_watermark=watermark,
        call_deadline_ms=0,
        scheduler_stall_timeout_ms=5001,
    )
    assert config.executor_selection_sample_size == 0
    table = ExecutorTable(config)
    table.scan_max_executors = scan_max
    # Start from a healthy pool so that binds and releases matter from step one.
    table.apply_snapshots(
        ExecutorSnapshot(executor_id=eid, usable_contexts=2 + i % 3, runnable_count=(2 * i) % 5)
        for i, eid in enumerate(IDS)
    )
    held: list[tuple[ExecutorState, DispatchCallContext]] = []
    now = 5_001
    seq = 0
    for op, arg in ops:
        if op == "snapshot":
            table.apply_snapshots(arg)  # type: ignore[arg-type]
        elif op == "bind_best":
            ex = table.select_executor(now)
            if ex is not None:
                seq += 1
                ctx = _context(seq)
                table.take_slot(ex, ctx)
                held.append((ex, ctx))
        elif op == "bind_any":
            ex = table.get(arg)  # type: ignore[arg-type]
            if ex is not None and ex.present and not ex.lost:
                seq += 1
                ctx = _context(seq)
                table.take_slot(ex, ctx)
                held.append((ex, ctx))
        elif op == "release" and held:
            index, completed = arg  # type: ignore[misc]
            ex, ctx = held.pop(index % len(held))
            table.release_slot(ex, ctx, completed=completed)
        elif op == "tick":
            now += arg  # type: ignore[operator]
        elif op == "lose":
            ex = table.get(arg)  # type: ignore[arg-type]
            if ex is not None:
                table.mark_lost(ex)
        elif op == "reserve":
            ex = table.get(arg)  # type: ignore[arg-type]
            if ex is not None and ex.present and not ex.lost:
                seq += 1
                table.reserve_for(ex, _context(seq))
        elif op == "unreserve":
            ex = table.get(arg)  # type: ignore[arg-type]
            if ex is not None and ex.reserved_for is not None:
                table.release_reservation(ex)
        expected = brute_force(table, config, now)
        assert table.select_executor(now) is expected
        if expected is not None:
            assert table.is_eligible(expected, now)
        for ex in table:
            assert ex.local_inflight == len(ex.calls)

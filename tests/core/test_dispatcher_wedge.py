"""Executor Filter -> Score, the scheduler-stall (wedge) filter, and executor loss."""

from __future__ import annotations

import pytest
from dispatcher_harness import START_MS, make_runtime, snapshot, specs

from blockx.worker.core import (
    ArmCallRetry,
    CancelCallCmd,
    DispatcherConfig,
    ExecutorSnapshot,
    UnbindCall,
)
from blockx.worker.core.config import stall_threshold_ms


def _selected(
    config: DispatcherConfig, *snaps: ExecutorSnapshot, now: int = START_MS
) -> str | None:
    rt = make_runtime(config, executors=0)
    rt.set_executors(*snaps)
    ex = rt.core._core.executors.select_executor(now)
    return None if ex is None else ex.executor_id


def _running(call_budget_ms: int, running_for_ms: int, **kw: object) -> ExecutorSnapshot:
    return snapshot(
        "exec-0",
        running_call_id="t/c1",
        running_call_budget_ms=call_budget_ms,
        running_for_ms=running_for_ms,
        **kw,
    )


@pytest.mark.parametrize("sample", [0, 1, 2, 64])  # exact, sampled, and a literal full scan
def test_a_call_running_past_its_own_budget_and_margin_stalls_its_executor(sample: int) -> None:
    config = DispatcherConfig(executor_selection_sample_size=sample)
    fresh = snapshot("exec-1", runnable_count=50)
    # 30 s budget: 34 s of running is healthy work, 35.001 s is past budget + 5 s.
    assert _selected(config, _running(30_000, 35_000), fresh) == "exec-0"
    assert _selected(config, _running(30_000, 35_001), fresh) == "exec-1"
    assert _selected(config, _running(1_000, 6_001), fresh) == "exec-1"
    # An unlimited budget is never judged by the backstop, however long it runs.
    assert _selected(config, _running(0, 10**9), fresh) == "exec-0"
    # Idle is not wedged; neither is a scheduler quiet for long (no extrapolation).
    idle = snapshot("exec-0", running_call_id=None, running_for_ms=10**9)
    assert _selected(config, idle, fresh) == "exec-0"
    quiet = _running(1_000, 10, last_scheduler_active_at_ms=START_MS - 10**6)
    assert _selected(config, quiet, fresh) == "exec-0"


def test_the_stall_threshold_follows_the_calls_own_budget() -> None:
    default = DispatcherConfig()
    assert stall_threshold_ms(default, 30_000) == 35_000
    assert stall_threshold_ms(default, 100) == 5_100
    assert stall_threshold_ms(default, 0) is None  # unlimited: never
    # SCHEDULER_STALL_TIMEOUT_MS overrides, never below the budget + 1 s.
    explicit = DispatcherConfig(scheduler_stall_timeout_ms=3_000)
    assert stall_threshold_ms(explicit, 1_000) == 3_000
    assert stall_threshold_ms(explicit, 10_000) == 11_000
    assert stall_threshold_ms(explicit, 0) is None
    # The worker-wide derived value is kept for the heartbeat timeout's coupling.
    assert DispatcherConfig().stall_timeout_ms == 10_000
    assert DispatcherConfig(call_deadline_ms=20_000).stall_timeout_ms == 25_000


@pytest.mark.parametrize("sample", [0, 1, 64])
def test_filter_skips_unhealthy_full_busy_and_memory_heavy_executors(sample: int) -> None:
    config = DispatcherConfig(
        executor_max_runnable=10,
        executor_max_inflight=4,
        executor_memory_high_watermark=1000,
        executor_selection_sample_size=sample,
    )
    assert _selected(config, snapshot("e", healthy=False)) is None
    assert _selected(config, snapshot("e", usable_contexts=0)) is None
    assert _selected(config, snapshot("e", runnable_count=10)) is None
    assert _selected(config, snapshot("e", runnable_count=9)) == "e"
    assert _selected(config, snapshot("e", memory_bytes=1000)) is None
    assert _selected(config, snapshot("e", memory_bytes=999)) == "e"
    off = DispatcherConfig(executor_memory_high_watermark=0)
    assert _selected(off, snapshot("e", memory_bytes=10**12)) == "e"


def test_local_inflight_limits_and_headroom_count_the_cores_own_binds() -> None:
    rt = make_runtime(DispatcherConfig(executor_max_inflight=3), executors=1, usable_contexts=10)
    rt.register("t1", specs(10))
    assert len(rt.binds(rt.pump())) == 3
    rt2 = make_runtime(DispatcherConfig(executor_max_inflight=0), executors=1, usable_contexts=5)
    rt2.register("t1", specs(10))
    assert len(rt2.binds(rt2.pump())) == 5  # headroom = usable contexts - local inflight


def test_completions_compensate_a_stale_runnable_count() -> None:
    rt = make_runtime(DispatcherConfig(executor_max_runnable=3), executors=0)
    rt.set_executors(snapshot("exec-0", runnable_count=2, heartbeat_seq=5, usable_contexts=2))
    rt.register("t1", specs(10))
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c0", "t1/c1"]  # 2 < 3 runnable
    rt.set_executors(snapshot("exec-0", runnable_count=3, heartbeat_seq=6, usable_contexts=4))
    assert rt.binds(rt.pump()) == []  # the heartbeat says 3 runnable
    rt.complete("t1/c0")  # one of them finished since: 3 - 1 < 3
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c2", "t1/c3", "t1/c4"]
    ex = rt.core.executor_state("exec-0")
    assert ex is not None and ex.completed_since_snapshot == 1 and ex.runnable == 2
    rt.set_executors(snapshot("exec-0", runnable_count=3, heartbeat_seq=6, usable_contexts=4))
    assert ex.completed_since_snapshot == 1  # same heartbeat: compensation kept
    rt.set_executors(snapshot("exec-0", runnable_count=3, heartbeat_seq=7, usable_contexts=4))
    assert ex.completed_since_snapshot == 0  # a new heartbeat already counts it
    rt.fail("t1/c1")  # failures leave the executor too
    assert ex.completed_since_snapshot == 1


def test_score_prefers_few_bound_calls_then_low_runnable_then_headroom_then_id() -> None:
    config = DispatcherConfig()
    assert (
        _selected(config, snapshot("a", runnable_count=5), snapshot("b", runnable_count=4)) == "b"
    )
    assert (
        _selected(config, snapshot("a", usable_contexts=10), snapshot("b", usable_contexts=20))
        == "b"
    )
    assert _selected(config, snapshot("b"), snapshot("a")) == "a"
    rt = make_runtime(config, executors=0)
    rt.set_executors(snapshot("a", usable_contexts=100), snapshot("b", usable_contexts=2))
    rt.register("t1", specs(1))
    rt.pump()  # a gets the first call (more headroom)
    assert rt.core._core.executors.select_executor(rt.now).executor_id == "b"  # type: ignore[union-attr]
    # Bound calls come first: a stale heartbeat's low runnable count does not
    # draw a burst onto one executor.
    rt2 = make_runtime(config, executors=0)
    rt2.set_executors(snapshot("a", runnable_count=0), snapshot("b", runnable_count=3))
    rt2.register("t1", specs(8))
    binds = rt2.binds(rt2.pump())
    assert [b.executor_id for b in binds].count("a") == 4


def test_sampling_scores_only_the_first_n_eligible_from_a_rotating_start() -> None:
    config = DispatcherConfig(executor_selection_sample_size=2)
    rt = make_runtime(config, executors=0)
    runnable = {"e0": 9, "e1": 5, "e2": 1, "e3": 7}
    rt.set_executors(*(snapshot(e, runnable_count=r) for e, r in runnable.items()))
    table = rt.core._core.executors
    picks = [table.select_executor(rt.now).executor_id for _ in range(4)]  # type: ignore[union-attr]
    # windows: (e0,e1) (e1,e2) (e2,e3) (e3,e0)
    assert picks == ["e1", "e2", "e2", "e3"]
    full = DispatcherConfig(executor_selection_sample_size=0)
    assert _selected(full, *(snapshot(e, runnable_count=r) for e, r in runnable.items())) == "e2"


def test_sampling_skips_ineligible_executors() -> None:
    config = DispatcherConfig(executor_selection_sample_size=1)
    assert (
        _selected(
            config, snapshot("e0", healthy=False), snapshot("e1", usable_contexts=0), snapshot("e2")
        )
        == "e2"
    )


def test_executor_loss_dispatches_its_calls_again_after_the_snapshot_refresh() -> None:
    rt = make_runtime(executors=2)
    rt.register("t1", specs(4))
    rt.pump()
    on_lost = sorted(c for c, cmd in rt.running.items() if cmd.executor_id == "exec-0")
    out = rt.lose_executor("exec-0")  # no report: every call a suspect, none charged
    assert not [c for c in out if isinstance(c, UnbindCall | CancelCallCmd)]
    for call_id in on_lost:
        ctx = rt.core.call_context(call_id)
        assert ctx is not None and ctx.error is not None and ctx.error.kind == "transport_lost"
        assert ctx.attempt_count == 0 and ctx.suspect
    assert rt.core.stats.executor_losses == 1
    assert rt.core.executor_state("exec-0") is None  # absent and idle: forgotten
    binds = rt.binds(out + rt.pump())
    assert {b.executor_id for b in binds} <= {"exec-1"}


def test_a_lost_executor_is_unselectable_until_a_snapshot_shows_it_again() -> None:
    rt = make_runtime(executors=1)
    rt.register("t1", specs(1))
    rt.pump()
    rt.running.clear()
    rt.lost.add("exec-0")
    rt.run(rt.core.handle_executor_lost("exec-0", rt.now))  # the snapshot still lists it
    rt.fire_all_retries()
    assert rt.binds(rt.pump()) == []
    rt.set_executors(snapshot("exec-0", heartbeat_seq=9))
    assert [b.executor_id for b in rt.binds(rt.pump())] == ["exec-0"]


def test_losing_an_executor_mid_bind_gives_the_attempt_back() -> None:
    rt = make_runtime(executors=1)
    rt.register("t1", specs(1))
    (bind,) = rt.core.try_dispatch_next(rt.now)  # not yet confirmed
    out = rt.core.handle_executor_lost(bind.executor_id, rt.now)
    (arm,) = out
    assert isinstance(arm, ArmCallRetry) and arm.attempt_count == 0
    assert rt.core.handle_executor_bound(bind.call_id, bind.executor_id, bind.attempt_seq) == []

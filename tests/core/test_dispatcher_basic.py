"""Basic dispatching: registration, release, completion, cache, singleflight, windows."""

from __future__ import annotations

import random

import pytest
from dispatcher_harness import (
    DIGEST,
    make_core,
    make_runtime,
    output_for,
    snapshot,
    spec,
    specs,
)
from tests.helpers.compiled import CORE_COMPILED

from blockx.worker.core import (
    BindCall,
    CallError,
    CallOutcome,
    CallRetryPolicy,
    CallSpec,
    CallState,
    CompleteCallFromCache,
    ConvergeTaskCalls,
    DispatchCallCmd,
    DispatcherConfig,
    DispatcherCore,
    DuplicateTaskError,
    FailurePolicy,
    InvalidCallSpecError,
    InvalidTransitionError,
    MissingFunctionDigestError,
    ReentrantCallError,
    SubcallIdSequence,
    TaskMode,
    UnbindCall,
    call_key,
)
from blockx.worker.core.lifecycle import set_call_terminal
from blockx.worker.core.state import move


def test_one_shot_phase_runs_every_call_and_converges_with_outputs_in_call_order() -> None:
    rt = make_runtime(executors=2)
    calls = specs(5)
    ids = rt.register("t1", calls)
    out = rt.pump()
    binds = rt.binds(out)
    assert [b.call_id for b in binds] == ids
    assert {b.executor_id for b in binds} == {"exec-0", "exec-1"}
    dispatched = rt.of_type(out, DispatchCallCmd)
    first = dispatched[0]
    assert first.call_id == "t1/c0"
    assert first.task_id == "t1"
    assert first.function_id == "f"
    assert first.function_code_digest == DIGEST
    assert first.args_json == b"0"
    assert first.call_key == call_key("f", DIGEST, b"0")
    assert first.parent_call_id is None
    assert first.ancestry == ()
    assert first.budget_ms == 5000
    assert first.attempt_seq == 1
    assert first.batch_idx == 0
    for call_id in reversed(ids):  # completion order must not matter
        out = rt.complete(call_id)
        assert isinstance(out[0], UnbindCall) and out[0].call_id == call_id
    assert rt.converged == {}  # convergence only in flush_dirty_tasks
    rt.settle()
    conv = rt.converged["t1"]
    assert conv.success and conv.failure is None and conv.mode is TaskMode.ONE_SHOT
    assert conv.outputs == tuple(output_for("f", s.args_json) for s in calls)
    assert (conv.total_count, conv.succeeded_count, conv.failed_count) == (5, 5, 0)
    assert rt.core.task_ids() == [] and rt.core.call_context("t1/c0") is None


def test_empty_phase_converges_at_the_next_flush() -> None:
    rt = make_runtime()
    rt.register("empty", [])
    assert rt.converged == {}
    rt.settle()
    assert rt.converged["empty"].success and rt.converged["empty"].outputs == ()


def test_binds_spread_by_score_and_stop_when_executors_are_full() -> None:
    rt = make_runtime(executors=2, usable_contexts=2)
    rt.register("t1", specs(6))
    binds = rt.binds(rt.pump())
    assert [b.executor_id for b in binds] == ["exec-0", "exec-1", "exec-0", "exec-1"]
    assert rt.core.try_dispatch_next(rt.now) == []  # no headroom left
    rt.complete("t1/c0")
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c4"]


def test_task_max_inflight_calls_is_a_window_per_task() -> None:
    rt = make_runtime(DispatcherConfig(task_max_inflight_calls=2))
    rt.register("t1", specs(5))
    rt.register("t2", specs(1))
    binds = rt.binds(rt.pump())
    assert sorted(b.call_id for b in binds) == ["t1/c0", "t1/c1", "t2/c0"]
    rt.complete("t1/c1")
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c2"]


def test_tasks_are_served_round_robin_without_instance_fairness() -> None:
    rt = make_runtime()
    rt.register("a", specs(3))
    rt.register("b", specs(3))
    order = [b.call_id for b in rt.binds(rt.pump())]
    assert order == ["a/c0", "b/c0", "a/c1", "b/c1", "a/c2", "b/c2"]


def test_call_cache_hit_completes_without_running() -> None:
    rt = make_runtime(DispatcherConfig(task_max_inflight_calls=1))
    rt.register("t1", [spec("f", "7"), spec("f", "7")])
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c0"]
    rt.complete("t1/c0")
    out = rt.pump()
    hits = rt.of_type(out, CompleteCallFromCache)
    assert [(h.call_id, h.source) for h in hits] == [("t1/c1", "cache")]
    assert hits[0].output_json == output_for("f", b"7") and hits[0].parent_call_id is None
    assert rt.binds(out) == []
    conv = rt.converged["t1"]
    assert conv.outputs == (output_for("f", b"7"),) * 2 and conv.cache_hit_count == 1


def test_call_cache_keeps_the_newest_entries_within_its_bound() -> None:
    rt = make_runtime(DispatcherConfig(task_max_inflight_calls=1, call_cache_max_entries=1))
    rt.register("t1", [spec("f", "1"), spec("f", "2"), spec("f", "1")])
    for call_id in ("t1/c0", "t1/c1"):
        rt.pump()
        rt.complete(call_id)
    out = rt.pump()
    assert [b.call_id for b in rt.binds(out)] == ["t1/c2"]  # "1" was evicted by "2"


def test_the_call_cache_grows_to_its_limit_once_the_task_repeats_a_call() -> None:
    # Distinct calls keep the first bound; a call joining an equal one in flight (or a
    # cache hit) is the sign that the task repeats calls, and the full limit applies.
    rt = make_runtime()
    rt.register("t1", [spec("f", "1"), spec("f", "2")])
    rt.register("t2", [spec("f", "1"), spec("f", "1")])
    rt.pump()
    t1, t2 = rt.core.task_state("t1"), rt.core.task_state("t2")
    assert t1 is not None and t2 is not None
    assert not t1.call_cache.grown and t2.call_cache.grown  # t2/c1 joined t2/c0


def test_call_cache_can_be_disabled() -> None:
    rt = make_runtime(DispatcherConfig(task_max_inflight_calls=1, call_cache_max_entries=0))
    rt.register("t1", [spec("f", "7"), spec("f", "7")])
    rt.pump()
    rt.complete("t1/c0")
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c1"]


def test_singleflight_waiters_get_the_leaders_output() -> None:
    rt = make_runtime()
    rt.register("t1", [spec("f", "1"), spec("f", "1"), spec("f", "1"), spec("f", "2")])
    binds = rt.binds(rt.pump())
    assert [b.call_id for b in binds] == ["t1/c0", "t1/c3"]  # c1, c2 wait behind c0
    assert rt.core.call_context("t1/c1").sf_waiting  # type: ignore[union-attr]
    out = rt.complete("t1/c0")
    hits = rt.of_type(out, CompleteCallFromCache)
    assert [(h.call_id, h.source) for h in hits] == [
        ("t1/c1", "singleflight"),
        ("t1/c2", "singleflight"),
    ]
    rt.complete("t1/c3")
    rt.settle()
    conv = rt.converged["t1"]
    assert len(conv.outputs) == 4 and conv.singleflight_hit_count == 2


def test_singleflight_waiters_fail_with_the_leaders_final_error() -> None:
    rt = make_runtime()
    policy = CallRetryPolicy(failure=FailurePolicy.CONTINUE)
    rt.register("t1", [spec("f", "1"), spec("f", "1"), spec("f", "2")], policy=policy)
    rt.pump()
    out = rt.fail("t1/c0", kind="user_error", retryable=False, message="bad input")
    hit = rt.of_type(out, CompleteCallFromCache)[0]
    assert hit.call_id == "t1/c1" and hit.output_json is None
    assert hit.error is not None and hit.error.kind == "user_error"
    rt.complete("t1/c2")
    rt.settle()
    conv = rt.converged["t1"]
    assert conv.success  # CONTINUE: failures are reported, the task carries on
    assert [f.call_id for f in conv.failed_calls] == ["t1/c0", "t1/c1"]
    assert conv.outputs == (output_for("f", b"2"),)


def test_a_retrying_leader_keeps_its_waiters() -> None:
    rt = make_runtime()
    rt.register("t1", [spec("f", "1"), spec("f", "1")])
    rt.pump()
    rt.fail("t1/c0", retryable=True)
    rt.fire_retry("t1/c0")
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c0"]
    out = rt.complete("t1/c0")
    assert [h.call_id for h in rt.of_type(out, CompleteCallFromCache)] == ["t1/c1"]


def test_root_budget_comes_from_config_or_task_policy() -> None:
    rt = make_runtime(DispatcherConfig(call_deadline_ms=0))
    rt.register("unlimited", specs(1))
    rt.register("policy", specs(1), policy=CallRetryPolicy(call_budget_ms=250))
    budgets = {c.task_id: c.budget_ms for c in rt.of_type(rt.pump(), DispatchCallCmd)}
    assert budgets == {"unlimited": 0, "policy": 250}


def test_prepare_is_free_of_side_effects() -> None:
    core = make_core()
    calls = specs(3)
    prepared = core.prepare_call_phase_with_digests("t1", calls, {"f": DIGEST}, instance="x")
    core.prepare_call_phase_with_digests("t1", calls, {"f": DIGEST})
    assert core.task_ids() == [] and not core.has_dirty_tasks
    assert [p.call_key for p in prepared.calls] == [
        call_key("f", DIGEST, s.args_json) for s in calls
    ]
    core.commit_call_phase(prepared)
    assert core.task_ids() == ["t1"]
    with pytest.raises(DuplicateTaskError):
        core.commit_call_phase(prepared)


def test_prepare_rejects_missing_digests_and_non_bytes_args() -> None:
    core = make_core()
    with pytest.raises(MissingFunctionDigestError, match="'g'"):
        core.prepare_call_phase_with_digests("t1", [spec("g")], {"f": DIGEST})
    if CORE_COMPILED:  # a compiled CallSpec refuses str arguments as it is built
        with pytest.raises(TypeError, match="bytes"):
            CallSpec("f", "not bytes")  # type: ignore[arg-type]
    else:
        bad = spec("f")
        object.__setattr__(bad, "args_json", "not bytes")
        with pytest.raises(InvalidCallSpecError, match="bytes"):
            core.prepare_call_phase_with_digests("t1", [bad], {"f": DIGEST})
    with pytest.raises(InvalidCallSpecError):
        core.prepare_call_phase_with_digests("", [], {})


def test_call_keys_are_stable_and_distinguish_their_parts() -> None:
    assert call_key("f", "d", b"[1]") == call_key("f", "d", b"[1]")
    assert len({call_key("ab", "c", b""), call_key("a", "bc", b""), call_key("a", "b", b"c")}) == 3
    assert len(call_key("f", "d", b"1")) == 32


def test_task_cancellation_cancels_in_flight_calls_and_converges() -> None:
    rt = make_runtime(usable_contexts=1)
    rt.register("t1", specs(4))
    rt.pump()
    out = rt.run(rt.core.handle_task_cancelled("t1", "deadline exceeded"))
    assert sorted(c.call_id for c in rt.cancelled) == ["t1/c0", "t1/c1"]
    assert all(c.reason == "task_cancelled" for c in rt.cancelled)
    assert not rt.of_type(out, ConvergeTaskCalls)
    rt.settle()
    conv = rt.converged["t1"]
    assert not conv.success and conv.failure is not None and conv.failure.kind == "CANCELLED"
    assert conv.cancelled_count == 4
    assert rt.core.handle_task_cancelled("t1", "again") == []


def test_state_table_refuses_impossible_transitions_without_changing_state() -> None:
    rt = make_runtime()
    rt.register("t1", specs(1))
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.state is CallState.READY
    with pytest.raises(InvalidTransitionError, match="READY -> WAITING"):
        move(ctx, CallState.WAITING)
    assert ctx.state is CallState.READY


def test_set_call_terminal_counts_an_end_exactly_once() -> None:
    rt = make_runtime()
    rt.register("t1", specs(2))
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None
    internal = rt.core._core
    assert set_call_terminal(internal, ctx, CallOutcome.CANCELLED) is True
    task = rt.core.task_state("t1")
    assert task is not None and (task.terminal_roots, task.cancelled) == (1, 1)
    assert set_call_terminal(internal, ctx, CallOutcome.SUCCEEDED, output=b"1") is False
    assert (task.terminal_roots, task.cancelled, task.succeeded) == (1, 1, 0)
    assert ctx.outcome is CallOutcome.CANCELLED


def test_reentrant_entry_raises_a_typed_error() -> None:
    class CallsBack(random.Random):
        core: DispatcherCore | None = None

        def random(self) -> float:
            assert self.core is not None
            self.core.try_dispatch_next(0)  # re-enters from inside a handler
            return 0.0

    rng = CallsBack(1)
    core = DispatcherCore(rng=rng, subcall_ids=SubcallIdSequence())
    rng.core = core
    core.handle_executor_snapshot_updated([snapshot("exec-0")])
    core.commit_call_phase(core.prepare_call_phase_with_digests("t1", specs(1), {"f": DIGEST}))
    bind = core.try_dispatch_next(1)[0]
    assert isinstance(bind, BindCall)
    core.handle_executor_bound(bind.call_id, bind.executor_id, bind.attempt_seq)
    error = CallError(kind="transport_lost", message="x", retryable=True)
    with pytest.raises(
        ReentrantCallError, match="try_dispatch_next entered while handle_attempt_failure"
    ):
        core.handle_attempt_failure(bind.call_id, 1, error, 3)
    core.flush_dirty_tasks()  # the guard was released


def test_reprs_show_call_state_and_attempt() -> None:
    rt = make_runtime()
    rt.register("t1", specs(1))
    rt.pump()
    ctx = rt.core.call_context("t1/c0")
    assert repr(ctx) == "<call t1/c0 RUNNING on exec-0 attempt=1/3 seq=1>"
    assert "t1" in repr(rt.core.task_state("t1")) and "inflight=1" in repr(rt.core.task_state("t1"))
    assert "exec-0" in repr(rt.core.executor_state("exec-0"))
    assert "tasks=1" in repr(rt.core)
    assert "binds=1" in repr(rt.core.stats)


def test_cancelling_a_call_whose_bind_is_unconfirmed_unbinds_it() -> None:
    rt = make_runtime()
    rt.defer_binds = True
    rt.register("t1", specs(1))
    rt.pump()
    (bind,) = rt.pending_binds
    out = rt.run(rt.core.handle_task_cancelled("t1", "user"))
    assert [type(c).__name__ for c in out] == ["UnbindCall"]  # no ExecuteCall was ever sent
    assert rt.answer_bind(bind) == []  # the late confirmation is stale

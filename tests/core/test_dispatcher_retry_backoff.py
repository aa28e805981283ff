"""Retries and backoff: handle_attempt_failure, bind failures, fast-fail, policies."""

from __future__ import annotations

import random

from dispatcher_harness import make_runtime, output_for, specs

from blockx.worker.core import (
    ArmCallRetry,
    CallError,
    CallRetryPolicy,
    CallState,
    DispatchCallCmd,
    DispatcherConfig,
    FailurePolicy,
    UnbindCall,
)
from blockx.worker.core.retry import compute_backoff, should_retry


class FixedJitter:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_backoff_doubles_per_attempt_with_up_to_five_percent_jitter() -> None:
    none, full = FixedJitter(0.0), FixedJitter(0.999999)
    assert [compute_backoff(10, n, none, 60_000) for n in (1, 2, 3, 4)] == [10, 20, 40, 80]
    assert [compute_backoff(10, n, full, 60_000) for n in (1, 2, 3)] == [10, 20, 41]
    assert compute_backoff(1000, 1, full, 60_000) == 1049
    assert compute_backoff(10, 40, none, 60_000) == 60_000  # capped
    assert compute_backoff(0, 3, full, 60_000) == 0
    rng = random.Random(3)
    delays = [compute_backoff(100, 1, rng, 60_000) for _ in range(200)]
    assert min(delays) >= 100 and max(delays) <= 105 and len(set(delays)) > 1


def test_retry_decision() -> None:
    retryable = CallError(kind="transport_lost", message="", retryable=True)
    final = CallError(kind="user_error", message="", retryable=False)
    assert should_retry(retryable, 1, 3, False)
    assert not should_retry(retryable, 3, 3, False)
    assert not should_retry(retryable, 1, 3, True)
    assert not should_retry(final, 1, 3, False)


def test_retryable_failure_rearms_the_same_call_with_backoff() -> None:
    rt = make_runtime(DispatcherConfig(base_backoff_ms=100))
    rt.register("t1", specs(1))
    rt.pump()
    out = rt.fail("t1/c0", kind="transport_lost", retryable=True)
    unbind, arm = out
    assert isinstance(unbind, UnbindCall) and unbind.call_id == "t1/c0"
    assert isinstance(arm, ArmCallRetry)
    assert arm.call_id == "t1/c0" and arm.attempt_count == 1
    assert 100 <= arm.delay_ms <= 105 and arm.due_at_ms == rt.now + arm.delay_ms
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.state is CallState.READY and ctx.retry_armed
    assert ctx.error is not None and ctx.error.kind == "transport_lost"
    assert rt.binds(rt.pump()) == []  # backing off: not in the queue
    rt.fire_retry("t1/c0")
    out = rt.pump()
    dispatch = rt.of_type(out, DispatchCallCmd)[0]
    assert dispatch.call_id == "t1/c0" and dispatch.attempt_seq == 2
    assert ctx.attempt_count == 2
    out = rt.fail("t1/c0", kind="transport_lost", retryable=True)
    assert 200 <= rt.of_type(out, ArmCallRetry)[0].delay_ms <= 210
    rt.fire_retry("t1/c0")
    rt.pump()
    rt.complete("t1/c0")
    rt.settle()
    conv = rt.converged["t1"]
    assert conv.success and conv.retry_count == 2 and conv.outputs == (output_for("f", b"0"),)


def test_retries_go_to_the_head_of_the_queue() -> None:
    rt = make_runtime(executors=1, usable_contexts=1)
    rt.register("t1", specs(3))
    rt.pump()
    rt.fail("t1/c0", retryable=True)
    rt.fire_retry("t1/c0")
    assert [b.call_id for b in rt.binds(rt.pump())] == ["t1/c0"]


def test_the_tasks_backoff_base_wins_over_the_configs() -> None:
    rt = make_runtime(DispatcherConfig(base_backoff_ms=100, max_backoff_ms=100_000))
    rt.register("t1", specs(1), policy=CallRetryPolicy(base_backoff_ms=1000))
    rt.register("t2", specs(1), policy=CallRetryPolicy(base_backoff_ms=0))
    rt.pump()
    assert 1000 <= rt.of_type(rt.fail("t1/c0"), ArmCallRetry)[0].delay_ms <= 1050
    assert rt.of_type(rt.fail("t2/c0"), ArmCallRetry)[0].delay_ms == 0


def test_attempts_are_limited_by_the_policy_or_the_config_default() -> None:
    rt = make_runtime(DispatcherConfig(default_max_attempts=2))
    rt.register("t1", specs(1), policy=CallRetryPolicy(failure=FailurePolicy.CONTINUE))
    rt.pump()
    rt.fail("t1/c0")
    rt.fire_retry("t1/c0")
    rt.pump()
    out = rt.fail("t1/c0", message="second time")
    assert not rt.of_type(out, ArmCallRetry)
    rt.settle()
    (failed,) = rt.converged["t1"].failed_calls
    assert failed.attempts == 2 and failed.error.message == "second time"
    rt.register("t2", specs(1), policy=CallRetryPolicy(max_attempts=1))
    rt.pump()
    assert not rt.of_type(rt.fail("t2/c0"), ArmCallRetry)


def test_bind_failure_rolls_the_attempt_back() -> None:
    rt = make_runtime()
    rt.bind_fails = lambda cmd: True
    rt.register("t1", specs(1))
    out = rt.pump()
    arm = rt.of_type(out, ArmCallRetry)[0]
    assert arm.delay_ms == 0 and arm.due_at_ms == rt.now and arm.attempt_count == 0
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.attempt_count == 0 and ctx.attempt_seq == 1
    assert rt.core.stats.bind_failures == 1
    rt.bind_fails = lambda cmd: False
    rt.fire_retry("t1/c0")
    dispatch = rt.of_type(rt.pump(), DispatchCallCmd)[0]
    assert dispatch.attempt_seq == 2 and ctx.attempt_count == 1


def test_bind_failures_never_exhaust_attempts() -> None:
    rt = make_runtime(DispatcherConfig(default_max_attempts=1))
    rt.register("t1", specs(1))
    rt.bind_fails = lambda cmd: True
    for _ in range(5):
        rt.pump()
        rt.fire_retry("t1/c0")
    rt.bind_fails = lambda cmd: False
    rt.pump()
    rt.complete("t1/c0")
    rt.settle()
    assert rt.converged["t1"].success


def test_fast_fail_waits_for_in_flight_calls_then_cancels_the_rest() -> None:
    rt = make_runtime(executors=1, usable_contexts=2)
    rt.register("t1", specs(5))
    rt.pump()
    rt.fail("t1/c0", kind="user_error", retryable=False, message="ZeroDivisionError")
    assert rt.binds(rt.pump()) == []
    assert "t1" not in rt.converged
    # Nothing is cancelled while a call is still in flight.
    task = rt.core.task_state("t1")
    assert task is not None and task.cancelled == 0
    assert rt.core.call_context("t1/c2").state is CallState.READY  # type: ignore[union-attr]
    out = rt.fail("t1/c1", kind="transport_lost", retryable=True)  # stopping: no retry
    assert not rt.of_type(out, ArmCallRetry)
    rt.settle()
    conv = rt.converged["t1"]
    assert not conv.success and conv.failure is not None
    assert conv.failure.kind == "CALL_FAILED" and conv.failure.call_id == "t1/c0"
    assert conv.failure.error is not None and conv.failure.error.message == "ZeroDivisionError"
    assert (conv.succeeded_count, conv.failed_count, conv.cancelled_count) == (0, 2, 3)
    assert [f.call_id for f in conv.failed_calls] == ["t1/c0", "t1/c1"]


def test_fast_fail_cancels_calls_backing_off() -> None:
    rt = make_runtime()
    rt.register("t1", specs(2))
    rt.pump()
    rt.fail("t1/c0", retryable=True)  # backing off
    rt.fail("t1/c1", retryable=False)
    rt.settle()
    assert rt.converged["t1"].cancelled_count == 1
    assert rt.core.handle_retry_ready("t1/c0") == []  # the timer fires late: stale


def test_continue_policy_keeps_dispatching_after_a_failure() -> None:
    rt = make_runtime(executors=1, usable_contexts=1)
    rt.register("t1", specs(3), policy=CallRetryPolicy(failure=FailurePolicy.CONTINUE))
    rt.pump()
    rt.fail("t1/c0", retryable=False)
    for call_id in ("t1/c1", "t1/c2"):
        rt.pump()
        rt.complete(call_id)
    rt.settle()
    conv = rt.converged["t1"]
    assert conv.success and conv.failed_count == 1 and len(conv.outputs) == 2


def test_retry_ready_for_a_stopping_task_leaves_the_call_to_the_drain() -> None:
    rt = make_runtime(executors=1, usable_contexts=2)
    rt.register("t1", specs(3))
    rt.pump()
    rt.fail("t1/c0", retryable=True)
    rt.fail("t1/c1", retryable=False)  # stops the task; c0 is backing off
    rt.fire_retry("t1/c0")
    assert rt.binds(rt.pump()) == []
    assert rt.converged["t1"].cancelled_count == 2


def test_a_refused_bind_of_a_stopping_task_is_not_re_armed_and_the_call_is_cancelled() -> None:
    # Seed: once the task stops dispatching, a bind that fails is not issued again.
    rt = make_runtime(executors=1, defer_binds=True)
    rt.register("t1", specs(2))  # fast-fail (the default)
    rt.pump()
    first, second = rt.pending_binds
    rt.pending_binds.clear()
    rt.answer_bind(first)  # dispatched
    rt.fail(first.call_id, kind="user_error", retryable=False)  # the task stops
    out = rt.answer_bind(second, fail=True)  # ... while the second bind is still out
    out += rt.pump()
    assert second.call_id not in rt.armed
    assert rt.of_type(out, ArmCallRetry) == [] and rt.binds(out) == []
    conv = rt.converged["t1"]
    assert not conv.success and conv.failure is not None
    assert conv.failure.kind == "CALL_FAILED" and conv.failure.call_id == first.call_id
    assert conv.cancelled_count == 1 and conv.failed_count == 1

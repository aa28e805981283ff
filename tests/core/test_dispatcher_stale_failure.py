"""Stale events: late, duplicate or foreign reports are dropped and counted."""

from __future__ import annotations

from dispatcher_harness import make_runtime, specs

from blockx.worker.core import CallError, CallState

LOST = CallError(kind="transport_lost", message="late", retryable=True)


def _setup():  # type: ignore[no-untyped-def]
    rt = make_runtime()
    rt.register("t1", specs(2))
    rt.pump()
    return rt


def test_failure_for_a_call_backing_off_is_dropped() -> None:
    rt = _setup()
    rt.fail("t1/c0", retryable=True)
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.state is CallState.READY and ctx.attempt_count == 1
    assert rt.core.handle_attempt_failure("t1/c0", 1, LOST, rt.now) == []
    assert rt.core.stats.stale_events == 1 and ctx.attempt_count == 1 and ctx.retry_armed


def test_failure_of_an_older_attempt_is_dropped() -> None:
    rt = _setup()
    rt.fail("t1/c0", retryable=True)
    rt.fire_retry("t1/c0")
    rt.pump()
    assert rt.running["t1/c0"].attempt_seq == 2
    assert rt.core.handle_attempt_failure("t1/c0", 1, LOST, rt.now) == []
    assert rt.core.handle_call_completed("t1/c0", 1, b"{}") == []
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.state is CallState.RUNNING and ctx.attempt_seq == 2


def test_reports_for_done_calls_are_dropped_and_counted_once() -> None:
    rt = _setup()
    rt.complete("t1/c0")
    task = rt.core.task_state("t1")
    assert task is not None and task.terminal_roots == 1
    assert rt.core.handle_call_completed("t1/c0", 1, b"{}") == []
    assert rt.core.handle_attempt_failure("t1/c0", 1, LOST, rt.now) == []
    assert rt.core.handle_call_waiting("t1/c0", 1) == []
    assert rt.core.handle_call_resumed("t1/c0", 1) == []
    assert task.terminal_roots == 1 and task.succeeded == 1
    assert rt.core.stats.stale_events == 4


def test_events_for_unknown_calls_are_dropped() -> None:
    rt = _setup()
    core = rt.core
    assert core.handle_call_completed("nope", 1, b"{}") == []
    assert core.handle_attempt_failure("nope", 1, LOST, rt.now) == []
    assert core.handle_retry_ready("nope") == []
    assert core.handle_executor_bound("nope", "exec-0", 1) == []
    assert core.handle_bind_failed("nope", "exec-0", 1, rt.now) == []
    assert core.handle_executor_lost("exec-unknown", rt.now) == []
    assert core.stats.stale_events == 5


def test_late_events_after_convergence_are_dropped() -> None:
    rt = _setup()
    rt.complete("t1/c0")
    rt.complete("t1/c1")
    rt.settle()
    assert "t1" in rt.converged
    assert rt.core.handle_call_completed("t1/c1", 1, b"{}") == []
    assert rt.core.flush_dirty_tasks() == []


def test_duplicate_bind_confirmations_and_retry_timers_are_dropped() -> None:
    rt = _setup()
    assert rt.core.handle_executor_bound("t1/c0", rt.running["t1/c0"].executor_id, 1) == []
    assert rt.core.handle_bind_failed("t1/c0", rt.running["t1/c0"].executor_id, 1, rt.now) == []
    rt.fail("t1/c0", retryable=True)
    assert rt.core.handle_retry_ready("t1/c0") == []
    assert rt.core.handle_retry_ready("t1/c0") == []  # the second fire is stale
    assert rt.core.stats.stale_events == 3


def test_waiting_and_resume_follow_the_live_attempt_only() -> None:
    rt = _setup()
    seq = rt.running["t1/c0"].attempt_seq
    rt.core.handle_call_waiting("t1/c0", seq + 1)
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.state is CallState.RUNNING
    rt.core.handle_call_waiting("t1/c0", seq)
    assert ctx.state is CallState.WAITING
    rt.core.handle_call_waiting("t1/c0", seq)  # already waiting: no change, no error
    rt.core.handle_call_resumed("t1/c0", seq)
    assert ctx.state is CallState.RUNNING


def test_a_call_that_completes_while_waiting_is_done() -> None:
    rt = _setup()
    seq = rt.running["t1/c0"].attempt_seq
    rt.core.handle_call_waiting("t1/c0", seq)
    ctx = rt.core.call_context("t1/c0")
    rt.complete("t1/c0")  # the completion overtook the resume notification
    assert ctx is not None and ctx.state is CallState.DONE
    assert rt.core.call_context("t1/c0") is None  # an ended one-shot root is forgotten
    assert rt.core.handle_call_resumed("t1/c0", seq) == []


def test_reports_for_an_attempt_whose_bind_is_unconfirmed_are_stale() -> None:
    rt = make_runtime()
    rt.defer_binds = True
    rt.register("t1", specs(1))
    rt.pump()
    (bind,) = rt.pending_binds
    assert rt.core.handle_call_completed("t1/c0", bind.attempt_seq, b"{}") == []
    assert rt.core.handle_attempt_failure("t1/c0", bind.attempt_seq, LOST, rt.now) == []
    assert rt.core.handle_call_waiting("t1/c0", bind.attempt_seq) == []
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.state is CallState.RUNNING and not ctx.bound
    assert rt.core.stats.stale_events == 3
    rt.answer_bind(bind)
    assert ctx.bound and "t1/c0" in rt.running

"""Sub-calls: binding next to the parent, refusals, parking, caches, subtree cancel."""

from __future__ import annotations

import re

from dispatcher_harness import DIGEST, make_core, make_runtime, output_for, snapshot, spec, specs

from blockx.worker.core import (
    ArmCallRetry,
    BindCall,
    CallState,
    CancelCallCmd,
    CompleteCallFromCache,
    DispatchCallCmd,
    DispatcherConfig,
    ResumeParentCall,
    SubcallIdSequence,
    SubcallRequest,
    call_key,
)


def _running_root(rt, args: str = "1"):  # type: ignore[no-untyped-def]
    rt.register("t1", [spec("root", args)])
    rt.pump()
    return rt.running["t1/c0"]


def test_subcall_runs_on_the_parents_executor_and_resumes_the_parent() -> None:
    rt = make_runtime(executors=3)
    parent = _running_root(rt)
    out = rt.request_subcall("t1/c0", "child", "[2]", granted_budget_ms=1234)
    bind = rt.binds(out)[0]
    assert re.fullmatch(r"t1/c0/sub-\d+", bind.call_id)
    assert bind.executor_id == parent.executor_id and bind.parent_call_id == "t1/c0"
    dispatch = rt.of_type(out, DispatchCallCmd)[0]
    assert dispatch.parent_call_id == "t1/c0"
    assert dispatch.ancestry == (call_key("root", DIGEST, b"1"),)
    assert dispatch.budget_ms == 1234 and dispatch.attempt_seq == 1
    assert rt.core.call_context("t1/c0").state is CallState.WAITING  # type: ignore[union-attr]
    out = rt.complete(bind.call_id, budget_used_ms=40)
    resume = rt.of_type(out, ResumeParentCall)[0]
    assert resume.parent_call_id == "t1/c0" and resume.call_id == bind.call_id
    assert resume.executor_id == parent.executor_id and resume.request_id == "req-test-1"
    assert resume.output_json == output_for("child", b"[2]") and resume.error is None
    assert resume.budget_used_ms == 40
    assert rt.core.call_context("t1/c0").state is CallState.RUNNING  # type: ignore[union-attr]
    assert rt.core.call_context(bind.call_id) is None  # a sub-call is forgotten at its end
    rt.complete("t1/c0")
    rt.settle()
    conv = rt.converged["t1"]
    assert conv.total_count == 1 and conv.outputs == (output_for("root", b"1"),)


def test_subcall_ids_come_from_one_counter_per_process() -> None:
    shared = SubcallIdSequence(start=100)
    ids = []
    for _ in range(2):
        rt = make_runtime()
        rt.core = make_core(subcall_ids=shared)
        rt.set_executors(snapshot("exec-0"))
        _running_root(rt)
        ids.append(rt.binds(rt.request_subcall("t1/c0"))[0].call_id)
    assert ids == ["t1/c0/sub-101", "t1/c0/sub-102"]


def test_a_failed_subcall_is_not_retried_and_reports_its_error() -> None:
    rt = make_runtime()
    _running_root(rt)
    child = rt.binds(rt.request_subcall("t1/c0"))[0].call_id
    out = rt.fail(child, kind="io_error", retryable=True, message="backend down")
    assert not rt.of_type(out, ArmCallRetry)
    resume = rt.of_type(out, ResumeParentCall)[0]
    assert resume.error is not None and resume.error.kind == "io_error" and resume.error.retryable
    assert resume.output_json is None


def test_depth_limit_refuses_the_subcall() -> None:
    rt = make_runtime(DispatcherConfig(max_subcall_depth=3))
    _running_root(rt)
    caller = "t1/c0"
    for depth in (1, 2):
        caller = rt.binds(rt.request_subcall(caller, "child", str(depth)))[0].call_id
    out = rt.request_subcall(caller, "child", "99")
    (resume,) = out
    assert isinstance(resume, ResumeParentCall)
    assert resume.parent_call_id == caller and resume.call_id is None
    assert resume.error is not None and resume.error.kind == "subcall_depth_exceeded"
    assert not resume.error.retryable
    assert rt.core.stats.subcalls_rejected == 1


def test_cycle_detection_compares_against_the_ancestry() -> None:
    rt = make_runtime()
    _running_root(rt, args="1")
    child = rt.binds(rt.request_subcall("t1/c0", "child", "2"))[0].call_id
    out = rt.request_subcall(child, "root", "1")  # the root again, two levels down
    (resume,) = out
    assert isinstance(resume, ResumeParentCall)
    assert resume.error is not None and resume.error.kind == "subcall_cycle_detected"
    out = rt.request_subcall(child, "child", "2")  # itself
    assert rt.of_type(out, ResumeParentCall)[0].error.kind == "subcall_cycle_detected"  # type: ignore[union-attr]


def test_requests_from_another_executor_or_attempt_are_stale() -> None:
    rt = make_runtime()
    parent = _running_root(rt)
    other = "exec-1" if parent.executor_id == "exec-0" else "exec-0"
    assert rt.request_subcall("t1/c0", executor_id=other) == []
    assert rt.request_subcall("t1/c0", attempt_seq=2) == []
    assert rt.core.stats.stale_events == 2 and rt.core.stats.subcalls_created == 0
    request = SubcallRequest(
        parent_call_id="nope",
        parent_attempt_seq=1,
        executor_id="exec-0",
        request_id="r",
        function_id="f",
        function_code_digest=DIGEST,
        args_json=b"1",
        granted_budget_ms=0,
    )
    assert rt.core.handle_subcall_request(request) == []


def test_subcall_parks_while_the_parents_executor_is_unhealthy() -> None:
    rt = make_runtime(executors=1)
    _running_root(rt)
    rt.set_executors(snapshot("exec-0", healthy=False, heartbeat_seq=2))
    assert rt.request_subcall("t1/c0") == []
    task = rt.core.task_state("t1")
    assert task is not None and len(task.pending_bind_subcalls) == 1
    out = rt.set_executors(snapshot("exec-0", heartbeat_seq=3))
    bind = rt.binds(out)[0]
    assert bind.parent_call_id == "t1/c0" and not task.pending_bind_subcalls


def test_subcall_bind_failure_parks_it_again_without_spending_its_attempt() -> None:
    rt = make_runtime(executors=1)
    _running_root(rt)
    rt.bind_fails = lambda cmd: cmd.parent_call_id is not None
    rt.request_subcall("t1/c0")
    task = rt.core.task_state("t1")
    assert task is not None
    (child,) = task.pending_bind_subcalls.values()
    assert child.attempt_count == 0 and child.attempt_seq == 1 and rt.core.stats.bind_failures == 1
    rt.bind_fails = lambda cmd: False
    out = rt.set_executors(snapshot("exec-0", heartbeat_seq=2))
    dispatch = rt.of_type(out, DispatchCallCmd)[0]
    assert dispatch.call_id == child.call_id and dispatch.attempt_seq == 2


def test_cache_hit_resumes_the_parent_directly() -> None:
    rt = make_runtime(DispatcherConfig(task_max_inflight_calls=1))
    rt.register("t1", [spec("leaf", "5"), spec("root", "1")])
    rt.pump()
    rt.complete("t1/c0")
    rt.pump()
    out = rt.request_subcall("t1/c1", "leaf", "5")
    hit = rt.of_type(out, CompleteCallFromCache)[0]
    resume = rt.of_type(out, ResumeParentCall)[0]
    assert hit.source == "cache" and hit.parent_call_id == "t1/c1"
    assert resume.call_id == hit.call_id and resume.output_json == output_for("leaf", b"5")
    assert resume.budget_used_ms == 0 and rt.binds(out) == []
    assert rt.core.call_context(hit.call_id) is None


def test_singleflight_subcall_waits_for_the_leader_and_then_resumes_its_parent() -> None:
    rt = make_runtime()
    rt.register("t1", [spec("root", "1"), spec("root", "2")])
    rt.pump()
    leader = rt.binds(rt.request_subcall("t1/c0", "leaf", "5"))[0].call_id
    assert rt.request_subcall("t1/c1", "leaf", "5") == []  # waits behind the leader
    out = rt.complete(leader)
    resumes = {r.parent_call_id: r for r in rt.of_type(out, ResumeParentCall)}
    assert set(resumes) == {"t1/c0", "t1/c1"}
    assert resumes["t1/c1"].output_json == output_for("leaf", b"5")
    assert [h.source for h in rt.of_type(out, CompleteCallFromCache)] == ["singleflight"]


def test_a_root_waits_on_a_subcall_leader_with_the_same_key() -> None:
    rt = make_runtime(DispatcherConfig(task_max_inflight_calls=1))
    rt.register("t1", [spec("root", "1"), spec("leaf", "5")])
    rt.pump()
    child = rt.binds(rt.request_subcall("t1/c0", "leaf", "5"))[0].call_id
    rt.run(rt.core.flush_dirty_tasks())
    task = rt.core.task_state("t1")
    assert task is not None and task.singleflight[call_key("leaf", DIGEST, b"5")].call_id == child
    rt.complete(child)
    rt.complete("t1/c0")
    out = rt.pump()
    assert [h.source for h in rt.of_type(out, CompleteCallFromCache)] == ["cache"]


def test_parent_retry_cancels_the_whole_subtree() -> None:
    rt = make_runtime()
    parent = _running_root(rt)
    child = rt.binds(rt.request_subcall("t1/c0", "child", "2"))[0].call_id
    grandchild = rt.binds(rt.request_subcall(child, "leaf", "3"))[0].call_id
    out = rt.fail("t1/c0", kind="transport_lost", retryable=True)
    cancels = rt.of_type(out, CancelCallCmd)
    assert [(c.call_id, c.reason) for c in cancels] == [
        (child, "parent_retrying"),
        (grandchild, "parent_ended"),
    ]
    assert all(c.executor_id == parent.executor_id and c.attempt_seq == 1 for c in cancels)
    assert rt.of_type(out, ArmCallRetry)[0].call_id == "t1/c0"
    assert not rt.of_type(out, ResumeParentCall)
    assert rt.core.call_context(child) is None and rt.core.call_context(grandchild) is None
    rt.core.check_invariants()


def test_parent_completion_cancels_subcalls_it_left_behind() -> None:
    rt = make_runtime()
    _running_root(rt)
    child = rt.binds(rt.request_subcall("t1/c0"))[0].call_id
    out = rt.complete("t1/c0")
    cancel = rt.of_type(out, CancelCallCmd)[0]
    assert cancel.call_id == child and cancel.reason == "parent_ended"
    # The child's late terminal frame is stale.
    assert rt.core.handle_call_completed(child, 1, b"{}") == []


def test_cancelled_leader_releases_its_waiters_to_contend_again() -> None:
    rt = make_runtime()
    rt.register("t1", [spec("root", "1"), spec("root", "2")])
    rt.pump()
    leader = rt.binds(rt.request_subcall("t1/c0", "leaf", "5"))[0].call_id
    assert rt.request_subcall("t1/c1", "leaf", "5") == []
    out = rt.fail("t1/c0", kind="user_error", retryable=False)  # its subtree is cancelled
    assert leader in {c.call_id for c in rt.of_type(out, CancelCallCmd)}
    new_bind = [b for b in rt.binds(out) if b.parent_call_id == "t1/c1"]
    assert len(new_bind) == 1  # the waiter became the leader and runs
    rt.complete(new_bind[0].call_id)
    assert rt.resumes[-1].parent_call_id == "t1/c1"


def test_executor_loss_takes_parents_before_children_and_sends_nothing_there() -> None:
    rt = make_runtime(executors=2)
    parent = _running_root(rt)
    child = rt.binds(rt.request_subcall("t1/c0"))[0].call_id
    out = rt.lose_executor(parent.executor_id)
    assert not rt.of_type(out, CancelCallCmd) and not rt.of_type(out, ResumeParentCall)
    assert rt.core.call_context(child) is None
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.attempt_count == 0  # not blamed: the attempt is back
    bind = rt.binds(rt.pump())[0]
    assert bind.call_id == "t1/c0" and bind.executor_id != parent.executor_id


def test_subcalls_are_not_counted_in_task_totals() -> None:
    rt = make_runtime()
    rt.register("t1", specs(1, function_id="root"))
    rt.pump()
    for i in range(3):
        child = rt.binds(rt.request_subcall("t1/c0", "leaf", str(i)))[0].call_id
        rt.complete(child)
    task = rt.core.task_state("t1")
    assert task is not None and task.total_count == 1 and task.live_subcalls == 0
    rt.complete("t1/c0")
    rt.settle()
    assert rt.converged["t1"].total_count == 1 and len(rt.converged["t1"].outputs) == 1


def test_subcall_of_a_stream_call_inherits_its_batch() -> None:
    rt = make_runtime()
    rt.open_stream("s")
    rt.add_batch("s", specs(1))
    rt.add_batch("s", specs(1, start=1))
    rt.pump()
    out = rt.request_subcall("s/c1")
    assert rt.of_type(out, DispatchCallCmd)[0].batch_idx == 1
    assert isinstance(out[0], BindCall)


def test_a_root_released_by_a_cancelled_leader_goes_back_to_the_queue_head() -> None:
    rt = make_runtime(DispatcherConfig(task_max_inflight_calls=2))
    rt.register("t1", [spec("root", "1"), spec("root", "2"), spec("leaf", "5"), spec("x", "9")])
    rt.pump()  # c0 and c1 run; the window is full
    leader = rt.binds(rt.request_subcall("t1/c0", "leaf", "5"))[0].call_id
    rt.complete("t1/c1")
    rt.pump()  # c2 ("leaf", "5") waits behind the sub-call leader; c3 runs
    c2 = rt.core.call_context("t1/c2")
    assert c2 is not None and c2.sf_waiting and "t1/c3" in rt.running
    out = rt.fail("t1/c0", kind="user_error", retryable=False)
    assert leader in {c.call_id for c in rt.of_type(out, CancelCallCmd)}
    assert c2.queued and not c2.sf_waiting  # released to contend again
    rt.core.check_invariants()


def test_a_subcall_requested_before_the_parents_bind_is_confirmed_waits_for_it() -> None:
    rt = make_runtime()
    rt.defer_binds = True
    rt.register("t1", [spec("root", "1")])
    rt.pump()
    (bind,) = rt.pending_binds
    assert rt.request_subcall("t1/c0") == []  # parked: the parent is not bound yet
    task = rt.core.task_state("t1")
    assert task is not None and len(task.pending_bind_subcalls) == 1
    out = rt.answer_bind(bind)
    child_bind = [b for b in rt.pending_binds if b.parent_call_id == "t1/c0"]
    assert rt.of_type(out, DispatchCallCmd)[0].call_id == "t1/c0"
    assert len(child_bind) == 1 and not task.pending_bind_subcalls


def test_a_failed_parent_bind_cancels_subcalls_requested_early() -> None:
    rt = make_runtime()
    rt.defer_binds = True
    rt.register("t1", [spec("root", "1")])
    rt.pump()
    (bind,) = rt.pending_binds
    rt.request_subcall("t1/c0")
    rt.answer_bind(bind, fail=True)
    task = rt.core.task_state("t1")
    assert task is not None and not task.pending_bind_subcalls and task.live_subcalls == 0
    rt.core.check_invariants()


def test_a_parent_is_charged_what_its_child_used_never_the_time_it_waited() -> None:
    """The seed's rule: queueing is never charged. A child that queued behind a CPU hog
    for seconds and ran 3 ms charges its parent 3 ms, whether it completes or fails."""
    from blockx.worker.core import CallError

    rt = make_runtime(executors=1)
    _running_root(rt)
    child = rt.binds(rt.request_subcall("t1/c0", "child", "[1]"))[0].call_id
    rt.now += 9_000  # it waited behind a neighbour for 9 s of wall time
    (resume,) = rt.of_type(rt.complete(child, budget_used_ms=3), ResumeParentCall)
    assert resume.budget_used_ms == 3
    failing = rt.binds(rt.request_subcall("t1/c0", "child", "[2]"))[0].call_id
    rt.now += 9_000
    cmd = rt.running.pop(failing)
    error = CallError(kind="user_error", message="boom", retryable=False)
    out = rt.run(
        rt.core.handle_attempt_failure(failing, cmd.attempt_seq, error, rt.now, budget_used_ms=4)
    )
    (resume,) = rt.of_type(out, ResumeParentCall)
    assert resume.budget_used_ms == 4 and resume.error is not None

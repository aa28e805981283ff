"""A wait left unanswered is handed back: ``wait_handle`` and ``ReleaseWait``.

The runtime puts what it holds for a call's IO wait (the handler's future) in the
call's ``wait_handle`` once the core moved the call to WAITING. The core clears it
when the wait is answered (the resume was delivered) and returns it, once, in a
``ReleaseWait`` when the attempt leaves the wait any other way: a failure (a
retryable one, a final one — the executor's budget cut-off is one), a cancel (the
task's, a parent's), the executor's loss, or a completion that overtook the
resume's delivery note.
"""

from __future__ import annotations

import pytest
from dispatcher_harness import Runtime, make_runtime, specs

from blockx.worker.core import (
    ArmCallRetry,
    CallState,
    CancelCallCmd,
    DispatchCallContext,
    DispatchCommand,
    DispatcherInvariantError,
    ReleaseWait,
)


class Handle:
    """What the runtime would put in ``wait_handle`` (a future): an opaque token here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Handle({self.name})"


def _started(n: int = 2) -> Runtime:
    rt = make_runtime()
    rt.register("t1", specs(n))
    rt.pump()
    return rt


def _wait_on_io(rt: Runtime, call_id: str) -> tuple[DispatchCallContext, Handle]:
    """``call_id`` suspends on IO and the runtime attaches a handle to the wait."""
    rt.run(rt.core.handle_call_waiting(call_id, rt.running[call_id].attempt_seq))
    ctx = rt.core.call_context(call_id)
    assert ctx is not None and ctx.state is CallState.WAITING
    handle = ctx.wait_handle = Handle(call_id)
    return ctx, handle


def _releases(out: list[DispatchCommand]) -> list[object]:
    return [cmd.handle for cmd in out if isinstance(cmd, ReleaseWait)]


def test_an_answered_wait_is_cleared_and_never_released() -> None:
    rt = _started()
    ctx, _handle = _wait_on_io(rt, "t1/c0")
    rt.run(rt.core.handle_calls_resumed([("t1/c0", ctx.attempt_seq)]))
    assert ctx.state is CallState.RUNNING and ctx.wait_handle is None
    out = rt.fail("t1/c0", kind="user_error", retryable=False)
    assert _releases(out) == [] and rt.released == []
    rt.core.check_invariants()


def test_a_retryable_failure_while_waiting_releases_the_wait_before_the_retry() -> None:
    rt = _started()
    ctx, handle = _wait_on_io(rt, "t1/c0")
    out = rt.fail("t1/c0", kind="transport_lost", retryable=True)
    assert _releases(out) == [handle]
    kinds = [type(cmd) for cmd in out]
    assert kinds.index(ReleaseWait) < kinds.index(ArmCallRetry)
    assert rt.released[0].call_id == "t1/c0" and rt.released[0].task_id == "t1"
    assert ctx.state is CallState.READY and ctx.wait_handle is None
    rt.core.check_invariants()
    # The retry's attempt starts with no handle: its own wait gets one of its own.
    rt.fire_retry("t1/c0")
    rt.pump()
    assert ctx.state is CallState.RUNNING and ctx.wait_handle is None


def test_a_final_failure_while_waiting_releases_the_wait() -> None:
    """The executor cut the wait off at the call's budget: ``deadline_exceeded``."""
    rt = _started()
    ctx, handle = _wait_on_io(rt, "t1/c0")
    out = rt.fail("t1/c0", kind="deadline_exceeded", retryable=False)
    assert _releases(out) == [handle]
    assert ctx.state is CallState.DONE and ctx.wait_handle is None
    rt.core.check_invariants()


def test_cancelling_a_task_releases_the_waits_of_its_calls() -> None:
    rt = _started(3)
    _, first = _wait_on_io(rt, "t1/c0")
    _, second = _wait_on_io(rt, "t1/c2")
    out = rt.run(rt.core.handle_task_cancelled("t1", "user"))
    assert set(map(id, _releases(out))) == {id(first), id(second)}
    assert {c.call_id for c in rt.of_type(out, CancelCallCmd)} >= {"t1/c0", "t1/c2"}
    rt.core.check_invariants()


def test_losing_the_executor_releases_the_waits_of_its_calls() -> None:
    rt = _started(4)
    executor = rt.running["t1/c0"].executor_id
    waiting = [c for c, cmd in rt.running.items() if cmd.executor_id == executor]
    handles = [_wait_on_io(rt, call_id)[1] for call_id in waiting]
    out = rt.lose_executor(executor)
    assert set(map(id, _releases(out))) == set(map(id, handles))
    rt.core.check_invariants()


def test_a_sub_call_cancelled_with_its_parent_releases_its_wait() -> None:
    rt = _started(1)
    rt.request_subcall("t1/c0", function_id="child")
    [child_id] = [c for c in rt.running if c != "t1/c0"]
    _, handle = _wait_on_io(rt, child_id)
    out = rt.fail("t1/c0", kind="user_error", retryable=False)
    [release] = [cmd for cmd in out if isinstance(cmd, ReleaseWait)]
    assert release.call_id == child_id and release.handle is handle
    rt.core.check_invariants()


def test_a_completion_that_overtakes_the_resume_releases_the_wait() -> None:
    rt = _started()
    ctx, handle = _wait_on_io(rt, "t1/c0")
    out = rt.complete("t1/c0")
    assert _releases(out) == [handle]
    assert ctx.state is CallState.DONE and ctx.wait_handle is None
    rt.core.check_invariants()


def test_the_invariant_check_finds_a_handle_outside_a_wait() -> None:
    rt = _started()
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.state is CallState.RUNNING
    ctx.wait_handle = Handle("stray")
    with pytest.raises(DispatcherInvariantError, match="holds a wait handle while RUNNING"):
        rt.core.check_invariants()

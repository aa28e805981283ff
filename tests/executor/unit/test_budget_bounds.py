"""Budgets never crash the executor (issue 15, "Budgets": the executor clamps and never
crashes on any number): a huge ``callBudgetMs`` / ``budgetUsedMs`` is clamped for that
call, a malformed one refuses that call only, and the alarm never overflows ``setitimer``."""

from __future__ import annotations

import time
from typing import Any

import pytest
from executor_harness import Harness

from blockx.executor.context import MAX_BUDGET_MS
from blockx.executor.deadline import DeadlineAlarm
from blockx.executor.execute_frames import ExecuteCallFrame, ResumeCallFrame, decode_inbound
from blockx.wire import FrameDecoder, encode_frame, keys

HUGE = [10**13, 2**63 + 5, 10**400]

SUB = "def _(p):\n    clock.advance_ms(5000)\n    return function.call('child', 1)\n"
READ = "from blockx.sdk import db\n\ndef _(p):\n    return db.get('t', p)\n"


@pytest.mark.parametrize("budget", HUGE)
def test_a_huge_call_budget_is_clamped_and_the_call_runs(h: Harness, budget: int) -> None:
    h.execute("c1", SUB, None, call_budget_ms=budget)
    h.run()
    assert h.rt.get_context("c1").budget_ms == MAX_BUDGET_MS  # type: ignore[union-attr]
    (wait,) = h.waits("c1", keys.WAIT_SUBCALL)
    assert wait[keys.F_PAYLOAD][keys.FP_GRANTED_BUDGET_MS] == MAX_BUDGET_MS - 5000
    h.resume(wait, {"ok": 1}, budget_used_ms=7)
    h.run()
    assert h.output("c1") == {"ok": 1}


@pytest.mark.parametrize("used", HUGE)
def test_a_huge_wait_charge_ends_a_budgeted_call_as_out_of_budget(h: Harness, used: int) -> None:
    h.execute("c1", READ, 1, call_budget_ms=1000)
    h.run()
    h.resume(h.last_wait("c1"), {"v": 1}, budget_used_ms=used)
    h.run()
    failure = h.failure("c1")
    assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
    assert failure[keys.FP_BUDGET_USED_MS] == MAX_BUDGET_MS


@pytest.mark.parametrize("used", HUGE)
def test_a_huge_wait_charge_on_an_unbudgeted_call_is_just_reported(h: Harness, used: int) -> None:
    h.execute("c1", READ, 1)
    h.run()
    h.resume(h.last_wait("c1"), {"v": 1}, budget_used_ms=used)
    h.run()
    assert h.output("c1") == {"v": 1}
    assert h.payload("c1")[keys.FP_BUDGET_USED_MS] == MAX_BUDGET_MS


@pytest.mark.parametrize("budget", HUGE[:2])
def test_the_typed_reader_path_leaves_huge_numbers_to_the_clamping_path(budget: int) -> None:
    execute = {
        keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
        keys.F_CALL_ID: "c1",
        keys.F_PAYLOAD: {
            keys.FP_TASK_ID: "t",
            keys.FP_FUNCTION_ID: "f",
            keys.FP_FUNCTION_CODE_DIGEST: "sha256:" + "0" * 64,
            keys.FP_CALL_BUDGET_MS: budget,
        },
    }
    resume = {
        keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
        keys.F_CALL_ID: "c1",
        keys.F_REQUEST_ID: "r",
        keys.F_PAYLOAD: {keys.FP_RESUME_KIND: "io", keys.FP_RESULT: 1, "budgetUsedMs": budget},
    }
    frames = FrameDecoder(typed=decode_inbound).feed(encode_frame(execute) + encode_frame(resume))
    assert [type(frame.envelope) for frame in frames] == [dict, dict]
    within = {**execute, keys.F_PAYLOAD: {**execute[keys.F_PAYLOAD], "callBudgetMs": 5}}
    (typed,) = FrameDecoder(typed=decode_inbound).feed(encode_frame(within))
    assert type(typed.envelope) is ExecuteCallFrame
    assert ResumeCallFrame  # the resume counterpart is checked by test_execute_frames


@pytest.mark.parametrize("seconds", [1e9, 1e12, 1e300])
def test_the_alarm_is_never_armed_past_what_setitimer_takes(seconds: float) -> None:
    alarm = DeadlineAlarm()
    try:
        now = time.perf_counter()
        alarm.arm(now + seconds, now)  # no OverflowError
        assert alarm.due <= now + 86_400.0 + 1
    finally:
        alarm.restore()


def test_a_huge_budget_on_a_cpu_bound_call_arms_the_real_alarm(make_harness: Any) -> None:
    h = make_harness(real_clock=True)
    h.execute("c1", "def _(p):\n    return sum(range(10000))\n", None, call_budget_ms=10**13)
    h.run()
    assert h.output("c1") == sum(range(10000))

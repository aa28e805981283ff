"""Budget: CPU + IO wait + sub-call + sleep are charged, queueing never; the safe points;
SIGALRM preemption of pure CPU loops; waits on the worker cut off when they outlast the
budget; the local call-timeout latch."""

from __future__ import annotations

import gc
import threading
import time
from textwrap import dedent

import pytest
from executor_harness import Harness
from greenlet import getcurrent as greenlet_getcurrent

from blockx.executor.context import ExecContext, ExecState, running
from blockx.executor.deadline import on_deadline_signal
from blockx.executor.errors import DeadlineSignalExpired
from blockx.executor.runtime import ExecutorRuntime
from blockx.wire import keys

BURN_THEN_READ = dedent(
    """
    from blockx.sdk import db

    def _(p):
        clock.advance_ms(p["before"])
        value = db.get("t", 1)
        record("after wait")
        clock.advance_ms(p["after"])
        return value
    """
)


def _budget(h: Harness, call_id: str) -> int:
    return h.payload(call_id)[keys.FP_BUDGET_USED_MS]


class TestCharging:
    def test_cpu_time_is_charged(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    clock.advance_ms(30)\n    return 1\n", None)
        h.run()
        assert _budget(h, "c1") == 30

    def test_io_wait_is_charged_as_the_worker_reports_it(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 5, "after": 7})
        h.run()
        h.clock.advance_ms(1000)  # wall time in the wait is not what counts
        h.resume(h.last_wait("c1"), "v", budget_used_ms=40)
        h.run()
        assert _budget(h, "c1") == 5 + 40 + 7

    def test_queueing_is_never_charged(self, h: Harness) -> None:
        h.add_source(BURN_THEN_READ)
        h.rt.registry.compile_source("fn", h.add_source(BURN_THEN_READ), BURN_THEN_READ)
        h.execute("c1", BURN_THEN_READ, {"before": 1, "after": 1})
        h.clock.advance_ms(100)  # admitted, waiting in the runnable queue
        h.run()
        h.resume(h.last_wait("c1"), "v")
        h.clock.advance_ms(50)  # resumed, waiting in the runnable queue again
        h.run()
        payload = h.payload("c1")
        assert payload[keys.FP_BUDGET_USED_MS] == 2
        assert payload[keys.FP_QUEUE_WAIT_US] == 150_000
        assert payload[keys.FP_EFFECTIVE_EXECUTION_DURATION_US] == 2_000

    def test_sleep_is_charged_for_what_was_asked_not_for_waking_late(self, h: Harness) -> None:
        h.execute("c1", "import time\ndef _(p):\n    time.sleep(0.2)\n", None)
        h.run()
        h.clock.advance(0.5)
        h.run()
        payload = h.payload("c1")
        assert payload[keys.FP_BUDGET_USED_MS] == 200
        assert payload[keys.FP_QUEUE_WAIT_US] == 300_000

    def test_subcall_time_is_charged(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    return function.call('child', 1)\n", None)
        h.run()
        h.resume(h.last_wait("c1"), {"ok": True}, budget_used_ms=25)
        h.run()
        assert _budget(h, "c1") == 25

    def test_code_fetches_are_not_charged(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        digest = h.add_source("def _(p):\n    return p\n")
        h.execute("c1", digest=digest, args=3)
        h.run()
        (wait,) = h.code_waits
        h.resume(
            wait,
            {keys.FP_SOURCE: h.sources[digest], keys.FP_FUNCTION_CODE_DIGEST: digest},
            budget_used_ms=500,
        )
        h.run()
        assert _budget(h, "c1") == 0

    def test_a_delivered_wait_is_charged_even_when_the_call_ends_before_resuming(
        self, h: Harness
    ) -> None:
        # The worker spent 40 ms on the read and said so; a cancel that arrives before
        # the call is switched back in must not make those 40 ms disappear.
        h.execute("c1", BURN_THEN_READ, {"before": 5, "after": 7}, call_budget_ms=1000)
        h.run()
        h.resume(h.last_wait("c1"), "v", budget_used_ms=40)
        h.cancel("c1", "user_request")
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert failure[keys.FP_BUDGET_USED_MS] == 5 + 40

    def test_a_delivered_code_fetch_is_still_not_charged_when_the_call_ends(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(auto_code=False)
        digest = h.add_source("def _(p):\n    return p\n")
        h.execute("c1", digest=digest, args=3)
        h.run()
        (wait,) = h.code_waits
        h.resume(
            wait,
            {keys.FP_SOURCE: h.sources[digest], keys.FP_FUNCTION_CODE_DIGEST: digest},
            budget_used_ms=500,
        )
        h.cancel("c1")
        h.run()
        assert _budget(h, "c1") == 0

    def test_an_unlimited_budget_never_expires(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 10_000, "after": 10_000}, call_budget_ms=0)
        h.run()
        h.resume(h.last_wait("c1"), "v", budget_used_ms=10**6)
        h.run()
        assert h.output("c1") == "v"


class TestSafePoints:
    def test_expired_after_resuming_a_wait(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 10, "after": 0}, call_budget_ms=100)
        h.run()
        h.resume(h.last_wait("c1"), "v", budget_used_ms=95)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert failure[keys.FP_RETRYABLE] is False
        assert failure[keys.FP_BUDGET_USED_MS] == 105
        assert h.records == []  # nothing after the wait ran

    def test_expired_before_sending_a_wait(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 150, "after": 0}, call_budget_ms=100)
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert h.waits("c1", keys.WAIT_IO) == []

    def test_expired_before_return(self, h: Harness) -> None:
        h.execute(
            "c1", "def _(p):\n    clock.advance_ms(101)\n    return 1\n", None, call_budget_ms=100
        )
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert failure[keys.FP_ERROR_MESSAGE] == (
            "call budget of 100 ms used up: 101.0 ms of CPU, sleeps, IO and sub-calls"
        )

    def test_a_sleep_longer_than_the_budget_wakes_at_the_budget_and_fails(self, h: Harness) -> None:
        h.execute(
            "c1",
            "import time\ndef _(p):\n    time.sleep(10)\n    record('after')\n",
            None,
            call_budget_ms=100,
        )
        h.run()
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.1)
        h.clock.advance(0.1)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert failure[keys.FP_BUDGET_USED_MS] == 100
        assert h.records == []

    def test_a_budget_that_holds_completes(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 30, "after": 30}, call_budget_ms=100)
        h.run()
        h.resume(h.last_wait("c1"), "v", budget_used_ms=39)
        h.run()
        assert h.output("c1") == "v"
        assert _budget(h, "c1") == 99


class TestPreemption:
    def test_a_pure_cpu_loop_is_preempted_at_its_budget(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(real_clock=True)
        h.execute(
            "c1", "def _(p):\n    n = 0\n    while True:\n        n += 1\n", None, call_budget_ms=50
        )
        started = time.perf_counter()
        h.run()
        elapsed = time.perf_counter() - started
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        # Preempted (the loop never ends by itself); how late the alarm lands is the
        # machine's business, so the upper bounds only rule out "never".
        assert 0.045 <= elapsed < 10.0
        assert 50 <= failure[keys.FP_BUDGET_USED_MS] < 5000
        assert 'File "<blockx:fn>", line' in failure[keys.FP_ERROR_STACK]
        h.execute("c2", "def _(p):\n    return p\n", 2)  # the executor carries on
        h.run()
        assert h.output("c2") == 2

    def test_every_cpu_bound_call_of_one_pass_is_preempted_at_its_own_budget(
        self,
        make_harness,  # type: ignore[no-untyped-def]
    ) -> None:
        # The first preemption leaves the armed expiry in the past: the next calls must be
        # aimed at their own budgets, not at the 0.1 s interval tick.
        h = make_harness(real_clock=True)
        for i in range(4):
            h.execute(f"c{i}", "def _(p):\n    while True:\n        pass\n", i, call_budget_ms=30)
        h.run()
        for i in range(4):
            failure = h.failure(f"c{i}")
            assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
            # Each at its own budget, not at the others' (4 x 30 ms = 120 ms would be
            # the shared clock); a loaded machine may deliver the alarm late.
            assert failure[keys.FP_BUDGET_USED_MS] < 1000, (i, failure[keys.FP_BUDGET_USED_MS])

    def test_a_call_after_one_that_ended_early_is_preempted_at_its_own_budget(
        self,
        make_harness,  # type: ignore[no-untyped-def]
    ) -> None:
        # The timer is still armed for c1 (budget 20 ms) when c1 returns; c2 (60 ms) is due
        # later. When it fires early the handler must aim at c2's expiry.
        h = make_harness(real_clock=True)
        h.execute("c1", "def _(p):\n    return p\n", 1, call_budget_ms=20)
        h.execute("c2", "def _(p):\n    while True:\n        pass\n", 2, call_budget_ms=60)
        h.run()
        assert h.output("c1") == 1
        failure = h.failure("c2")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert 60 <= failure[keys.FP_BUDGET_USED_MS] < 1000, failure[keys.FP_BUDGET_USED_MS]

    def test_while_true_pass_is_preempted(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(real_clock=True)
        h.execute("c1", "def _(p):\n    while True:\n        pass\n", None, call_budget_ms=30)
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED

    def test_preemption_counts_budget_already_used_by_waits(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(real_clock=True)
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                db.get("t", 1)
                while True:
                    pass
            """
        )
        h.execute("c1", source, None, call_budget_ms=10_000)
        h.run()
        h.resume(h.last_wait("c1"), "v", budget_used_ms=9_960)
        started = time.perf_counter()
        h.run()
        # 40 ms were left; a loop that did not count the wait would run 10 s.
        assert time.perf_counter() - started < 5.0
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED

    def test_preemption_counts_budget_already_used_by_sleeping(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(real_clock=True)
        source = "import time\ndef _(p):\n    time.sleep(0.9)\n    while True:\n        pass\n"
        h.execute("c1", source, None, call_budget_ms=1000)
        started = time.perf_counter()
        while h.rt.inflight_count():
            h.run()
            time.sleep(0.005)
        # The loop gets the 0.1 s the sleep left, not a fresh second (0.9 + 1.0 s).
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert 1000 <= failure[keys.FP_BUDGET_USED_MS] < 1800
        assert time.perf_counter() - started >= 0.9

    def test_the_signal_acts_on_a_running_call_only(self) -> None:
        ctx = ExecContext("c1", "t1", "fn", "sha256:x", clock=lambda: 100.0, budget_ms=1)
        ctx.cpu_s = 1.0  # far over its budget
        ctx.greenlet = greenlet_getcurrent()
        running.ctx = ctx
        try:
            ctx.state = ExecState.WAITING_IO
            on_deadline_signal(14, None)  # framework code of a waiting call: left alone
            ctx.state = ExecState.RUNNING
            with pytest.raises(DeadlineSignalExpired):
                on_deadline_signal(14, None)
        finally:
            running.ctx = None

    def test_the_alarm_is_disarmed_between_calls(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        import signal

        h = make_harness(real_clock=True)
        h.execute("c1", "def _(p):\n    return 1\n", None, call_budget_ms=10_000)
        h.run()
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)

    def test_the_signal_handler_leaves_everything_else_alone(self) -> None:
        assert running.ctx is None
        on_deadline_signal(14, None)  # no call running: nothing happens

    def test_off_the_main_thread_there_is_no_alarm_but_budgets_still_hold(self) -> None:
        results: dict[str, object] = {}

        def build_and_run() -> None:
            rt = ExecutorRuntime("exec-t")
            results["alarm"] = rt._alarm.enabled
            source = "def _(p):\n    return p\n"
            from executor_harness import digest_of

            digest = digest_of(source)
            rt.registry.compile_source("fn", digest, source)
            rt.handle_inbound_message(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
                    keys.F_CALL_ID: "c1",
                    keys.F_PAYLOAD: {
                        keys.FP_TASK_ID: "t",
                        keys.FP_FUNCTION_ID: "fn",
                        keys.FP_FUNCTION_CODE_DIGEST: digest,
                        keys.FP_ARGS: 4,
                        keys.FP_CALL_BUDGET_MS: 1000,
                    },
                }
            )
            rt.run_until_idle()
            results["frames"] = rt.drain_outbox()
            rt.shutdown()

        thread = threading.Thread(target=build_and_run)
        thread.start()
        thread.join()
        assert results["alarm"] is False
        (frame,) = results["frames"]  # type: ignore[misc]
        assert frame[0][keys.F_PAYLOAD][keys.FP_OUTPUT] == 4


def _cut_off_message(budget_ms: int, waited_ms: int, waiting_on: str, wait: dict) -> str:  # type: ignore[type-arg]
    return (
        f"call budget of {budget_ms} ms ran out after waiting {waited_ms} ms on {waiting_on} "
        f"(request {wait[keys.F_REQUEST_ID]})"
    )


READ_TWICE = dedent(
    """
    from blockx.sdk import db

    def _(p):
        first = db.get("t", 1)
        record("between")
        return [first, db.get("t", 2)]
    """
)


class TestWaitCutOff:
    """A wait on the worker is charged to the budget, so one that outlasts what is left of
    it can only fail: the executor ends the call when the budget runs out, naming the wait."""

    def test_an_io_wait_never_answered_ends_the_call_when_the_budget_runs_out(
        self, h: Harness
    ) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 20, "after": 0}, call_budget_ms=300)
        h.run()
        wait = h.last_wait("c1")
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.28)
        h.clock.advance_ms(279)
        h.run()
        assert h.terminals("c1") == []
        h.clock.advance_ms(1)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert failure[keys.FP_RETRYABLE] is False
        message = failure[keys.FP_ERROR_MESSAGE]
        assert message.startswith(_cut_off_message(300, 280, "IO blockdb.get_row", wait))
        assert failure[keys.FP_BUDGET_USED_MS] == 300  # 20 ms CPU + 280 ms waited
        assert 'File "<blockx:fn>", line' in failure[keys.FP_ERROR_STACK]  # the user's db.get
        assert h.records == []  # nothing after the wait ran
        assert h.rt.stats()["waits_cut_off"] == 1

    def test_waking_late_for_the_cut_off_is_queueing_not_budget(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=300)
        h.run()
        h.clock.advance_ms(420)  # the scheduler was busy elsewhere 120 ms past the budget
        h.run()
        payload = h.failure("c1")
        assert payload[keys.FP_BUDGET_USED_MS] == 300
        assert "after waiting 300 ms" in payload[keys.FP_ERROR_MESSAGE]

    def test_the_late_resume_is_dropped_and_the_executor_serves_on(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=300)
        h.run()
        wait = h.last_wait("c1")
        h.clock.advance_ms(300)
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        h.resume(wait, "too late", budget_used_ms=43_000)
        assert h.run() == []
        assert h.rt.stats()["stale_resume_dropped"] == 1
        assert h.rt.inflight_count() == 0
        h.execute("c2", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=300)
        h.run()
        h.resume(h.last_wait("c2"), "v", budget_used_ms=5)
        h.run()
        assert h.output("c2") == "v"

    def test_a_wait_answered_in_time_does_not_fail_and_its_timer_is_disarmed(
        self, h: Harness
    ) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=300)
        h.run()
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.3)  # armed
        h.clock.advance_ms(290)
        h.resume(h.last_wait("c1"), "v", budget_used_ms=290)
        h.run()
        assert h.output("c1") == "v"
        assert h.payload("c1")[keys.FP_BUDGET_USED_MS] == 290
        h.clock.advance_ms(100)  # past the old cut-off: nothing fires
        assert h.run() == []
        assert h.rt.next_scheduler_delay(None) is None
        assert h.rt.stats()["waits_cut_off"] == 0

    def test_a_later_wait_is_cut_off_at_what_is_left_of_the_budget(self, h: Harness) -> None:
        # The worker charged 100 ms for a read that took 150 ms of wall time (the rest
        # was queueing): the second read may last 200 ms, until 350 ms after the start.
        h.execute("c1", READ_TWICE, None, call_budget_ms=300)
        h.run()
        h.clock.advance_ms(150)
        h.resume(h.last_wait("c1"), "a", budget_used_ms=100)
        h.run()
        second = h.last_wait("c1")
        assert h.records == ["between"]
        h.clock.advance_ms(150)  # the first read's cut-off: the second read is not due yet
        h.run()
        assert h.terminals("c1") == []
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.05)
        h.clock.advance_ms(51)  # a hair past: the fake clock's sums are floats
        h.run()
        failure = h.failure("c1")
        message = failure[keys.FP_ERROR_MESSAGE]
        assert message.startswith(_cut_off_message(300, 200, "IO blockdb.get_row", second))
        assert failure[keys.FP_BUDGET_USED_MS] == 300

    def test_many_waits_within_one_budget_keep_one_timer(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                return sum(db.get("t", i) for i in range(50))
            """
        )
        h.execute("c1", source, None, call_budget_ms=5000)
        h.run()
        for _ in range(50):
            h.clock.advance_ms(2)
            h.resume(h.last_wait("c1"), 1, budget_used_ms=1)
            h.run()
        assert h.output("c1") == 50
        assert len(h.rt._timers.wait_limits) <= 1

    def test_a_subcall_is_charged_its_childs_used_budget_never_the_wall_time(
        self, h: Harness
    ) -> None:
        """The child queued 5 s behind a CPU-bound neighbour and ran 40 ms: the caller,
        with 150 ms of budget left, is charged the 40 ms (docs/protocol.md "Budgets")."""
        h.execute(
            "c1",
            "def _(p):\n    clock.advance_ms(50)\n    return function.call('pricer', p)\n",
            {"x": 1},
            call_budget_ms=200,
        )
        h.run()
        (wait,) = h.waits("c1", keys.WAIT_SUBCALL)
        assert wait[keys.F_PAYLOAD][keys.FP_GRANTED_BUDGET_MS] == 150
        assert h.rt.next_scheduler_delay(None) is None  # no wall-time cut-off armed
        h.clock.advance(5.0)
        assert h.run() == []
        h.resume(wait, {"price": 3}, budget_used_ms=40)
        h.run()
        assert h.output("c1") == {"price": 3}
        assert h.payload("c1")[keys.FP_BUDGET_USED_MS] == 90  # 50 ms CPU + the child's 40
        assert h.rt.stats()["waits_cut_off"] == 0

    # The child was granted the 150 ms left and ran out of them; whether its figure
    # rounds to 149 or 150 ms, the caller's budget is used up: deadline_exceeded.
    @pytest.mark.parametrize("child_used_ms", [149, 150])
    def test_a_child_out_of_its_granted_budget_fails_the_caller_through_its_answer(
        self, h: Harness, child_used_ms: int
    ) -> None:
        h.execute(
            "c1",
            "def _(p):\n    clock.advance_ms(50)\n    return function.call('pricer', p)\n",
            {"x": 1},
            call_budget_ms=200,
        )
        h.run()
        (wait,) = h.waits("c1", keys.WAIT_SUBCALL)
        error = {"kind": keys.ERR_DEADLINE_EXCEEDED, "message": "child out", "retryable": False}
        h.resume(wait, error=error, budget_used_ms=child_used_ms)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_BUDGET_USED_MS] == 50 + child_used_ms  # what was used, no more
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert "call budget of 200 ms ran out" in failure[keys.FP_ERROR_MESSAGE]
        assert "sub-call pricer" in failure[keys.FP_ERROR_MESSAGE]

    def test_an_io_wait_timer_never_cuts_off_a_later_subcall_wait(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                db.get("t", 1)
                return function.call("pricer", p)
            """
        )
        h.execute("c1", source, 1, call_budget_ms=300)
        h.run()
        h.resume(h.last_wait("c1"), "a", budget_used_ms=10)  # the IO wait armed a timer
        h.run()
        (wait,) = h.waits("c1", keys.WAIT_SUBCALL)
        h.clock.advance(10.0)  # far past the IO timer's due time
        assert h.run() == []
        h.resume(wait, "child", budget_used_ms=20)
        h.run()
        assert h.output("c1") == "child"

    def test_user_code_that_swallows_the_cut_off_cannot_wait_again(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                try:
                    db.get("t", 1)
                except BaseException:
                    record("swallowed")
                return db.get("t", 2)
            """
        )
        h.execute("c1", source, None, call_budget_ms=300)
        h.run()
        h.clock.advance_ms(300)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert h.records == ["swallowed"]
        assert len(h.waits("c1", keys.WAIT_IO)) == 1  # the budget was charged: no 2nd wait

    def test_a_cancelled_wait_disarms_its_timer(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=300)
        h.run()
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.3)
        h.cancel("c1", "user_request")
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert h.rt.next_scheduler_delay(None) is None
        h.clock.advance_ms(400)
        assert h.run() == []
        assert h.rt.stats()["waits_cut_off"] == 0

    def test_a_replaced_attempt_is_not_cut_off_at_the_old_attempts_budget(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=300)
        h.run()
        h.clock.advance_ms(200)
        h.execute(
            "c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=300, attempt_seq=2
        )
        h.run()
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.3)  # attempt 2's budget
        h.clock.advance_ms(150)  # past attempt 1's cut-off
        h.run()
        assert h.terminals("c1") == []  # attempt 1 ended silently, attempt 2 still waits
        h.clock.advance_ms(150)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ATTEMPT_SEQ] == 2
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED

    def test_an_unbudgeted_wait_arms_nothing(self, h: Harness) -> None:
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=0)
        h.run()
        assert h.rt.next_scheduler_delay(None) is None
        assert h.rt._timers.wait_limits == []
        h.clock.advance(3600)
        assert h.run() == []
        assert h.rt.get_context("c1") is not None

    def test_a_code_fetch_is_never_cut_off_but_the_wait_after_it_is(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        # Code fetches are not charged, so they may outlast the budget; the IO wait after
        # one still has the whole budget, and no more.
        h = make_harness(auto_code=False)
        digest = h.add_source(BURN_THEN_READ)
        h.execute("c1", digest=digest, args={"before": 0, "after": 0}, call_budget_ms=100)
        h.run()
        h.clock.advance_ms(500)
        assert h.run() == []
        (fetch,) = h.code_waits
        h.resume(fetch, {keys.FP_SOURCE: h.sources[digest], keys.FP_FUNCTION_CODE_DIGEST: digest})
        h.run()
        wait = h.last_wait("c1")
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.1)
        h.clock.advance_ms(100)
        h.run()
        failure = h.failure("c1")
        message = failure[keys.FP_ERROR_MESSAGE]
        assert message.startswith(_cut_off_message(100, 100, "IO blockdb.get_row", wait))
        assert failure[keys.FP_BUDGET_USED_MS] == 100

    def test_the_deadline_cuts_off_a_budgeted_wait_first_when_it_comes_first(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(call_timeout_ms=100)
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=1000)
        h.run()
        wait = h.last_wait("c1")
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.1)
        h.clock.advance_ms(100)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert failure[keys.FP_ERROR_MESSAGE] == (
            f"call deadline passed after waiting 100 ms on IO blockdb.get_row "
            f"(request {wait[keys.F_REQUEST_ID]}): used 100.0 ms of a 1000 ms budget"
        )
        assert failure[keys.FP_BUDGET_USED_MS] == 100

    def test_a_budget_and_a_deadline_due_in_one_pass_cut_off_at_the_budget(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(call_timeout_ms=100)
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0}, call_budget_ms=90)
        h.run()
        wait = h.last_wait("c1")
        h.clock.advance_ms(150)  # the scheduler wakes late, past both
        h.run()
        failure = h.failure("c1")
        message = failure[keys.FP_ERROR_MESSAGE]
        assert message.startswith(_cut_off_message(90, 90, "IO blockdb.get_row", wait))
        assert failure[keys.FP_BUDGET_USED_MS] == 90


class TestCallTimeoutLatch:
    def test_a_waiting_call_past_its_timeout_ends_as_deadline_exceeded(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(call_timeout_ms=100)
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0})
        h.run()
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.1)
        h.clock.advance_ms(150)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        # The wait is cut off at the deadline, and the failure says what it waited for.
        assert failure[keys.FP_ERROR_MESSAGE].startswith(
            "call deadline passed after waiting 100 ms on IO blockdb.get_row (request req-"
        )

    def test_a_wait_never_answered_ends_at_the_deadline_in_real_time(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(real_clock=True, call_timeout_ms=300)
        started = time.perf_counter()
        h.execute("c1", BURN_THEN_READ, {"before": 0, "after": 0})
        h.run()
        wait = h.last_wait("c1")
        while h.rt.inflight_count() and time.perf_counter() - started < 10:
            time.sleep(h.rt.next_scheduler_delay(0.05) or 0.0)  # as the main loop does
            h.run()
        elapsed = time.perf_counter() - started
        assert 0.29 <= elapsed < 3, elapsed
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert failure[keys.FP_ERROR_MESSAGE].startswith("call deadline passed after waiting ")
        assert (
            f"ms on IO blockdb.get_row (request {wait[keys.F_REQUEST_ID]})"
            in (failure[keys.FP_ERROR_MESSAGE])
        )

    def test_a_running_call_past_its_timeout_fails_at_the_next_safe_point(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(call_timeout_ms=100)
        h.execute("c1", BURN_THEN_READ, {"before": 150, "after": 0})
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert h.waits("c1", keys.WAIT_IO) == []

    def test_finished_calls_are_not_kept_alive_by_their_timers(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        # A 60 s latch on a stream of short calls: each call's timer entry outlives the
        # call by up to 60 s; it must not keep the finished context (and its args) alive.
        h = make_harness(call_timeout_ms=60_000)
        source = "import time\ndef _(p):\n    time.sleep(0.001 if p % 2 else 0)\n    return 1\n"
        for i in range(600):
            h.execute(f"c{i}", source, i)
            h.run()
            h.clock.advance(0.001)
            h.run()
        assert h.rt.inflight_count() == 0
        gc.collect()
        alive = sum(1 for obj in gc.get_objects() if type(obj) is ExecContext)
        assert alive < 150, f"{alive} finished contexts still referenced"

    def test_the_budget_wins_over_the_deadline(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(call_timeout_ms=100)
        h.execute("c1", "def _(p):\n    clock.advance_ms(200)\n", None, call_budget_ms=50)
        h.run()
        assert "budget" in h.failure("c1")[keys.FP_ERROR_MESSAGE]

"""Termination: cancel in every state, swallowed cancellations, transport loss, shutdown,
and the invariant that every non-replaced attempt ends in exactly one terminal frame."""

from __future__ import annotations

from textwrap import dedent
from typing import Any

from executor_harness import Harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockx.wire import keys

READ = dedent(
    """
    from blockx.sdk import db

    def _(p):
        try:
            return db.get("t", p)
        finally:
            record(("finally", p))
    """
)
SLEEPY = "import time\ndef _(p):\n    time.sleep(10)\n    record('woke')\n"


class TestCancel:
    def test_cancelling_a_waiting_call_ends_it_at_once(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.run()
        assert h.state("c1") == "WAITING_IO"
        h.cancel("c1", "user_request")
        assert h.rt.inflight_count() == 0  # before any run_until_idle
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert failure[keys.FP_RETRYABLE] is False
        assert "user_request" in failure[keys.FP_ERROR_MESSAGE]
        assert h.records == [("finally", 1)]  # the user's finally ran

    def test_cancel_without_a_reason_means_worker_shutdown(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.run()
        h.cancel("c1")
        h.run()
        assert keys.DEFAULT_CANCEL_REASON in h.failure("c1")[keys.FP_ERROR_MESSAGE]

    def test_cancelling_a_runnable_call_ends_it_before_it_runs(self, h: Harness) -> None:
        h.add_source(READ)
        h.execute("c1", READ, 1)
        h.cancel("c1", "early")
        assert h.state("c1") == "RUNNABLE"
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert h.records == []
        assert h.code_waits == []  # never even fetched its code

    def test_cancelling_a_sleeping_call(self, h: Harness) -> None:
        h.execute("c1", SLEEPY, None)
        h.run()
        assert h.state("c1") == "WAITING_SLEEP"
        h.cancel("c1", "bored")
        h.clock.advance(20)
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert h.records == []
        assert h.rt.next_scheduler_delay(None) is None  # the stale timer is gone

    def test_cancelling_a_call_whose_resume_is_queued(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.run()
        h.resume(h.last_wait("c1"), "row")
        h.cancel("c1", "late")
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED

    def test_call_timeout_ends_as_deadline_exceeded_not_cancelled(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.run()
        h.cancel("c1", "call_timeout")
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_DEADLINE_EXCEEDED
        assert failure[keys.FP_RETRYABLE] is False

    def test_cancel_for_an_unknown_call_is_dropped_and_counted(self, h: Harness) -> None:
        h.cancel("nobody", "x")
        assert h.run() == []
        assert h.rt.stats()["stale_cancel_dropped"] == 1

    def test_cancel_for_another_attempt_is_dropped_and_counted(self, h: Harness) -> None:
        h.execute("c1", READ, 1, attempt_seq=2)
        h.run()
        h.cancel("c1", "old", attempt_seq=1)
        h.run()
        assert h.state("c1") == "WAITING_IO"
        assert h.rt.stats()["stale_cancel_dropped"] == 1
        h.cancel("c1", "current", attempt_seq=2)
        h.run()
        assert h.failure("c1")[keys.FP_ATTEMPT_SEQ] == 2


class TestSwallowedCancellation:
    def test_except_exception_does_not_catch_a_cancellation(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                try:
                    db.get("t", 1)
                except Exception:
                    record("caught")
                    return "survived"
            """
        )
        h.execute("c1", source, None)
        h.run()
        h.cancel("c1")
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert h.records == []

    def test_a_call_that_swallows_its_cancellation_cannot_wait_again(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                for attempt in range(3):
                    try:
                        db.get("t", attempt)
                    except BaseException as exc:
                        record(type(exc).__name__)
                return "survived"
            """
        )
        h.execute("c1", source, None)
        h.run()
        h.cancel("c1", "stop")
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert h.records == ["CallCancelledError"] * 3
        assert len(h.waits("c1", keys.WAIT_IO)) == 1  # no second CallWaiting
        assert h.rt.stats()["greenlets_discarded"] == 0

    def test_a_call_that_swallows_its_cancellation_and_returns_still_fails(
        self, h: Harness
    ) -> None:
        source = dedent(
            """
            import time

            def _(p):
                try:
                    time.sleep(5)
                except BaseException:
                    pass
                return "survived"
            """
        )
        h.execute("c1", source, None)
        h.run()
        h.cancel("c1")
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED

    def test_a_greenlet_whose_code_escapes_is_discarded_not_reused(self, h: Harness) -> None:
        source = dedent(
            """
            import greenlet
            from blockx.sdk import db

            def _(p):
                try:
                    db.get("t", 1)
                except BaseException:
                    greenlet.getcurrent().parent.switch("escaped")
                return "never"
            """
        )
        h.execute("c1", source, None)
        h.run()
        h.cancel("c1", "stop")
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        stats = h.rt.stats()
        assert stats["greenlets_discarded"] == 1
        assert stats["idle_greenlets"] == 0
        h.execute("c2", "def _(p):\n    return p\n", 5)
        h.run()
        assert h.output("c2") == 5

    def test_user_code_raising_greenlet_exit_still_gets_one_terminal_frame(
        self, h: Harness
    ) -> None:
        h.execute(
            "c1", "import greenlet\ndef _(p):\n    raise greenlet.GreenletExit('odd')\n", None
        )
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert failure[keys.FP_ERROR_MESSAGE] == "GreenletExit: odd"
        h.execute("c2", "def _(p):\n    return 2\n", None)
        h.run()
        assert h.output("c2") == 2

    def test_user_code_switching_away_by_itself_fails_as_user_error(self, h: Harness) -> None:
        source = "import greenlet\ndef _(p):\n    greenlet.getcurrent().parent.switch('away')\n"
        h.execute("c1", source, None)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert "left its greenlet" in failure[keys.FP_ERROR_MESSAGE]
        assert h.rt.stats()["greenlets_discarded"] == 1


class TestTransportLoss:
    def test_transport_loss_ends_every_call_without_frames_and_refuses_new_ones(
        self, h: Harness
    ) -> None:
        h.execute("c1", READ, 1)
        h.execute("c2", SLEEPY, None)
        h.run()
        h.execute("c3", READ, 3)  # admitted, never run
        h.rt.on_transport_lost()
        assert h.rt.inflight_count() == 0
        assert h.rt.drain_outbox() == []
        h.execute("c4", READ, 4)
        assert h.rt.inflight_count() == 0
        stats = h.rt.stats()
        assert stats["transport_lost_calls"] == 3
        assert stats["refused_after_transport_lost"] == 1
        assert stats["terminal_suppressed"] == 3
        assert ("finally", 1) in h.records

    def test_transport_loss_reported_from_another_thread_converges_on_the_next_pass(
        self, h: Harness
    ) -> None:
        import threading

        h.execute("c1", READ, 1)
        h.run()
        thread = threading.Thread(target=h.rt.on_transport_lost)
        thread.start()
        thread.join()
        assert h.rt.inflight_count() == 1  # only recorded
        assert h.rt.next_scheduler_delay(None) == 0.0
        h.rt.run_until_idle()
        assert h.rt.inflight_count() == 0

    def test_a_failed_send_is_a_transport_loss(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        class BrokenSession:
            def __init__(self) -> None:
                self.sent = 0

            def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
                raise ConnectionError("peer gone")

            def drain_incoming(self) -> list[Any]:
                return []

            def is_connected(self) -> bool:
                return True

        h = make_harness(session=BrokenSession())
        h.rt.registry.compile_source("fn", h.add_source(READ), READ)
        h.execute("c1", READ, 1)
        h.execute("c2", READ, 2)
        h.rt.run_until_idle()
        assert h.rt.inflight_count() == 0
        assert h.rt.stats()["transport_lost"] is True


class TestShutdown:
    def test_shutdown_cancels_every_call_once_and_refuses_new_ones(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.execute("c2", SLEEPY, None)
        h.run()
        h.execute("c3", READ, 3)
        h.rt.shutdown()
        h.rt.shutdown()  # idempotent
        frames = [envelope for envelope, _ in h.rt.drain_outbox()]
        assert sorted(f[keys.F_CALL_ID] for f in frames) == ["c1", "c2", "c3"]
        for frame in frames:
            payload = frame[keys.F_PAYLOAD]
            assert payload[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
            assert payload[keys.FP_RETRYABLE] is True
        h.execute("c4", READ, 4)
        (refusal,) = [envelope for envelope, _ in h.rt.drain_outbox()]
        assert refusal[keys.F_PAYLOAD][keys.FP_ERROR_KIND] == keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED
        assert refusal[keys.F_PAYLOAD][keys.FP_RETRYABLE] is True
        assert h.rt.stats()["idle_greenlets"] == 0


# --- the invariant, across random sequences ------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["execute", "resume", "resume_error", "cancel", "stale", "tick", "lose"]),
        st.integers(min_value=0, max_value=3),
        st.integers(min_value=1, max_value=3),
    ),
    max_size=40,
)
PROGRAM = dedent(
    """
    import time
    from blockx.sdk import db

    def _(p):
        if p % 3 == 0:
            time.sleep(0.5)
        value = db.get("t", p)
        if p % 4 == 1:
            raise ValueError(p)
        return value
    """
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_every_attempt_not_replaced_ends_in_exactly_one_terminal_frame(
    make_harness, ops: list[tuple[str, int, int]]
) -> None:  # type: ignore[no-untyped-def]
    h: Harness = make_harness(max_inflight=3)
    attempts: dict[str, int] = {}
    admitted: set[tuple[str, int]] = set()
    replaced: set[tuple[str, int]] = set()
    lost = False
    for op, index, seq in ops:
        call_id = f"c{index}"
        if op == "execute":
            before = h.rt.get_context(call_id)
            if (call_id, seq) in admitted and before is None:
                continue  # a worker never re-sends an attempt that already ended
            h.execute(call_id, PROGRAM, index + seq, attempt_seq=seq)
            after = h.rt.get_context(call_id)
            if after is not None and after is not before:
                admitted.add((call_id, seq))
                if before is not None:
                    replaced.add((call_id, before.attempt_seq))
            attempts[call_id] = seq
        elif op in ("resume", "resume_error"):
            ctx = h.rt.get_context(call_id)
            waits = h.waits(call_id, keys.WAIT_IO)
            if ctx is not None and waits:
                error = {"kind": "io_error", "message": "x", "retryable": True}
                h.resume(waits[-1], "v", error=error if op == "resume_error" else None)
        elif op == "cancel":
            h.cancel(call_id, "test", attempt_seq=seq if seq > 1 else None)
        elif op == "stale":
            h.resume(
                {
                    keys.F_CALL_ID: call_id,
                    keys.F_REQUEST_ID: "req-x-1",
                    keys.F_PAYLOAD: {keys.FP_WAIT_KIND: "io"},
                },
                1,
            )
        elif op == "tick":
            h.clock.advance(0.3)
        elif op == "lose" and index == 0 and seq == 3:
            h.rt.on_transport_lost()
            lost = True
        h.pump()
    # Drive everything still resident to its end.
    for _ in range(20):
        if not h.rt.inflight_count():
            break
        h.clock.advance(1)
        for call_id in list(attempts):
            ctx = h.rt.get_context(call_id)
            if ctx is not None and ctx.pending_request_id is not None:
                h.resume(h.waits(call_id, keys.WAIT_IO)[-1], "v")
        h.pump()
    assert h.rt.inflight_count() == 0
    counts: dict[tuple[str, int], int] = {}
    for envelope in h.terminals():
        key = (envelope[keys.F_CALL_ID], envelope[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ])
        counts[key] = counts.get(key, 0) + 1
    for attempt in admitted:
        expected = 0 if attempt in replaced else 1
        if lost:
            assert counts.get(attempt, 0) <= expected
        else:
            assert counts.get(attempt, 0) == expected, (attempt, counts)
    h.close()
    h.rt.drain_outbox()

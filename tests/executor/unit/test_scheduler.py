"""Scheduler: run queues, resident greenlets, sleep-ready priority, run_until_idle, sessions."""

from __future__ import annotations

from textwrap import dedent
from typing import Any

import pytest
from executor_harness import Harness, live_call_greenlets

from blockx.executor.runtime import POOL_MAX_IDLE, SLEEP_READY_STREAK
from blockx.wire import Frame, decode_frame, encode_frame, keys

ECHO = "def _(*args):\n    return list(args)\n"
READ = dedent(
    """
    from blockx.sdk import db

    def _(p):
        row = db.get("prices", p)
        return {"key": p, "row": row}
    """
)


class TestSchedulerRunsCalls:
    def test_trivial_call_completes_with_its_output(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    return {'y': p['x'] + 1}\n", {"x": 41})
        frames = h.run()
        assert [f[keys.F_MESSAGE_TYPE] for f in frames] == [keys.MT_CALL_COMPLETED]
        assert h.output("c1") == {"y": 42}
        assert h.rt.inflight_count() == 0

    @pytest.mark.parametrize(
        ("args", "expected"),
        [
            ([1, 2, 3], [1, 2, 3]),
            ([], []),
            ({"a": 1}, [{"a": 1}]),
            (None, [None]),
            ("text", ["text"]),
            (7, [7]),
            ([[1, 2]], [[1, 2]]),
        ],
    )
    def test_a_json_array_is_spread_anything_else_is_one_argument(
        self, h: Harness, args: Any, expected: Any
    ) -> None:
        h.execute("c1", ECHO, args)
        h.run()
        assert h.output("c1") == expected

    def test_runnable_calls_run_in_arrival_order(self, h: Harness) -> None:
        source = "def _(p):\n    record(p)\n"
        for i in range(5):
            h.execute(f"c{i}", source, i)
        h.run()
        assert h.records == [0, 1, 2, 3, 4]

    def test_max_runnable_is_stored_but_not_enforced(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_runnable=1)
        assert h.rt.max_runnable == 1
        for i in range(3):
            h.execute(f"c{i}", READ, i)
        h.run()
        assert {h.state(f"c{i}") for i in range(3)} == {"WAITING_IO"}


class TestSuspendedCalls:
    def test_128_calls_suspend_at_once_and_resume_in_any_order(self, h: Harness) -> None:
        for i in range(128):
            h.execute(f"c{i}", READ, i)
        h.run()
        waits = {w[keys.F_CALL_ID]: w for w in h.waits(kind=keys.WAIT_IO)}
        assert len(waits) == 128
        assert h.rt.build_heartbeat()[keys.FP_CALL_STATE_COUNTS]["WAITING_IO"] == 128
        for i in reversed(range(128)):
            h.resume(waits[f"c{i}"], {"usd": i})
        h.run()
        for i in range(128):
            assert h.output(f"c{i}") == {"key": i, "row": {"usd": i}}
        assert h.rt.inflight_count() == 0
        assert h.rt.stats()["greenlets_created"] == 128

    def test_a_resumed_context_stays_waiting_until_switched_in(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.run()
        h.resume(h.last_wait("c1"), {"usd": 1})
        ctx = h.rt.get_context("c1")
        assert ctx is not None and ctx.state.value == "WAITING_IO" and ctx.queued
        h.run()
        assert h.output("c1")["row"] == {"usd": 1}


class TestResidentGreenlets:
    def test_sequential_calls_reuse_one_resident_greenlet(self, h: Harness) -> None:
        source = "def _(p):\n    return p\n"
        for i in range(50):
            h.execute(f"c{i}", source, i)
            h.run()
        stats = h.rt.stats()
        assert stats["greenlets_created"] == 1
        assert stats["idle_greenlets"] == 1

    def test_the_idle_pool_is_bounded(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_inflight=0)
        count = POOL_MAX_IDLE + 20
        for i in range(count):
            h.execute(f"c{i}", READ, i)
        h.run()
        for wait in h.waits(kind=keys.WAIT_IO):
            h.resume(wait, None)
        h.run()
        stats = h.rt.stats()
        assert stats["idle_greenlets"] == POOL_MAX_IDLE
        assert stats["greenlets_retired"] == 20
        assert len(live_call_greenlets()) == POOL_MAX_IDLE

    def test_no_context_keeps_a_greenlet_after_it_ends(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.execute("c2", "def _(p):\n    raise ValueError(p)\n", 2)
        h.run()
        ctx = h.rt.get_context("c1")
        assert ctx is not None
        h.resume(h.last_wait("c1"), None)
        h.run()
        assert ctx.greenlet is None and ctx.finished
        assert len(live_call_greenlets()) == h.rt.stats()["idle_greenlets"]


class TestSleepReadyPriority:
    SOURCE = dedent(
        """
        import time

        def _(p):
            if p != "runnable":
                time.sleep(1)
            record(p)
        """
    )

    def test_sleep_ready_contexts_yield_to_a_runnable_one_after_64_in_a_row(
        self, h: Harness
    ) -> None:
        for i in range(100):
            h.execute(f"s{i}", self.SOURCE, i)
        h.run()
        assert h.rt.stats()["sleeping"] == 100
        h.execute("r", self.SOURCE, "runnable")
        h.clock.advance(2)
        h.run()
        assert len(h.records) == 101
        assert h.records.index("runnable") == SLEEP_READY_STREAK
        assert h.records[:SLEEP_READY_STREAK] == list(range(SLEEP_READY_STREAK))

    def test_sleep_ready_goes_first_when_under_the_streak(self, h: Harness) -> None:
        for i in range(3):
            h.execute(f"s{i}", self.SOURCE, i)
        h.run()
        h.execute("r", self.SOURCE, "runnable")
        h.clock.advance(2)
        h.run()
        assert h.records == [0, 1, 2, "runnable"]


class TestRunUntilIdle:
    def test_next_scheduler_delay(self, h: Harness) -> None:
        assert h.rt.next_scheduler_delay(None) is None
        assert h.rt.next_scheduler_delay(5.0) == 5.0
        h.execute("c1", "import time\ndef _(p):\n    time.sleep(0.25)\n", None)
        assert h.rt.next_scheduler_delay(None) == 0.0
        h.run()
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.25)
        assert h.rt.next_scheduler_delay(0.1) == pytest.approx(0.1)
        h.clock.advance(0.1)
        assert h.rt.next_scheduler_delay(None) == pytest.approx(0.15)
        h.clock.advance(0.2)
        assert h.rt.next_scheduler_delay(None) == 0.0
        h.run()
        assert h.terminal("c1")[keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED
        assert h.rt.next_scheduler_delay(None) is None

    def test_run_until_idle_is_not_reentrant(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        holder: dict[str, Any] = {}
        h = make_harness(prelude={"holder": holder})
        holder["rt"] = h.rt
        h.execute("c1", "def _(p):\n    holder['rt'].run_until_idle()\n", None)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert "not re-entrant" in failure[keys.FP_ERROR_MESSAGE]

    def test_a_call_looping_on_sleep_zero_does_not_pin_run_until_idle(self, h: Harness) -> None:
        h.execute("c1", "import time\ndef _(p):\n    while True:\n        time.sleep(0)\n", None)
        h.run()  # returns although the call never finishes
        assert h.state("c1") == "WAITING_SLEEP"  # between passes a call never runs
        assert h.rt.next_scheduler_delay(None) == 0.0
        h.cancel("c1")
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED


class FakeSession:
    def __init__(self) -> None:
        self.incoming: list[Frame] = []
        self.sent: list[tuple[dict[str, Any], bytes | None]] = []
        self.connected = True

    def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        if not self.connected:
            raise ConnectionError("gone")
        frame = decode_frame(encode_frame(envelope, sidecar))
        self.sent.append((frame.envelope, frame.sidecar))

    def drain_incoming(self) -> list[Frame]:
        frames, self.incoming = self.incoming, []
        return frames

    def is_connected(self) -> bool:
        return self.connected


class TestWithASession:
    def test_frames_flow_through_the_session(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        session = FakeSession()
        h = make_harness(session=session)
        digest = h.add_source(READ)
        session.incoming.append(
            Frame(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
                    keys.F_CALL_ID: "c1",
                    keys.F_PAYLOAD: {
                        keys.FP_TASK_ID: "t1",
                        keys.FP_FUNCTION_ID: "fn",
                        keys.FP_FUNCTION_CODE_DIGEST: digest,
                        keys.FP_ARGS: 5,
                    },
                }
            )
        )
        h.rt.run_until_idle()
        ((code_wait, _),) = session.sent
        assert code_wait[keys.F_PAYLOAD][keys.FP_WAIT_KIND] == keys.WAIT_FUNCTION_CODE
        session.incoming.append(
            Frame(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
                    keys.F_CALL_ID: "c1",
                    keys.F_REQUEST_ID: code_wait[keys.F_REQUEST_ID],
                    keys.F_PAYLOAD: {
                        keys.FP_RESUME_KIND: keys.WAIT_FUNCTION_CODE,
                        keys.FP_RESULT: {
                            keys.FP_SOURCE: READ,
                            keys.FP_FUNCTION_CODE_DIGEST: digest,
                        },
                    },
                }
            )
        )
        h.rt.run_until_idle()
        io_wait = session.sent[-1][0]
        assert io_wait[keys.F_PAYLOAD][keys.FP_WAIT_KIND] == keys.WAIT_IO
        session.incoming.append(
            Frame(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
                    keys.F_CALL_ID: "c1",
                    keys.F_REQUEST_ID: io_wait[keys.F_REQUEST_ID],
                    keys.F_PAYLOAD: {keys.FP_RESUME_KIND: keys.WAIT_IO, keys.FP_RESULT: 9},
                }
            )
        )
        h.rt.run_until_idle()
        done = session.sent[-1][0]
        assert done[keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED
        assert done[keys.F_PAYLOAD][keys.FP_OUTPUT] == {"key": 5, "row": 9}
        assert all(env[keys.F_EXECUTOR_ID] == "exec-1" for env, _ in session.sent)
        assert h.rt.drain_outbox() == []

    def test_a_disconnected_session_ends_every_call_without_frames(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        session = FakeSession()
        h = make_harness(session=session)
        h.add_source(READ)
        for i in range(3):
            h.execute(f"c{i}", READ, i)
        h.rt.run_until_idle()
        code_wait = session.sent[0][0]
        h.resume(
            code_wait,
            {
                keys.FP_SOURCE: READ,
                keys.FP_FUNCTION_CODE_DIGEST: code_wait[keys.F_PAYLOAD][
                    keys.FP_FUNCTION_CODE_DIGEST
                ],
            },
        )
        h.rt.run_until_idle()
        sent_before = len(session.sent)
        session.connected = False
        h.rt.run_until_idle()
        assert h.rt.inflight_count() == 0
        assert len(session.sent) == sent_before
        assert h.rt.stats()["transport_lost_calls"] == 3


class EchoingSession(FakeSession):
    """A worker that answers every io wait at once: the ResumeCall is waiting to be
    drained before run_until_idle's pass ends. It also counts the drains."""

    def __init__(self) -> None:
        super().__init__()
        self.drains = 0

    def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        super().send_message(envelope, sidecar)
        payload = envelope[keys.F_PAYLOAD]
        if envelope[keys.F_MESSAGE_TYPE] == keys.MT_CALL_WAITING:
            self.incoming.append(
                Frame(
                    {
                        keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
                        keys.F_CALL_ID: envelope[keys.F_CALL_ID],
                        keys.F_REQUEST_ID: envelope[keys.F_REQUEST_ID],
                        keys.F_PAYLOAD: {
                            keys.FP_RESUME_KIND: payload[keys.FP_WAIT_KIND],
                            keys.FP_RESULT: 7,
                        },
                    }
                )
            )

    def drain_incoming(self) -> list[Frame]:
        self.drains += 1
        return super().drain_incoming()

    def has_incoming(self) -> bool:
        return bool(self.incoming)


class TestPasses:
    def _execute(self, h: Harness, call_id: str, source: str) -> None:
        digest = h.add_source(source)
        h.rt.registry.compile_source("fn", digest, source)
        h.execute(call_id, digest=digest, args=1)

    def test_frames_that_arrive_during_a_pass_are_handled_in_the_same_run(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        session = EchoingSession()
        h = make_harness(session=session)
        self._execute(h, "c1", READ)
        h.rt.run_until_idle()  # waits, is answered, resumes, completes
        done = session.sent[-1][0]
        assert done[keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED
        assert done[keys.F_PAYLOAD][keys.FP_OUTPUT] == {"key": 1, "row": 7}

    def test_no_second_pass_when_nothing_can_have_arrived(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        session = EchoingSession()
        h = make_harness(session=session)
        self._execute(h, "c1", ECHO)
        h.rt.run_until_idle()
        assert session.sent[-1][0][keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED
        assert session.drains == 1

    def test_a_pending_timer_keeps_the_passes_going(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        session = EchoingSession()
        h = make_harness(session=session)
        self._execute(h, "c1", "import time\ndef _(p):\n    time.sleep(0)\n    return p\n")
        h.rt.run_until_idle()  # sleeps, the timer is due at once, wakes, completes
        assert session.sent[-1][0][keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED

"""Attempts and request ids: replacement, duplicates, and ResumeCall matching."""

from __future__ import annotations

import re
from textwrap import dedent

from executor_harness import Harness

from blockx.wire import keys

READ = dedent(
    """
    from blockx.sdk import db

    def _(p):
        try:
            return {"row": db.get("t", p)}
        finally:
            record(("finally", p))
    """
)


class TestAttemptReplacement:
    def test_a_higher_attempt_replaces_a_waiting_one_without_a_terminal_frame(
        self, h: Harness
    ) -> None:
        h.execute("c1", READ, 1, attempt_seq=1)
        h.run()
        old_wait = h.last_wait("c1")
        old_ctx = h.rt.get_context("c1")
        h.execute("c1", READ, 2, attempt_seq=2)
        assert old_ctx is not None and old_ctx.stale and old_ctx.finished
        assert h.records == [("finally", 1)]
        h.run()
        new_wait = h.last_wait("c1")
        assert new_wait[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ] == 2
        h.resume(old_wait, "old")  # the old attempt's answer arrives late
        h.run()
        assert h.rt.stats()["stale_resume_dropped"] == 1
        h.resume(new_wait, "new")
        h.run()
        (terminal,) = h.terminals("c1")
        assert terminal[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ] == 2
        assert terminal[keys.F_PAYLOAD][keys.FP_OUTPUT] == {"row": "new"}
        assert h.rt.stats()["attempts_replaced"] == 1

    def test_replacing_a_runnable_attempt_never_runs_it(self, h: Harness) -> None:
        h.execute("c1", READ, 1, attempt_seq=1)
        h.execute("c1", READ, 2, attempt_seq=3)
        h.run()
        h.resume(h.last_wait("c1"), "x")
        h.run()
        assert h.records == [("finally", 2)]
        assert [t[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ] for t in h.terminals("c1")] == [3]

    def test_replacing_a_sleeping_attempt(self, h: Harness) -> None:
        source = "import time\ndef _(p):\n    time.sleep(5)\n    return p\n"
        h.execute("c1", source, 1, attempt_seq=1)
        h.run()
        h.execute("c1", source, 2, attempt_seq=2)
        h.run()
        h.clock.advance(6)
        h.run()
        (terminal,) = h.terminals("c1")
        assert terminal[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ] == 2
        assert terminal[keys.F_PAYLOAD][keys.FP_OUTPUT] == 2

    def test_an_equal_or_lower_attempt_is_a_duplicate(self, h: Harness) -> None:
        h.execute("c1", READ, 1, attempt_seq=2)
        h.run()
        h.execute("c1", READ, 1, attempt_seq=2)
        h.execute("c1", READ, 1, attempt_seq=1)
        assert h.run() == []
        assert h.rt.stats()["duplicate_execute_dropped"] == 2
        assert h.state("c1") == "WAITING_IO"
        assert h.rt.get_context("c1").attempt_seq == 2  # type: ignore[union-attr]

    def test_a_replacement_is_admitted_at_capacity(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_inflight=1)
        h.execute("c1", READ, 1, attempt_seq=1)
        h.run()
        h.execute("c2", READ, 2)
        h.execute("c1", READ, 3, attempt_seq=2)
        h.run()
        refused = h.failure("c2")
        assert refused[keys.FP_ERROR_KIND] == keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED
        assert refused[keys.FP_RETRYABLE] is True
        assert h.rt.get_context("c1").attempt_seq == 2  # type: ignore[union-attr]
        assert h.state("c1") == "WAITING_IO"

    def test_attempt_seq_defaults_to_one(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    return p\n", 1)
        h.run()
        assert h.payload("c1")[keys.FP_ATTEMPT_SEQ] == 1


class TestRequestIds:
    def test_request_ids_carry_the_process_instance_and_a_rising_sequence(
        self, make_harness
    ) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(process_instance_id="p0c3ss")
        for i in range(3):
            h.execute(f"c{i}", READ, i)
        h.run()
        ids = [w[keys.F_REQUEST_ID] for w in h.waits()]
        assert ids == [f"req-p0c3ss-{n}" for n in range(1, len(ids) + 1)]

    def test_the_default_process_instance_id_is_twelve_hex_digits(self, h: Harness) -> None:
        assert re.fullmatch(r"[0-9a-f]{12}", h.rt.process_instance_id)
        assert h.rt.next_request_id().startswith(f"req-{h.rt.process_instance_id}-")


class TestResumeMatching:
    def _waiting(self, h: Harness) -> dict:  # type: ignore[type-arg]
        h.execute("c1", READ, 1)
        h.run()
        return h.last_wait("c1")

    def test_a_resume_with_another_request_id_is_stale(self, h: Harness) -> None:
        wait = self._waiting(h)
        h.resume(wait, "x", request_id="req-other-1")
        h.run()
        assert h.rt.stats()["stale_resume_dropped"] == 1
        assert h.state("c1") == "WAITING_IO"

    def test_a_resume_of_the_wrong_kind_is_stale(self, h: Harness) -> None:
        wait = self._waiting(h)
        h.resume(wait, "x", kind=keys.WAIT_SUBCALL)
        h.resume(wait, "x", kind=keys.WAIT_FUNCTION_CODE)
        h.run()
        assert h.rt.stats()["stale_resume_dropped"] == 2
        h.resume(wait, "right")
        h.run()
        assert h.output("c1") == {"row": "right"}

    def test_a_resume_for_an_unknown_call_is_stale(self, h: Harness) -> None:
        h.resume(
            {
                keys.F_CALL_ID: "ghost",
                keys.F_REQUEST_ID: "req-1",
                keys.F_PAYLOAD: {keys.FP_WAIT_KIND: "io"},
            },
            1,
        )
        assert h.rt.stats()["stale_resume_dropped"] == 1

    def test_a_second_resume_for_the_same_request_is_stale(self, h: Harness) -> None:
        wait = self._waiting(h)
        h.resume(wait, "first")
        h.resume(wait, "second")
        h.run()
        assert h.output("c1") == {"row": "first"}
        assert h.rt.stats()["stale_resume_dropped"] == 1

    def test_a_resume_for_a_finished_call_is_stale(self, h: Harness) -> None:
        wait = self._waiting(h)
        h.resume(wait, "x")
        h.run()
        h.resume(wait, "y")
        assert h.rt.stats()["stale_resume_dropped"] == 1

    def test_a_resume_for_a_sleeping_call_is_stale(self, h: Harness) -> None:
        h.execute("c1", "import time\ndef _(p):\n    time.sleep(1)\n", None)
        h.run()
        ctx = h.rt.get_context("c1")
        assert ctx is not None
        h.resume(
            {
                keys.F_CALL_ID: "c1",
                keys.F_REQUEST_ID: "req-1",
                keys.F_PAYLOAD: {keys.FP_WAIT_KIND: "io"},
            },
            1,
        )
        assert h.rt.stats()["stale_resume_dropped"] == 1


def test_a_late_redelivery_of_an_attempt_that_already_ended_is_a_duplicate(h: Harness) -> None:
    source = "def _(x):\n    return {'x': x}\n"
    h.execute("c0", source, 1, attempt_seq=2)
    h.run()
    assert len(h.terminals("c0")) == 1
    h.execute("c0", source, 1, attempt_seq=2)  # the same attempt, delivered again
    h.execute("c0", source, 1, attempt_seq=1)  # an older one
    h.run()
    assert len(h.terminals("c0")) == 1
    assert h.rt.stats()["duplicate_execute_dropped"] == 2
    h.execute("c0", source, 2, attempt_seq=3)  # a newer attempt still runs
    h.run()
    assert [t[keys.F_PAYLOAD][keys.FP_ATTEMPT_SEQ] for t in h.terminals("c0")] == [2, 3]

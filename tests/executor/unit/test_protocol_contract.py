"""Protocol contract: ExecuteCall validation, inbound control messages, admission replies,
and every Heartbeat field (docs/protocol.md)."""

from __future__ import annotations

import threading
from textwrap import dedent
from typing import Any

import pytest
from executor_harness import Harness

from blockx.wire import keys, schema, validate

READ = dedent(
    """
    from blockx.sdk import db

    def _(p):
        return db.get("t", p)
    """
)


def _execute_envelope(call_id: Any, payload: Any) -> dict[str, Any]:
    envelope: dict[str, Any] = {keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL, keys.F_PAYLOAD: payload}
    if call_id is not None:
        envelope[keys.F_CALL_ID] = call_id
    return envelope


GOOD = {
    keys.FP_TASK_ID: "t1",
    keys.FP_FUNCTION_ID: "fn",
    keys.FP_FUNCTION_CODE_DIGEST: "sha256:" + "0" * 64,
}


class TestExecuteCallValidation:
    @pytest.mark.parametrize(
        ("change", "named"),
        [
            ({keys.FP_TASK_ID: None}, keys.FP_TASK_ID),
            ({keys.FP_FUNCTION_ID: 3}, keys.FP_FUNCTION_ID),
            ({keys.FP_FUNCTION_CODE_DIGEST: None}, keys.FP_FUNCTION_CODE_DIGEST),
            ({keys.FP_CALL_BUDGET_MS: "100"}, keys.FP_CALL_BUDGET_MS),
            ({keys.FP_CALL_BUDGET_MS: -1}, keys.FP_CALL_BUDGET_MS),
            ({keys.FP_CALL_BUDGET_MS: 1.5}, keys.FP_CALL_BUDGET_MS),
            ({keys.FP_CALL_BUDGET_MS: 100.0}, keys.FP_CALL_BUDGET_MS),
            ({keys.FP_CALL_BUDGET_MS: True}, keys.FP_CALL_BUDGET_MS),
            ({keys.FP_CALL_BUDGET_MS: -(10**30)}, keys.FP_CALL_BUDGET_MS),
            ({keys.FP_CALL_BUDGET_MS: [1]}, keys.FP_CALL_BUDGET_MS),
            ({keys.FP_ATTEMPT_SEQ: 0}, keys.FP_ATTEMPT_SEQ),
            ({keys.FP_ATTEMPT_SEQ: True}, keys.FP_ATTEMPT_SEQ),
            ({keys.FP_ANCESTRY: "k1"}, keys.FP_ANCESTRY),
            ({keys.FP_ANCESTRY: [1]}, keys.FP_ANCESTRY),
            ({keys.FP_DEBUG: "yes"}, keys.FP_DEBUG),
            ({keys.FP_PARENT_CALL_ID: 5}, keys.FP_PARENT_CALL_ID),
            ({keys.FP_AUDIT: "on"}, keys.FP_AUDIT),
            ({keys.FP_ENTRY_SELECTOR: 1}, keys.FP_ENTRY_SELECTOR),
        ],
    )
    def test_a_malformed_execute_call_is_refused_as_a_non_retryable_protocol_error(
        self, h: Harness, change: dict[str, Any], named: str
    ) -> None:
        payload = {**GOOD, keys.FP_ATTEMPT_SEQ: 2}
        for key, value in change.items():
            if value is None:
                payload.pop(key)
            else:
                payload[key] = value
        h.send(_execute_envelope("c1", payload))
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_PROTOCOL_ERROR
        assert failure[keys.FP_RETRYABLE] is False
        assert named in failure[keys.FP_ERROR_MESSAGE]
        assert h.rt.inflight_count() == 0

    def test_a_payload_that_is_not_an_object_fails_that_call(self, h: Harness) -> None:
        h.send(_execute_envelope("c1", [1, 2]))
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_PROTOCOL_ERROR
        assert failure[keys.FP_TASK_ID] == ""

    def test_an_execute_call_without_a_call_id_is_dropped(self, h: Harness) -> None:
        h.send(_execute_envelope(None, GOOD))
        assert h.run() == []
        assert h.rt.stats()["invalid_message_dropped"] == 1

    def test_a_malformed_execute_call_never_disturbs_the_live_attempt(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.run()
        h.send(_execute_envelope("c1", {keys.FP_TASK_ID: "t1"}))
        assert h.run() == []
        assert h.state("c1") == "WAITING_IO"
        assert h.rt.stats()["invalid_message_dropped"] == 1

    def test_a_malformed_newer_attempt_replaces_the_live_one_and_fails(self, h: Harness) -> None:
        # attemptSeq 2 names a new attempt: the worker now waits for attempt 2's terminal
        # frame and will drop attempt 1's. Dropping the frame would leave it waiting forever.
        h.execute("c1", READ, 1)
        h.run()
        h.send(_execute_envelope("c1", {keys.FP_TASK_ID: "t1", keys.FP_ATTEMPT_SEQ: 2}))
        h.run()
        failure = h.failure("c1")  # exactly one terminal frame for c1, and it is attempt 2's
        assert failure[keys.FP_ATTEMPT_SEQ] == 2
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_PROTOCOL_ERROR
        assert h.rt.inflight_count() == 0
        stats = h.rt.stats()
        assert stats["attempts_replaced"] == 1
        assert stats["calls_refused"] == 1
        assert stats["invalid_message_dropped"] == 0

    def test_optional_keys_take_their_defaults(self, h: Harness) -> None:
        h.execute("c1", "def _(p):\n    return p\n")
        h.run()
        ctx_payload = h.payload("c1")
        assert ctx_payload[keys.FP_OUTPUT] is None
        assert ctx_payload[keys.FP_ATTEMPT_SEQ] == 1
        assert ctx_payload[keys.FP_DEBUG_OUTPUT] is None


class TestInboundControlMessages:
    def test_unknown_message_types_are_dropped_and_counted(self, h: Harness) -> None:
        h.send({keys.F_MESSAGE_TYPE: "Hello", keys.F_PAYLOAD: {}})
        h.send({keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT, keys.F_PAYLOAD: {}})  # wrong direction
        assert h.run() == []
        assert h.rt.stats()["unknown_message_dropped"] == 2

    @pytest.mark.parametrize("envelope", [{}, {keys.F_MESSAGE_TYPE: 7}, [], "frame", None])
    def test_frames_without_a_message_type_are_dropped(self, h: Harness, envelope: Any) -> None:
        h.send(envelope)
        assert h.run() == []
        assert h.rt.stats()["invalid_message_dropped"] == 1

    def test_heartbeat_acks_are_harmless(self, h: Harness) -> None:
        h.send({keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT_ACK})
        h.send({keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT_ACK, keys.F_PAYLOAD: {}})
        assert h.run() == []
        assert h.rt.stats()["heartbeat_acks"] == 2

    @pytest.mark.parametrize("payload", [None, {}, {keys.FP_REASON: 5}, {keys.FP_ATTEMPT_SEQ: "x"}])
    def test_cancel_payload_defaults(self, h: Harness, payload: Any) -> None:
        h.execute("c1", READ, 1)
        h.run()
        envelope = {keys.F_MESSAGE_TYPE: keys.MT_CANCEL_CALL, keys.F_CALL_ID: "c1"}
        if payload is not None:
            envelope[keys.F_PAYLOAD] = payload
        h.send(envelope)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_CANCELLED
        assert keys.DEFAULT_CANCEL_REASON in failure[keys.FP_ERROR_MESSAGE]

    def test_a_resume_call_without_a_request_id_is_dropped(self, h: Harness) -> None:
        h.execute("c1", READ, 1)
        h.run()
        h.send({keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL, keys.F_CALL_ID: "c1", keys.F_PAYLOAD: {}})
        h.run()
        assert h.state("c1") == "WAITING_IO"
        assert h.rt.stats()["invalid_message_dropped"] == 1

    @pytest.mark.parametrize(
        "payload",
        [
            [],
            {keys.FP_RESUME_KIND: 3},
            {keys.FP_RESUME_KIND: "io", keys.FP_ERROR: "boom"},
            {keys.FP_RESUME_KIND: "io", keys.FP_ERROR: {"message": "no kind"}},
            {keys.FP_RESUME_KIND: "io", keys.FP_ERROR: {"kind": "x", "retryable": "yes"}},
            {keys.FP_RESUME_KIND: "io", keys.FP_BUDGET_USED_MS: -5},
            {keys.FP_RESUME_KIND: "io", keys.FP_BUDGET_USED_MS: 1.5},
        ],
    )
    def test_a_malformed_resume_for_the_pending_wait_fails_that_call(
        self, h: Harness, payload: Any
    ) -> None:
        h.execute("c1", READ, 1)
        h.run()
        wait = h.last_wait("c1")
        h.send(
            {
                keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
                keys.F_CALL_ID: "c1",
                keys.F_REQUEST_ID: wait[keys.F_REQUEST_ID],
                keys.F_PAYLOAD: payload,
            }
        )
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_INTERNAL_ERROR
        assert failure[keys.FP_RETRYABLE] is True
        assert "malformed ResumeCall" in failure[keys.FP_ERROR_MESSAGE]


class TestAdmission:
    def test_top_level_calls_beyond_max_inflight_are_refused_retryably(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_inflight=2)
        for i in range(3):
            h.execute(f"c{i}", READ, i, attempt_seq=4)
        h.run()
        refused = h.failure("c2")
        assert refused[keys.FP_ERROR_KIND] == keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED
        assert refused[keys.FP_RETRYABLE] is True
        assert refused[keys.FP_ATTEMPT_SEQ] == 4
        assert h.rt.inflight_count() == 2
        h.resume(h.last_wait("c0"), 0)
        h.run()
        h.execute("c3", READ, 3)  # a slot is free again
        h.run()
        assert h.state("c3") == "WAITING_IO"

    def test_max_inflight_zero_means_unlimited(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_inflight=0)
        for i in range(300):
            h.execute(f"c{i}", READ, i)
        h.run()
        assert h.rt.inflight_count() == 300
        assert h.rt.build_heartbeat()[keys.FP_AVAILABLE_CONTEXTS] == keys.UNLIMITED_CONTEXTS

    def test_the_runtime_marks_the_process_as_an_executor(self, h: Harness) -> None:
        import os
        import time

        from blockx.executor.sleep_patch import is_sleep_patch_installed

        assert os.environ["BLOCKX_EXECUTOR_RUNTIME"] == "1"
        assert is_sleep_patch_installed()
        assert time.sleep.__name__ == "sleep"


class FakeMetrics:
    def sample_memory_bytes(self) -> int:
        return 123_456_789

    def sample_cpu(self) -> tuple[float, float]:
        return (0.25, 12.5)


class TestHeartbeat:
    def test_every_field_is_present_and_typed(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(metrics=FakeMetrics(), process_instance_id="abc123", max_inflight=10)
        h.execute("c1", READ, 1)
        h.execute("c2", "import time\ndef _(p):\n    time.sleep(1)\n", None)
        h.run()
        h.execute("c3", READ, 3)  # admitted, not run yet
        h.execute("c4", READ, 4)
        h.run()
        h.resume(h.last_wait("c4"), 4)  # resumed, queued
        h.rt.handle_inbound_message({keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT_ACK})
        h.execute("c5", READ, 5)  # admitted, never run
        beat = h.rt.build_heartbeat()
        validate(schema.HeartbeatPayload, beat)  # validates every key and type
        assert set(beat) == {
            keys.FP_EXECUTOR_ID,
            keys.FP_HEARTBEAT_SEQ,
            keys.FP_RUNNABLE_COUNT,
            keys.FP_INFLIGHT_COUNT,
            keys.FP_AVAILABLE_CONTEXTS,
            keys.FP_MEMORY_BYTES,
            keys.FP_EXECUTOR_CPU_UTILIZATION,
            keys.FP_EXECUTOR_CPU_SECONDS_TOTAL,
            keys.FP_EXECUTOR_PROCESS_INSTANCE_ID,
            keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS,
            keys.FP_RUNNING_CALL_ID,
            keys.FP_RUNNING_FOR_MS,
            keys.FP_RUNNING_CALL_BUDGET_MS,
            keys.FP_CALL_STATE_COUNTS,
            keys.FP_SENT_AT_MS,
            keys.FP_FEATURES,
        }
        assert list(beat[keys.FP_FEATURES]) == ["batch"]  # docs/protocol.md "Batched frames"
        assert beat[keys.FP_EXECUTOR_ID] == "exec-1"
        assert beat[keys.FP_HEARTBEAT_SEQ] == 1
        assert beat[keys.FP_INFLIGHT_COUNT] == 5
        assert beat[keys.FP_AVAILABLE_CONTEXTS] == 5
        assert beat[keys.FP_RUNNABLE_COUNT] == 2  # c4 (resumed) and c5 (new)
        assert beat[keys.FP_CALL_STATE_COUNTS] == {
            "RUNNABLE": 1,
            "RUNNING": 0,
            "WAITING_IO": 3,
            "WAITING_SUBCALL": 0,
            "WAITING_FUNCTION_CODE": 0,
            "WAITING_SLEEP": 1,
        }
        assert beat[keys.FP_MEMORY_BYTES] == 123_456_789
        assert beat[keys.FP_EXECUTOR_CPU_UTILIZATION] == 0.25
        assert beat[keys.FP_EXECUTOR_CPU_SECONDS_TOTAL] == 12.5
        assert beat[keys.FP_EXECUTOR_PROCESS_INSTANCE_ID] == "abc123"
        assert beat[keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS] == h.wall_ms
        assert beat[keys.FP_RUNNING_CALL_ID] is None
        assert beat[keys.FP_RUNNING_FOR_MS] == 0
        assert beat[keys.FP_RUNNING_CALL_BUDGET_MS] == 0
        assert beat[keys.FP_SENT_AT_MS] == h.wall_ms
        assert h.rt.build_heartbeat()[keys.FP_HEARTBEAT_SEQ] == 2

    def test_last_scheduler_activity_moves_with_run_until_idle(self, h: Harness) -> None:
        h.run()
        h.wall_ms += 5000
        assert h.rt.build_heartbeat()[keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS] == h.wall_ms - 5000
        h.run()
        assert h.rt.build_heartbeat()[keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS] == h.wall_ms

    def test_without_metrics_the_samples_are_zero(self, h: Harness) -> None:
        beat = h.rt.build_heartbeat()
        assert beat[keys.FP_MEMORY_BYTES] == 0
        assert beat[keys.FP_EXECUTOR_CPU_UTILIZATION] == 0.0

    def test_running_call_id_names_the_call_on_its_greenlet(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        holder: dict[str, Any] = {}
        h = make_harness(prelude={"holder": holder})
        holder["rt"] = h.rt
        h.execute(
            "c1", "def _(p):\n    return holder['rt'].build_heartbeat()['runningCallId']\n", None
        )
        h.run()
        assert h.output("c1") == "c1"

    def test_building_heartbeats_from_another_thread_while_calls_run(self, make_harness) -> None:  # type: ignore[no-untyped-def]
        h = make_harness(max_inflight=0)
        stop = threading.Event()
        beats: list[dict[str, Any]] = []
        errors: list[BaseException] = []

        def beat() -> None:
            while not stop.is_set():
                try:
                    beats.append(h.rt.build_heartbeat())
                except BaseException as exc:  # pragma: no cover - the failure we look for
                    errors.append(exc)

        thread = threading.Thread(target=beat)
        thread.start()
        try:
            for round_ in range(20):
                for i in range(50):
                    h.execute(f"c{round_}-{i}", READ, i)
                h.run()
                for wait in h.waits(kind=keys.WAIT_IO)[-50:]:
                    h.resume(wait, 1)
                h.run()
        finally:
            stop.set()
            thread.join()
        assert errors == []
        assert beats
        seqs = [b[keys.FP_HEARTBEAT_SEQ] for b in beats]
        assert seqs == list(range(1, len(seqs) + 1))


def test_the_executor_imports_nothing_from_the_worker() -> None:
    import subprocess
    import sys

    code = (
        "import sys, blockx.executor.runtime, blockx.executor.__main__, blockx.function, blockx.sdk\n"
        "bad = sorted(m for m in sys.modules if m.startswith('blockx.worker'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_framework_signals_are_base_exceptions() -> None:
    from blockx.executor import sdk_bridge
    from blockx.executor.errors import CallCancelledError, CallDeadlineExceededError

    for cls in (CallCancelledError, CallDeadlineExceededError):
        assert issubclass(cls, BaseException) and not issubclass(cls, Exception)
    assert sdk_bridge.CallCancelledError is CallCancelledError

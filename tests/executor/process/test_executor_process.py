"""The executor as a process: a real ``python -m blockx.executor`` over a real Unix socket,
driven by the test-side worker (tests/helpers/fake_worker.py), which plays the
worker's dispatcher, code view and IO backends."""

from __future__ import annotations

import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from tests.helpers.fake_worker import FakeWorker, IoReply, digest_of, process_is_gone

from blockx.wire import Frame, keys, schema, validate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

StartWorker = Callable[..., FakeWorker]

REQUEST_ID = re.compile(r"req-.+-\d+")

PARENT = """\
from blockx.sdk import get_provider


def _(p):
    row = get_provider().read_req("blockdb", "get_row", {"table": "prices", "key": p["token"]}, cache_key="prices:" + p["token"])
    bal = get_provider().read_req("rpc", "eth_getBalance", {"address": p["addr"]})
    child = function.call("adder", {"left": row["usd"], "right": bal["wei"]})
    return {"sum": child["sum"], "usd": row["usd"], "wei": bal["wei"]}
"""

ADDER = """\
def _(p):
    return {"sum": p["left"] + p["right"]}
"""

ONE_READ = """\
from blockx.sdk import get_provider


def _(i):
    value = get_provider().read_req("blockdb", "get_row", {"i": i})
    return {"i": i, "value": value["v"]}
"""

ECHO = """\
def _(x):
    return {"y": x + 1}
"""


def _payload(frame: Frame) -> dict[str, Any]:
    return frame.envelope[keys.F_PAYLOAD]


def _assert_waiting(frame: Frame, call_id: str, wait_kind: str) -> dict[str, Any]:
    assert frame.message_type == keys.MT_CALL_WAITING, frame.envelope
    assert frame.envelope[keys.F_CALL_ID] == call_id
    payload = _payload(frame)
    assert payload[keys.FP_WAIT_KIND] == wait_kind, payload
    assert REQUEST_ID.fullmatch(frame.envelope[keys.F_REQUEST_ID])
    return payload


def _assert_completed(frame: Frame) -> dict[str, Any]:
    assert frame.message_type == keys.MT_CALL_COMPLETED, frame.envelope
    return _payload(frame)


def _assert_failed(frame: Frame, error_kind: str) -> dict[str, Any]:
    assert frame.message_type == keys.MT_CALL_FAILED, frame.envelope
    payload = _payload(frame)
    assert payload[keys.FP_ERROR_KIND] == error_kind, payload
    return payload


def _assert_alive(worker: FakeWorker, call_id: str = "alive-check") -> None:
    worker.execute_call(call_id, source=ECHO, function_id="echo", args=41)
    assert _assert_completed(worker.wait_terminal(call_id))[keys.FP_OUTPUT] == {"y": 42}


# --- one call, all the way ------------------------------------------------------------


def test_a_call_through_code_fetch_two_io_waits_and_a_sub_call(start_worker: StartWorker) -> None:
    worker = start_worker(sources={"adder": ADDER})
    worker.execute_call(
        "t1/root",
        source=PARENT,
        function_id="pricer",
        task_id="t1",
        args={"token": "eth", "addr": "0xabc"},
        call_key="pricer:root",
        call_budget_ms=30_000,
    )

    first = worker.next_frame()
    io1 = _assert_waiting(first, "t1/root", keys.WAIT_IO)
    assert worker.function_code_requests == 1  # the source was fetched by digest
    assert first.envelope[keys.F_EXECUTOR_ID] == "exec-test"
    assert io1[keys.FP_TASK_ID] == "t1"
    assert io1[keys.FP_ATTEMPT_SEQ] == 1
    assert io1[keys.FP_IO_KIND] == keys.IO_READ
    assert (io1[keys.FP_BACKEND], io1[keys.FP_OPERATION]) == ("blockdb", "get_row")
    assert io1[keys.FP_PARAMS] == {"table": "prices", "key": "eth"}
    assert io1[keys.FP_CACHE_KEY] == "prices:eth"
    worker.resume_call(
        "t1/root",
        first.envelope[keys.F_REQUEST_ID],
        keys.WAIT_IO,
        result={"usd": 3000},
        budget_used_ms=5,
    )

    second = worker.next_frame()
    io2 = _assert_waiting(second, "t1/root", keys.WAIT_IO)
    assert (io2[keys.FP_BACKEND], io2[keys.FP_OPERATION]) == ("rpc", "eth_getBalance")
    assert second.envelope[keys.F_REQUEST_ID] != first.envelope[keys.F_REQUEST_ID]
    worker.resume_call(
        "t1/root",
        second.envelope[keys.F_REQUEST_ID],
        keys.WAIT_IO,
        result={"wei": 7},
        budget_used_ms=3,
    )

    # The sub-call: the test plays the dispatcher.
    third = worker.next_frame()
    sub = _assert_waiting(third, "t1/root", keys.WAIT_SUBCALL)
    assert sub[keys.FP_FUNCTION_ID] == "adder"
    assert sub[keys.FP_ARGS] == {"left": 3000, "right": 7}
    assert sub[keys.FP_ANCESTRY] == ["pricer:root"]
    # the 30 s budget less the 8 ms of IO the worker charged and the little CPU used so far
    assert 28_000 < sub[keys.FP_GRANTED_BUDGET_MS] <= 29_992
    worker.execute_call(
        "t1/child",
        source=ADDER,
        function_id="adder",
        task_id="t1",
        args=sub[keys.FP_ARGS],
        parent_call_id="t1/root",
        ancestry=sub[keys.FP_ANCESTRY],
        call_budget_ms=sub[keys.FP_GRANTED_BUDGET_MS],
    )
    child = _assert_completed(worker.wait_terminal("t1/child"))
    assert child[keys.FP_OUTPUT] == {"sum": 3007}
    assert worker.function_code_requests == 2
    worker.resume_call(
        "t1/root",
        third.envelope[keys.F_REQUEST_ID],
        keys.WAIT_SUBCALL,
        result=child[keys.FP_OUTPUT],
        budget_used_ms=child[keys.FP_BUDGET_USED_MS],
    )

    done = _assert_completed(worker.wait_terminal("t1/root"))
    assert done[keys.FP_OUTPUT] == {"sum": 3007, "usd": 3000, "wei": 7}
    assert done[keys.FP_TASK_ID] == "t1"
    assert done[keys.FP_ATTEMPT_SEQ] == 1
    assert done[keys.FP_BUDGET_USED_MS] >= 8  # the IO time the worker charged
    assert done[keys.FP_EFFECTIVE_EXECUTION_DURATION_US] > 0
    assert worker.drain_frames() == []


def test_io_answered_with_a_sidecar_reaches_user_code_as_bytes(start_worker: StartWorker) -> None:
    source = """\
from blockx.sdk import get_provider


def _(p):
    got = get_provider().read_req("blockdb", "get_row", {"k": 1})
    return {"hex": got["data"].hex(), "meta": got.get("meta")}
"""

    def io(frame: Frame) -> IoReply:
        return IoReply(result={"meta": "m"}, sidecar=b"\x00\x01\xff")

    worker = start_worker(io_handler=io)
    worker.execute_call("c1", source=source)
    assert _assert_completed(worker.wait_terminal("c1"))[keys.FP_OUTPUT] == {
        "hex": "0001ff",
        "meta": "m",
    }


# --- many calls at once ---------------------------------------------------------------------


def test_128_calls_suspended_at_once_then_resumed(start_worker: StartWorker) -> None:
    worker = start_worker(max_inflight=128, heartbeat_interval=0.1)
    digest = worker.add_source(ONE_READ)
    worker.send_many(
        (worker.execute_call_envelope(f"c{i}", digest=digest, args=i, function_id="one_read"), None)
        for i in range(128)
    )
    waits = worker.next_frames(128, timeout=30)
    assert {f.envelope[keys.F_CALL_ID] for f in waits} == {f"c{i}" for i in range(128)}
    assert all(_payload(f)[keys.FP_WAIT_KIND] == keys.WAIT_IO for f in waits)
    assert worker.function_code_requests == 1  # one fetch for 128 calls of one digest

    beat = worker.wait_heartbeat(
        lambda f: _payload(f)[keys.FP_CALL_STATE_COUNTS].get("WAITING_IO") == 128
    )
    assert _payload(beat)[keys.FP_INFLIGHT_COUNT] == 128
    assert _payload(beat)[keys.FP_AVAILABLE_CONTEXTS] == 0

    worker.send_many(
        (
            worker.resume_envelope(
                f.envelope[keys.F_CALL_ID],
                f.envelope[keys.F_REQUEST_ID],
                keys.WAIT_IO,
                result={"v": _payload(f)[keys.FP_PARAMS]["i"] * 10},
            ),
            None,
        )
        for f in waits
    )
    done = worker.collect_terminals([f"c{i}" for i in range(128)], timeout=30)
    for i in range(128):
        assert _assert_completed(done[f"c{i}"])[keys.FP_OUTPUT] == {"i": i, "value": i * 10}
    worker.wait_heartbeat(lambda f: _payload(f)[keys.FP_INFLIGHT_COUNT] == 0)


def test_call_129_at_max_inflight_128_is_refused_retryable(start_worker: StartWorker) -> None:
    worker = start_worker(max_inflight=128)
    digest = worker.add_source(ONE_READ)
    worker.send_many(
        (worker.execute_call_envelope(f"c{i}", digest=digest, args=i), None) for i in range(128)
    )
    waits = worker.next_frames(128, timeout=30)
    worker.execute_call("c128", digest=digest, args=128)
    refused = _assert_failed(worker.wait_terminal("c128"), keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED)
    assert refused[keys.FP_RETRYABLE] is True
    # The resident calls are unaffected and finish.
    worker.send_many(
        (
            worker.resume_envelope(
                f.envelope[keys.F_CALL_ID],
                f.envelope[keys.F_REQUEST_ID],
                keys.WAIT_IO,
                result={"v": 0},
            ),
            None,
        )
        for f in waits
    )
    done = worker.collect_terminals([f"c{i}" for i in range(128)], timeout=30)
    assert all(f.message_type == keys.MT_CALL_COMPLETED for f in done.values())
    # A slot is free again.
    worker.execute_call("c129", digest=digest, args=129)
    retry = worker.next_frame()
    _assert_waiting(retry, "c129", keys.WAIT_IO)


# --- budgets and errors ------------------------------------------------------------------------


def test_a_pure_cpu_loop_is_preempted_at_its_budget(start_worker: StartWorker) -> None:
    worker = start_worker()
    spin = "def _(p):\n    while True:\n        pass\n"
    start = time.monotonic()
    worker.execute_call("spin", source=spin, call_budget_ms=300)
    failed = _assert_failed(worker.wait_terminal("spin", timeout=20), keys.ERR_DEADLINE_EXCEEDED)
    elapsed = time.monotonic() - start
    assert failed[keys.FP_RETRYABLE] is False
    assert 0.25 < elapsed < 10, elapsed
    assert failed[keys.FP_BUDGET_USED_MS] >= 250
    _assert_alive(worker)


def test_a_cancel_ends_a_pure_cpu_loop_with_no_budget_at_once(start_worker: StartWorker) -> None:
    # The scheduler thread never gets the CancelCall back from a call that computes
    # without pause: the reader thread notes it and interrupts the call (deadline.py).
    # Before, the call spun on for good and every later call of the executor waited.
    worker = start_worker()
    spin = "def _(p):\n    while True:\n        pass\n"
    worker.execute_call("spin", source=spin, call_budget_ms=0)
    time.sleep(0.3)  # it runs
    assert worker.drain_frames() == []
    start = time.monotonic()
    worker.cancel_call("spin", reason="task_cancelled", attempt_seq=1)
    failed = _assert_failed(worker.wait_terminal("spin", timeout=20), keys.ERR_CANCELLED)
    assert time.monotonic() - start < 5
    assert "task_cancelled" in failed[keys.FP_ERROR_MESSAGE], failed
    _assert_alive(worker)


def test_a_cancel_of_another_attempt_leaves_a_running_loop_alone(start_worker: StartWorker) -> None:
    worker = start_worker()
    spin_until = (
        "import time\n"
        "def _(p):\n"
        "    end = time.monotonic() + 0.6\n"
        "    while time.monotonic() < end:\n"
        "        pass\n"
        "    return {'done': True}\n"
    )
    worker.execute_call("spin", source=spin_until, call_budget_ms=0)
    time.sleep(0.2)
    worker.cancel_call("spin", reason="task_cancelled", attempt_seq=7)  # a stale attempt
    completed = _assert_completed(worker.wait_terminal("spin", timeout=20))
    assert completed[keys.FP_OUTPUT] == {"done": True}
    _assert_alive(worker)


def test_an_io_wait_never_answered_ends_the_call_at_its_budget(start_worker: StartWorker) -> None:
    # The worker's backend would answer only after its own timeouts and retries (tens of
    # seconds): the wait is charged to the budget, so the executor ends the call at 300 ms.
    worker = start_worker()
    start = time.monotonic()
    worker.execute_call("stuck", source=ONE_READ, args=1, call_budget_ms=300)
    wait = worker.next_frame()
    _assert_waiting(wait, "stuck", keys.WAIT_IO)
    failed = _assert_failed(worker.wait_terminal("stuck", timeout=20), keys.ERR_DEADLINE_EXCEEDED)
    elapsed = time.monotonic() - start
    assert 0.25 < elapsed < 5, elapsed
    request_id = wait.envelope[keys.F_REQUEST_ID]
    message = failed[keys.FP_ERROR_MESSAGE]
    assert message.startswith("call budget of 300 ms ran out after waiting "), message
    assert f"ms on IO blockdb.get_row (request {request_id})" in message
    assert failed[keys.FP_RETRYABLE] is False
    assert 300 <= failed[keys.FP_BUDGET_USED_MS] < 400
    # The answer comes at last: dropped; the executor serves on.
    worker.resume_call("stuck", request_id, keys.WAIT_IO, result={"v": 1}, budget_used_ms=43_000)
    _assert_alive(worker)
    assert worker.drain_frames() == []


def test_a_subcall_wait_is_charged_the_childs_budget_not_the_wall_time(
    start_worker: StartWorker,
) -> None:
    # The child "queues" for a second (the test plays a dispatcher that binds it late),
    # three times the caller's whole budget, then reports 50 ms of its own.
    worker = start_worker()
    caller = "def _(p):\n    return function.call('pricer', p)\n"
    worker.execute_call("caller", source=caller, args={"x": 1}, call_budget_ms=300)
    wait = worker.next_frame()
    _assert_waiting(wait, "caller", keys.WAIT_SUBCALL)
    time.sleep(1.0)
    assert worker.drain_frames() == []  # not cut off at the caller's budget
    worker.resume_call(
        "caller",
        wait.envelope[keys.F_REQUEST_ID],
        keys.WAIT_SUBCALL,
        result={"price": 3},
        budget_used_ms=50,
    )
    done = _assert_completed(worker.wait_terminal("caller", timeout=20))
    assert done[keys.FP_OUTPUT] == {"price": 3}
    assert 50 <= done[keys.FP_BUDGET_USED_MS] < 300
    _assert_alive(worker)


def test_a_user_exception_reports_the_users_line(start_worker: StartWorker) -> None:
    worker = start_worker()
    source = (
        "def helper(x):\n"  # 1
        "    return x * 2\n"  # 2
        "\n"  # 3
        "def _(p):\n"  # 4
        "    y = helper(p)\n"  # 5
        "    raise ValueError(f'bad input {y}')\n"  # 6
    )
    worker.execute_call("boom", source=source, args=21)
    failed = _assert_failed(worker.wait_terminal("boom"), keys.ERR_USER_ERROR)
    assert failed[keys.FP_RETRYABLE] is False
    assert "bad input 42" in failed[keys.FP_ERROR_MESSAGE]
    stack = failed[keys.FP_ERROR_STACK]
    assert stack is not None and "ValueError" in stack
    assert re.search(r"line 6\b", stack), stack
    _assert_alive(worker)


def test_unknown_message_types_are_dropped_and_the_connection_lives(
    start_worker: StartWorker,
) -> None:
    worker = start_worker()
    worker.send({keys.F_MESSAGE_TYPE: "FutureThing", keys.F_PAYLOAD: {"x": 1}})
    _assert_alive(worker)


# --- heartbeats ------------------------------------------------------------------------------------


def test_heartbeats_carry_every_field_and_count_from_1(start_worker: StartWorker) -> None:
    worker = start_worker(heartbeat_interval=0.05)
    worker.wait_heartbeat(lambda f: _payload(f)[keys.FP_HEARTBEAT_SEQ] >= 4)
    beats = list(worker.heartbeats)
    required = {
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
        keys.FP_CALL_STATE_COUNTS,
        keys.FP_SENT_AT_MS,
    }
    seqs = []
    for frame in beats:
        payload = _payload(frame)
        assert required <= payload.keys(), required - payload.keys()
        validate(schema.HeartbeatPayload, payload)  # every field has its docs/protocol.md type
        assert frame.envelope[keys.F_EXECUTOR_ID] == "exec-test"
        assert keys.F_CALL_ID not in frame.envelope
        assert payload[keys.FP_EXECUTOR_ID] == "exec-test"
        assert payload[keys.FP_MEMORY_BYTES] > 1 << 20
        assert 0.0 <= payload[keys.FP_EXECUTOR_CPU_UTILIZATION] <= 1.0
        assert payload[keys.FP_EXECUTOR_CPU_SECONDS_TOTAL] > 0
        assert payload[keys.FP_AVAILABLE_CONTEXTS] == 128
        assert payload[keys.FP_INFLIGHT_COUNT] == 0
        assert payload[keys.FP_RUNNING_CALL_ID] is None
        seqs.append(payload[keys.FP_HEARTBEAT_SEQ])
    assert seqs == list(range(1, len(seqs) + 1))
    instance_ids = {_payload(f)[keys.FP_EXECUTOR_PROCESS_INSTANCE_ID] for f in beats}
    assert len(instance_ids) == 1 and "" not in instance_ids
    cpu_totals = [_payload(f)[keys.FP_EXECUTOR_CPU_SECONDS_TOTAL] for f in beats]
    assert cpu_totals == sorted(cpu_totals)


def test_unlimited_inflight_reports_1_shl_30_available(start_worker: StartWorker) -> None:
    worker = start_worker(max_inflight=0)
    assert _payload(worker.heartbeats[0])[keys.FP_AVAILABLE_CONTEXTS] == keys.UNLIMITED_CONTEXTS


def test_logs_are_json_lines_with_the_executor_id(start_worker: StartWorker) -> None:
    worker = start_worker()
    _assert_alive(worker)
    lines = worker.log_lines()
    started = [line for line in lines if line.get("msg") == "executor started"]
    assert started and started[0]["executorId"] == "exec-test"
    assert all({"ts", "level", "logger", "msg"} <= line.keys() for line in lines)


# --- the process ending --------------------------------------------------------------------------------


def test_the_socket_closed_mid_call_ends_the_executor_non_zero(start_worker: StartWorker) -> None:
    worker = start_worker()
    worker.execute_call("hanging", source=ONE_READ, args=1)
    _assert_waiting(worker.next_frame(), "hanging", keys.WAIT_IO)
    pid = worker.pid
    worker.close_socket()
    status = worker.wait_exit(timeout=10)
    assert status != 0
    assert process_is_gone(pid)
    assert any("lost its connection" in str(line.get("msg")) for line in worker.log_lines())


def test_sigterm_is_a_clean_exit_0(start_worker: StartWorker) -> None:
    worker = start_worker()
    worker.execute_call("live", source=ONE_READ, args=1)
    _assert_waiting(worker.next_frame(), "live", keys.WAIT_IO)
    worker.terminate()
    assert worker.wait_exit(timeout=10) == 0
    # The live call ended with exactly one terminal frame before the connection closed.
    worker.eof.wait(5)
    terminal = [f for f in worker.drain_frames() if f.envelope.get(keys.F_CALL_ID) == "live"]
    assert len(terminal) == 1
    assert terminal[0].message_type == keys.MT_CALL_FAILED
    assert any("shutting down on SIGTERM" in str(line.get("msg")) for line in worker.log_lines())


def test_sigterm_while_idle_exits_promptly(start_worker: StartWorker) -> None:
    worker = start_worker(heartbeat_interval=30)
    start = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert worker.wait_exit(timeout=10) == 0
    assert time.monotonic() - start < 3


LINGERING_THREAD = """
import threading

def _(x):
    threading.Thread(target=threading.Event().wait, name="user-lingerer").start()
    return {"ok": x}
"""


def test_sigterm_exits_without_waiting_for_a_thread_user_code_left_running(
    start_worker: StartWorker,
) -> None:
    """The executor leaves with os._exit once its own shutdown is done: a non-daemon thread
    user code started and never ended does not hold the exit (the interpreter's
    finalization would wait for it until the worker's SIGKILL)."""
    worker = start_worker(heartbeat_interval=30)
    worker.execute_call("lingers", source=LINGERING_THREAD, args=1)
    done = worker.next_frame()
    assert done.message_type == keys.MT_CALL_COMPLETED, done.envelope
    start = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert worker.wait_exit(timeout=10) == 0
    assert time.monotonic() - start < 3
    assert any("shutting down on SIGTERM" in str(line.get("msg")) for line in worker.log_lines())


def test_a_malformed_frame_from_the_worker_ends_the_executor_non_zero(
    start_worker: StartWorker,
) -> None:
    worker = start_worker()
    worker.send_bytes(struct.pack(">I", 9) + b"not json!")
    assert worker.wait_exit(timeout=10) != 0
    errors = [line for line in worker.log_lines() if line.get("level") == "error"]
    assert any("protocol error" in str(line.get("msg")) for line in errors), worker.stderr_text()


def test_an_oversize_frame_header_ends_the_executor_non_zero(start_worker: StartWorker) -> None:
    worker = start_worker()
    worker.send_bytes(struct.pack(">I", (16 << 20) + 1))
    assert worker.wait_exit(timeout=10) != 0


def test_no_worker_listening_is_a_clear_error(tmp_path: Any) -> None:
    path = tmp_path / "nobody.sock"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "blockx.executor",
            "--executor-id",
            "e1",
            "--socket-path",
            str(path),
            "--connect-timeout",
            "0.2",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 3
    assert "cannot connect to the worker socket" in result.stderr
    assert str(path) in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--socket-path", "/tmp/x.sock"],
        ["--executor-id", "e", "--socket-path", "/tmp/x.sock", "--executor-max-inflight", "-1"],
        ["--executor-id", "e", "--socket-path", "/tmp/x.sock", "--heartbeat-interval", "0"],
    ],
)
def test_bad_flags_exit_2_with_usage(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "blockx.executor", *args], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_the_digest_helper_matches_protocol() -> None:
    assert (
        digest_of("x") == "sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    )


def test_log_lines_from_inside_a_call_carry_its_call_fields(start_worker: StartWorker) -> None:
    worker = start_worker()
    source = (
        "import logging\n"
        "\n"
        "def _(p):\n"
        "    logging.getLogger('user.code').warning('inside the call %s', p)\n"
        "    return {'ok': True}\n"
    )
    worker.execute_call("t7/logged", source=source, function_id="logger_fn", task_id="t7", args=5)
    _assert_completed(worker.wait_terminal("t7/logged"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = [line for line in worker.log_lines() if line.get("msg") == "inside the call 5"]
        if lines:
            break
        time.sleep(0.05)
    (line,) = lines
    assert line["logger"] == "user.code"
    assert line["level"] == "warning"
    assert line["executorId"] == "exec-test"
    assert (line["callId"], line["taskId"], line["attemptSeq"], line["functionId"]) == (
        "t7/logged",
        "t7",
        1,
        "logger_fn",
    )

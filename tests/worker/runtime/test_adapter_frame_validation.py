"""Every call frame the worker takes is checked before it changes anything.

A malformed CallCompleted / CallFailed / CallWaiting is a protocol error of its
connection: closed, counted, logged with the executor id, and its calls go the lost way
with cause ``protocol_error`` -- the reservation is never released by a frame the
dispatcher would then ignore. Scripted peers send the frames (executor_peer.py).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from executor_peer import ExecutorPeer, Recorder, attached, execute_payload

from blockx.wire import keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.pool.exits import ProcessExit

Run = Callable[[Coroutine[Any, Any, Any]], Any]


def completed(call_id: Any = "c1", **payload: Any) -> dict[str, Any]:
    body: dict[str, Any] = {keys.FP_TASK_ID: "t1", keys.FP_ATTEMPT_SEQ: 1, keys.FP_OUTPUT: {"y": 2}}
    body.update(payload)
    return {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
        keys.F_CALL_ID: call_id,
        keys.F_PAYLOAD: body,
    }


def failed(call_id: Any = "c1", **payload: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        keys.FP_TASK_ID: "t1",
        keys.FP_ATTEMPT_SEQ: 1,
        keys.FP_ERROR_KIND: "user_error",
        keys.FP_RETRYABLE: False,
        keys.FP_ERROR_MESSAGE: "boom",
    }
    body.update(payload)
    return {keys.F_MESSAGE_TYPE: keys.MT_CALL_FAILED, keys.F_CALL_ID: call_id, keys.F_PAYLOAD: body}


def without(key: str) -> dict[str, Any]:
    frame = completed()
    del frame[keys.F_PAYLOAD][key]
    return frame


def waiting(**payload: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        keys.FP_TASK_ID: "t1",
        keys.FP_ATTEMPT_SEQ: 1,
        keys.FP_WAIT_KIND: "io",
        keys.FP_IO_KIND: "read",
        "backend": "kv",
        "operation": "get",
        "params": {},
    }
    body.update(payload)
    return {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
        keys.F_CALL_ID: "c1",
        keys.F_REQUEST_ID: "r1",
        keys.F_PAYLOAD: body,
    }


MALFORMED = {
    "attempt-string": completed(attemptSeq="1"),
    "attempt-zero": completed(attemptSeq=0),
    "attempt-never-sent": completed(attemptSeq=99),
    "attempt-null": completed(attemptSeq=None),
    "attempt-bool": completed(attemptSeq=True),
    "attempt-missing": without(keys.FP_ATTEMPT_SEQ),
    "no-output": without(keys.FP_OUTPUT),
    "call-id-int": completed(call_id=123),
    "call-id-empty": completed(call_id=""),
    "budget-string": completed(budgetUsedMs="5"),
    "budget-negative": completed(budgetUsedMs=-1),
    "failed-attempt-string": failed(attemptSeq="1"),
    "failed-no-kind": failed(errorKind=None),
    "failed-kind-int": failed(errorKind=7),
    "failed-retryable-string": failed(retryable="yes"),
    "waiting-attempt-zero": waiting(attemptSeq=0),
    "waiting-task-int": waiting(taskId=5),
}


@pytest.mark.parametrize("frame", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_call_frame_is_a_protocol_error_and_releases_nothing(
    run: Run, frame: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            adapter.send_execute_call("exec-0", "c1", execute_payload(attempt=1))
            await peer.wait_frames(keys.MT_EXECUTE_CALL)
            with caplog.at_level(logging.ERROR, logger="blockx.worker.adapter"):
                peer.send(frame)
                [(_, lost_calls, reason)] = await rec.wait("lost")
            # Nothing reached the orchestrator; the call went the lost way, still reserved
            # until then (a frame the dispatcher would ignore released nothing).
            assert rec.named("completed") == rec.named("failed") == rec.named("waiting") == []
            assert [c.call_id for c in lost_calls] == ["c1"]
            assert rec.loss().cause == "protocol_error" and "protocol error" in reason
            assert adapter.protocol_errors == 1
            assert any(
                getattr(r, "executorId", None) == "exec-0" and "protocol error" in r.getMessage()
                for r in caplog.records
            )
            await peer.wait_closed()
            # The worker serves the next connection as before.
            await attached(adapter, rec)

    run(scenario())


def test_a_depth_bomb_is_a_protocol_error_not_a_reader_crash(run: Run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            adapter.send_execute_call("exec-0", "c1", execute_payload(attempt=1))
            deep = b"[" * 100_000 + b"]" * 100_000
            body = (
                b'{"messageType":"CallCompleted","callId":"c1","payload":{"attemptSeq":1,'
                b'"output":' + deep + b"}}"
            )
            peer.send_raw(struct.pack(">I", len(body)) + body)
            [(_, lost_calls, _)] = await rec.wait("lost")
            assert rec.loss().cause == "protocol_error"
            assert [c.call_id for c in lost_calls] == ["c1"]
            assert adapter.protocol_errors == 1
            await peer.wait_closed()

    run(scenario())


def test_well_formed_frames_still_pass(run: Run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            for call_id in ("a", "b"):
                adapter.bind(call_id, "exec-0")
                adapter.send_execute_call("exec-0", call_id, execute_payload(attempt=2))
            peer.send(completed("a", attemptSeq=2, output=None))  # a null output is a row
            peer.send(failed("b", attemptSeq=1))  # an older attempt: stale, not an error
            await rec.wait("completed")
            await rec.wait("failed")
            assert adapter.protocol_errors == 0
            assert adapter.reserved_calls("exec-0") == ("b",)

    run(scenario())


def test_started_calls_are_those_that_sent_a_frame(run: Run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec, runningCallId="c1", runningForMs=1234)
            for call_id in ("c1", "c2", "c3"):
                adapter.bind(call_id, "exec-0")
                adapter.send_execute_call("exec-0", call_id, execute_payload())
            peer.send(waiting())  # c1 waits on IO: it ran user code
            await rec.wait("waiting")
            snapshot = adapter.snapshot("exec-0")
            assert snapshot is not None and snapshot.running_for_ms == 1234
            peer.close()
            [(_, lost_calls, _)] = await rec.wait("lost")
            assert {c.call_id: c.started for c in lost_calls} == {
                "c1": True,
                "c2": False,
                "c3": False,
            }
            loss = rec.loss()
            # No exit source: the link alone cannot tell more than "the connection ended".
            assert loss.cause == "transport_lost"
            assert loss.started_call_ids == frozenset({"c1"})
            assert loss.running_call_id == "c1" and not loss.running_call_known
            assert loss.running_for_ms == 1234

    run(scenario())


def test_heartbeat_timeout_is_a_transport_loss_naming_the_last_running_call(run: Run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), heartbeat_timeout_ms=200, heartbeat_check_interval_ms=50
        ) as adapter:
            await attached(adapter, rec, runningCallId="c9", runningCallBudgetMs=1000)
            adapter.bind("c9", "exec-0")
            await rec.wait("lost", timeout=10)
            loss = rec.loss()
            assert loss.cause == "transport_lost" and "heartbeat" in loss.message
            assert loss.running_call_id == "c9" and loss.running_call_budget_ms == 1000

    run(scenario())


# --- waiting for the exit status (an exit source standing in for the pool) -------------


class ExitSource:
    """The pool's side of the seam: generations and exits, reported when the test says."""

    def __init__(self) -> None:
        self.generation = 1
        self.exits: dict[int, ProcessExit] = {}
        self.listeners: list[Callable[[ProcessExit], None]] = []

    def running_generation(self, executor_id: str) -> int | None:
        return self.generation

    def exit_of(self, executor_id: str, generation: int) -> ProcessExit | None:
        return self.exits.get(generation)

    def add_exit_listener(self, listener: Callable[[ProcessExit], None]) -> None:
        self.listeners.append(listener)

    def exited(self, returncode: int) -> None:
        exit_ = ProcessExit(
            executor_id="exec-0", generation=self.generation, pid=1, returncode=returncode
        )
        self.exits[self.generation] = exit_
        for listener in self.listeners:
            listener(exit_)


def test_the_report_waits_for_the_exit_status(run: Run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        source = ExitSource()
        async with ExecutorAdapter(callbacks=rec.callbacks(), exit_wait_ms=30_000) as adapter:
            adapter.set_exit_source(source)
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            peer.close()
            await asyncio.sleep(0.2)
            assert not adapter.is_attached("exec-0")  # the era is over at once ...
            assert rec.named("lost") == []  # ... its report waits for the exit
            source.exited(-11)
            await rec.wait("lost")
            assert rec.loss().cause == "executor_crashed"
            assert "SIGSEGV" in rec.loss().message

    run(scenario())


def test_without_an_exit_the_report_goes_out_after_the_wait_or_at_the_next_attach(
    run: Run,
) -> None:
    async def scenario() -> None:
        rec = Recorder()
        source = ExitSource()
        async with ExecutorAdapter(callbacks=rec.callbacks(), exit_wait_ms=100) as adapter:
            adapter.set_exit_source(source)
            peer = await attached(adapter, rec)
            peer.close()
            await rec.wait("lost", timeout=10)
            assert rec.loss().cause == "transport_lost"
            assert "had not exited" in rec.loss().message
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks(), exit_wait_ms=60_000) as adapter:
            adapter.set_exit_source(source)
            peer = await attached(adapter, rec)
            peer.close()
            await peer.wait_closed()
            await asyncio.sleep(0.1)
            await attached(adapter, rec)  # the same executor id again: the old era first
            names = [name for name, _ in rec.events if name in ("lost", "attached")]
            assert names == ["attached", "lost", "attached"]

    run(scenario())


def test_unknown_connection_without_heartbeat_is_not_an_era(run: Run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks(), attach_timeout_ms=100) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            await peer.wait_closed(timeout=10)
            assert rec.named("lost") == [] and adapter.dropped_unattached == 1

    run(scenario())

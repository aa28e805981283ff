"""ExecutorAdapter: CallWaiting routing, function-code answers, callback robustness.
Both event loops, real sockets.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from executor_peer import (
    DIGEST,
    ExecutorPeer,
    Recorder,
    attached,
    eventually,
)

from blockx.wire import RemoteError, encode_frame, keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.callbacks import AdapterCallbacks, FunctionCodeUnavailable
from blockx.worker.link.completed_frames import WaitingFrame, decode_call_frames

pytestmark = pytest.mark.timeout(30)


# --- waits ------------------------------------------------------------------------------


def test_io_and_subcall_waits_go_to_the_orchestrator_with_the_sidecar(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            peer.waiting(
                "c1",
                "req-1",
                {
                    keys.FP_WAIT_KIND: "io",
                    keys.FP_IO_KIND: "read",
                    keys.FP_BACKEND: "blockdb",
                    keys.FP_OPERATION: "get_row",
                },
                sidecar=b"\x01\x02",
            )
            peer.waiting("c1", "req-2", {keys.FP_WAIT_KIND: "subcall", keys.FP_FUNCTION_ID: "f"})
            io, sub = await rec.wait("waiting", 2)
            assert io[:3] == ("exec-0", "c1", "req-1") and io[4] == b"\x01\x02"
            assert io[3][keys.FP_BACKEND] == "blockdb"
            assert sub[2] == "req-2" and sub[3][keys.FP_WAIT_KIND] == "subcall" and sub[4] is None
            assert rec.named("batch_done")  # the actor can wake once per batch

    run(scenario())


@pytest.mark.parametrize(
    ("envelope", "says"),
    [
        # Typed by the connection's decoder (a WaitingFrame), judged by the adapter.
        ({keys.FP_TASK_ID: "t1", keys.FP_WAIT_KIND: "sleep"}, "unknown waitKind 'sleep'"),
        ({keys.FP_TASK_ID: 7, keys.FP_WAIT_KIND: "io"}, "taskId must be a string"),
        ({keys.FP_WAIT_KIND: "io"}, "taskId must be a string"),
        # Not typed (no requestId): the generic path.
        (None, "needs a callId, a requestId and a payload object"),
    ],
)
@pytest.mark.parametrize("batched", [False, True])
def test_a_malformed_call_waiting_is_a_protocol_error(run, caplog, envelope, says, batched) -> None:
    async def scenario() -> None:
        rec = Recorder()
        callbacks = rec.callbacks()
        if batched:  # as the orchestrator runs it: call frames delivered per batch
            callbacks = dataclasses.replace(callbacks, on_call_frames=rec._record("frames"))
        async with ExecutorAdapter(callbacks=callbacks) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            frame: dict[str, Any] = {
                keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
                keys.F_CALL_ID: "c1",
            }
            if envelope is None:
                frame[keys.F_PAYLOAD] = {keys.FP_TASK_ID: "t1", keys.FP_WAIT_KIND: "io"}
            else:
                frame[keys.F_REQUEST_ID] = "req-1"
                frame[keys.F_PAYLOAD] = envelope
            # The typed cases really are decoded typed (and refused by the adapter).
            typed = decode_call_frames(encode_frame(frame)[4:])
            assert isinstance(typed, WaitingFrame) is (envelope is not None)
            with caplog.at_level(logging.ERROR, logger="blockx.worker.adapter"):
                peer.send(frame)
                await peer.wait_closed()
            assert adapter.protocol_errors == 1
            assert rec.named("waiting") == [] and rec.named("frames") == []
            assert any(says in r.getMessage() for r in caplog.records), caplog.text

    run(scenario())


def test_function_code_waits_are_answered_by_the_resolver(run) -> None:
    asked: list[tuple[str, str, str]] = []

    def resolver(task_id: str, function_id: str, digest: str) -> str | RemoteError:
        asked.append((task_id, function_id, digest))
        if function_id == "missing":
            raise FunctionCodeUnavailable("not in the task's code view", retryable=False)
        if function_id == "odd":
            return RemoteError(kind="function_code_fetch_failed", message="odd", retryable=True)
        if function_id == "buggy":
            raise RuntimeError("resolver bug")
        return "def _(p):\n    return p\n"

    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), function_code_resolver=resolver
        ) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            for i, function_id in enumerate(["adder", "missing", "odd", "buggy"]):
                peer.waiting(
                    "c1",
                    f"req-{i}",
                    {
                        keys.FP_WAIT_KIND: "function_code",
                        keys.FP_FUNCTION_ID: function_id,
                        keys.FP_FUNCTION_CODE_DIGEST: DIGEST,
                    },
                )
            resumes = await peer.wait_frames(keys.MT_RESUME_CALL, 4)
            payloads = [r.envelope[keys.F_PAYLOAD] for r in resumes]
            assert [r.envelope[keys.F_REQUEST_ID] for r in resumes] == [
                "req-0",
                "req-1",
                "req-2",
                "req-3",
            ]
            assert payloads[0] == {
                "resumeKind": "function_code",
                "budgetUsedMs": 0,
                "result": {"source": "def _(p):\n    return p\n", "functionCodeDigest": DIGEST},
            }
            assert payloads[1]["error"] == {
                "kind": "function_code_fetch_failed",
                "message": "not in the task's code view",
                "retryable": False,
            }
            assert payloads[2]["error"]["message"] == "odd"
            assert payloads[3]["error"]["retryable"] is True
            assert "resolver bug" in payloads[3]["error"]["message"]
            assert asked[0] == ("t1", "adder", DIGEST)
            assert rec.named("waiting") == []  # the orchestrator never saw them
            assert rec.named("control_sent") == []
            assert adapter.function_code_answered == 4

    run(scenario())


def test_function_code_wait_without_a_resolver_gets_an_error(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            peer.waiting(
                "c1",
                "req-1",
                {
                    keys.FP_WAIT_KIND: "function_code",
                    keys.FP_FUNCTION_ID: "f",
                    keys.FP_FUNCTION_CODE_DIGEST: DIGEST,
                },
            )
            [resume] = await peer.wait_frames(keys.MT_RESUME_CALL)
            assert resume.envelope[keys.F_PAYLOAD]["error"]["kind"] == "function_code_fetch_failed"

    run(scenario())


def test_a_raising_callback_does_not_break_the_connection(run, caplog) -> None:
    async def scenario() -> None:
        seen: list[str] = []

        def broken(executor_id: str, call_id: str, payload: dict[str, Any]) -> None:
            seen.append(call_id)
            raise RuntimeError("orchestrator bug")

        async with ExecutorAdapter(callbacks=AdapterCallbacks(on_call_completed=broken)) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            peer.heartbeat("exec-0")
            await eventually(lambda: adapter.is_attached("exec-0"))
            adapter.bind("a", "exec-0")
            adapter.bind("b", "exec-0")
            peer.completed("a")
            peer.completed("b")
            await eventually(lambda: seen == ["a", "b"])
            assert adapter.is_attached("exec-0")
            assert adapter.reserved_calls("exec-0") == ()

    with caplog.at_level(logging.ERROR, "blockx.worker.adapter"):
        run(scenario())
    assert "orchestrator bug" in caplog.text


def test_repr_shows_state(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            assert "attached=1/1" in repr(adapter)
            assert "exec-0" in repr(adapter.connection("exec-0"))
            assert "inflight=1/128" in repr(adapter.snapshot("exec-0"))

    run(scenario())

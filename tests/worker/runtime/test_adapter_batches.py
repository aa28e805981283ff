"""ExecutorAdapter batch delivery: ``on_call_frames`` and ``on_controls_sent``.

With the batch callbacks set, a read's call frames arrive as one list in frame
order, delivered before any other callback of the connection; flushed control
frames arrive as one list per flush. Both event loops, real sockets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from executor_peer import ExecutorPeer, Recorder, attached, eventually, heartbeat_payload

from blockx.wire import encode_frame, keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.callbacks import AdapterCallbacks
from blockx.worker.link.completed_frames import CompletedPayload

pytestmark = pytest.mark.timeout(30)


def batch_callbacks(rec: Recorder) -> AdapterCallbacks:
    return dataclasses.replace(
        rec.callbacks(),
        on_call_frames=rec._record("call_frames"),
        on_controls_sent=rec._record("controls_sent"),
    )


def completed(call_id: str, attempt: int = 1) -> dict[str, Any]:
    return {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
        keys.F_CALL_ID: call_id,
        keys.F_EXECUTOR_ID: "exec-0",
        keys.F_PAYLOAD: {
            keys.FP_TASK_ID: "t1",
            keys.FP_ATTEMPT_SEQ: attempt,
            keys.FP_OUTPUT: {"c": call_id},
            keys.FP_BUDGET_USED_MS: 1,
        },
    }


def failed(call_id: str) -> dict[str, Any]:
    return {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_FAILED,
        keys.F_CALL_ID: call_id,
        keys.F_EXECUTOR_ID: "exec-0",
        keys.F_PAYLOAD: {
            keys.FP_TASK_ID: "t1",
            keys.FP_ATTEMPT_SEQ: 1,
            keys.FP_ERROR_KIND: "user_error",
            keys.FP_RETRYABLE: False,
            keys.FP_ERROR_MESSAGE: "boom",
        },
    }


def waiting(call_id: str, request_id: str, kind: str = "io") -> dict[str, Any]:
    return {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
        keys.F_CALL_ID: call_id,
        keys.F_REQUEST_ID: request_id,
        keys.F_EXECUTOR_ID: "exec-0",
        keys.F_PAYLOAD: {keys.FP_TASK_ID: "t1", keys.FP_ATTEMPT_SEQ: 1, keys.FP_WAIT_KIND: kind},
    }


def heartbeat(seq: int) -> dict[str, Any]:
    return {
        keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
        keys.F_PAYLOAD: heartbeat_payload("exec-0", seq),
    }


def one_write(peer: ExecutorPeer, *envelopes: dict[str, Any], sidecar_of: str = "") -> None:
    peer.send_raw(
        b"".join(
            encode_frame(env, b"\x07" if env.get(keys.F_REQUEST_ID) == sidecar_of else None)
            for env in envelopes
        )
    )


def delivered(rec: Recorder) -> list[tuple[str, str]]:
    """Every call frame delivered so far, as (messageType, callId), in order."""
    return [(f[0], f[1]) for _executor, frames in rec.named("call_frames") for f in frames]


def test_a_read_of_call_frames_is_one_list_in_frame_order(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=batch_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec)
            for call_id in ("c1", "c2", "c3"):
                adapter.bind(call_id, "exec-0")
            one_write(
                peer,
                completed("c1"),
                waiting("c2", "req-1"),
                failed("c3"),
                waiting("c2", "req-2", kind="subcall"),
                sidecar_of="req-1",
            )
            await eventually(lambda: len(delivered(rec)) == 4)
            assert delivered(rec) == [
                (keys.MT_CALL_COMPLETED, "c1"),
                (keys.MT_CALL_WAITING, "c2"),
                (keys.MT_CALL_FAILED, "c3"),
                (keys.MT_CALL_WAITING, "c2"),
            ]
            frames = [f for _e, batch in rec.named("call_frames") for f in batch]
            assert frames[1][3:] == ("req-1", b"\x07") and frames[3][3:] == ("req-2", None)
            # A CallCompleted is decoded typed: its output stays the executor's JSON.
            assert isinstance(frames[0][2], CompletedPayload)
            assert bytes(frames[0][2].output) == b'{"c":"c1"}'
            assert frames[0][2].to_wire()[keys.FP_OUTPUT] == {"c": "c1"}
            # Terminal frames released their reservations before delivery; waits did not.
            assert adapter.reserved_calls("exec-0") == ("c2",)
            # The per-frame callbacks are not used.
            assert not rec.named("completed") and not rec.named("waiting")
            assert not rec.named("failed")

    run(scenario())


def test_call_frames_are_delivered_before_a_heartbeat_callback(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=batch_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec)
            for call_id in ("c1", "c2"):
                adapter.bind(call_id, "exec-0")
            one_write(peer, completed("c1"), heartbeat(2), completed("c2"))
            await eventually(lambda: len(delivered(rec)) == 2)
            order = [name for name, _args in rec.events if name in ("call_frames", "heartbeat")]
            assert order == ["call_frames", "heartbeat", "call_frames"]
            assert delivered(rec) == [
                (keys.MT_CALL_COMPLETED, "c1"),
                (keys.MT_CALL_COMPLETED, "c2"),
            ]

    run(scenario())


def test_frames_before_a_protocol_error_are_delivered_then_the_era_ends(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=batch_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            adapter.bind("c2", "exec-0")
            broken = {keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED, keys.F_CALL_ID: "c2"}
            one_write(peer, completed("c1"), broken, completed("c2"))
            await rec.wait("lost")
            assert delivered(rec) == [(keys.MT_CALL_COMPLETED, "c1")]
            order = [name for name, _args in rec.events if name in ("call_frames", "lost")]
            assert order == ["call_frames", "lost"]
            assert adapter.protocol_errors == 1

    run(scenario())


def test_a_flush_reports_its_control_frames_in_one_call(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=batch_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec)
            for call_id in ("c1", "c2"):
                adapter.bind(call_id, "exec-0")
            resume = {keys.FP_RESUME_KIND: "io", keys.FP_RESULT: 1, keys.FP_BUDGET_USED_MS: 0}
            adapter.send_resume_call("exec-0", "c1", "req-1", resume, token=1)
            adapter.send_resume_call("exec-0", "c2", "req-2", resume, token=3)
            adapter.send_cancel_call("exec-0", "c2", attempt_seq=3)
            adapter.flush("exec-0")
            (notes,) = (args[0] for args in await rec.wait("controls_sent"))
            assert [(n.message_type, n.call_id, n.token) for n in notes] == [
                (keys.MT_RESUME_CALL, "c1", 1),
                (keys.MT_RESUME_CALL, "c2", 3),
                (keys.MT_CANCEL_CALL, "c2", None),
            ]
            assert not rec.named("control_sent")
            await eventually(lambda: len(peer.frames) >= 4)  # heartbeat ack + the three

    run(scenario())

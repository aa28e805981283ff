"""ExecutorAdapter and batched frames (docs/protocol.md "Batched frames"): an executor
whose Heartbeat announces ``features: ["batch"]`` is acked with the feature and gets
each write's frames as one batched frame after that; a v1 executor (no features) is
acked with the v1 empty payload and never gets a batch. Batches the executor sends are
delivered frame by frame, in order. Both event loops, real sockets."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from executor_peer import ExecutorPeer, Recorder, attached, eventually, heartbeat_payload

from blockx.wire import FEATURE_BATCH, batch_frames, encode_frame, keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.callbacks import AdapterCallbacks

pytestmark = pytest.mark.timeout(30)

RESUME = {keys.FP_RESUME_KIND: "io", keys.FP_RESULT: 1, keys.FP_BUDGET_USED_MS: 0}
CALLS = ("c1", "c2", "c3", "c4")


def _callbacks(rec: Recorder) -> AdapterCallbacks:
    return dataclasses.replace(rec.callbacks(), on_call_frames=rec._record("call_frames"))


def _acks(peer: ExecutorPeer) -> list[dict[str, Any]]:
    return [f.envelope[keys.F_PAYLOAD] for f in peer.of_type(keys.MT_HEARTBEAT_ACK)]


def _connection(adapter: ExecutorAdapter) -> Any:
    (conn,) = adapter._connections
    return conn


async def _send_run(adapter: ExecutorAdapter, peer: ExecutorPeer) -> list[tuple[str, str]]:
    """Four resumes and a cancel in one flush; the frames the peer got, as (type, callId)."""
    before = len(peer.frames)
    for call_id in CALLS:
        adapter.bind(call_id, "exec-0")
    for index, call_id in enumerate(CALLS):
        adapter.send_resume_call("exec-0", call_id, f"req-{index}", RESUME, token=index)
    adapter.send_cancel_call("exec-0", "c4", attempt_seq=1)
    adapter.flush("exec-0")
    await eventually(lambda: len(peer.frames) >= before + 5)
    return [(f.message_type, f.envelope[keys.F_CALL_ID]) for f in peer.frames[before:]]


EXPECTED = [(keys.MT_RESUME_CALL, call_id) for call_id in CALLS] + [(keys.MT_CANCEL_CALL, "c4")]


def test_an_executor_announcing_batch_is_acked_with_it_and_gets_batches(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec, features=[FEATURE_BATCH])
            await eventually(lambda: bool(_acks(peer)))
            assert _acks(peer)[0] == {keys.FP_FEATURES: [FEATURE_BATCH]}
            assert _connection(adapter).batching
            assert await _send_run(adapter, peer) == EXPECTED  # every frame, once, in order
            assert peer.outer_batched == 1  # the run was one batched frame
            assert _connection(adapter).batches_sent == 1

    run(scenario())


@pytest.mark.parametrize("features", [None, [], ["something-else"]], ids=["v1", "none", "other"])
def test_an_executor_not_announcing_batch_never_gets_one(run, features) -> None:
    async def scenario() -> None:
        rec = Recorder()
        hb = {} if features is None else {keys.FP_FEATURES: features}
        async with ExecutorAdapter(callbacks=_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec, **hb)
            for seq in (2, 3):
                peer.heartbeat("exec-0", seq, **hb)
            await eventually(lambda: len(_acks(peer)) == 3)
            assert _acks(peer) == [{}, {}, {}]  # the v1 ack, byte for byte
            assert await _send_run(adapter, peer) == EXPECTED
            assert await _send_run(adapter, peer) == EXPECTED
            assert peer.outer_batched == 0
            assert peer.outer_frames == 3 + 10
            assert not _connection(adapter).batching

    run(scenario())


def test_batches_start_after_the_heartbeat_that_announces_them(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec)
            await eventually(lambda: len(_acks(peer)) == 1)
            assert await _send_run(adapter, peer) == EXPECTED
            assert peer.outer_batched == 0
            peer.heartbeat("exec-0", 2, features=[FEATURE_BATCH])
            await eventually(lambda: len(_acks(peer)) == 2)
            assert _acks(peer)[1] == {keys.FP_FEATURES: [FEATURE_BATCH]}
            assert await _send_run(adapter, peer) == EXPECTED
            assert peer.outer_batched == 1

    run(scenario())


def _completed(call_id: str) -> dict[str, Any]:
    return {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
        keys.F_CALL_ID: call_id,
        keys.F_EXECUTOR_ID: "exec-0",
        keys.F_PAYLOAD: {
            keys.FP_TASK_ID: "t1",
            keys.FP_ATTEMPT_SEQ: 1,
            keys.FP_OUTPUT: {"c": call_id},
            keys.FP_BUDGET_USED_MS: 1,
        },
    }


def test_the_executors_batched_frames_are_delivered_in_order(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=_callbacks(rec)) as adapter:
            peer = await attached(adapter, rec, features=[FEATURE_BATCH])
            for call_id in CALLS:
                adapter.bind(call_id, "exec-0")
            frames = [encode_frame(_completed(call_id)) for call_id in CALLS]
            heartbeat = {
                keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
                keys.F_PAYLOAD: heartbeat_payload("exec-0", 2, features=[FEATURE_BATCH]),
            }
            frames.insert(2, encode_frame(heartbeat))
            peer.send_raw(batch_frames(frames))
            await eventually(lambda: len(rec.named("heartbeat")) == 1)  # after attach
            got = [f[1] for _executor, batch in rec.named("call_frames") for f in batch]
            assert got == list(CALLS)
            assert adapter.protocol_errors == 0

    run(scenario())

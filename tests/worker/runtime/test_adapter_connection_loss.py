"""ExecutorAdapter: how a connection era ends — reconnect, heartbeat timeout, protocol error,
disconnect — and what the orchestrator is told. Both event loops, real sockets.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from typing import Any

import pytest
from executor_peer import (
    ExecutorPeer,
    Recorder,
    attached,
    execute_payload,
    heartbeat_payload,
)

from blockx.wire import encode_frame, keys
from blockx.worker.errors import (
    ExecutorUnavailableError,
)
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.reservations import LostCall

pytestmark = pytest.mark.timeout(30)


# --- eras and loss ----------------------------------------------------------------------


def test_reconnect_starts_a_new_era_and_reports_the_old_calls_lost(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            old = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            adapter.send_execute_call("exec-0", "c1", execute_payload(attempt=2))
            adapter.bind("c2", "exec-0")
            snapshots_at_loss: list[Any] = []
            rec.hooks["lost"] = lambda *_: snapshots_at_loss.append(adapter.snapshot("exec-0"))
            new = await ExecutorPeer.connect(adapter.socket_path)
            new.heartbeat("exec-0", seq=1)
            [(executor_id, lost, reason)] = await rec.wait("lost")
            assert executor_id == "exec-0"
            assert lost == (LostCall("c1", 2, None, False), LostCall("c2", None, None, False))
            assert "superseded" in reason
            [(_, snap)] = (await rec.wait("attached", 2))[1:]
            assert snap.era == 2 and snap.local_inflight == 0
            assert snapshots_at_loss[0].healthy is False
            await old.wait_closed()
            assert adapter.reserved_calls("exec-0") == ()
            # The new era works; a late frame on the old connection cannot arrive.
            adapter.bind("c3", "exec-0")
            adapter.send_execute_call("exec-0", "c3", execute_payload())
            await new.wait_frames(keys.MT_EXECUTE_CALL)

    run(scenario())


def test_heartbeat_timeout_reports_inflight_calls_lost_after_the_snapshot(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), heartbeat_timeout_ms=150, heartbeat_check_interval_ms=25
        ) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            adapter.bind("c2", "exec-0")
            adapter.bind_subcall("c1/sub-1", "c1", "exec-0")
            seen: list[Any] = []
            rec.hooks["lost"] = lambda *_: seen.append(adapter.snapshots())
            [(executor_id, lost, reason)] = await rec.wait("lost", timeout=3)
            assert executor_id == "exec-0"
            assert [c.call_id for c in lost] == ["c1", "c2", "c1/sub-1"]
            assert lost[2].parent_call_id == "c1"
            assert "heartbeat timeout" in reason
            [snap] = seen[0]
            assert not snap.healthy and snap.local_inflight == 0
            await peer.wait_closed()
            with pytest.raises(ExecutorUnavailableError, match="heartbeat timeout"):
                adapter.bind("c3", "exec-0")
            assert adapter.check_heartbeat_timeouts() == []  # reported once

    run(scenario())


def test_heartbeats_keep_the_executor_alive(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), heartbeat_timeout_ms=400, heartbeat_check_interval_ms=25
        ) as adapter:
            peer = await attached(adapter, rec)
            for seq in range(2, 18):  # 0.8 s: twice the timeout
                await asyncio.sleep(0.05)
                peer.heartbeat(seq=seq)
            assert rec.named("lost") == []
            assert adapter.snapshot("exec-0").healthy  # type: ignore[union-attr]

    run(scenario())


def test_check_heartbeat_timeouts_with_an_injected_clock(run) -> None:
    now = [1000.0]

    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(),
            heartbeat_timeout_ms=10_000,
            heartbeat_check_interval_ms=None,
            clock=lambda: now[0],
        ) as adapter:
            await attached(adapter, rec)
            now[0] += 9.9
            assert adapter.check_heartbeat_timeouts() == []
            assert adapter.snapshot("exec-0").heartbeat_age_ms == 9900  # type: ignore[union-attr]
            now[0] += 0.2
            assert adapter.check_heartbeat_timeouts() == ["exec-0"]
            await rec.wait("lost")

    run(scenario())


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">I", 17 * 1024 * 1024),  # a length over the 16 MiB limit
        struct.pack(">I", 5) + b"{nope",  # not JSON
        struct.pack(">I", 2) + b"[]",  # not an envelope object
    ],
    ids=["too-large", "not-json", "not-object"],
)
def test_protocol_error_closes_the_connection_and_reports_lost(run, garbage) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            peer.send_raw(garbage)
            [(_, lost, reason)] = await rec.wait("lost")
            assert [c.call_id for c in lost] == ["c1"]
            assert reason.startswith("protocol error")
            await peer.wait_closed()
            assert adapter.protocol_errors == 1
            assert not adapter.is_attached("exec-0")

    run(scenario())


@pytest.mark.parametrize(
    "envelope",
    [
        {keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED, keys.F_PAYLOAD: {}},  # no callId
        {keys.F_MESSAGE_TYPE: keys.MT_CALL_FAILED, keys.F_CALL_ID: "c", keys.F_PAYLOAD: []},
        {keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL, keys.F_CALL_ID: "c", keys.F_PAYLOAD: {}},
        {
            keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
            keys.F_CALL_ID: "c",
            keys.F_PAYLOAD: {keys.FP_TASK_ID: "t", keys.FP_WAIT_KIND: "io"},
        },  # no requestId
        {
            keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
            keys.F_CALL_ID: "c",
            keys.F_REQUEST_ID: "r",
            keys.F_PAYLOAD: {keys.FP_TASK_ID: "t", keys.FP_WAIT_KIND: "teleport"},
        },
        {
            keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
            keys.F_CALL_ID: "c",
            keys.F_REQUEST_ID: "r",
            keys.F_PAYLOAD: {keys.FP_TASK_ID: "t", keys.FP_WAIT_KIND: ["io"]},
        },  # not hashable: once a TypeError out of on_frames
        {
            keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
            keys.F_PAYLOAD: {keys.FP_EXECUTOR_ID: "exec-9", keys.FP_HEARTBEAT_SEQ: 2},
        },  # another executor's heartbeat on this connection
    ],
    ids=[
        "no-call-id",
        "payload-not-object",
        "wrong-direction",
        "no-request-id",
        "bad-wait-kind",
        "wait-kind-a-list",
        "foreign-heartbeat",
    ],
)
def test_malformed_known_frames_are_protocol_errors(run, envelope) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            peer.send(dict(envelope))
            await rec.wait("lost")
            await peer.wait_closed()
            assert adapter.protocol_errors == 1

    run(scenario())


def test_executor_disconnect_reports_lost_and_close_reports_nothing(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        adapter = ExecutorAdapter(callbacks=rec.callbacks())
        await adapter.start()
        a = await attached(adapter, rec, "exec-a")
        await attached(adapter, rec, "exec-b")
        adapter.bind("c1", "exec-a")
        a.close()
        [(executor_id, lost, reason)] = await rec.wait("lost")
        assert executor_id == "exec-a" and [c.call_id for c in lost] == ["c1"]
        assert "closed by the executor" in reason
        adapter.bind("c2", "exec-b")
        await adapter.close()
        assert len(rec.named("lost")) == 1  # closing the adapter reports nothing
        assert adapter.forget_executor("exec-a")

    run(scenario())


def test_disconnect_ends_the_era_on_request(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c1", "exec-0")
            assert adapter.disconnect("exec-0", "wedged")
            [(_, lost, reason)] = rec.named("lost")
            assert reason == "wedged" and lost[0].call_id == "c1"
            await peer.wait_closed()
            assert not adapter.disconnect("exec-0")
            assert adapter.snapshot("exec-0").healthy is False  # type: ignore[union-attr]

    run(scenario())


def test_a_stalled_event_loop_does_not_declare_live_executors_lost(run) -> None:
    """A stall inside frame handling (where uvloop next runs due timers before it reads
    the sockets) must not turn heartbeats that queued up meanwhile into a loss."""

    def executor_thread(path: str, stop: threading.Event) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall(encode_frame(_heartbeat_envelope(1)))
        time.sleep(0.1)
        sock.sendall(encode_frame(_completed_envelope("stall")))  # the worker stalls on it
        seq = 2
        while not stop.wait(0.03):
            sock.sendall(encode_frame(_heartbeat_envelope(seq)))
            seq += 1
        sock.close()

    async def scenario() -> None:
        rec = Recorder()
        rec.hooks["completed"] = lambda *_: time.sleep(0.8)  # a slow orchestrator callback
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), heartbeat_timeout_ms=350, heartbeat_check_interval_ms=50
        ) as adapter:
            stop = threading.Event()
            thread = threading.Thread(target=executor_thread, args=(adapter.socket_path, stop))
            thread.start()
            try:
                await rec.wait("attached")
                await rec.wait("completed")
                await asyncio.sleep(0.3)
                assert rec.named("lost") == []
                assert adapter.snapshot("exec-0").heartbeat_seq > 2  # type: ignore[union-attr]
            finally:
                stop.set()
                await asyncio.to_thread(thread.join)
            await rec.wait("lost")  # the connection's end is still noticed

    run(scenario())


def _heartbeat_envelope(seq: int) -> dict[str, Any]:
    return {
        keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
        keys.F_PAYLOAD: heartbeat_payload("exec-0", seq),
    }


def _completed_envelope(call_id: str) -> dict[str, Any]:
    return {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
        keys.F_CALL_ID: call_id,
        keys.F_PAYLOAD: {keys.FP_TASK_ID: "t1", keys.FP_ATTEMPT_SEQ: 1, keys.FP_OUTPUT: None},
    }

"""ExecutorAdapter over real Unix sockets: listening, attach, sending, reservations.

Every scenario runs on the default asyncio loop and on uvloop (``run`` fixture),
against a scripted executor peer (executor_peer.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat

import pytest
from executor_peer import (
    ExecutorPeer,
    Recorder,
    attached,
    execute_payload,
)

from blockx.wire import EncodeError, keys
from blockx.worker.errors import (
    CallDrainingError,
    CallNotBoundError,
    ExecutorCapacityError,
    ExecutorUnavailableError,
    ParentNotResidentError,
)
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.connection import ControlSend

pytestmark = pytest.mark.timeout(30)


# --- listener and attach ------------------------------------------------------------------


def test_listens_in_private_dir_and_removes_socket_on_close(run, tmp_path) -> None:
    async def scenario() -> None:
        adapter = ExecutorAdapter(socket_dir=tmp_path)
        path = await adapter.start()
        assert path == adapter.socket_path
        assert os.path.dirname(path) == adapter.socket_dir
        assert os.path.dirname(adapter.socket_dir) == str(tmp_path)
        assert stat.S_IMODE(os.stat(adapter.socket_dir).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        await adapter.close()
        assert not os.path.exists(path)
        assert not os.path.exists(adapter.socket_dir)
        await adapter.close()  # idempotent

    run(scenario())


def test_too_long_socket_path_is_refused(run, tmp_path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()

    async def scenario() -> None:
        with pytest.raises(ValueError, match="longer than the 107 bytes"):
            await ExecutorAdapter(socket_dir=deep).start()
        assert list(deep.iterdir()) == []

    run(scenario())


def test_first_heartbeat_attaches_and_is_acked(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            await asyncio.sleep(0.01)
            assert adapter.snapshots() == []
            assert adapter.attached_executor_ids() == []
            peer.heartbeat(
                "exec-3",
                seq=1,
                runnableCount=2,
                inflightCount=5,
                availableContexts=123,
                memoryBytes=1234,
                runningCallId="t1/c9",
            )
            [(executor_id, snap)] = await rec.wait("attached")
            assert executor_id == "exec-3"
            assert snap.healthy and snap.era == 1
            assert snap.usable_contexts == 128  # available 123 + the executor's own 5
            assert snap.local_inflight == 0 and snap.headroom == 128
            assert snap.runnable_count == 2 and snap.inflight_count == 5
            assert snap.memory_bytes == 1234 and snap.running_call_id == "t1/c9"
            await peer.wait_frames(keys.MT_HEARTBEAT_ACK)
            assert adapter.attached_executor_ids() == ["exec-3"]
            assert [s.executor_id for s in adapter.snapshots()] == ["exec-3"]
            # Later heartbeats refresh the snapshot and are acked too.
            peer.heartbeat(seq=2, runnableCount=7)
            [(_, later)] = await rec.wait("heartbeat")
            assert later.heartbeat_seq == 2 and later.runnable_count == 7
            await peer.wait_frames(keys.MT_HEARTBEAT_ACK, 2)
            assert rec.named("lost") == []

    run(scenario())


def test_unlimited_executor_reports_unlimited_contexts(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            await attached(adapter, rec, availableContexts=keys.UNLIMITED_CONTEXTS, inflightCount=3)
            [snap] = adapter.snapshots()
            assert snap.usable_contexts == keys.UNLIMITED_CONTEXTS

    run(scenario())


@pytest.mark.parametrize(
    "first",
    [keys.MT_CALL_COMPLETED, keys.MT_CALL_WAITING, keys.MT_CALL_FAILED],
)
def test_call_frames_before_the_heartbeat_close_the_connection(run, first) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            peer.send({keys.F_MESSAGE_TYPE: first, keys.F_CALL_ID: "c1", keys.F_PAYLOAD: {}})
            peer.heartbeat("exec-0")  # too late: the connection is closed first
            await peer.wait_closed()
            assert rec.named("attached") == []
            assert adapter.protocol_errors == 1
            assert adapter.snapshots() == []

    run(scenario())


def test_a_well_formed_call_waiting_before_the_heartbeat_closes_the_connection(run, caplog) -> None:
    # Decoded typed (completed_frames.WaitingFrame), not as a dict: refused all the same.
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            peer.send(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
                    keys.F_CALL_ID: "c1",
                    keys.F_REQUEST_ID: "req-1",
                    keys.F_PAYLOAD: {keys.FP_TASK_ID: "t", keys.FP_WAIT_KIND: keys.WAIT_IO},
                }
            )
            with caplog.at_level(logging.ERROR, logger="blockx.worker.adapter"):
                peer.heartbeat("exec-0")
                await peer.wait_closed()
            assert rec.named("attached") == []
            assert adapter.protocol_errors == 1
            assert "CallWaiting before the attaching Heartbeat" in caplog.text

    run(scenario())


def test_invalid_first_heartbeat_closes_the_connection(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            peer.send(
                {keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT, keys.F_PAYLOAD: {"executorId": "e"}}
            )  # no heartbeatSeq
            await peer.wait_closed()
            assert rec.named("attached") == []
            assert adapter.protocol_errors == 1

    run(scenario())


def test_unknown_message_types_are_dropped_before_and_after_attach(run, caplog) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            peer.send({keys.F_MESSAGE_TYPE: "FutureHello", keys.F_PAYLOAD: {}})
            peer.heartbeat("exec-0")
            await rec.wait("attached")
            adapter.bind("c1", "exec-0")
            peer.send({keys.F_MESSAGE_TYPE: "FutureThing", keys.F_CALL_ID: "c1"})
            peer.completed("c1", {"y": 2})
            [(_, call_id, payload)] = await rec.wait("completed")
            assert call_id == "c1" and payload[keys.FP_OUTPUT] == {"y": 2}
            assert adapter.unknown_frames == 2
            assert not peer.closed.is_set()
            assert adapter.protocol_errors == 0

    with caplog.at_level(logging.WARNING, "blockx.worker.adapter"):
        run(scenario())
    assert "unknown messageType 'FutureThing'" in caplog.text


def test_connection_without_heartbeat_is_closed_after_the_attach_timeout(run) -> None:
    async def scenario() -> None:
        async with ExecutorAdapter(
            attach_timeout_ms=100, heartbeat_check_interval_ms=None
        ) as adapter:
            peer = await ExecutorPeer.connect(adapter.socket_path)
            await peer.wait_closed(timeout=5)
            assert adapter.dropped_unattached == 1

    run(scenario())


# --- sending ------------------------------------------------------------------------------


def test_execute_calls_are_coalesced_into_few_writes(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec, availableContexts=1000)
            await peer.wait_frames(keys.MT_HEARTBEAT_ACK)
            conn = adapter.connection("exec-0")
            assert conn is not None
            writes_before, batches_before = conn.writes, peer.recv_batches
            for i in range(200):
                adapter.bind(f"c{i}", "exec-0")
                adapter.send_execute_call("exec-0", f"c{i}", execute_payload())
            frames = await peer.wait_frames(keys.MT_EXECUTE_CALL, 200)
            assert [f.envelope[keys.F_CALL_ID] for f in frames] == [f"c{i}" for i in range(200)]
            assert frames[0].envelope[keys.F_PAYLOAD] == execute_payload()
            # 200 frames: three writes of 64 during the burst, the last 8 at the turn's end.
            assert conn.writes - writes_before == 4
            assert peer.recv_batches - batches_before <= 4
            assert conn.frames_sent >= 201

    run(scenario())


def test_single_send_is_flushed_at_the_end_of_the_loop_turn(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            conn = adapter.connection("exec-0")
            assert conn is not None
            adapter.bind("c1", "exec-0")
            adapter.send_execute_call("exec-0", "c1", execute_payload(), trace={"traceparent": "x"})
            assert conn.outbox_size == 1  # queued, not written yet
            await asyncio.sleep(0)
            assert conn.outbox_size == 0
            [frame] = await peer.wait_frames(keys.MT_EXECUTE_CALL)
            assert frame.envelope[keys.F_TRACE] == {"traceparent": "x"}

    run(scenario())


async def _back_up(
    adapter: ExecutorAdapter, peer: ExecutorPeer, executor_id: str = "exec-0"
) -> int:
    """Stop the peer reading and fill the adapter's transport until it pauses writing."""
    assert peer.transport is not None
    peer.transport.pause_reading()
    conn = adapter.connection(executor_id)
    assert conn is not None
    big = "x" * 65536
    sent = 0
    while not conn.paused:
        call_id = f"fill{sent}"
        adapter.bind(call_id, executor_id)
        adapter.send_execute_call(executor_id, call_id, execute_payload(args=big))
        adapter.flush(executor_id)
        sent += 1
        await asyncio.sleep(0)
        assert sent < 1000, "transport never paused"
    return sent


def test_a_backed_up_outbox_holds_call_frames_instead_of_refusing_them(run) -> None:
    """No configuration makes the outbox fail calls: past ``outbox_depth`` frames an
    ExecuteCall / ResumeCall waits for the connection to drain (back-pressure)."""

    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks(), outbox_depth=256) as adapter:
            peer = await attached(adapter, rec, availableContexts=keys.UNLIMITED_CONTEXTS)
            filled = await _back_up(adapter, peer)
            conn = adapter.connection("exec-0")
            assert conn is not None
            for i in range(1000):  # four times the depth
                adapter.bind(f"q{i}", "exec-0")
                adapter.send_execute_call("exec-0", f"q{i}", execute_payload())
            adapter.send_resume_call(
                "exec-0", "q0", "req-1", {keys.FP_RESUME_KIND: "io", keys.FP_RESULT: 1}
            )
            assert conn.outbox_size == 1001
            assert adapter.connection("exec-0") is conn  # the connection lives on
            # The executor reads again: everything queued arrives, in order.
            assert peer.transport is not None
            peer.transport.resume_reading()
            frames = await peer.wait_frames(keys.MT_EXECUTE_CALL, filled + 1000, timeout=20)
            assert frames[-1].envelope[keys.F_CALL_ID] == "q999"
            await peer.wait_frames(keys.MT_RESUME_CALL, 1, timeout=10)
            await rec.wait("control_sent")

    run(scenario())


def test_resume_and_cancel_count_as_sent_only_once_flushed(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec, availableContexts=keys.UNLIMITED_CONTEXTS)
            adapter.bind("w1", "exec-0")
            # Not backed up: reported after the end-of-turn flush, never inside the call.
            adapter.send_resume_call(
                "exec-0", "w1", "req-1", {keys.FP_RESUME_KIND: "io", keys.FP_RESULT: 1}, token=7
            )
            assert rec.named("control_sent") == []
            [(note,)] = await rec.wait("control_sent")
            assert note == ControlSend("exec-0", keys.MT_RESUME_CALL, "w1", "req-1", 7)
            # Backed up: the frames wait in the outbox and are not reported.
            await _back_up(adapter, peer)
            adapter.send_resume_call(
                "exec-0",
                "w1",
                "req-2",
                {keys.FP_RESUME_KIND: "io", keys.FP_RESULT: None},
                sidecar=b"\x00raw",
                token="a",
            )
            adapter.send_cancel_call("exec-0", "w1", attempt_seq=3, reason="test", token="b")
            waiter = asyncio.ensure_future(adapter.wait_flushed("exec-0"))
            await asyncio.sleep(0.05)
            assert len(rec.named("control_sent")) == 1
            assert not waiter.done()
            assert peer.transport is not None
            peer.transport.resume_reading()
            sent = await rec.wait("control_sent", 3, timeout=10)
            assert [n.token for (n,) in sent] == [7, "a", "b"]
            await asyncio.wait_for(waiter, 5)
            [_, resume] = await peer.wait_frames(keys.MT_RESUME_CALL, 2)
            assert resume.envelope[keys.F_REQUEST_ID] == "req-2" and resume.sidecar == b"\x00raw"
            [cancel] = await peer.wait_frames(keys.MT_CANCEL_CALL)
            assert cancel.envelope[keys.F_PAYLOAD] == {"reason": "test", "attemptSeq": 3}
            assert rec.named("control_failed") == []

    run(scenario())


def test_unflushed_controls_fail_when_the_connection_ends(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec, availableContexts=keys.UNLIMITED_CONTEXTS)
            await _back_up(adapter, peer)
            adapter.bind("w1", "exec-0")
            adapter.send_resume_call("exec-0", "w1", "req-1", {"resumeKind": "io"}, token=1)
            waiter = asyncio.ensure_future(adapter.wait_flushed("exec-0"))
            await asyncio.sleep(0)
            peer.close()
            [(note, error)] = await rec.wait("control_failed")
            assert note.call_id == "w1" and note.token == 1
            assert isinstance(error, ExecutorUnavailableError) and error.retryable
            with pytest.raises(ExecutorUnavailableError):
                await asyncio.wait_for(waiter, 5)
            # The failures came before the era's end was reported.
            names = [name for name, _ in rec.events]
            assert names.index("control_failed") < names.index("lost")
            assert rec.named("control_sent") == []

    run(scenario())


def test_send_errors_leave_nothing_queued(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            with pytest.raises(ExecutorUnavailableError, match="never attached"):
                adapter.send_execute_call("nobody", "c1", execute_payload())
            with pytest.raises(ExecutorUnavailableError):
                adapter.bind("c1", "nobody")
            await attached(adapter, rec)
            with pytest.raises(CallNotBoundError) as not_bound:
                adapter.send_execute_call("exec-0", "c1", execute_payload())
            assert not_bound.value.retryable
            with pytest.raises(CallNotBoundError):
                adapter.send_resume_call("exec-0", "c1", "r", {"resumeKind": "io"})
            adapter.bind("c1", "exec-0")
            assert adapter.mark_draining("c1", "exec-0")
            with pytest.raises(CallDrainingError) as draining:
                adapter.send_execute_call("exec-0", "c1", execute_payload())
            assert not draining.value.retryable
            conn = adapter.connection("exec-0")
            assert conn is not None and conn.outbox_size == 0
            # An unencodable payload raises the wire's EncodeError and queues nothing.
            adapter.bind("c2", "exec-0")
            with pytest.raises(EncodeError):
                adapter.send_execute_call("exec-0", "c2", execute_payload(args={1, 2}))
            assert conn.outbox_size == 0

    run(scenario())


# --- reservations ---------------------------------------------------------------------------


def test_terminal_frames_release_reservations_idempotently_with_unbind(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec, availableContexts=10)
            for call_id in ("a", "b", "c"):
                adapter.bind(call_id, "exec-0")
                adapter.send_execute_call("exec-0", call_id, execute_payload())
            assert adapter.snapshot("exec-0").local_inflight == 3  # type: ignore[union-attr]
            peer.completed("a", 1)
            peer.failed("b")
            await rec.wait("completed")
            await rec.wait("failed")
            assert adapter.reserved_calls("exec-0") == ("c",)
            assert adapter.unbind("a", "exec-0") is False  # already released: no-op
            assert adapter.unbind("c", "exec-0") is True
            assert adapter.unbind("c", "exec-0") is False
            snap = adapter.snapshot("exec-0")
            assert snap is not None and snap.local_inflight == 0
            assert snap.completions_since_heartbeat == 2
            peer.heartbeat(seq=2)
            await rec.wait("heartbeat")
            assert adapter.snapshot("exec-0").completions_since_heartbeat == 0  # type: ignore[union-attr]

    run(scenario())


def test_draining_reservation_is_kept_until_the_terminal_frame(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("p", "exec-0")
            adapter.send_execute_call("exec-0", "p", execute_payload())
            adapter.bind_subcall("p/sub-1", "p", "exec-0")
            assert adapter.mark_draining("p", "exec-0")
            assert adapter.is_draining("p", "exec-0")
            assert not adapter.mark_draining("ghost", "exec-0")
            # Draining parents take no more sub-calls.
            with pytest.raises(ParentNotResidentError):
                adapter.bind_subcall("p/sub-2", "p", "exec-0")
            assert adapter.unbind("p", "exec-0") is False  # kept: the executor still runs it
            assert adapter.is_reserved("p", "exec-0")
            assert adapter.snapshot("exec-0").draining == 1  # type: ignore[union-attr]
            peer.failed("p", "cancelled")
            await rec.wait("failed")
            assert not adapter.is_reserved("p", "exec-0")
            assert not adapter.is_draining("p", "exec-0")
            assert adapter.reserved_calls("exec-0") == ("p/sub-1",)

    run(scenario())


def test_terminal_frame_of_a_replaced_attempt_releases_nothing(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            peer = await attached(adapter, rec)
            adapter.bind("c", "exec-0")
            adapter.send_execute_call("exec-0", "c", execute_payload(attempt=1))
            adapter.bind("c", "exec-0")  # a new attempt on the same executor
            adapter.send_execute_call("exec-0", "c", execute_payload(attempt=2))
            peer.failed("c", attempt=1)
            await rec.wait("failed")  # still forwarded: the core drops it as stale
            assert adapter.is_reserved("c", "exec-0")
            assert adapter.stale_terminal_frames == 1
            peer.completed("c", attempt=2)
            await rec.wait("completed")
            assert not adapter.is_reserved("c", "exec-0")

    run(scenario())


def test_bind_respects_usable_contexts_but_subcalls_are_exempt(run) -> None:
    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            await attached(adapter, rec, availableContexts=1, inflightCount=1)
            adapter.bind("a", "exec-0")
            adapter.bind("b", "exec-0")
            with pytest.raises(ExecutorCapacityError) as full:
                adapter.bind("c", "exec-0")
            assert full.value.retryable and full.value.usable == 2
            adapter.bind("a", "exec-0")  # re-bind of a reserved call needs no new context
            adapter.bind_subcall("a/sub-1", "a", "exec-0")
            assert adapter.snapshot("exec-0").headroom == -1  # type: ignore[union-attr]

    run(scenario())

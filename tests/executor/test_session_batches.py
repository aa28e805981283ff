"""UDSSession over a real socketpair, batched frames (docs/protocol.md "Batched frames"):
plain frames until the worker's ack enables batching, then each write's run of frames
goes out as one batched frame that decodes to the same frames in the same order."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from blockx.executor.uds_session import MAX_FRAMES_PER_WRITE, UDSSession, _coalesce
from blockx.wire import BATCH_MAGIC, FrameDecoder, decode_frames, encode_frame, keys

pytestmark = pytest.mark.timeout(30)


class RawPeer:
    """The worker's end: keeps every outer frame as written, and decodes them too."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self.outer: list[bytes] = []  # every outer frame, prefix included
        self.decoder = FrameDecoder()
        self.call_ids: list[str] = []

    def read_calls(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.call_ids) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"got {len(self.call_ids)} of {count} frames")
            self.sock.settimeout(remaining)
            data = self.sock.recv(1 << 20)
            assert data, "EOF"
            self._buffer += data
            while len(self._buffer) >= 4:
                (size,) = struct.unpack_from(">I", self._buffer, 0)
                if len(self._buffer) < 4 + size:
                    break
                self.outer.append(bytes(self._buffer[: 4 + size]))
                del self._buffer[: 4 + size]
            for frame in self.decoder.feed(data):
                self.call_ids.append(frame.envelope[keys.F_CALL_ID])

    @property
    def batched(self) -> list[bytes]:
        return [frame for frame in self.outer if frame[4:8] == BATCH_MAGIC]


@pytest.fixture(params=[True, False], ids=["owner-flush", "writer-only"])
def pair(request: Any) -> Iterator[tuple[UDSSession, RawPeer]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    session = UDSSession.from_socket(ours, executor_id="exec-1", owner_flush=request.param)
    try:
        yield session, RawPeer(theirs)
    finally:
        session.close(flush_timeout=1)
        theirs.close()


def _completed(call_id: str) -> dict[str, Any]:
    return {keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED, keys.F_CALL_ID: call_id, "payload": {}}


def _send_run(session: UDSSession, ids: list[str]) -> None:
    for call_id in ids:
        session.send_message(_completed(call_id))
    session.flush()


def test_before_batching_is_enabled_every_frame_is_plain(pair) -> None:
    session, peer = pair
    ids = [f"c{i}" for i in range(40)]
    _send_run(session, ids)
    peer.read_calls(40)
    assert peer.call_ids == ids
    assert peer.batched == []
    assert len(peer.outer) == 40
    assert not session.batching


def test_after_batching_is_enabled_a_run_arrives_as_batched_frames(pair) -> None:
    session, peer = pair
    session.enable_batching()
    ids = [f"c{i}" for i in range(200)]
    _send_run(session, ids)
    peer.read_calls(200)
    assert peer.call_ids == ids  # every frame once, in order
    # Whatever the writes were, the runs went out batched: far fewer outer frames.
    assert peer.batched
    assert len(peer.outer) < 200
    for outer in peer.outer:
        inner = decode_frames(outer)
        assert len(inner) <= MAX_FRAMES_PER_WRITE


def test_a_run_queued_in_one_go_is_one_batched_frame() -> None:
    # Only the writer writes, and it is blocked behind a big frame while the run queues:
    # the whole run then goes out in one write, as one batched frame.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    session = UDSSession.from_socket(ours, executor_id="exec-1", owner_flush=False)
    peer = RawPeer(theirs)
    try:
        session.enable_batching()
        session.send_message(_completed("big"), b"z" * (4 << 20))
        deadline = time.monotonic() + 10
        while session._outgoing and time.monotonic() < deadline:  # the writer took it
            time.sleep(0.002)
        ids = [f"c{i}" for i in range(10)]
        for call_id in ids:
            session.send_message(_completed(call_id))
        peer.read_calls(11)
        assert peer.call_ids == ["big", *ids]
        assert len(peer.outer) == 2 and peer.outer[1][4:8] == BATCH_MAGIC
        assert struct.unpack_from(">I", peer.outer[1], 8)[0] == 10
    finally:
        session.close(flush_timeout=1)
        theirs.close()


def test_coalesce_batches_each_write_sized_group() -> None:
    frames = [encode_frame(_completed(f"c{i}")) for i in range(150)]
    plain = _coalesce(frames)
    batched = _coalesce(frames, batching=True)
    assert len(batched) == len(plain) == 3
    for chunk_plain, chunk_batched in zip(plain, batched, strict=True):
        assert chunk_batched[4:8] == BATCH_MAGIC
        assert [f.envelope for f in decode_frames(chunk_batched)] == [
            f.envelope for f in FrameDecoder().feed(chunk_plain)
        ]
    assert _coalesce(frames[:1], batching=True) == frames[:1]  # one frame stays plain

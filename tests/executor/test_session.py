"""UDSSession over real sockets: frames both ways, batched wake-ups, coalesced writes,
EOF and protocol errors, close/flush, connect, and the heartbeat thread on top of it."""

from __future__ import annotations

import collections
import logging
import math
import socket
import struct
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from blockx.executor.heartbeat import HeartbeatThread
from blockx.executor.uds_session import (
    MAX_BYTES_PER_WRITE,
    MAX_FRAMES_PER_WRITE,
    SessionConnectError,
    UDSSession,
    _coalesce,
    _WakeFlag,
)
from blockx.wire import (
    MAX_FRAME_BYTES,
    Frame,
    FrameDecoder,
    NotSerializableError,
    PayloadTooLargeError,
    encode_frame,
    keys,
)

pytestmark = pytest.mark.timeout(30)


def _session_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("blockx-")]


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    before = set(_session_threads())
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        leaked = [t for t in _session_threads() if t not in before and t.is_alive()]
        if not leaked:
            return
        time.sleep(0.01)
    raise AssertionError(f"threads left running: {leaked}")


class Peer:
    """The worker's end of a socketpair, read with a real FrameDecoder."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(5)
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []

    def send(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        self.sock.sendall(encode_frame(envelope, sidecar))

    def read(self, count: int, timeout: float = 5.0) -> list[Frame]:
        deadline = time.monotonic() + timeout
        while len(self.frames) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"got {len(self.frames)} of {count} frames")
            self.sock.settimeout(remaining)
            data = self.sock.recv(1 << 20)
            if not data:
                raise AssertionError(f"EOF after {len(self.frames)} of {count} frames")
            self.frames.extend(self.decoder.feed(data))
        taken, self.frames = self.frames[:count], self.frames[count:]
        return taken

    def read_eof(self, timeout: float = 5.0) -> bytes:
        """Read until EOF; return whatever bytes came."""
        self.sock.settimeout(timeout)
        chunks = []
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                return b"".join(chunks)
            chunks.append(data)


def _make_pair(owner_flush: bool) -> Iterator[tuple[UDSSession, Peer]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    session = UDSSession.from_socket(ours, executor_id="exec-1", owner_flush=owner_flush)
    peer = Peer(theirs)
    try:
        yield session, peer
    finally:
        session.close(flush_timeout=1)
        theirs.close()


@pytest.fixture
def pair() -> Iterator[tuple[UDSSession, Peer]]:
    """A session whose owner (this thread) also writes: the executor's configuration."""
    yield from _make_pair(owner_flush=True)


@pytest.fixture
def writer_pair() -> Iterator[tuple[UDSSession, Peer]]:
    """A session where only the writer thread writes."""
    yield from _make_pair(owner_flush=False)


def _envelope(message_type: str, call_id: str | None = "c1", **payload: Any) -> dict[str, Any]:
    env: dict[str, Any] = {keys.F_MESSAGE_TYPE: message_type, keys.F_PAYLOAD: payload}
    if call_id is not None:
        env[keys.F_CALL_ID] = call_id
    return env


def _wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


# --- frames both ways -----------------------------------------------------------------


def test_sent_frames_arrive_whole_in_order_with_executor_id(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    for i in range(10):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED, f"c{i}", taskId="t", output=i))
    frames = peer.read(10)
    assert [f.envelope[keys.F_CALL_ID] for f in frames] == [f"c{i}" for i in range(10)]
    assert all(f.envelope[keys.F_EXECUTOR_ID] == "exec-1" for f in frames)
    assert [f.envelope[keys.F_PAYLOAD]["output"] for f in frames] == list(range(10))


def test_an_executor_id_already_set_is_kept(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    env = _envelope(keys.MT_HEARTBEAT, None)
    env[keys.F_EXECUTOR_ID] = "other"
    session.send_message(env)
    assert peer.read(1)[0].envelope[keys.F_EXECUTOR_ID] == "other"


def test_sidecars_travel_both_ways_untouched(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    blob = bytes(range(256)) * 10
    session.send_message(_envelope(keys.MT_CALL_WAITING, taskId="t", waitKind="io"), blob)
    out = peer.read(1)[0]
    assert out.sidecar == blob
    peer.send(_envelope(keys.MT_RESUME_CALL, resumeKind="io"), b"\x00\xffresponse")
    assert session.wait_for_message(5)
    (inbound,) = session.drain_incoming()
    assert inbound.sidecar == b"\x00\xffresponse"
    assert inbound.envelope[keys.F_PAYLOAD] == {"resumeKind": "io"}


def test_received_frames_are_drained_in_order(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    for i in range(5):
        peer.send(_envelope(keys.MT_EXECUTE_CALL, f"c{i}"))
    got: list[Frame] = []
    deadline = time.monotonic() + 5
    while len(got) < 5 and time.monotonic() < deadline:
        session.wait_for_message(1)
        got.extend(session.drain_incoming())
    assert [f.envelope[keys.F_CALL_ID] for f in got] == [f"c{i}" for i in range(5)]
    assert session.drain_incoming() == []
    assert session.frames_received == 5


def test_frames_split_at_every_byte_still_decode(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    data = encode_frame(_envelope(keys.MT_EXECUTE_CALL, "split"), b"side") + encode_frame(
        _envelope(keys.MT_CANCEL_CALL, "split")
    )
    for i in range(len(data)):
        peer.sock.sendall(data[i : i + 1])
    got: list[Frame] = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        session.wait_for_message(1)
        got.extend(session.drain_incoming())
    assert [f.message_type for f in got] == [keys.MT_EXECUTE_CALL, keys.MT_CANCEL_CALL]
    assert got[0].sidecar == b"side"
    assert session.is_connected()


# --- wake-ups ---------------------------------------------------------------------------


def test_wait_for_message_times_out_without_frames(pair: tuple[UDSSession, Peer]) -> None:
    session, _ = pair
    start = time.monotonic()
    assert session.wait_for_message(0.05) is False
    assert time.monotonic() - start >= 0.04
    assert session.wait_for_message(0) is False


def test_wait_for_message_returns_at_once_when_frames_are_pending(
    pair: tuple[UDSSession, Peer],
) -> None:
    session, peer = pair
    peer.send(_envelope(keys.MT_EXECUTE_CALL))
    _wait_until(session.has_incoming)
    assert session.wait_for_message(0) is True
    assert session.wait_for_message(None) is True
    assert len(session.drain_incoming()) == 1


def test_a_burst_of_frames_costs_one_wake_up(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    burst = b"".join(encode_frame(_envelope(keys.MT_RESUME_CALL, f"c{i}")) for i in range(200))
    peer.sock.sendall(burst)
    _wait_until(lambda: session.frames_received == 200)
    # One recv usually takes the whole burst; in any case far fewer wake-ups than frames.
    assert session.wakeups <= 3
    assert len(session.drain_incoming()) == 200


def test_wake_from_another_thread_ends_a_wait(pair: tuple[UDSSession, Peer]) -> None:
    session, _ = pair
    timer = threading.Timer(0.05, session.wake)
    timer.start()
    start = time.monotonic()
    session.wait_for_message(5)
    assert time.monotonic() - start < 2
    timer.join()


def test_no_wake_up_is_lost_between_drain_and_wait(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    received = 0
    for i in range(300):
        peer.send(_envelope(keys.MT_RESUME_CALL, f"c{i}"))
        assert session.wait_for_message(5), f"frame {i} never woke the loop"
        received += len(session.drain_incoming())
        _ = i
    _wait_until(lambda: session.frames_received == 300)
    received += len(session.drain_incoming())
    assert received == 300


def test_a_frame_arriving_while_the_loop_drains_is_never_lost(
    pair: tuple[UDSSession, Peer],
) -> None:
    # Deterministic form of the race above: the reader appends a frame and sets the flag
    # at the worst moment, while drain_incoming takes what is queued. Either the frame is
    # drained now, or the flag stays set so the next wait returns at once.
    session, _ = pair
    late = Frame(_envelope(keys.MT_RESUME_CALL, "late"), None)

    class RacingDeque(collections.deque):  # type: ignore[type-arg]
        raced = False

        def __len__(self) -> int:
            n = super().__len__()
            if not self.raced:
                self.raced = True
                self.append(late)  # the reader thread, just now
                session._wake.set()
            return n

    session._incoming = RacingDeque([Frame(_envelope(keys.MT_RESUME_CALL, "first"), None)])
    drained = session.drain_incoming()
    if late not in drained:
        assert session.wait_for_message(0.05), "the late frame's wake-up was lost"
        drained += session.drain_incoming()
    assert [f.envelope[keys.F_CALL_ID] for f in drained] == ["first", "late"]


# --- coalesced writes ---------------------------------------------------------------------


def test_coalesce_groups_whole_frames_under_both_caps() -> None:
    small = [bytes([i % 256]) * 10 for i in range(150)]
    chunks = _coalesce(small)
    assert b"".join(chunks) == b"".join(small)
    assert [len(c) // 10 for c in chunks] == [64, 64, 22]
    big = b"x" * (MAX_BYTES_PER_WRITE + 1)
    chunks = _coalesce([b"a", big, b"b", b"c"])
    assert chunks == [b"a", big, b"bc"]
    assert _coalesce([b"only"]) == [b"only"]
    near = [b"y" * (MAX_BYTES_PER_WRITE // 2 + 1)] * 3
    assert len(_coalesce(near)) == 3


def test_frames_queued_while_a_write_blocks_go_out_in_few_writes(
    writer_pair: tuple[UDSSession, Peer],
) -> None:
    session, peer = writer_pair
    # A 4 MiB frame fills the socket buffers: the writer blocks in sendall until we read.
    session.send_message(
        _envelope(keys.MT_CALL_WAITING, "big", taskId="t", waitKind="io"), b"z" * (4 << 20)
    )
    _wait_until(lambda: session.writes == 0 and not session._outgoing)
    time.sleep(0.05)
    for i in range(100):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED, f"c{i}", taskId="t"))
    frames = peer.read(101, timeout=10)
    assert frames[0].envelope[keys.F_CALL_ID] == "big"
    assert [f.envelope[keys.F_CALL_ID] for f in frames[1:]] == [f"c{i}" for i in range(100)]
    _wait_until(lambda: session.frames_sent == 101)
    # 1 write for the big frame, then 100 small frames in ceil(100 / 64) writes.
    assert session.writes == 1 + math.ceil(100 / MAX_FRAMES_PER_WRITE)


def test_the_owner_sends_its_queue_in_one_write_before_it_waits(
    pair: tuple[UDSSession, Peer],
) -> None:
    session, peer = pair
    for i in range(10):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED, f"c{i}"))
    session.wait_for_message(0)
    assert [f.envelope[keys.F_CALL_ID] for f in peer.read(10)] == [f"c{i}" for i in range(10)]
    assert session.frames_sent == 10
    assert session.writes <= 2  # one, unless a GIL switch let the writer take the first frames


def test_the_owner_writes_a_full_batch_without_waiting(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    for i in range(MAX_FRAMES_PER_WRITE):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED, f"c{i}"))
    assert session.frames_sent == MAX_FRAMES_PER_WRITE  # sent from this thread, at once
    assert len(peer.read(MAX_FRAMES_PER_WRITE)) == MAX_FRAMES_PER_WRITE


def test_a_partial_owner_write_is_finished_by_the_writer_in_order(
    pair: tuple[UDSSession, Peer],
) -> None:
    session, peer = pair
    big = b"z" * (4 << 20)  # more than the socket buffers take at once
    session.send_message(_envelope(keys.MT_CALL_WAITING, "big"), big)
    assert session._partial is not None or session.frames_sent == 1
    for i in range(100):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED, f"c{i}"))
        session.flush()
    frames = peer.read(101, timeout=10)
    assert frames[0].envelope[keys.F_CALL_ID] == "big" and frames[0].sidecar == big
    assert [f.envelope[keys.F_CALL_ID] for f in frames[1:]] == [f"c{i}" for i in range(100)]


def test_frames_sent_from_other_threads_go_through_the_writer(
    pair: tuple[UDSSession, Peer],
) -> None:
    session, peer = pair
    thread = threading.Thread(
        target=lambda: session.send_message(_envelope(keys.MT_HEARTBEAT, None))
    )
    thread.start()
    thread.join()
    (frame,) = peer.read(1)
    assert frame.message_type == keys.MT_HEARTBEAT


def test_a_busy_owner_does_not_hold_back_its_frames(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    session.send_message(_envelope(keys.MT_CALL_WAITING, "early"))
    # The owner now runs a long call without reaching wait_for_message: the writer sends.
    # The owner stays busy for up to 10 s; the frame must arrive long before that
    # (how soon depends on the machine, so the bound is far from both ends).
    start = time.monotonic()
    end = start + 10.0
    got: list[Frame] = []

    def read() -> None:
        got.extend(peer.read(1))

    reader = threading.Thread(target=read)
    reader.start()
    while time.monotonic() < end and reader.is_alive():
        pass  # busy, holding the GIL between switch intervals
    reader.join()
    assert got and got[0].envelope[keys.F_CALL_ID] == "early"
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize("owner_flush", [True, False])
def test_many_threads_sending_never_interleave_frames(owner_flush: bool) -> None:
    pairs = _make_pair(owner_flush)
    session, peer = next(pairs)

    def blast(tag: int) -> None:
        for i in range(200):
            session.send_message(
                _envelope(keys.MT_CALL_COMPLETED, f"{tag}-{i}", pad="p" * (i % 50))
            )

    threads = [threading.Thread(target=blast, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    blast(4)  # the owner thread too
    session.flush()
    for t in threads:
        t.join()
    frames = peer.read(1000, timeout=10)
    for tag in range(5):
        ids = [
            f.envelope[keys.F_CALL_ID]
            for f in frames
            if f.envelope[keys.F_CALL_ID].startswith(f"{tag}-")
        ]
        assert ids == [f"{tag}-{i}" for i in range(200)]
    pairs.close()


# --- encoding errors ---------------------------------------------------------------------


def test_an_unencodable_frame_raises_to_the_caller_and_the_connection_lives_on(
    pair: tuple[UDSSession, Peer],
) -> None:
    session, peer = pair
    with pytest.raises(NotSerializableError):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED, output=Decimal("1.5")))
    with pytest.raises(PayloadTooLargeError):
        session.send_message(_envelope(keys.MT_CALL_WAITING), b"x" * MAX_FRAME_BYTES)
    session.send_message(_envelope(keys.MT_CALL_COMPLETED, "after", output=1))
    (frame,) = peer.read(1)
    assert frame.envelope[keys.F_CALL_ID] == "after"
    assert session.is_connected()


# --- the connection ending -----------------------------------------------------------------


def test_eof_from_the_worker_disconnects_and_wakes(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    waiter_result: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(session.wait_for_message(10)))
    waiter.start()
    time.sleep(0.05)
    peer.sock.shutdown(socket.SHUT_RDWR)
    waiter.join(5)
    assert waiter_result == [True]
    _wait_until(lambda: not session.is_connected())
    assert "closed by the worker" in (session.disconnect_reason or "")
    with pytest.raises(ConnectionError):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED))
    assert session.wait_for_message(None) is True


def test_frames_before_eof_are_still_delivered(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    peer.send(_envelope(keys.MT_EXECUTE_CALL, "last"))
    peer.sock.shutdown(socket.SHUT_WR)
    _wait_until(lambda: not session.is_connected())
    assert [f.envelope[keys.F_CALL_ID] for f in session.drain_incoming()] == ["last"]


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("oversize", struct.pack(">I", MAX_FRAME_BYTES + 1)),
        ("not json", struct.pack(">I", 5) + b"{oops"),
        ("not an object", struct.pack(">I", 2) + b"[]"),
        ("no messageType", struct.pack(">I", 2) + b"{}"),
        ("bad sidecar header", struct.pack(">I", 10) + b"BXB1" + struct.pack(">I", 99) + b"{}"),
    ],
)
def test_a_protocol_error_logs_disconnects_and_wakes(
    pair: tuple[UDSSession, Peer], caplog: pytest.LogCaptureFixture, name: str, data: bytes
) -> None:
    session, peer = pair
    caplog.set_level(logging.ERROR, logger="blockx.executor.session")
    peer.send(_envelope(keys.MT_EXECUTE_CALL, "good"))
    peer.sock.sendall(data)
    assert session.wait_for_message(5)
    _wait_until(lambda: not session.is_connected())
    assert session.disconnect_reason is not None
    assert session.disconnect_reason.startswith("protocol error"), name
    assert any("protocol error" in r.getMessage() for r in caplog.records)
    # The executor closed its side: the worker sees EOF.
    peer.read_eof()
    with pytest.raises(ConnectionError):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED))


def test_eof_inside_a_frame_is_a_protocol_error(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    peer.sock.sendall(struct.pack(">I", 100) + b'{"messageType"')
    peer.sock.shutdown(socket.SHUT_WR)
    _wait_until(lambda: not session.is_connected())
    assert "protocol error" in (session.disconnect_reason or "")


def test_a_failed_write_disconnects(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    peer.sock.close()
    deadline = time.monotonic() + 5
    while session.is_connected() and time.monotonic() < deadline:
        try:
            session.send_message(_envelope(keys.MT_CALL_COMPLETED))
        except ConnectionError:
            break
        time.sleep(0.01)
    assert not session.is_connected()
    assert session.wait_for_message(0) is True


# --- close ----------------------------------------------------------------------------------


def test_close_flushes_queued_frames_then_ends_the_threads(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    for i in range(500):
        session.send_message(
            _envelope(keys.MT_CALL_FAILED, f"c{i}", taskId="t", errorKind="cancelled")
        )
    session.close(flush_timeout=5)
    assert not session.is_connected()
    data = peer.read_eof()
    frames = FrameDecoder().feed(data)
    assert [f.envelope[keys.F_CALL_ID] for f in frames] == [f"c{i}" for i in range(500)]
    assert not session._reader.is_alive()
    assert not session._writer.is_alive()
    session.close()  # idempotent
    with pytest.raises(ConnectionError):
        session.send_message(_envelope(keys.MT_CALL_COMPLETED))


def test_close_does_not_hang_when_the_worker_stops_reading(pair: tuple[UDSSession, Peer]) -> None:
    session, _peer = pair
    session.send_message(_envelope(keys.MT_CALL_WAITING), b"q" * (8 << 20))
    start = time.monotonic()
    session.close(flush_timeout=0.2)
    assert time.monotonic() - start < 3
    assert not session._writer.is_alive()


def test_repr_shows_state(pair: tuple[UDSSession, Peer]) -> None:
    session, _ = pair
    assert "exec-1" in repr(session) and "connected" in repr(session)
    session.close()
    assert "disconnected" in repr(session)


# --- connecting -------------------------------------------------------------------------------


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bx-") as d:
        yield Path(d)


def test_connects_to_a_listening_socket(short_tmp: Path) -> None:
    path = str(short_tmp / "w.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    session = UDSSession(path, executor_id="exec-9", connect_timeout=2)
    conn, _ = listener.accept()
    try:
        session.send_message(_envelope(keys.MT_HEARTBEAT, None))
        peer = Peer(conn)
        assert peer.read(1)[0].envelope[keys.F_EXECUTOR_ID] == "exec-9"
    finally:
        session.close()
        conn.close()
        listener.close()


def test_connect_retries_until_the_listener_appears(short_tmp: Path) -> None:
    path = str(short_tmp / "late.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def listen_late() -> None:
        time.sleep(0.2)
        listener.bind(path)
        listener.listen(1)

    thread = threading.Thread(target=listen_late)
    thread.start()
    session = UDSSession(path, executor_id="exec-late", connect_timeout=5)
    thread.join()
    conn, _ = listener.accept()
    assert session.is_connected()
    session.close()
    conn.close()
    listener.close()


def test_connect_failure_is_a_clear_error_after_the_timeout(short_tmp: Path) -> None:
    path = str(short_tmp / "missing.sock")
    start = time.monotonic()
    with pytest.raises(
        SessionConnectError, match=r"cannot connect to the worker socket .*missing\.sock"
    ):
        UDSSession(path, executor_id="exec-1", connect_timeout=0.2)
    assert 0.15 < time.monotonic() - start < 3


def test_a_socket_path_too_long_is_refused_at_once(short_tmp: Path) -> None:
    with pytest.raises(SessionConnectError, match="longer than"):
        UDSSession(str(short_tmp / ("x" * 200)), executor_id="exec-1", connect_timeout=5)


# --- the heartbeat thread on a session ------------------------------------------------------------


def test_heartbeat_thread_sends_first_at_once_then_every_interval(
    pair: tuple[UDSSession, Peer],
) -> None:
    session, peer = pair
    seq = iter(range(1, 1000))
    heartbeat = HeartbeatThread(
        session,
        lambda: {keys.FP_EXECUTOR_ID: "exec-1", keys.FP_HEARTBEAT_SEQ: next(seq)},
        executor_id="exec-1",
        interval_s=0.05,
    )
    start = time.monotonic()
    heartbeat.start()
    first = peer.read(1)[0]
    assert time.monotonic() - start < 1
    frames = [first, *peer.read(3)]
    heartbeat.stop()
    assert not heartbeat.is_alive()
    assert [f.message_type for f in frames] == [keys.MT_HEARTBEAT] * 4
    assert [f.envelope[keys.F_PAYLOAD][keys.FP_HEARTBEAT_SEQ] for f in frames] == [1, 2, 3, 4]
    for f in frames:
        assert f.envelope[keys.F_EXECUTOR_ID] == "exec-1"
        assert keys.FP_SENT_AT_MS in f.envelope[keys.F_PAYLOAD]
        assert keys.F_CALL_ID not in f.envelope


def test_heartbeat_build_failure_is_retried_not_fatal(
    pair: tuple[UDSSession, Peer], caplog: pytest.LogCaptureFixture
) -> None:
    session, peer = pair
    calls = {"n": 0}

    def build() -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return {keys.FP_HEARTBEAT_SEQ: calls["n"]}

    heartbeat = HeartbeatThread(session, build, executor_id="exec-1", interval_s=10)
    heartbeat.start()
    (frame,) = peer.read(1)
    heartbeat.stop()
    assert frame.envelope[keys.F_PAYLOAD][keys.FP_HEARTBEAT_SEQ] == 2
    assert heartbeat.failures == 1


def test_heartbeat_thread_stops_on_disconnect(pair: tuple[UDSSession, Peer]) -> None:
    session, peer = pair
    heartbeat = HeartbeatThread(session, dict, executor_id="exec-1", interval_s=0.02)
    heartbeat.start()
    peer.read(1)
    peer.sock.shutdown(socket.SHUT_RDWR)
    _wait_until(lambda: not heartbeat.is_alive())
    heartbeat.stop()


def test_heartbeat_interval_must_be_positive(pair: tuple[UDSSession, Peer]) -> None:
    session, _ = pair
    with pytest.raises(ValueError):
        HeartbeatThread(session, dict, executor_id="e", interval_s=0)


def test_wake_flag_behaves_like_an_event() -> None:
    flag = _WakeFlag()
    assert not flag.is_set() and flag.wait(0.01) is False
    flag.set()
    flag.set()  # idempotent
    assert flag.is_set() and flag.wait(None) is True and flag.wait(0.01) is True  # stays set
    flag.clear()
    flag.clear()  # idempotent
    assert not flag.is_set() and flag.wait(0.01) is False
    setter = threading.Timer(0.05, flag.set)
    setter.start()
    started = time.monotonic()
    assert flag.wait(5.0) is True
    assert time.monotonic() - started < 4.0
    setter.join()

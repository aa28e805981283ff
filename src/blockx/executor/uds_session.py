"""UDSSession: the executor's one Unix-socket connection to its worker.

Theory of operation
-------------------
The main thread runs the scheduler (``ExecutorRuntime``) and is the only thread
that switches into call greenlets. Two daemon threads own the socket's two
directions and never touch the runtime:

* the **reader** ``recv``s into one :class:`~blockx.wire.FrameDecoder`, appends
  every frame a read completed to ``_incoming`` and sets ``_wake`` once per
  read, not once per frame — a burst of 64 ``ResumeCall`` frames costs the main
  thread one wake-up (``_wake`` is a :class:`_WakeFlag`: an Event on plain locks,
  a quarter of ``threading.Event``'s cost per wake-up);
* the **writer** sends what :meth:`UDSSession.send_message` queued. Frames are
  encoded in the *caller's* thread (so an encoding error reaches the caller and
  nothing is half-queued) and the writer joins everything queued since its last
  write — up to :data:`MAX_FRAMES_PER_WRITE` frames or :data:`MAX_BYTES_PER_WRITE`
  bytes — into one ``sendall``. Once the worker has acked ``features: ["batch"]``
  (:meth:`UDSSession.enable_batching`, docs/protocol.md "Batched frames") the frames
  of one write go out as one batched frame instead of back to back.

**Owner flush.** The thread that built the session (the main loop) also writes,
without a thread hand-off: when its queue reaches a full write, and in
:meth:`UDSSession.wait_for_message` just before it blocks, it sends what is
queued with one non-blocking ``send``; whatever the kernel does not take is left
to the writer thread (blocking ``sendall``). One ``_write_lock`` makes sure a
single thread writes at a time, and the unsent tail of a partial write goes out
before anything queued after it. The writer is still woken by the first frame
queued while it sleeps, and then polls the queue every 2 ms for a while instead
of being woken per frame (a thread wake-up per round trip costs more than the
round trip's own work): if the main thread stays busy in a long call, the poll
plus Python's GIL switch interval send its frames within ~7 ms.

Invariants:

* Frames go out whole and in ``send_message`` order; one thread writes at a time.
* Once the connection is gone (EOF, a protocol error from the peer, a failed
  write, :meth:`UDSSession.close`) ``is_connected()`` is False for good,
  ``send_message`` raises :class:`ConnectionError` and the main loop is woken.
  There is no reconnect (docs/protocol.md, "Disconnects").
* No lost wake-ups: :meth:`drain_incoming` clears ``_wake`` (when set) *before*
  it takes the frames, and the reader appends *before* it sets ``_wake``. At
  worst a wake-up is spurious: the frames it announced were already taken.

Who calls it: ``blockx.executor.__main__`` builds it and runs the main loop;
the runtime calls ``send_message`` / ``drain_incoming`` from the main thread,
the heartbeat thread calls ``send_message``.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from blockx.wire import Frame, FrameDecoder, ProtocolError, batch_frames, encode_frame, keys

from .errors import SessionConnectError
from .execute_frames import decode_inbound

__all__ = [
    "MAX_BYTES_PER_WRITE",
    "MAX_FRAMES_PER_WRITE",
    "SessionConnectError",
    "UDSSession",
]

_log = logging.getLogger("blockx.executor.session")

#: At most this many frames are joined into one ``sendall``.
MAX_FRAMES_PER_WRITE: Final = 64
#: ... and at most about this many bytes (a single larger frame goes alone).
MAX_BYTES_PER_WRITE: Final = 256 * 1024
#: While traffic flows the writer polls the queue this often (seconds) instead of being
#: woken for every frame the owner queues ...
_WRITER_POLL_S: Final = 0.002
#: ... and goes back to sleep (woken by the next frame) after this many empty polls.
_WRITER_IDLE_POLLS: Final = 50
_WRITER_RUNNING: Final = 0
_WRITER_POLLING: Final = 1
_WRITER_SLEEPING: Final = 2
#: The owner thread sends its queue as soon as it holds this many frames.
_OWNER_FLUSH_FRAMES: Final = MAX_FRAMES_PER_WRITE
#: Bytes asked of each ``recv``.
_RECV_BYTES: Final = 256 * 1024
#: Errors on connect that mean "the worker is not listening yet": retried until the timeout.
_RETRY_CONNECT_ERRNOS: Final = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN})


class _WakeFlag:
    """``threading.Event``'s ``set`` / ``clear`` / ``is_set`` / ``wait`` on two plain locks.

    ``Event.wait`` goes through a ``Condition`` that allocates a lock per wait:
    a set → wait → clear cycle costs ~3 µs of Python, once per main-loop wake-up.
    Here ``_signal`` is released exactly while the flag is set (``_guard`` keeps
    the two in step), so a wait is one ``acquire``. One thread waits at a time.
    """

    __slots__ = ("_guard", "_signal", "flag")

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._signal = threading.Lock()
        self._signal.acquire()  # held while the flag is clear
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        with self._guard:
            if not self.flag:
                self.flag = True
                self._signal.release()

    def clear(self) -> None:
        with self._guard:
            if self.flag:
                self.flag = False
                self._signal.acquire()  # released while set: does not block (or only
                # for the instant a wait() holds it before handing it back)

    def wait(self, timeout: float | None) -> bool:
        """Block until set or ``timeout`` passed (None: no limit); the flag stays set."""
        if self.flag:
            return True
        if self._signal.acquire(timeout=-1 if timeout is None else timeout):
            self._signal.release()
            return True
        return self.flag


class UDSSession:
    """One Unix stream connection with a reader thread, a writer thread and a wake event.

    Build it with a socket path (it connects, retrying while the worker's
    listener is not there yet, for up to ``connect_timeout`` seconds) or wrap an
    already connected socket with :meth:`from_socket`. The threads start at once.
    """

    def __init__(
        self,
        socket_path: str,
        *,
        executor_id: str,
        connect_timeout: float = 10.0,
        owner_flush: bool = True,
        connected: socket.socket | None = None,
    ) -> None:
        # connected: the socket from_socket wraps (socket_path is then unused). One
        # constructor, not cls.__new__ + _init: mypyc compiles no __new__ call.
        if connected is None:
            sock = _connect(socket_path, connect_timeout)
            peer = socket_path
        else:
            sock = connected
            peer = repr(sock.getpeername() or "socketpair")
        self._init(sock, executor_id=executor_id, peer=peer, owner_flush=owner_flush)

    @classmethod
    def from_socket(
        cls, sock: socket.socket, *, executor_id: str, owner_flush: bool = True
    ) -> UDSSession:
        """Wrap a connected stream socket (tests use one end of a ``socketpair``)."""
        return cls("", executor_id=executor_id, owner_flush=owner_flush, connected=sock)

    def _init(self, sock: socket.socket, *, executor_id: str, peer: str, owner_flush: bool) -> None:
        sock.settimeout(None)
        # The thread that writes without a hand-off (None: only the writer thread writes).
        self._owner = threading.get_ident() if owner_flush else None
        self._sock = sock
        self._executor_id = executor_id
        self._peer = peer
        self._connected = True  # False for good once the transport is gone
        self._closing = False  # set by close(): EOF after it is not an error
        self._disconnect_reason: str | None = None
        # Inbound: reader appends, main thread drains. deque append/popleft are atomic.
        self._incoming: deque[Frame] = deque()
        self._wake = _WakeFlag()
        # Outbound: encoded frames, guarded by _out_lock; the writer sleeps on _writer_wakeup
        # (a lock used as a binary semaphore: released exactly once per sleep).
        self._out_lock = threading.Lock()
        self._outgoing: list[bytes] = []
        self._outgoing_bytes = 0
        # True once the worker acked features ["batch"] (never reset): each write's run of
        # frames then goes out as batched frames (docs/protocol.md "Batched frames").
        self._batching = False
        # The unsent tail of a partial owner write; goes out before _outgoing.
        self._partial: memoryview | None = None
        # Held by whichever thread is writing to the socket.
        self._write_lock = threading.Lock()
        # _WRITER_RUNNING, _WRITER_POLLING or _WRITER_SLEEPING; guarded by _out_lock.
        self._writer_state = _WRITER_RUNNING
        self._writer_wakeup = threading.Lock()
        self._writer_wakeup.acquire()
        self._writer_done = threading.Event()
        # Counters, for tests and benches.
        self.reads = 0
        self.frames_received = 0
        self.frames_sent = 0
        self.writes = 0
        self.wakeups = 0
        #: Called by the reader thread with (call id, attempt, reason) for every
        #: CancelCall, before the frame is queued: the runtime sets it (deadline.py,
        #: ``note_cancel_request``) so a call stuck in pure CPU work can be cancelled.
        self.cancel_notice: Callable[[str, int, str], None] | None = None
        self._reader = threading.Thread(
            target=self._read_loop, name="blockx-uds-reader", daemon=True
        )
        self._writer = threading.Thread(
            target=self._write_loop, name="blockx-uds-writer", daemon=True
        )
        self._reader.start()
        self._writer.start()

    def __repr__(self) -> str:
        state = "connected" if self._connected else f"disconnected({self._disconnect_reason})"
        return (
            f"UDSSession({self._executor_id!r}, peer={self._peer!r}, {state}, "
            f"in={len(self._incoming)}, out={len(self._outgoing)})"
        )

    # --- the main thread's side -------------------------------------------------

    @property
    def executor_id(self) -> str:
        return self._executor_id

    @property
    def disconnect_reason(self) -> str | None:
        """Why the connection ended (``None`` while it is up)."""
        return self._disconnect_reason

    def is_connected(self) -> bool:
        return self._connected

    def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        """Queue one frame for the writer. Thread-safe; never blocks on the socket.

        Sets the envelope's ``executorId`` when it is missing. Raises
        :class:`ConnectionError` once the transport is gone, and an
        :class:`~blockx.wire.EncodeError` (``PayloadTooLargeError``,
        ``NotSerializableError``) when the frame cannot be encoded — in both
        cases nothing was queued and the connection is unaffected.
        """
        if not self._connected:
            raise ConnectionError(f"executor transport is gone: {self._disconnect_reason}")
        if keys.F_EXECUTOR_ID not in envelope:
            envelope[keys.F_EXECUTOR_ID] = self._executor_id
        self.send_encoded(encode_frame(envelope, sidecar))

    def send_encoded(self, frame: bytes) -> None:
        """Queue one frame already encoded with ``encode_frame`` (its envelope carries
        ``executorId``). Thread-safe; raises :class:`ConnectionError` once the
        transport is gone."""
        if not self._connected:
            raise ConnectionError(f"executor transport is gone: {self._disconnect_reason}")
        is_owner = self._owner == threading.get_ident()
        with self._out_lock:
            outgoing = self._outgoing
            outgoing.append(frame)
            self._outgoing_bytes += len(frame)
            state = self._writer_state
            # The owner flushes its own frames (a polling writer is only its safety net).
            if state == _WRITER_SLEEPING or (state == _WRITER_POLLING and not is_owner):
                self._writer_state = _WRITER_RUNNING
                self._writer_wakeup.release()
            full = (
                len(outgoing) >= _OWNER_FLUSH_FRAMES or self._outgoing_bytes >= MAX_BYTES_PER_WRITE
            )
        if full and is_owner:
            self._flush_from_owner()

    def enable_batching(self) -> None:
        """The worker acked ``features: ["batch"]``: from the next write on, the frames
        one write joins go out as batched frames. Thread-safe; never turned off."""
        self._batching = True

    @property
    def batching(self) -> bool:
        """Whether writes send batched frames (the worker acked the feature)."""
        return self._batching

    def flush(self) -> None:
        """Send what is queued now, from the calling thread, without blocking.

        Only the owner thread (the one that built the session) writes this way;
        from any other thread it does nothing: the writer thread sends.
        """
        if self._owner == threading.get_ident() and self._outgoing:
            self._flush_from_owner()

    def drain_incoming(self) -> list[Frame]:
        """Take every frame received so far, in arrival order (main thread only)."""
        wake = self._wake
        if wake.flag:  # clear() takes a lock: not when there is nothing to clear
            wake.clear()
        incoming = self._incoming
        count = len(incoming)
        if count == 0:
            return []
        popleft = incoming.popleft
        return [popleft() for _ in range(count)]

    def has_incoming(self) -> bool:
        return bool(self._incoming)

    def wait_for_message(self, timeout: float | None) -> bool:
        """Block until a frame arrived, the connection ended, or ``timeout`` passed.

        Returns True when woken (frames to drain or a disconnect), False on
        timeout. ``timeout`` None waits without limit; 0 only polls.
        """
        if self._outgoing and self._owner == threading.get_ident():
            self._flush_from_owner()
        if self._incoming or not self._connected:
            return True
        if timeout is not None and timeout <= 0:
            return False
        woke = self._wake.wait(timeout)
        return woke or bool(self._incoming) or not self._connected

    def wake(self) -> None:
        """Wake a :meth:`wait_for_message` in progress (from another thread)."""
        self._wake.set()

    def close(self, *, flush_timeout: float = 2.0) -> None:
        """Flush queued frames (for up to ``flush_timeout`` s), close the socket, join the threads.

        Idempotent. After it ``is_connected()`` is False and ``send_message`` raises.
        """
        if self._closing:
            self._join_threads(flush_timeout)
            return
        with self._out_lock:
            self._closing = True
            self._wake_writer_locked(force=True)
        if self._writer is not threading.current_thread():
            self._writer_done.wait(flush_timeout)
        self._mark_disconnected("closed by the executor")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._join_threads(flush_timeout)
        self._sock.close()
        _log.debug("executor session closed", extra=self.stats())

    def stats(self) -> dict[str, int]:
        """Traffic counters: frames, reads, main-loop wake-ups, writes."""
        return {
            "framesReceived": self.frames_received,
            "reads": self.reads,
            "wakeups": self.wakeups,
            "framesSent": self.frames_sent,
            "writes": self.writes,
        }

    def _join_threads(self, timeout: float) -> None:
        current = threading.current_thread()
        for thread in (self._writer, self._reader):
            if thread is not current:
                thread.join(timeout)

    # --- reader thread ----------------------------------------------------------------

    def _read_loop(self) -> None:
        decoder = FrameDecoder(typed=decode_inbound)
        buffer = bytearray(_RECV_BYTES)
        view = memoryview(buffer)
        recv_into = self._sock.recv_into
        incoming = self._incoming
        wake = self._wake
        reason = "connection closed by the worker"
        try:
            while True:
                try:
                    count = recv_into(buffer)
                except OSError as exc:
                    reason = f"read failed: {exc}"
                    if not self._closing:
                        _log.error("executor socket read failed: %s", exc)
                    break
                if count == 0:
                    try:
                        decoder.close()
                    except ProtocolError as cut:  # own names: compiled, a name has one type
                        reason = f"protocol error: {cut}"
                        _log.error("worker closed the connection mid-frame: %s", cut)
                    else:
                        if not self._closing:
                            _log.warning("worker closed the connection")
                    break
                try:
                    frames = decoder.feed(view[:count])
                except ProtocolError as bad:
                    reason = f"protocol error: {bad}"
                    _log.error(
                        "protocol error from the worker, closing the connection: %s",
                        bad,
                        extra={"errorType": type(bad).__name__},
                    )
                    break
                self.reads += 1
                if frames:
                    notice = self.cancel_notice
                    if notice is not None:
                        for frame in frames:
                            envelope = frame.envelope
                            if (
                                type(envelope) is dict
                                and envelope.get(keys.F_MESSAGE_TYPE) == keys.MT_CANCEL_CALL
                            ):
                                _notice_cancel(notice, envelope)
                    incoming.extend(frames)
                    self.frames_received += len(frames)
                    if not wake.flag:
                        self.wakeups += 1
                        wake.set()
        except BaseException as crash:  # pragma: no cover - a bug here must not hang the executor
            reason = f"reader crashed: {crash!r}"
            _log.exception("executor socket reader crashed")
        finally:
            view.release()
            self._mark_disconnected(reason)
            if not self._closing:
                # Unblock the writer's peer side too: the connection is unusable.
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # --- writer thread ----------------------------------------------------------------

    def _write_loop(self) -> None:
        sendall = self._sock.sendall
        out_lock = self._out_lock
        write_lock = self._write_lock
        wakeup = self._writer_wakeup
        idle_polls = 0
        try:
            while True:
                with out_lock:
                    if self._outgoing or self._partial is not None:
                        state = _WRITER_RUNNING
                    elif self._closing or not self._connected:
                        return
                    elif idle_polls < _WRITER_IDLE_POLLS:
                        state = self._writer_state = _WRITER_POLLING
                    else:
                        state = self._writer_state = _WRITER_SLEEPING
                if state == _WRITER_SLEEPING:
                    wakeup.acquire()
                    idle_polls = 0
                    continue
                if state == _WRITER_POLLING:
                    if not wakeup.acquire(timeout=_WRITER_POLL_S):
                        with out_lock:
                            if self._writer_state == _WRITER_RUNNING:
                                # Woken just as the poll timed out: consume that release.
                                wakeup.acquire(blocking=False)
                            else:
                                self._writer_state = _WRITER_RUNNING
                        idle_polls += 1
                    continue
                idle_polls = 0
                with write_lock:
                    with out_lock:
                        partial, batch = self._partial, self._outgoing
                        self._partial = None
                        self._outgoing = []
                        self._outgoing_bytes = 0
                    try:
                        if partial is not None:
                            sendall(partial)
                            self.writes += 1
                        for chunk in _coalesce(batch, self._batching):
                            sendall(chunk)
                            self.writes += 1
                        self.frames_sent += len(batch)
                    except OSError as exc:
                        if not self._closing:
                            _log.error("executor socket write failed: %s", exc)
                        self._mark_disconnected(f"write failed: {exc}")
                        return
        except BaseException:  # pragma: no cover - a bug here must not hang the executor
            _log.exception("executor socket writer crashed")
            self._mark_disconnected("writer crashed")
        finally:
            self._writer_done.set()

    def _wake_writer_locked(self, *, force: bool) -> None:
        """Wake the writer thread (caller holds ``_out_lock``).

        A sleeping writer is always woken; a polling one only when ``force``:
        frames from other threads, a partial write, close, disconnect. The
        owner's own frames do not wake a polling writer — the owner flushes
        them itself, and the poll catches any it leaves behind.
        """
        state = self._writer_state
        if state == _WRITER_SLEEPING or (force and state == _WRITER_POLLING):
            self._writer_state = _WRITER_RUNNING
            self._writer_wakeup.release()

    def _flush_from_owner(self) -> None:
        """One non-blocking ``send`` of everything queued; the rest is the writer's."""
        if not self._write_lock.acquire(blocking=False):
            return  # the writer thread is sending; it takes what is queued next
        try:
            with self._out_lock:
                if self._partial is not None or not self._outgoing:
                    return  # a partial write pending: only the writer's blocking sendall
                batch = self._outgoing
                self._outgoing = []
                self._outgoing_bytes = 0
            if len(batch) == 1:
                data = batch[0]
            elif self._batching:
                data = batch_frames(batch)
            else:
                data = b"".join(batch)
            try:
                sent = self._sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                if not self._closing:
                    _log.error("executor socket write failed: %s", exc)
                self._mark_disconnected(f"write failed: {exc}")
                return
            self.writes += 1
            self.frames_sent += len(batch)
            if sent < len(data):
                with self._out_lock:
                    self._partial = memoryview(data)[sent:]
                    self._wake_writer_locked(force=True)
        finally:
            self._write_lock.release()

    # --- both -------------------------------------------------------------------------

    def _mark_disconnected(self, reason: str) -> None:
        with self._out_lock:
            if self._connected:
                self._connected = False
                self._disconnect_reason = reason
            self._outgoing = []
            self._outgoing_bytes = 0
            self._partial = None
            self._wake_writer_locked(force=True)
        self._wake.set()


def _notice_cancel(notice: Callable[[str, int, str], None], envelope: dict[str, Any]) -> None:
    """Pass a CancelCall's call id, attempt (0: any) and reason to ``notice``; a frame
    without a call id is left to the scheduler (which counts it invalid)."""
    call_id = envelope.get(keys.F_CALL_ID)
    if type(call_id) is not str:
        return
    payload = envelope.get(keys.F_PAYLOAD)
    reason: Any = None
    attempt_seq: Any = 0
    if type(payload) is dict:
        reason = payload.get(keys.FP_REASON)
        attempt_seq = payload.get(keys.FP_ATTEMPT_SEQ, 0)
    if type(reason) is not str or not reason:
        reason = keys.DEFAULT_CANCEL_REASON
    if type(attempt_seq) is not int:
        attempt_seq = 0
    try:
        notice(call_id, attempt_seq, reason)
    except Exception:  # pragma: no cover - the scheduler still handles the frame
        _log.exception("noting a CancelCall failed")


def _coalesce(frames: list[bytes], batching: bool = False) -> list[bytes]:
    """Group encoded frames into write-sized chunks, each whole frames only; with
    ``batching``, each chunk of several frames is written as batched frames."""
    if len(frames) == 1:
        return frames
    chunks: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for frame in frames:
        full = len(group) >= MAX_FRAMES_PER_WRITE or size + len(frame) > MAX_BYTES_PER_WRITE
        if group and full:
            chunks.append(batch_frames(group) if batching else b"".join(group))
            group = []
            size = 0
        group.append(frame)
        size += len(frame)
    if len(group) == 1:
        chunks.append(group[0])
    else:
        chunks.append(batch_frames(group) if batching else b"".join(group))
    return chunks


def _connect(socket_path: str, timeout: float) -> socket.socket:
    """Connect to the worker's listener, retrying while it is not there yet."""
    if len(socket_path.encode()) > 107:
        raise SessionConnectError(
            f"socket path is {len(socket_path.encode())} bytes, longer than the 107 a Unix "
            f"socket allows: {socket_path}"
        )
    deadline = time.monotonic() + max(timeout, 0.0)
    delay = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(socket_path)
        except OSError as exc:
            sock.close()
            remaining = deadline - time.monotonic()
            if exc.errno in _RETRY_CONNECT_ERRNOS and remaining > 0:
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.2)
                continue
            raise SessionConnectError(
                f"cannot connect to the worker socket {socket_path}: "
                f"{exc.strerror or exc} (after {timeout:g}s)"
            ) from exc
        sock.settimeout(None)
        return sock

"""ExecutorConnection: one executor's Unix-socket connection, as an ``asyncio.Protocol``.

Theory of operation
-------------------
The seed gives every connection a reader goroutine and a writer goroutine. In
asyncio both are this one protocol object, with no task and no future per
frame (docs/operations.md: a Task + Future per call costs ~9 µs):

* **Reader** — :meth:`ExecutorConnection.data_received` feeds the connection's
  :class:`~blockx.wire.FrameDecoder` and hands every frame the read completed
  to its :class:`FrameReceiver` (the adapter's
  :class:`~blockx.worker.link.handlers.InboundHandlers`) as one batch.
* **Writer** — an outbox of encoded frames. Queuing never blocks and never
  writes one frame at a time: a frame queued into an empty outbox schedules one
  flush for the end of the current event-loop turn (``loop.call_soon``), and an
  outbox that reaches :attr:`frames_per_write` frames is flushed at once. A
  flush joins up to ``frames_per_write`` (64) frames into each
  ``transport.write`` — as one batched frame once the executor announced
  ``features: ["batch"]`` (:attr:`ExecutorConnection.batching`, docs/protocol.md
  "Batched frames"). While the transport is paused (its buffer passed the
  high-water mark: ``pause_writing``) frames wait in the outbox until it
  drains: that is the back-pressure. No call frame is ever refused for want of
  room (a refused ``ExecuteCall`` or ``ResumeCall`` would fail its call): each
  one belongs to a call holding a reservation on this executor, so the outbox
  is bounded by the calls bound here (one ``ExecuteCall`` each, one
  ``ResumeCall`` per wait, which a call has one of at a time). Only
  ``HeartbeatAck`` is dropped past ``outbox_depth`` (256) frames.

Flush notes: a control frame (``ResumeCall`` / ``CancelCall``) counts as sent
only once it has been handed to the transport. Its *note* sits in a queue
beside the outbox, keyed by the frame's position in the stream; each flush
reports the notes it passed, all of them in one call
(``owner.on_controls_flushed(notes)``), and a connection that ends first
reports the rest as failed (``owner.on_control_failed``). A waiter
(:meth:`wait_flushed`) is a note too — one future for everything queued so far,
not one per frame.

"Handed to the transport" is the asyncio meaning of the seed's ``Flush``: the
transport delivers it unless the connection dies, and a dead connection fails
every call on it through the transport-lost path anyway.

Invariants:

* Frames go out whole and in queue order.
* Once :attr:`closed` is set it stays set: nothing more is queued or written.
* Every note is reported exactly once: flushed, or failed.

Who owns what: the connection owns its transport, decoder, outbox and notes.
It knows two collaborators, each through a Protocol defined here: its
:class:`ConnectionOwner` (the adapter: the connection opened, ended, sent a
frame that does not decode; control notes flushed or failed) and its
:class:`FrameReceiver` (every decoded batch). Of the adapter's per-executor
state it knows only :attr:`ExecutorConnection.executor_id`, set when a
Heartbeat attaches it: :class:`~blockx.worker.link.state.ExecutorState` holds
its connection, never the other way round (no import between the two modules
but ``state`` -> ``connection``).

Single-threaded: every method runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import deque
from typing import Any, Final, NamedTuple, Protocol, cast

from blockx.wire import Frame, FrameDecoder, ProtocolError, batch_frames
from blockx.worker.errors import ExecutorUnavailableError
from blockx.worker.link.completed_frames import decode_call_frames

__all__ = [
    "DEFAULT_FRAMES_PER_WRITE",
    "DEFAULT_OUTBOX_DEPTH",
    "ConnectionOwner",
    "ControlSend",
    "ExecutorConnection",
    "FrameReceiver",
]

_log = logging.getLogger("blockx.worker.adapter")

#: Frames that may wait in an outbox (seed: the writer's channel depth).
DEFAULT_OUTBOX_DEPTH: Final = 256
#: Frames joined into one ``transport.write``.
DEFAULT_FRAMES_PER_WRITE: Final = 64


class ControlSend(NamedTuple):
    """A queued ``ResumeCall`` / ``CancelCall``, reported once flushed or failed."""

    executor_id: str
    message_type: str
    call_id: str
    request_id: str | None
    #: Whatever the caller passed as ``token`` (e.g. the attempt number).
    token: Any


class ConnectionOwner(Protocol):
    """What a connection tells about itself (the adapter)."""

    def on_connection_made(self, conn: ExecutorConnection) -> None: ...

    def on_protocol_error(self, conn: ExecutorConnection, error: ProtocolError) -> None: ...

    def on_connection_lost(self, conn: ExecutorConnection, exc: Exception | None) -> None: ...

    def on_controls_flushed(self, notes: list[ControlSend]) -> None: ...

    def on_control_failed(self, note: ControlSend, error: ExecutorUnavailableError) -> None: ...


class FrameReceiver(Protocol):
    """Where a connection's decoded frames go, one batch per read (the inbound handlers)."""

    def on_frames(self, conn: ExecutorConnection, frames: list[Frame]) -> None: ...


class ExecutorConnection(asyncio.Protocol):
    """The reader and writer of one executor connection."""

    __slots__ = (
        "_closed",
        "_decoder",
        "_enqueued",
        "_flush_scheduled",
        "_frames",
        "_loop",
        "_notes",
        "_owner",
        "_paused",
        "_receiver",
        "_transport",
        "_written",
        "batches_received",
        "batches_sent",
        "batching",
        "close_reason",
        "connection_id",
        "executor_id",
        "frames_per_write",
        "frames_received",
        "frames_sent",
        "opened_at",
        "outbox_depth",
        "peer_pid",
        "writes",
    )

    def __init__(
        self,
        owner: ConnectionOwner,
        receiver: FrameReceiver,
        *,
        connection_id: int,
        opened_at: float,
        outbox_depth: int = DEFAULT_OUTBOX_DEPTH,
        frames_per_write: int = DEFAULT_FRAMES_PER_WRITE,
    ) -> None:
        if outbox_depth < 1 or frames_per_write < 1:
            raise ValueError("outbox_depth and frames_per_write must be positive")
        self._owner = owner
        self._receiver = receiver
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(typed=decode_call_frames)
        self._frames: list[bytes] = []
        # (stream position of the frame, note): reported once _written passes it.
        self._notes: deque[tuple[int, ControlSend | asyncio.Future[None]]] = deque()
        self._enqueued = 0  # frames ever queued
        self._written = 0  # frames ever handed to the transport
        self._flush_scheduled = False
        self._paused = False
        self._closed = False
        #: True while the attached executor's latest Heartbeat announces ``features:
        #: ["batch"]`` (set by the handlers): each write's frames then go out as batched
        #: frames (docs/protocol.md "Batched frames"). A v1 executor never gets one.
        self.batching = False
        self.connection_id = connection_id
        self.opened_at = opened_at
        self.outbox_depth = outbox_depth
        self.frames_per_write = frames_per_write
        #: The executor id a Heartbeat attached this connection as; None until then.
        self.executor_id: str | None = None
        self.close_reason: str | None = None
        #: The connecting process (``SO_PEERCRED``, in this pid namespace); None when the
        #: transport has no Unix socket (an in-process transport in tests and benches).
        self.peer_pid: int | None = None
        # Counters, for tests and benches.
        self.frames_received = 0
        self.batches_received = 0
        self.frames_sent = 0
        self.writes = 0
        self.batches_sent = 0  # writes that went out as batched frames

    def __repr__(self) -> str:
        who = self.executor_id if self.executor_id is not None else "unattached"
        status = f"closed({self.close_reason})" if self._closed else "open"
        paused = ", paused" if self._paused else ""
        return (
            f"ExecutorConnection(#{self.connection_id}, {who}, {status}{paused}, "
            f"outbox={len(self._frames)}, in={self.frames_received}, out={self.frames_sent})"
        )

    # --- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        self.peer_pid = peer_pid(transport)
        self._owner.on_connection_made(self)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            self._owner.on_protocol_error(self, exc)
            return
        except RecursionError:
            # A depth bomb (JSON nested deeper than the decoder recurses): the peer's
            # fault, never the reader's.
            self._owner.on_protocol_error(
                self, ProtocolError("a frame nests deeper than the decoder allows")
            )
            return
        if frames:
            self.frames_received += len(frames)
            self.batches_received += 1
            try:
                self._receiver.on_frames(self, frames)
            except (RecursionError, ProtocolError, TypeError, ValueError, KeyError) as unhandled:
                # A frame of a shape the handlers did not expect: a protocol error of
                # this connection, logged with what it was. (Its own name: mypyc types a
                # name once per function.)
                _log.exception("%r: handling a frame failed", self)
                if not self._closed:
                    what = f"{type(unhandled).__name__}: {unhandled}"
                    self._owner.on_protocol_error(
                        self, ProtocolError(f"unhandled frame shape: {what}")
                    )

    def eof_received(self) -> bool:
        # The executor half-closed: it will send nothing more. Close our side too.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed:
            if exc is not None:
                reason = f"connection lost: {exc}"
            else:
                try:
                    self._decoder.close()
                    reason = "connection closed by the executor"
                except ProtocolError as cut:
                    reason = f"connection closed mid-frame: {cut}"
            self._mark_closed(reason)
        self._owner.on_connection_lost(self, exc)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._frames and not self._closed:
            self._flush()

    # --- the writer --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def outbox_size(self) -> int:
        """Frames queued and not yet handed to the transport."""
        return len(self._frames)

    def enqueue(self, frame: bytes, call_id: str | None = None) -> None:
        """Queue one frame (``ExecuteCall``); it waits while the transport is paused.

        Raises :class:`ExecutorUnavailableError` once closed; nothing is queued then.
        Never refused for want of room (the module docstring).
        """
        frames = self._frames
        if self._closed:
            raise self._unavailable(call_id)
        frames.append(frame)
        self._enqueued += 1
        self._after_enqueue()

    def enqueue_control(
        self, frame: bytes, note: ControlSend | None, call_id: str | None = None
    ) -> None:
        """Queue a control frame whose flush is reported through the owner.

        Never refused for want of room, like :meth:`enqueue`. Raises
        :class:`ExecutorUnavailableError` once closed; no note is reported then. A
        frame with no note (the adapter's own answers) is queued the same way,
        unreported.
        """
        frames = self._frames
        if self._closed:
            raise self._unavailable(call_id)
        frames.append(frame)
        if note is not None:
            self._notes.append((self._enqueued, note))
        self._enqueued += 1
        self._after_enqueue()

    def enqueue_lossy(self, frame: bytes) -> bool:
        """Queue a frame whose loss is harmless (``HeartbeatAck``); False if dropped."""
        if self._closed or len(self._frames) >= self.outbox_depth:
            return False
        self._frames.append(frame)
        self._enqueued += 1
        self._after_enqueue()
        return True

    async def wait_flushed(self) -> None:
        """Return once everything queued so far has been handed to the transport.

        Raises :class:`ExecutorUnavailableError` if the connection ends first.
        One future per call, shared by the whole batch queued before it.
        """
        if self._closed:
            raise self._unavailable(None)
        if self._written >= self._enqueued:
            return
        assert self._loop is not None
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._notes.append((self._enqueued - 1, waiter))
        await waiter

    def flush(self) -> None:
        """Write what is queued now (the orchestrator may call it at the end of a batch)."""
        if self._frames and not self._paused and not self._closed:
            self._flush()

    def _after_enqueue(self) -> None:
        if self._paused:
            return  # resume_writing flushes
        if len(self._frames) >= self.frames_per_write:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        if self._frames and not self._paused and not self._closed:
            self._flush()

    def _flush(self) -> None:
        transport = self._transport
        assert transport is not None
        write = transport.write
        per_write = self.frames_per_write
        frames = self._frames
        # pause_writing may be called from inside write(): check before each chunk.
        while frames and not self._paused and not self._closed:
            if len(frames) <= per_write:
                chunk = frames
                self._frames = frames = []
            else:
                chunk = frames[:per_write]
                del frames[:per_write]
            if len(chunk) == 1:
                write(chunk[0])
            elif self.batching:
                write(batch_frames(chunk))
                self.batches_sent += 1
            else:
                write(b"".join(chunk))
            count = len(chunk)
            self._written += count
            self.frames_sent += count
            self.writes += 1
            if self._notes:
                self._report_flushed()

    def _report_flushed(self) -> None:
        notes = self._notes
        written = self._written
        flushed: list[ControlSend] = []
        while notes and notes[0][0] < written:
            _position, note = notes.popleft()
            if isinstance(note, ControlSend):
                flushed.append(note)
            elif not note.done():
                note.set_result(None)
        if flushed:
            try:
                self._owner.on_controls_flushed(flushed)
            except Exception:
                _log.exception("on_controls_flushed callback failed for %d note(s)", len(flushed))

    # --- closing --------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Close now, dropping queued frames; pending notes are reported failed. Idempotent."""
        if self._closed:
            return
        self._mark_closed(reason)
        if self._transport is not None:
            self._transport.abort()

    def _mark_closed(self, reason: str) -> None:
        self._closed = True
        self.close_reason = reason
        self._frames = []
        notes = self._notes
        if notes:
            error = self._unavailable(None)
            owner = self._owner
            while notes:
                _position, note = notes.popleft()
                if isinstance(note, ControlSend):
                    try:
                        owner.on_control_failed(
                            note,
                            ExecutorUnavailableError(
                                note.executor_id, call_id=note.call_id, reason=reason
                            ),
                        )
                    except Exception:
                        _log.exception("on_control_failed callback failed for %r", note)
                elif not note.done():
                    note.set_exception(error)

    def _executor_id(self) -> str:
        if self.executor_id is not None:
            return self.executor_id
        return f"<connection #{self.connection_id}>"

    def _unavailable(self, call_id: str | None) -> ExecutorUnavailableError:
        return ExecutorUnavailableError(
            self._executor_id(), call_id=call_id, reason=self.close_reason or "closed"
        )


_PEERCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(transport: asyncio.BaseTransport) -> int | None:
    """The pid of the process at the other end of a Unix socket transport (``SO_PEERCRED``).

    None when the transport has no Unix socket or the platform has no ``SO_PEERCRED``.
    """
    sock = transport.get_extra_info("socket")
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        pid, _uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, option, _PEERCRED.size)
        )
    except (OSError, AttributeError, struct.error):
        return None
    return pid or None

"""Outbox: every frame the executor sends, and whether the transport is still there.

Theory of operation
-------------------
One ``Outbox`` per runtime, held by every part that sends: the call runner
(terminal frames, refusals), the SDK bridge (``CallWaiting``) and the runtime
itself. With a session (``uds_session.UDSSession``) a frame goes to its
thread-safe queue; without one (unit tests) the encoded frames collect here
and :meth:`Outbox.drain` hands them out decoded, as the worker would read them.

``transport_lost`` is the one record that the connection is gone. A send that
finds it gone (``ConnectionError``) is answered by :meth:`note_transport_lost`
from whoever sent; the runtime converges every resident call at its next pass,
and the parts read the flag to send nothing more (no terminal frames, no
admission). It is set from any thread (the heartbeat thread's failed send, the
process shell's signal handlers), never cleared.

Invariants: ``send_*`` either queues the whole frame or raises (``ConnectionError``
once the transport is gone, ``EncodeError`` when the envelope cannot be framed:
nothing is queued then).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from blockx.wire import decode_frame, encode_frame

__all__ = ["Outbox", "SessionLike"]

_log = logging.getLogger("blockx.executor")


class SessionLike(Protocol):
    """The transport, as the runtime uses it (``uds_session.UDSSession``)."""

    def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        """Thread-safe enqueue; raises ``ConnectionError`` once the transport is gone."""
        ...

    def drain_incoming(self) -> list[Any]:
        """Every frame received so far (``blockx.wire.Frame``: ``envelope``, ``sidecar``)."""
        ...

    def is_connected(self) -> bool: ...

    # Optional: ``has_incoming() -> bool`` (frames waiting to be drained) lets
    # run_until_idle skip a pass that would drain nothing; ``send_encoded(frame:
    # bytes)`` queues a frame the runtime already encoded (without it such a frame
    # is decoded again for ``send_message``).


class Outbox:
    """The sending side of the transport (see the module doc); ``session`` None collects."""

    def __init__(self, session: SessionLike | None) -> None:
        self._session = session
        self._session_send_encoded = getattr(session, "send_encoded", None)  # optional
        self._collected: list[bytes] = []  # without a session: every frame sent, encoded
        self.transport_lost = False

    def __repr__(self) -> str:
        where = "session" if self._session is not None else f"collected={len(self._collected)}"
        return f"Outbox({where}{', transport lost' if self.transport_lost else ''})"

    def send_frame(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        """Send one frame (``ConnectionError`` once the transport is gone; ``EncodeError``
        when it cannot be framed — nothing is sent)."""
        session = self._session
        if session is not None:
            session.send_message(envelope, sidecar)
            return
        if self.transport_lost:
            raise ConnectionError("executor transport is gone")
        self._collected.append(encode_frame(envelope, sidecar))

    def send_encoded(self, frame: bytes) -> None:
        """Send one frame already encoded (``encode_frame``); ``ConnectionError`` once the
        transport is gone."""
        send = self._session_send_encoded
        if send is not None:
            send(frame)
            return
        session = self._session
        if session is not None:  # a session without send_encoded (test doubles)
            decoded = decode_frame(frame)
            session.send_message(decoded.envelope, decoded.sidecar)
            return
        if self.transport_lost:
            raise ConnectionError("executor transport is gone")
        self._collected.append(frame)

    def enable_batching(self) -> None:
        """The worker acked ``features: ["batch"]``: the session may send batched frames
        (docs/protocol.md "Batched frames"). A session without ``enable_batching``
        (test doubles) and the collecting outbox keep sending plain frames."""
        enable = getattr(self._session, "enable_batching", None)
        if enable is not None:
            enable()

    def note_transport_lost(self) -> None:
        """A send found the transport gone; every context converges at the next pass."""
        if not self.transport_lost:
            self.transport_lost = True
            _log.error("executor transport lost; ending every resident call")

    def drain(self) -> list[tuple[dict[str, Any], bytes | None]]:
        """Without a session: every frame sent so far, decoded as the worker would see it."""
        frames = [decode_frame(data) for data in self._collected]
        self._collected.clear()
        return [(frame.envelope, frame.sidecar) for frame in frames]

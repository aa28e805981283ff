"""Connections to the worker's socket that have not attached yet, kept few and short-lived.

Theory of operation
-------------------
Anything that can reach the socket can connect -- code inside an executor too
(docs/security.md). A connection is anonymous until its first valid Heartbeat;
until then it costs the worker a descriptor and gives nothing. The adapter
hands every new connection to :class:`UnattachedConnections`, which

* holds at most ``limit`` of them: a new one beyond that drops the oldest
  (a real executor sends its Heartbeat right after connecting, so it is rarely
  the oldest);
* drops each that is still unattached ``timeout_s`` after it connected (one
  timer per connection, cancelled when it attaches or closes).

Dropping is ``conn.abort``: the connection ends; being unattached it has no era
and no calls. Event-loop thread only; the adapter owns the one instance.
"""

from __future__ import annotations

import asyncio
import logging

from blockx.worker.link.connection import ExecutorConnection

__all__ = ["UnattachedConnections"]

_log = logging.getLogger("blockx.worker.adapter")


class UnattachedConnections:
    """See the module docstring."""

    __slots__ = ("_conns", "_limit", "_timeout_s", "dropped")

    def __init__(self, limit: int, timeout_s: float) -> None:
        if limit < 1 or timeout_s <= 0:
            raise ValueError("limit and timeout_s must be positive")
        self._limit = limit
        self._timeout_s = timeout_s
        #: Oldest first; the attach deadline timer (None once it fired).
        self._conns: dict[ExecutorConnection, asyncio.TimerHandle | None] = {}
        #: Connections dropped so far (over the limit, or no Heartbeat in time).
        self.dropped = 0

    def __repr__(self) -> str:
        return (
            f"UnattachedConnections({len(self._conns)}/{self._limit}, "
            f"timeout={self._timeout_s:.1f}s, dropped={self.dropped})"
        )

    def __len__(self) -> int:
        return len(self._conns)

    def admit(self, conn: ExecutorConnection, loop: asyncio.AbstractEventLoop) -> None:
        """A new connection: make room (dropping the oldest), start its attach deadline."""
        conns = self._conns
        while len(conns) >= self._limit:
            self.drop(next(iter(conns)), "too many connections waiting to attach")
        conns[conn] = loop.call_later(self._timeout_s, self._deadline, conn)

    def forget(self, conn: ExecutorConnection) -> None:
        """It attached or closed: no longer counted, its deadline cancelled."""
        timer = self._conns.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def expire(self, now: float) -> None:
        """Drop every connection older than the timeout at monotonic ``now`` (a sweep for
        when the timers could not run: the adapter's heartbeat check calls it)."""
        for conn in list(self._conns):
            if (
                conn.executor_id is None
                and not conn.closed
                and now - conn.opened_at > self._timeout_s
            ):
                self.drop(conn, "no heartbeat after connecting")

    def close(self) -> None:
        for timer in self._conns.values():
            if timer is not None:
                timer.cancel()
        self._conns.clear()

    def drop(self, conn: ExecutorConnection, why: str) -> None:
        self.forget(conn)
        if conn.closed:
            return
        self.dropped += 1
        log = _log.warning if self.dropped <= 10 else _log.debug
        log("dropping %r (process %s): %s within %.1f s", conn, conn.peer_pid, why, self._timeout_s)
        conn.abort(why)

    def _deadline(self, conn: ExecutorConnection) -> None:
        if conn in self._conns:
            self._conns[conn] = None
            if conn.executor_id is None and not conn.closed:
                self.drop(conn, "no heartbeat after connecting")

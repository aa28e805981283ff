"""Eras: where an executor id's connection era begins, ends, and is reported lost.

Theory of operation
-------------------
Each attach of an executor id starts a new *era* of it
(:meth:`Eras.begin`, called by the inbound handlers on the attaching
Heartbeat). An era ends (:meth:`Eras.end`) when its connection closes, sends
a malformed frame (:meth:`Eras.protocol_error`), stays silent past the
heartbeat timeout, is superseded by a new attach of the same id, or the worker
disconnects it. Ending an era detaches the connection, takes the reservations,
aborts the connection (its pending control notes fail first), and then reports
``on_executor_lost(executor_id, lost_calls, reason, loss)`` once.

``loss`` (:class:`~blockx.worker.link.loss.ExecutorLoss`) says why, as far as
the worker can tell. An era that simply ended (EOF) usually ends before the pool
has seen its process exit: with an exit source (the pool,
:meth:`set_exit_source`) the report waits -- on the event loop, never blocking
it -- up to ``exit_wait_s`` for the exit status and black box, and the cause
comes from them. A new attach of the same id sends a waiting report out first
(:meth:`begin`), so an era's report always precedes the next era's attach.

Who owns what: :class:`Eras` owns the reports still waiting for an exit, the
exit source, the callbacks it reports to (``on_executor_lost`` only), and the
counts ``eras_ended`` and ``protocol_errors``. The
:class:`~blockx.worker.link.state.ExecutorState` it is handed is the adapter's;
the :class:`~blockx.worker.link.unattached.UnattachedConnections` too (an attach
or a protocol error takes a connection out of it).

After :meth:`close` eras still end (detach, take, abort) but nothing is
reported. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from blockx.wire import ProtocolError
from blockx.wire.schema import HeartbeatPayload
from blockx.worker.link.callbacks import AdapterCallbacks
from blockx.worker.link.connection import ExecutorConnection
from blockx.worker.link.loss import EraEnd, ExecutorLoss
from blockx.worker.link.state import ExecutorState
from blockx.worker.link.unattached import UnattachedConnections
from blockx.worker.pool.exits import LossCause, ProcessExit, ProcessExitSource

__all__ = ["Eras"]

_log = logging.getLogger("blockx.worker.adapter")


class Eras:
    """See the module docstring."""

    __slots__ = (
        "_closed",
        "_exit_wait_s",
        "_pending",
        "_stopping",
        "_unattached",
        "callbacks",
        "eras_ended",
        "exit_source",
        "loop",
        "protocol_errors",
    )

    def __init__(
        self,
        unattached: UnattachedConnections,
        callbacks: AdapterCallbacks,
        *,
        exit_wait_s: float,
    ) -> None:
        self._unattached = unattached
        #: The orchestrator's callbacks (the adapter replaces them: ``set_callbacks``).
        self.callbacks = callbacks
        self._exit_wait_s = exit_wait_s
        #: Where exit statuses come from (:meth:`set_exit_source`).
        self.exit_source: ProcessExitSource | None = None
        #: The adapter's loop, set when it starts (the exit wait's timers run on it).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Ended eras whose report waits for their process's exit, by executor id.
        self._pending: dict[str, tuple[EraEnd, asyncio.TimerHandle]] = {}
        self._closed = False
        #: Set by :meth:`expect_disconnects`: the worker is stopping its executors.
        self._stopping = False
        self.eras_ended = 0
        self.protocol_errors = 0

    def __repr__(self) -> str:
        status = "closed" if self._closed else ("stopping" if self._stopping else "open")
        return (
            f"Eras({status}, ended={self.eras_ended}, waiting_for_exit={sorted(self._pending)}, "
            f"protocol_errors={self.protocol_errors})"
        )

    # --- configuration -------------------------------------------------------------------

    def set_exit_source(self, source: ProcessExitSource | None) -> None:
        self.exit_source = source
        if source is not None:
            source.add_exit_listener(self.on_process_exit)

    def expect_disconnects(self) -> None:
        """Connections ending from now on are expected: logged at debug level."""
        self._stopping = True

    # --- beginning and ending --------------------------------------------------------------

    def begin(
        self,
        state: ExecutorState,
        conn: ExecutorConnection,
        heartbeat: HeartbeatPayload,
        now: float,
    ) -> None:
        """Attach ``conn`` as ``state``'s new era (its previous era must have ended).

        The previous era's waiting report goes out first.
        """
        self.flush_pending(state.executor_id)
        self._unattached.forget(conn)
        state.start_era(conn, heartbeat, now)
        source = self.exit_source
        state.generation = None if source is None else source.running_generation(state.executor_id)

    def end(self, state: ExecutorState, reason: str, cause: LossCause | None = None) -> None:
        """The transport-lost path: detach, take the reservations, close, then report.

        ``cause`` None: the connection just ended; the report waits for the process's
        exit when there is an exit source (the module docstring), else it is
        ``transport_lost`` (``shutdown`` while the worker stops its executors).
        """
        conn = state.connection
        if conn is None:
            return
        state.connection = None
        state.lost_reason = reason
        lost = state.reservations.take_all()
        self.eras_ended += 1
        if not self._closed:
            _log.log(
                logging.DEBUG if self._stopping else logging.WARNING,
                "executor %s lost (era %d): %s; %d in-flight call(s)",
                state.executor_id,
                state.era,
                reason,
                len(lost),
                extra={"executorId": state.executor_id},
            )
        # Pending control frames fail first (on_control_failed), then the era ends.
        conn.abort(reason)
        if self._closed:
            return
        heartbeat = state.heartbeat
        era = EraEnd(
            executor_id=state.executor_id,
            era=state.era,
            generation=state.generation,
            lost=lost,
            reason=reason,
            started=frozenset(c.call_id for c in lost if c.started),
            running_call_id=None if heartbeat is None else heartbeat.runningCallId,
            running_for_ms=0 if heartbeat is None else heartbeat.runningForMs,
            running_call_budget_ms=0 if heartbeat is None else heartbeat.runningCallBudgetMs,
        )
        if cause is None and self._stopping:
            cause = "shutdown"
        source = self.exit_source
        if cause is not None or source is None or state.generation is None:
            self._report(era, era.link_loss(cause or "transport_lost", reason))
            return
        exit_ = source.exit_of(state.executor_id, state.generation)
        if exit_ is not None:
            self._report(era, era.exit_loss(exit_))
            return
        # The connection ended before the pool saw the process exit: wait a little.
        self.flush_pending(state.executor_id)  # (none: an attach flushes it)
        assert self.loop is not None
        timer = self.loop.call_later(self._exit_wait_s, self._exit_wait_expired, era)
        self._pending[state.executor_id] = (era, timer)

    def protocol_error(
        self, conn: ExecutorConnection, state: ExecutorState | None, error: ProtocolError | str
    ) -> None:
        """``conn`` broke the protocol: log it, end its era (``state``: the era it is,
        None before it attached) or drop it unattached.

        While the worker stops its executors, an unattached connection's error is
        logged at debug level: an executor that connected before its worker served
        the socket, and whose attach is read only after the stop reaped its process,
        is refused ("the slot has no running executor process") as expected."""
        self.protocol_errors += 1
        reason = f"protocol error: {error}"
        log = _log.debug if self._stopping and state is None else _log.error
        log(
            "%r: %s; closing the connection",
            conn,
            reason,
            extra={"errorType": type(error).__name__, "executorId": conn.executor_id},
        )
        if state is not None and state.connection is conn:
            self.end(state, reason, "protocol_error")
        else:
            self._unattached.forget(conn)
            conn.abort(reason)

    def close(self, states: Iterable[ExecutorState]) -> None:
        """End every era in ``states`` with nothing reported; drop the waiting reports."""
        self._closed = True
        for state in states:
            if state.connection is not None:
                self.end(state, "worker adapter closed")
        for _era, exit_timer in self._pending.values():
            exit_timer.cancel()
        self._pending.clear()

    # --- reports ------------------------------------------------------------------------

    def on_process_exit(self, exit_: ProcessExit) -> None:
        """The exit source saw a process exit: a report waiting for it goes out."""
        waiting = self._pending.get(exit_.executor_id)
        if waiting is None or waiting[0].generation != exit_.generation or self._closed:
            return
        del self._pending[exit_.executor_id]
        era, timer = waiting
        timer.cancel()
        self._report(era, era.exit_loss(exit_))

    def flush_pending(self, executor_id: str) -> None:
        """Report a waiting era now (its executor id attaches again)."""
        waiting = self._pending.pop(executor_id, None)
        if waiting is not None:
            era, timer = waiting
            timer.cancel()
            why = "a new connection attached before its exit was seen"
            self._report(era, era.link_loss("transport_lost", f"{era.reason}; {why}"))

    def _exit_wait_expired(self, era: EraEnd) -> None:
        waiting = self._pending.get(era.executor_id)
        if waiting is None or waiting[0] is not era or self._closed:
            return
        del self._pending[era.executor_id]
        why = f"its process had not exited {self._exit_wait_s:.1f} s later"
        self._report(era, era.link_loss("transport_lost", f"{era.reason}; {why}"))

    def _report(self, era: EraEnd, loss: ExecutorLoss) -> None:
        executor_id = era.executor_id
        quiet = self._stopping or loss.cause == "shutdown"
        _log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "executor %s era %d ended: %s: %s (running %s%s; %d call(s) lost, %d started)",
            executor_id,
            era.era,
            loss.cause,
            loss.message,
            loss.running_call_id,
            "" if loss.running_call_known else "?",
            len(era.lost),
            len(loss.started_call_ids),
            extra={"executorId": executor_id, "lossCause": loss.cause},
        )
        try:
            self.callbacks.on_executor_lost(executor_id, era.lost, era.reason, loss)
        except Exception:
            _log.exception("on_executor_lost callback failed for %s", executor_id)

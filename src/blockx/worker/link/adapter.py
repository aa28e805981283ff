"""ExecutorAdapter: the worker's side of every executor connection (seed: ``adapters/executor``).

Theory of operation
-------------------
The adapter listens on a Unix socket in a private directory. Executors connect
(``--socket-path``); a connection is anonymous until its first valid
``Heartbeat``, which *attaches* it to ``payload.executorId``. Each attach starts
a new *era* of that executor id: a reconnect ends the previous era, whose
reservations are dropped and whose calls are reported lost.

What the adapter owns, per executor id (:class:`ExecutorState`, one table the
parts below share):

* the current :class:`~blockx.worker.link.connection.ExecutorConnection`
  (reader: frames in batches; writer: outbox of 256, 64 frames per write);
* :class:`~blockx.worker.link.reservations.Reservations` — the calls bound
  there (``bind`` / ``bind_subcall`` / ``unbind`` / ``mark_draining``),
  released by the executor's terminal frame (transport truth);
* the latest heartbeat and the terminal frames seen since, from which
  :meth:`ExecutorAdapter.snapshots` derives the dispatcher's view.

The adapter is the listener, the reservations, the views and the timers; it
holds its other parts, each given only what it needs (the way h11's
``Connection`` holds its ``ConnectionState``):

* ``inbound`` — :class:`~blockx.worker.link.handlers.InboundHandlers`: every
  connection hands it its frames, in the protocol's ``data_received``, one
  batch per read, with no task or future per frame; each fact becomes one
  synchronous callback (:class:`~blockx.worker.link.callbacks.AdapterCallbacks`)
  that the orchestrator turns into an event for its actor. ``function_code``
  waits never reach the orchestrator: it answers them itself through the
  function-code resolver. Holds the state table, ``eras``, the clock, the
  callbacks, the resolver and the peer check.
* ``outbound`` — :class:`~blockx.worker.link.outbound.OutboundSends`: the sends
  (``send_execute_call*``, ``send_resume_call``, ``send_cancel_call``,
  ``flush``, ``wait_flushed``); the adapter's methods of those names call it
  (one call more per send than when it was a base class: a subclass's override
  of the adapter's method is still what the orchestrator calls). Holds the
  state table only.
* ``_eras`` — :class:`~blockx.worker.link.eras.Eras`: where an era begins and
  ends and is reported lost, with the reports waiting for a process's exit.
* ``_unattached`` — :class:`~blockx.worker.link.unattached.UnattachedConnections`.

The setters (``set_callbacks``, ``set_function_code_resolver``,
``set_peer_check``, ``set_exit_source``) hand the new value to the part that
uses it.

An executor id is accepted only from the process the peer check allows
(:meth:`ExecutorAdapter.set_peer_check`; the worker's pool: the slot's process
or its descendant, by ``SO_PEERCRED``).

An era ends — reservations taken, snapshot unhealthy, then
``on_executor_lost(executor_id, lost_calls, reason, loss)`` — when:

* the connection closes (EOF, reset, a failed write);
* the peer sends a malformed frame (a :class:`~blockx.wire.ProtocolError`, or a
  call frame of the wrong shape: logged, counted in ``protocol_errors``,
  connection closed);
* no heartbeat arrived for ``heartbeat_timeout_ms`` (checked every
  ``heartbeat_check_interval_ms`` by the adapter's own timer — a round that
  fires late because the event loop stalled is skipped, so heartbeats queued
  meanwhile are read first — or by the orchestrator's tick through
  :meth:`ExecutorAdapter.check_heartbeat_timeouts`);
* the same executor id attaches on a new connection.

``loss`` (:class:`~blockx.worker.link.loss.ExecutorLoss`) says why, as far as
the worker can tell: with an exit source (the pool,
:meth:`ExecutorAdapter.set_exit_source`) the report of a connection that just
ended waits up to ``exit_wait_ms`` for the process's exit status and black box
(``executor_crashed``, ``memory_exceeded``, ``executor_wedged``, ``shutdown``),
and always precedes the same id's next attach (:mod:`.eras`).

Unattached connections: at most ``max_unattached`` at a time (the oldest is
dropped for a new one), and each is dropped unless it sends a valid Heartbeat
within ``attach_timeout_ms`` of connecting (code inside an executor can reach
the socket; it must not be able to spend the worker's descriptors). The listen
backlog (``max(16, 2 * max_unattached)``) bounds what one loop iteration
accepts before that rule runs; an executor that finds it full retries.

Threading: every method runs on the event loop thread that called
:meth:`ExecutorAdapter.start`. Nothing here blocks.

Errors: ``bind*`` raise a :class:`~blockx.worker.errors.BindError`
and ``send_*`` a :class:`~blockx.worker.errors.SendError` (both
carry ``error_kind`` and ``retryable``); nothing was reserved or queued then.
An :class:`~blockx.wire.EncodeError` from ``send_*`` means the payload itself
cannot go on the wire: fail that call with ``error.error_kind``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from blockx.wire import ProtocolError, keys
from blockx.wire.schema import ExecuteCallPayload, ResumeCallPayload
from blockx.worker.errors import (
    AdapterUsageError,
    ExecutorCapacityError,
    ExecutorUnavailableError,
)
from blockx.worker.link.callbacks import AdapterCallbacks, FunctionCodeResolver, PeerCheck
from blockx.worker.link.connection import (
    DEFAULT_FRAMES_PER_WRITE,
    DEFAULT_OUTBOX_DEPTH,
    ControlSend,
    ExecutorConnection,
)
from blockx.worker.link.eras import Eras
from blockx.worker.link.handlers import InboundHandlers
from blockx.worker.link.outbound import OutboundSends
from blockx.worker.link.snapshot import ExecutorSnapshot
from blockx.worker.link.state import (
    ExecutorState,
    attached_state,
    build_snapshot,
    unavailable_error,
)
from blockx.worker.link.unattached import UnattachedConnections
from blockx.worker.pool.exits import LossCause, ProcessExitSource
from blockx.worker.pool.listener import SOCKET_NAME, listen_backlog
from blockx.worker.pool.listener import socket_dir as new_socket_dir

try:
    # mypyc reads the marker (below). Nothing applies it at run time: a compiled
    # class's markers are not called, and an interpreted class needs none. (Not an
    # ``if TYPE_CHECKING`` import with an ``else``: compiled, that else branch is
    # mypyc's "unreachable" trap.)
    from mypy_extensions import mypyc_attr
except ImportError:  # mypy_extensions is not a run-time dependency

    def _no_marker(*_names: str, **_values: object) -> Any:
        return lambda cls: cls

    mypyc_attr = _no_marker

__all__ = [
    "DEFAULT_ATTACH_TIMEOUT_MS",
    "DEFAULT_EXIT_WAIT_MS",
    "DEFAULT_HEARTBEAT_CHECK_INTERVAL_MS",
    "DEFAULT_HEARTBEAT_TIMEOUT_MS",
    "DEFAULT_MAX_UNATTACHED",
    "SOCKET_NAME",
    "ExecutorAdapter",
]

_log = logging.getLogger("blockx.worker.adapter")

#: Seed default of ``executor.Config.HeartbeatTimeoutMs`` (WorkerConfig couples
#: it to the scheduler stall timeout: stall + 5000).
DEFAULT_HEARTBEAT_TIMEOUT_MS: Final = 10_000
#: How often the adapter's own timer checks heartbeat ages.
DEFAULT_HEARTBEAT_CHECK_INTERVAL_MS: Final = 500
#: Unattached connections held at once (the oldest is dropped for a new one).
DEFAULT_MAX_UNATTACHED: Final = 8
#: A connection that sent no valid Heartbeat this long after connecting is dropped.
DEFAULT_ATTACH_TIMEOUT_MS: Final = 2000
#: How long a lost era's report waits for its process's exit status.
DEFAULT_EXIT_WAIT_MS: Final = 1500


# Tests subclass it (tests/worker/runtime/orchestrator_rig.py: FlakyAdapter overrides
# bind and the sends), compiled too.
@mypyc_attr(allow_interpreted_subclasses=True)
class ExecutorAdapter:
    """The UDS listener and every executor connection; see the module docstring.

    Build it, optionally set callbacks and the function-code resolver, then
    ``await start()`` (or ``async with``). ``socket_path`` is what executors get
    as ``--socket-path``.
    """

    def __init__(
        self,
        *,
        callbacks: AdapterCallbacks | None = None,
        function_code_resolver: FunctionCodeResolver | None = None,
        heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
        heartbeat_check_interval_ms: int | None = DEFAULT_HEARTBEAT_CHECK_INTERVAL_MS,
        outbox_depth: int = DEFAULT_OUTBOX_DEPTH,
        frames_per_write: int = DEFAULT_FRAMES_PER_WRITE,
        write_buffer_high_water: int | None = None,
        socket_dir: str | os.PathLike[str] | None = None,
        max_unattached: int = DEFAULT_MAX_UNATTACHED,
        attach_timeout_ms: int = DEFAULT_ATTACH_TIMEOUT_MS,
        exit_wait_ms: int = DEFAULT_EXIT_WAIT_MS,
        clock: Callable[[], float] = time.monotonic,
        listener: socket.socket | None = None,
    ) -> None:
        """``heartbeat_check_interval_ms=None`` disables the adapter's own timer (the
        orchestrator then calls :meth:`check_heartbeat_timeouts` on its tick).
        ``socket_dir`` is where the private socket directory is created
        (default: the system temp dir); ``listener``: a socket already bound and listening
        in such a directory (``blockx/worker/pool/listener.py``), served instead, its
        directory removed on :meth:`close` all the same. ``max_unattached`` / ``attach_timeout_ms``
        bound connections that have not attached; ``exit_wait_ms`` is how long a lost
        era's report waits for the exit status (module docstring). ``clock`` returns
        monotonic seconds."""
        if heartbeat_timeout_ms <= 0:
            raise ValueError(f"heartbeat_timeout_ms must be positive, got {heartbeat_timeout_ms}")
        if max_unattached < 1 or attach_timeout_ms <= 0 or exit_wait_ms < 0:
            raise ValueError(
                "max_unattached and attach_timeout_ms must be positive, exit_wait_ms >= 0"
            )
        if heartbeat_check_interval_ms is not None and heartbeat_check_interval_ms <= 0:
            raise ValueError("heartbeat_check_interval_ms must be positive or None")
        if outbox_depth < 1 or frames_per_write < 1:
            raise ValueError("outbox_depth and frames_per_write must be positive")
        self._callbacks = callbacks or AdapterCallbacks()
        self._heartbeat_timeout_ms = heartbeat_timeout_ms
        self._heartbeat_timeout_s = heartbeat_timeout_ms / 1000.0
        self._check_interval_s = (
            None if heartbeat_check_interval_ms is None else heartbeat_check_interval_ms / 1000.0
        )
        self._outbox_depth = outbox_depth
        self._frames_per_write = frames_per_write
        self._write_buffer_high_water = write_buffer_high_water
        self._socket_parent = None if socket_dir is None else os.fspath(socket_dir)
        self._clock = clock
        self._backlog = listen_backlog(max_unattached)
        self._listener = listener
        #: Connections not attached yet (at most max_unattached, each for a while).
        self._unattached = UnattachedConnections(max_unattached, attach_timeout_ms / 1000.0)
        #: One entry per executor id ever attached (until forgotten); the parts share it.
        self._executors: dict[str, ExecutorState] = {}
        self._eras = Eras(self._unattached, self._callbacks, exit_wait_s=exit_wait_ms / 1000.0)
        #: The inbound frame handling (every connection's FrameReceiver).
        self.inbound = InboundHandlers(
            self._executors,
            self._eras,
            callbacks=self._callbacks,
            resolver=function_code_resolver,
            clock=clock,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
        )
        #: The sends (the adapter's send_* / flush / wait_flushed call it).
        self.outbound = OutboundSends(self._executors)
        self._connections: set[ExecutorConnection] = set()
        self._next_connection_id = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._socket_dir: str | None = None
        self._socket_path: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tick_due = 0.0
        self._started = False
        self._closing = False

    def __repr__(self) -> str:
        attached = sum(1 for s in self._executors.values() if s.connection is not None)
        status = "closed" if self._closing else ("listening" if self._started else "new")
        return (
            f"ExecutorAdapter({status}, {self._socket_path!r}, attached={attached}/"
            f"{len(self._executors)}, connections={len(self._connections)})"
        )

    # --- configuration ---------------------------------------------------------------

    def set_callbacks(self, callbacks: AdapterCallbacks) -> None:
        """Replace the orchestrator's callbacks (takes effect for the next frame)."""
        self._callbacks = callbacks
        self.inbound.callbacks = callbacks
        self._eras.callbacks = callbacks

    def set_function_code_resolver(self, resolver: FunctionCodeResolver | None) -> None:
        self.inbound.resolver = resolver

    # Counters, for tests, benches and logs (each kept by the part that counts it).

    @property
    def dropped_unattached(self) -> int:
        """Connections dropped before attaching: over the limit, or no Heartbeat in time."""
        return self._unattached.dropped

    @property
    def protocol_errors(self) -> int:
        """Connections closed for breaking the protocol (attached or not)."""
        return self._eras.protocol_errors

    @property
    def eras_ended(self) -> int:
        return self._eras.eras_ended

    @property
    def refused_attaches(self) -> int:
        """Attaches the peer check refused."""
        return self.inbound.refused_attaches

    @property
    def unknown_frames(self) -> int:
        """Frames of an unknown ``messageType`` (dropped)."""
        return self.inbound.unknown_frames

    @property
    def stale_terminal_frames(self) -> int:
        """Terminal frames that released nothing (a replaced attempt, or already released)."""
        return self.inbound.stale_terminal_frames

    @property
    def function_code_answered(self) -> int:
        return self.inbound.function_code_answered

    @property
    def heartbeat_timeout_ms(self) -> int:
        return self._heartbeat_timeout_ms

    @property
    def socket_path(self) -> str:
        """The listening socket (``--socket-path`` for executors). Only after :meth:`start`."""
        if self._socket_path is None:
            raise AdapterUsageError("the adapter is not started")
        return self._socket_path

    @property
    def socket_dir(self) -> str:
        """The private directory holding only the socket (what a sandbox mounts)."""
        if self._socket_dir is None:
            raise AdapterUsageError("the adapter is not started")
        return self._socket_dir

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> str:
        """Create the private socket directory, listen, start the heartbeat timer.

        Returns the socket path. Raises :class:`AdapterUsageError` if called twice
        and :class:`ValueError` if the socket path would not fit ``sun_path``.
        """
        if self._started:
            raise AdapterUsageError("ExecutorAdapter.start() called twice")
        self._started = True
        self._loop = self._eras.loop = asyncio.get_running_loop()
        listener = self._listener
        if listener is None:
            socket_dir, path = new_socket_dir(self._socket_parent)  # ValueError: too long
        else:
            path = listener.getsockname()
            socket_dir = os.path.dirname(path)
        self._socket_dir = socket_dir
        self._socket_path = path
        try:
            # The backlog also caps how many connections asyncio accepts in one loop
            # iteration (before on_connection_made can drop any): listener.listen_backlog.
            if listener is None:
                self._server = await self._loop.create_unix_server(
                    self._new_connection, path, backlog=self._backlog
                )
            else:
                self._server = await self._loop.create_unix_server(
                    self._new_connection, sock=listener, backlog=self._backlog
                )
        except BaseException:
            if listener is not None:
                listener.close()
            shutil.rmtree(socket_dir, ignore_errors=True)
            raise
        if self._check_interval_s is not None:
            self._schedule_tick()
        _log.info("executor adapter listening on %s", path)
        return path

    def set_peer_check(self, check: PeerCheck | None) -> None:
        """Vet every attach: ``check(executor_id, peer_pid)`` returns None to accept, or
        why the connecting process may not be that executor (the connection is then
        closed as a protocol error and nothing is attached). ``peer_pid`` is None for a
        transport without a Unix socket. The worker passes its pool's check: only the
        process it started for a slot (or a descendant, e.g. inside bubblewrap) may attach
        as that slot's executor.
        """
        self.inbound.peer_check = check

    def set_exit_source(self, source: ProcessExitSource | None) -> None:
        """Where lost eras learn how their process ended (the worker passes its pool).

        With none, a connection that ends is reported at once as ``transport_lost``.
        """
        self._eras.set_exit_source(source)

    def expect_disconnects(self) -> None:
        """The worker is stopping its executors: their connections ending is expected.

        Lost executors are still reported to the callbacks, but logged at debug
        level instead of as a warning (a clean shutdown prints nothing alarming).
        """
        self._eras.expect_disconnects()

    async def close(self) -> None:
        """Stop listening, close every connection, remove the socket and its directory.

        Reservations are dropped silently: no ``on_executor_lost`` and no
        ``on_control_failed`` callbacks are made from here on. Idempotent.
        """
        if self._closing:
            return
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        server = self._server
        if server is not None:
            server.close()
        self._eras.close(self._executors.values())
        self._unattached.close()
        for conn in list(self._connections):
            conn.abort("worker adapter closed")
        if server is not None:
            await server.wait_closed()
        # Let the aborted transports run connection_lost before the loop moves on.
        await asyncio.sleep(0)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        _log.info("executor adapter closed")

    async def __aenter__(self) -> ExecutorAdapter:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # --- reservations ---------------------------------------------------------------------

    def bind(self, call_id: str, executor_id: str) -> None:
        """Reserve a context on ``executor_id`` for a root call.

        Raises :class:`ExecutorUnavailableError` (no live connection) or
        :class:`ExecutorCapacityError` (every usable context reserved). Re-binding
        a call already reserved there is a new attempt: it keeps the one
        reservation and clears draining.
        """
        state = self._executors.get(executor_id)
        if state is None or state.connection is None:
            raise unavailable_error(state, executor_id, call_id)
        reservations = state.reservations
        if not reservations.bind_within(call_id, state.capacity):
            raise ExecutorCapacityError(
                executor_id, call_id=call_id, reserved=len(reservations), usable=state.capacity
            )

    def bind_subcall(self, call_id: str, parent_call_id: str, executor_id: str) -> None:
        """Reserve a context for a sub-call on its parent's executor.

        Allowed while the parent holds a live (bound, not draining) reservation
        there, even at capacity (the executor exempts sub-calls too). Raises
        :class:`ExecutorUnavailableError` or :class:`ParentNotResidentError`.
        """
        self._live_state(executor_id, call_id).reservations.bind_subcall(call_id, parent_call_id)

    def unbind(self, call_id: str, executor_id: str) -> bool:
        """Release a reservation (idempotent with the terminal-frame release).

        A draining reservation is kept until the executor's terminal frame.
        True if a reservation was released.
        """
        state = self._executors.get(executor_id)
        return state is not None and state.reservations.unbind(call_id)

    def mark_draining(self, call_id: str, executor_id: str) -> bool:
        """Mark a reservation draining (the call is being cancelled); False if none."""
        state = self._executors.get(executor_id)
        return state is not None and state.reservations.mark_draining(call_id)

    def is_draining(self, call_id: str, executor_id: str) -> bool:
        state = self._executors.get(executor_id)
        return state is not None and state.reservations.is_draining(call_id)

    def is_reserved(self, call_id: str, executor_id: str) -> bool:
        state = self._executors.get(executor_id)
        return state is not None and call_id in state.reservations

    def reserved_calls(self, executor_id: str) -> tuple[str, ...]:
        """Call ids holding a reservation on ``executor_id``, in bind order."""
        state = self._executors.get(executor_id)
        return () if state is None else state.reservations.call_ids()

    # --- sends (self.outbound: outbound.py documents each) ---------------------------------------

    def send_execute_call(
        self,
        executor_id: str,
        call_id: str,
        payload: Mapping[str, Any] | ExecuteCallPayload,
        *,
        trace: Mapping[str, str] | None = None,
    ) -> None:
        """Queue an ``ExecuteCall`` for a bound call (:meth:`OutboundSends.send_execute_call`)."""
        self.outbound.send_execute_call(executor_id, call_id, payload, trace=trace)

    def send_execute_call_encoded(
        self, executor_id: str, call_id: str, attempt_seq: int, body: bytes
    ) -> None:
        """Queue a pre-encoded ``ExecuteCall`` (:meth:`OutboundSends.send_execute_call_encoded`)."""
        self.outbound.send_execute_call_encoded(executor_id, call_id, attempt_seq, body)

    def send_resume_call(
        self,
        executor_id: str,
        call_id: str,
        request_id: str,
        payload: Mapping[str, Any] | ResumeCallPayload,
        *,
        sidecar: bytes | None = None,
        token: Any = None,
    ) -> None:
        """Queue a ``ResumeCall`` (:meth:`OutboundSends.send_resume_call`)."""
        self.outbound.send_resume_call(
            executor_id, call_id, request_id, payload, sidecar=sidecar, token=token
        )

    def send_cancel_call(
        self,
        executor_id: str,
        call_id: str,
        *,
        attempt_seq: int,
        reason: str = keys.DEFAULT_CANCEL_REASON,
        token: Any = None,
    ) -> None:
        """Queue a best-effort ``CancelCall`` (:meth:`OutboundSends.send_cancel_call`)."""
        self.outbound.send_cancel_call(
            executor_id, call_id, attempt_seq=attempt_seq, reason=reason, token=token
        )

    def flush(self, executor_id: str | None = None) -> None:
        """Write what is queued now (all executors when ``executor_id`` is None)."""
        self.outbound.flush(executor_id)

    async def wait_flushed(self, executor_id: str) -> None:
        """Wait until what is queued for ``executor_id`` is written (see ``outbound``)."""
        await self.outbound.wait_flushed(executor_id)

    # --- views -----------------------------------------------------------------------------------

    def snapshots(self) -> list[ExecutorSnapshot]:
        """One snapshot per executor id ever attached, sorted by id (lost ones unhealthy)."""
        now = self._clock()
        return [
            self._snapshot(self._executors[executor_id], now)
            for executor_id in sorted(self._executors)
            if self._executors[executor_id].heartbeat is not None
        ]

    def snapshot(self, executor_id: str) -> ExecutorSnapshot | None:
        state = self._executors.get(executor_id)
        if state is None or state.heartbeat is None:
            return None
        return self._snapshot(state, self._clock())

    def executor_states(self) -> Mapping[str, ExecutorState]:
        """Every executor id ever attached (until forgotten) -> its state: connection,
        reservations, latest heartbeat and when it came (``heartbeat_at``, on
        :meth:`now`'s clock). Read-only, for metrics and status pages: read it on the
        event loop thread, never write it."""
        return self._executors

    def now(self) -> float:
        """The adapter's clock (monotonic seconds): ``heartbeat_at`` is on it."""
        return self._clock()

    def is_attached(self, executor_id: str) -> bool:
        state = self._executors.get(executor_id)
        return state is not None and state.connection is not None

    def attached_executor_ids(self) -> list[str]:
        return sorted(e for e, s in self._executors.items() if s.connection is not None)

    def connection(self, executor_id: str) -> ExecutorConnection | None:
        """The attached connection (its counters are useful in tests and benches)."""
        state = self._executors.get(executor_id)
        return None if state is None else state.connection

    def forget_executor(self, executor_id: str) -> bool:
        """Drop a lost executor id from :meth:`snapshots` (e.g. its pool slot stopped).

        An attached executor is not forgotten (False); disconnect it first.
        """
        state = self._executors.get(executor_id)
        if state is None or state.connection is not None:
            return False
        del self._executors[executor_id]
        return True

    def disconnect(
        self,
        executor_id: str,
        reason: str = "disconnected by the worker",
        *,
        cause: LossCause = "transport_lost",
    ) -> bool:
        """End the executor's current era now (closes the connection; lost path runs,
        reported at once with ``cause``)."""
        state = self._executors.get(executor_id)
        if state is None or state.connection is None:
            return False
        self._eras.end(state, reason, cause)
        return True

    def check_heartbeat_timeouts(self, now: float | None = None) -> list[str]:
        """End the era of every executor silent for longer than the heartbeat timeout.

        Also closes connections that sent no heartbeat within the timeout of
        connecting. Returns the executor ids declared lost. ``now`` is monotonic
        seconds from the adapter's clock (default: read it).
        """
        if now is None:
            now = self._clock()
        timeout = self._heartbeat_timeout_s
        lost: list[str] = []
        for state in list(self._executors.values()):
            if state.connection is not None and now - state.heartbeat_at > timeout:
                silent_ms = int((now - state.heartbeat_at) * 1000)
                # No cause given: with an exit source the report waits for the process
                # to exit (the orchestrator kills a silent executor at once), so its
                # black box is read -- the call a computation in C was stuck in.
                self._eras.end(
                    state,
                    f"heartbeat timeout: none for {silent_ms} ms "
                    f"(limit {self._heartbeat_timeout_ms} ms)",
                )
                lost.append(state.executor_id)
        self._unattached.expire(now)
        return lost

    # --- internals: connections --------------------------------------------------------------

    def _new_connection(self) -> ExecutorConnection:
        conn = ExecutorConnection(
            self,
            self.inbound,
            connection_id=self._next_connection_id,
            opened_at=self._clock(),
            outbox_depth=self._outbox_depth,
            frames_per_write=self._frames_per_write,
        )
        self._next_connection_id += 1
        return conn

    def _schedule_tick(self) -> None:
        assert self._loop is not None and self._check_interval_s is not None
        self._tick_due = self._clock() + self._check_interval_s
        self._timer = self._loop.call_later(self._check_interval_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._closing:
            return
        interval = self._check_interval_s
        assert interval is not None
        late = self._clock() - self._tick_due
        try:
            if late > interval:
                # The event loop stalled. uvloop runs due timers before it polls the
                # sockets, so heartbeats that arrived meanwhile are still unread:
                # judge silence only after they had a turn.
                _log.warning("event loop stalled %.0f ms; heartbeat check deferred", late * 1000)
            else:
                self.check_heartbeat_timeouts()
        finally:
            if not self._closing:
                self._schedule_tick()

    def _live_state(self, executor_id: str, call_id: str | None) -> ExecutorState:
        state = self._executors.get(executor_id)
        if state is None or state.connection is None:
            raise unavailable_error(state, executor_id, call_id)
        return state

    def _snapshot(self, state: ExecutorState, now: float) -> ExecutorSnapshot:
        return build_snapshot(state, now, self._heartbeat_timeout_ms)

    # --- ConnectionOwner: called by ExecutorConnection only -------------------------------------

    def on_connection_made(self, conn: ExecutorConnection) -> None:
        if self._closing:
            conn.abort("worker adapter closed")
            return
        assert self._loop is not None
        self._unattached.admit(conn, self._loop)
        self._connections.add(conn)
        transport = conn._transport
        if self._write_buffer_high_water is not None and transport is not None:
            transport.set_write_buffer_limits(high=self._write_buffer_high_water)
        _log.debug("executor connection #%d opened", conn.connection_id)

    def on_connection_lost(self, conn: ExecutorConnection, exc: Exception | None) -> None:
        self._connections.discard(conn)
        self._unattached.forget(conn)
        state = attached_state(self._executors, conn)
        if state is not None:
            self._eras.end(state, conn.close_reason or "connection lost")

    def on_protocol_error(self, conn: ExecutorConnection, error: ProtocolError) -> None:
        self._eras.protocol_error(conn, attached_state(self._executors, conn), error)

    def on_controls_flushed(self, notes: list[ControlSend]) -> None:
        callbacks = self._callbacks
        if callbacks.on_controls_sent is not None:
            callbacks.on_controls_sent(notes)
            return
        on_control_sent = callbacks.on_control_sent
        for note in notes:
            try:
                on_control_sent(note)
            except Exception:
                _log.exception("on_control_sent callback failed for %r", note)

    def on_control_failed(self, note: ControlSend, error: ExecutorUnavailableError) -> None:
        if not self._closing:
            self._callbacks.on_control_failed(note, error)

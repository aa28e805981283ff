"""TaskIOScope: one task's IO — backends behind a read cache, singleflight and statistics.

Theory of operation
-------------------
A :class:`TaskIOScope` is the :class:`~blockx.worker.io.IOHandler` of one task
(:meth:`IOSubsystem.task_scope <blockx.worker.io.registry.IOSubsystem.task_scope>`
makes one). For each ``CallWaiting(io)`` it:

* **reads** (``ioKind=read``, and ``capability`` with a ``cacheKey``) — builds
  the request bytes (:func:`~blockx.worker.io.cache.request_key`: backend,
  operation, and the executor's ``cacheKey``, else the sidecar bytes, else the
  canonical params JSON) and answers, cheapest first:

  1. from the task's :class:`~blockx.worker.io.cache.ReadCache` — an
     :class:`~blockx.worker.io.IOResult` returned at once (no future);
  2. by joining an identical read in flight (*singleflight*): one backend call
     for all of them, each waiter with an answer future of its own;
  3. by a backend call of its own (a *flight*): the backend prepares the
     request (a refusal answers ``io_error`` at once) and executes it; when the
     answer arrives every waiter gets it, and a successful answer the backend
     marked cacheable is stored — unless a write of the same domain started or
     ended meanwhile (the cache's generations).

  Errors are never cached; a flight's waiters share its error.

  **Abandoned reads.** The worker cancels the future it got from ``handle_io``
  when nobody waits for it any more (the call's attempt failed — its budget
  ran out while it waited —, was cancelled, or its executor was lost). Each
  waiter has a future of its own (a :class:`~.read_answer.ReadAnswer`): cancelling it takes
  that one waiter off the flight, and the others still get the answer. When
  the last waiter of a read is gone while its backend call runs, the backend's
  future is cancelled (an RPC request stops at its next try), the flight is
  forgotten (a later identical read starts afresh) and counted in
  ``abandoned``. A write — or a capability call without a ``cacheKey`` — is
  never cancelled: cancelling does not undo it, so it runs to its answer
  whoever waits.

* **writes** (``ioKind=write``) — never cached, never shared. A write
  invalidates the task's cached reads of the same backend and domain (for
  ``blockdb``: the same table; a backend naming no domain: all of its reads)
  when it starts *and* when it ends, and in-flight reads of that domain are
  detached from singleflight (later reads do not join them, their answers are
  not cached). So a call that writes a table and then reads it sees its write,
  and so does every later read of the task. Writes by other tasks, or outside
  BlockX, do not invalidate anything: a task sees a table as it first read it,
  until it writes it itself.

* **capability** calls without a ``cacheKey`` — one backend call each, no
  cache, no invalidation.

Statistics go to :attr:`TaskIOScope.stats` (and roll up into the subsystem's).
Everything runs on the event loop thread; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from blockx.wire import keys

from .backend import IOBackend, IORequestError, PreparedRequest, Reply
from .cache import ReadCache, canonical_params, estimate_size
from .handler import IOResult, IOReturn, io_error
from .read_answer import ReadAnswer
from .stats import IOStats, OperationStats

__all__ = ["TaskIOScope"]

_log = logging.getLogger("blockx.worker.io")

_FP_BACKEND: Final = keys.FP_BACKEND
_FP_OPERATION: Final = keys.FP_OPERATION
_FP_IO_KIND: Final = keys.FP_IO_KIND
_FP_PARAMS: Final = keys.FP_PARAMS
_FP_CACHE_KEY: Final = keys.FP_CACHE_KEY
_IO_READ: Final = keys.IO_READ
_IO_WRITE: Final = keys.IO_WRITE
_IO_CAPABILITY: Final = keys.IO_CAPABILITY

#: Longest backend/operation name kept in statistics (longer ones are cut).
_MAX_NAME: Final = 64


class _Flight:
    """One backend call and its waiters: the first one's future is ``answer``, each
    later one (a singleflight join, reads only) has its own in ``joiners``."""

    __slots__ = (
        "answer",
        "backend",
        "cacheable",
        "domain",
        "generation",
        "immutable",
        "joiners",
        "key",
        "pending",
        "scope",
        "started",
        "stats",
        "waiters",
        "write",
    )

    def __init__(
        self,
        scope: TaskIOScope,
        key: Any,
        backend: str,
        prepared: PreparedRequest,
        stats: OperationStats,
        *,
        write: bool,
    ) -> None:
        self.scope = scope
        #: The request bytes of a read (singleflight, cache); None: a write or an unkeyed
        #: capability call, whose backend call is never cancelled.
        self.key = key
        self.backend = backend
        self.domain = prepared.domain
        self.cacheable = prepared.cacheable and key is not None and not write
        self.immutable = prepared.immutable and self.cacheable
        self.generation = scope._cache.generation(backend, prepared.domain)
        self.stats = stats
        self.write = write
        #: The backend's future while the call runs (the scope cancels it when it closes,
        #: or when every waiter of a read is gone).
        self.pending: asyncio.Future[Any] | None = None
        # The scope's loop, given: without it the C future asks for the running loop,
        # which costs a getpid system call on CPython 3.11 (its fork check).
        answer = self.answer = ReadAnswer(loop=scope.running_loop())
        answer.flight = self
        answer.direct = None
        #: The answer futures of the waiters that joined; None: nobody did (or the
        #: flight ended: :meth:`let_go`). ``waiters``
        #: (those not gone, the first one included) is kept from the first join on.
        self.joiners: list[ReadAnswer] | None = None
        # Not loop.time(): uvloop's clock counts whole milliseconds, and most table reads
        # take less than one (the statistics would show 0 or 1 ms for each).
        self.started = time.perf_counter()

    def __repr__(self) -> str:
        kind = "write" if self.write else "read"
        waiting = sum(not f.done() for f in (self.answer, *(self.joiners or ())))
        return (
            f"_Flight({kind} {self.backend}/{self.stats.operation}, domain={self.domain!r}, "
            f"waiting={waiting}, running={self.pending is not None})"
        )

    def join(self) -> ReadAnswer:
        """One more waiter of this read: an answer future of its own."""
        waiter = ReadAnswer(loop=self.scope.running_loop())
        waiter.flight = self
        waiter.direct = None
        joiners = self.joiners
        if joiners is None:
            self.joiners = [waiter]
            # The first waiter may have left already (its call stopped waiting).
            self.waiters = 1 if self.answer.done() else 2
        else:
            joiners.append(waiter)
            self.waiters += 1
        return waiter

    def waiter_left(self) -> None:
        """A waiter's answer future was cancelled: nobody waits for it any more.

        When it was a read's last waiter and the backend call still runs, the call is
        cancelled (its answer would go to nobody), the flight is forgotten so a later
        identical read starts afresh, and it counts as ``abandoned`` (not as a backend
        call: it never answered). A write, or an unkeyed capability call, runs on:
        cancelling it would not undo it.
        """
        if self.key is None:
            return
        if self.joiners is not None:
            self.waiters -= 1
            if self.waiters:
                return
        pending = self.pending
        if pending is None or pending.done():
            return  # the answer is here or on its way: it still fills the cache
        pending.remove_done_callback(self._backend_done)
        self.pending = None
        scope = self.scope
        scope._running.discard(self)
        if scope._flights.get(self.key) is self:
            del scope._flights[self.key]
        self.stats.record_abandoned()
        self.let_go()
        pending.cancel()

    def let_go(self) -> None:
        """The flight ended (answered, or abandoned): its answer futures let go of it.

        While it runs, the flight and its waiters' futures point at each other (a
        waiter's cancel must reach it); broken here, the flight and the answer its
        futures hold (rows, sidecar bytes) are freed by reference counting as soon as
        the waiters are served, not at the next pass of the cyclic GC -- which the
        worker runs rarely (``tune_gc``), and later still for a flight that was running
        during a pass.
        """
        self.answer.flight = None
        joiners = self.joiners
        if joiners is not None:
            self.joiners = None
            for waiter in joiners:
                waiter.flight = None

    def start(self, backend: IOBackend, prepared: PreparedRequest) -> None:
        try:
            pending: Any = backend.execute(prepared)
            # isinstance first: asyncio.isfuture is an interpreted function, once a read.
            if not isinstance(pending, asyncio.Future) and not asyncio.isfuture(pending):
                pending = asyncio.ensure_future(pending)
        except Exception as exc:
            _log.exception("IO backend %s raised starting %s", self.backend, prepared)
            self.finish(_bug_reply(self.backend, prepared.operation, exc))
            return
        pending.add_done_callback(self._backend_done)
        if not pending.done():
            self.pending = pending
            self.scope._running.add(self)

    def _backend_done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            reply = Reply.failure(
                f"{self.backend} {self.stats.operation}: the request was cancelled",
                retryable=True,
            )
        else:
            exc = future.exception()
            if exc is not None:
                _log.error("IO backend %s failed %s: %r", self.backend, self.stats.operation, exc)
                reply = _bug_reply(self.backend, self.stats.operation, exc)
            else:
                reply = future.result()
                if type(reply) is not Reply:
                    reply = _bug_reply(
                        self.backend,
                        self.stats.operation,
                        TypeError(f"backend answered {type(reply).__name__}, not a Reply"),
                    )
        self.finish(reply)

    def finish(self, reply: Reply) -> None:
        scope = self.scope
        if self.pending is not None:
            self.pending = None
            scope._running.discard(self)
        elapsed = time.perf_counter() - self.started
        self.stats.record_call(elapsed, reply.error is not None, reply.throttled)
        result = reply.to_io_result()
        if (
            self.immutable
            and reply.error is None
            and reply.sidecar is None
            and (
                reply.result is not None  # null: a block not there yet, which may come
            )
        ):
            result.immutable = True  # the executor may keep it (docs/protocol.md)
        scope._flight_done(self, reply)
        answer = self.answer
        joiners = self.joiners
        if not answer.done():  # a cancelled one: its waiter left
            answer.set_result(result)
        if joiners is not None:
            for waiter in joiners:
                if not waiter.done():
                    waiter.set_result(result)
        self.let_go()
        # Then the callbacks given to deliver_to (the worker's), now rather than a loop
        # turn later; the other done callbacks run from the loop as always.
        if answer.direct is not None:
            _deliver(answer)
        if joiners is not None:
            for waiter in joiners:
                if waiter.direct is not None:
                    _deliver(waiter)


def _deliver(waiter: ReadAnswer) -> None:
    """Call the callback ``waiter.deliver_to`` registered (it is done, not cancelled)."""
    callback = waiter.direct
    waiter.direct = None
    assert callback is not None
    try:
        callback(waiter)
    except Exception:  # as the event loop reports a done callback that raised
        _log.exception("the answer callback of an IO read raised")


def _bug_reply(backend: str, operation: str, exc: BaseException) -> Reply:
    return Reply.failure(
        f"{backend} {operation}: internal error in the backend: {exc!r}", retryable=False
    )


class TaskIOScope:
    """The :class:`~blockx.worker.io.IOHandler` of one task (see the module docstring).

    ``resolve_backend(name)`` returns the backend serving ``name`` or None;
    ``backend_names()`` lists them for error messages. Cache bounds:
    ``cache_max_entries`` / ``cache_max_bytes`` (0 disables the cache).
    """

    __slots__ = (
        "_backend_names",
        "_cache",
        "_closed",
        "_flights",
        "_loop",
        "_op_stats",
        "_resolve",
        "_running",
        "stats",
        "task_id",
    )

    def __init__(
        self,
        task_id: str,
        resolve_backend: Callable[[str], IOBackend | None],
        *,
        backend_names: Callable[[], list[str]] | None = None,
        cache_max_entries: int = 10_000,
        cache_max_bytes: int = 16 * 1024 * 1024,
        stats_parent: IOStats | None = None,
    ) -> None:
        self.task_id = task_id
        self._resolve = resolve_backend
        self._backend_names = backend_names
        self._cache = ReadCache(max_entries=cache_max_entries, max_bytes=cache_max_bytes)
        self._flights: dict[Any, _Flight] = {}
        # Every flight whose backend call is still running (reads and writes).
        self._running: set[_Flight] = set()
        #: ``request_head`` -> counters (the scope's shortcut into ``stats``).
        self._op_stats: dict[str, OperationStats] = {}
        self._closed = False
        self.stats = IOStats(parent=stats_parent)
        #: The loop its flights run on, kept once known (:meth:`running_loop`).
        self._loop: asyncio.AbstractEventLoop | None = None

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop: the one kept while it runs, else asked for (once: asking
        costs a ``getpid`` system call on CPython 3.11, and every flight needs it)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def __repr__(self) -> str:
        return (
            f"TaskIOScope({self.task_id!r}, {self._cache!r}, in_flight={len(self._flights)}, "
            f"{self.stats!r})"
        )

    @property
    def cache(self) -> ReadCache:
        return self._cache

    @property
    def in_flight(self) -> int:
        """Reads in flight that can still be joined."""
        return len(self._flights)

    def close(self, *, cancel_running: bool = False) -> None:
        """Drop the cache; flights in progress still answer their waiters — unless
        ``cancel_running``: the run is over and nobody waits for them, so the backend calls
        still running are cancelled (an RPC request stops at its next retry instead of going
        through every try). Only the end of the scope's own run may ask that: a scope
        dropped while its task runs (IOSubsystem's LRU, ``end_task``) must let a write
        answer, since cancelling its future does not undo it."""
        self._closed = True
        self._cache.clear()
        self._flights.clear()
        running, self._running = self._running, set()
        if not cancel_running:
            return
        for flight in running:
            pending = flight.pending
            if pending is not None and not pending.done():
                pending.cancel()

    def note_local_hits(self, hits: Any) -> None:
        """Count reads an executor answered from its own immutable-read cache
        (``{backend: {operation: count}}``, a call's ``localReadHits``) in
        ``stats.local_hits``; anything malformed is ignored (statistics only)."""
        if type(hits) is not dict:
            return
        for backend, operations in hits.items():
            if type(backend) is not str or type(operations) is not dict:
                continue
            for operation, count in operations.items():
                if type(operation) is str and type(count) is int and count > 0:
                    self.stats.operation(
                        backend[:_MAX_NAME], operation[:_MAX_NAME]
                    ).record_local_hits(count)

    # --- IOHandler ------------------------------------------------------------------------------

    def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOReturn:
        get = payload.get
        backend_name = get(_FP_BACKEND)
        operation = get(_FP_OPERATION)
        if type(backend_name) is not str or type(operation) is not str:
            return io_error(
                f"an IO request needs string 'backend' and 'operation', got "
                f"{backend_name!r} and {operation!r}"
            )
        head = f"{backend_name}\x00{operation}\x00"
        stats = self._op_stats.get(head)
        if stats is None:
            stats = self._op_stats[head] = self.stats.operation(
                backend_name[:_MAX_NAME], operation[:_MAX_NAME]
            )
        io_kind = get(_FP_IO_KIND)
        cache_key = get(_FP_CACHE_KEY)
        if io_kind == _IO_READ or (io_kind == _IO_CAPABILITY and cache_key):
            return self._read(
                head, backend_name, io_kind, operation, get(_FP_PARAMS), sidecar, cache_key, stats
            )
        if io_kind == _IO_WRITE or io_kind == _IO_CAPABILITY:
            backend = self._backend(backend_name, stats)
            if type(backend) is IOResult:
                return backend
            return self._uncached(
                backend,
                backend_name,
                io_kind,
                operation,
                get(_FP_PARAMS),
                sidecar,
                stats,
                write=io_kind == _IO_WRITE,
            )
        stats.record_rejected()
        return io_error(f"ioKind must be 'read', 'write' or 'capability', not {io_kind!r}")

    # --- paths ----------------------------------------------------------------------------------

    def _backend(self, name: str, stats: OperationStats) -> Any:
        """The backend serving ``name``, or the IOResult refusing the request."""
        try:
            backend = self._resolve(name)
        except RuntimeError as exc:  # the backend could not be set up (bad config, ...)
            stats.record_rejected()
            return io_error(str(exc))
        if backend is None:
            stats.record_rejected()
            names = self._backend_names() if self._backend_names is not None else []
            return io_error(f"unknown IO backend {name!r}; configured: {names}")
        return backend

    def _read(
        self,
        head: str,
        backend_name: str,
        io_kind: str,
        operation: str,
        params: Any,
        sidecar: bytes | None,
        cache_key: Any,
        stats: OperationStats,
    ) -> IOReturn:
        # The hot path: a cache hit needs neither the backend nor the params.
        key: Any
        if cache_key and type(cache_key) is str:
            key = head + "k" + cache_key
        elif sidecar is not None:
            key = (head + "s", sidecar)
        else:
            try:
                key = head + "p" + canonical_params(params).decode("utf-8")
            except (TypeError, ValueError) as exc:
                stats.record_rejected()
                return io_error(f"{backend_name} {operation}: params are not JSON: {exc}")
        cache = self._cache
        hit = cache.get(key)
        if hit is not None:
            stats.record_cache_hit()
            return hit
        flight = self._flights.get(key)
        if flight is not None and flight.generation == cache.generation(
            backend_name, flight.domain
        ):
            stats.record_join()
            cache.grow()
            return flight.join()
        backend = self._backend(backend_name, stats)
        if type(backend) is IOResult:
            return backend
        prepared = self._prepare(backend, io_kind, operation, params, sidecar, stats)
        if type(prepared) is IOResult:
            return prepared
        assert type(prepared) is PreparedRequest
        flight = _Flight(self, key, backend_name, prepared, stats, write=False)
        self._flights[key] = flight
        flight.start(backend, prepared)
        return flight.answer

    def _uncached(
        self,
        backend: IOBackend,
        backend_name: str,
        io_kind: str,
        operation: str,
        params: Any,
        sidecar: bytes | None,
        stats: OperationStats,
        *,
        write: bool,
    ) -> IOReturn:
        prepared = self._prepare(backend, io_kind, operation, params, sidecar, stats)
        if type(prepared) is IOResult:
            return prepared
        assert type(prepared) is PreparedRequest
        if write:
            self._cache.invalidate(backend_name, prepared.domain)
        flight = _Flight(self, None, backend_name, prepared, stats, write=write)
        flight.start(backend, prepared)
        return flight.answer

    @staticmethod
    def _prepare(
        backend: IOBackend,
        io_kind: str,
        operation: str,
        params: Any,
        sidecar: bytes | None,
        stats: OperationStats,
    ) -> PreparedRequest | IOResult:
        try:
            prepared = backend.prepare(io_kind, operation, params, sidecar)
        except IORequestError as exc:
            stats.record_rejected()
            return io_error(exc.message, retryable=exc.retryable)
        except Exception as backend_bug:  # own name: mypyc types a name once
            _log.exception("IO backend %s raised preparing %s", backend.name, operation)
            stats.record_rejected()
            return io_error(
                f"{backend.name} {operation}: internal error in the backend: {backend_bug!r}"
            )
        if type(prepared) is not PreparedRequest:
            stats.record_rejected()
            return io_error(f"{backend.name} {operation}: the backend prepared no request")
        return prepared

    def _flight_done(self, flight: _Flight, reply: Reply) -> None:
        key = flight.key
        if key is not None and self._flights.get(key) is flight:
            del self._flights[key]
        if flight.write:
            # The write is over: reads that overlapped it are not cached, later ones miss.
            self._cache.invalidate(flight.backend, flight.domain)
            return
        if key is None or not flight.cacheable or reply.error is not None or self._closed:
            return
        nbytes = reply.nbytes or estimate_size(reply.result, reply.sidecar)
        hit = IOResult(
            result=reply.result,
            sidecar=reply.sidecar,
            budget_used_ms=0,
            immutable=flight.immutable and reply.sidecar is None and reply.result is not None,
        )
        self._cache.put(key, hit, flight.backend, flight.domain, flight.generation, nbytes)

"""Immutable reads answered inside the executor: a small read cache per task.

Theory of operation
-------------------
Every IO wait normally crosses the socket twice: ``CallWaiting`` out, the
worker's answer back as ``ResumeCall``. For most reads that is necessary -- a
table row may be written by any call of the task, on any executor -- but some
answers never change: a ``ChainState`` read at a block number or a block hash
(not at a tag such as ``latest``). The worker knows which reads those are (its
``rpc`` backend decides; a table read never is one) and says so in the answer:
``ResumeCall.payload.immutable`` (docs/protocol.md). The executor keeps such an
answer here, and the next identical read of the same task is answered at
once: no frame, no suspension, no round trip.

* **Keyed like the worker's cache**: ``backend``, ``operation`` and the
  request's ``cacheKey`` (the SDK computes it from the request: for
  ``ChainState`` the chain and the params, canonical JSON). A read without a
  ``cacheKey``, a write and a capability call are never looked up.
* **Only what the worker marked**: an answer without ``immutable``, an error,
  an answer with a sidecar or a value JSON cannot hold exactly (an integer
  beyond 64 bits) is never stored.
* **Per task, dropped with the task's namespaces**: a :class:`TaskReads`
  lives with the task's module namespaces in the
  :class:`~blockx.executor.module_registry.ModuleRegistry`, so it goes when
  they go (the task's last call ended and its namespaces left the
  released-namespace LRU). One task never sees another's answers.
* **Bounded**: at most ``max_entries`` answers and ``max_bytes`` bytes
  (estimated: the stored form's length plus a fixed overhead) per task,
  first in, first out; an answer larger than a quarter of ``max_bytes`` is
  not kept. Until the task's first hit at most :data:`FIRST_ENTRIES` (1,024):
  a task of distinct reads never hits, and its answers kept alive only made
  every new read's objects land in memory the CPU's caches no longer held
  (the worker's read cache does the same, ``blockx/worker/io/cache.py``). A
  dict and a deque of the entries, oldest first (an ``OrderedDict`` is reached
  only by generic method calls from compiled code); a replaced entry is marked
  dead and skipped. ``BLOCKX_EXECUTOR_LOCAL_READ_CACHE`` sets ``max_entries``
  (default 4096; 0 turns the cache off), ``BLOCKX_EXECUTOR_LOCAL_READ_CACHE_BYTES``
  ``max_bytes`` (default 8 MiB).
* **Writes**: a write by one of the task's calls to a backend drops the
  task's entries of that backend. An immutable answer cannot change, so this
  only guards against a backend that marks more than it should; it costs
  nothing while the task writes nothing.
* **Fresh values**: a string, number, boolean or null is kept as is
  (immutable in Python); an object or array is kept as its JSON bytes and
  decoded afresh for every hit, so a caller that changes its answer never
  changes the next caller's.

Hits are counted per call (``ExecContext.local_hits``) and reported in the
call's ``CallCompleted`` / ``CallFailed`` as ``localReadHits``; the worker adds
them to the task's IO statistics (``local_hits``, apart from its own
``cache_hits``). Only the scheduler thread touches a :class:`TaskReads`.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

import orjson

__all__ = [
    "DEFAULT_LOCAL_READ_CACHE",
    "DEFAULT_LOCAL_READ_CACHE_BYTES",
    "ENTRY_OVERHEAD",
    "FIRST_ENTRIES",
    "LOCAL_READ_CACHE_BYTES_ENV",
    "LOCAL_READ_CACHE_ENV",
    "MISS",
    "TaskReads",
    "read_key",
]

LOCAL_READ_CACHE_ENV: Final = "BLOCKX_EXECUTOR_LOCAL_READ_CACHE"
LOCAL_READ_CACHE_BYTES_ENV: Final = "BLOCKX_EXECUTOR_LOCAL_READ_CACHE_BYTES"
DEFAULT_LOCAL_READ_CACHE: Final = 4096
DEFAULT_LOCAL_READ_CACHE_BYTES: Final = 8 << 20
#: Bytes charged per entry on top of its key and value (dict slot, objects).
ENTRY_OVERHEAD: Final = 96
#: The answers a task keeps until its first hit (then up to ``max_entries``).
FIRST_ENTRIES: Final = 1024


class _Miss:
    """The answer :meth:`TaskReads.get` gives for a read it does not hold."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"


#: Not in the cache (``None`` is a valid answer: JSON null).
MISS: Final = _Miss()


def read_key(backend: str, operation: str, cache_key: str) -> str:
    """The key of a read: its backend, operation and cacheKey (``\\x00`` never occurs
    in a backend or operation name the worker accepts)."""
    return f"{backend}\x00{operation}\x00{cache_key}"


class _Entry:
    """A kept answer: ``value`` itself, or its JSON bytes when ``encoded``."""

    __slots__ = ("alive", "encoded", "key", "size", "value")

    def __init__(self, key: str, value: Any, encoded: bool, size: int) -> None:
        self.key = key
        self.value = value
        self.encoded = encoded
        self.size = size
        #: False once replaced or dropped: eviction skips it.
        self.alive = True


class TaskReads:
    """One task's immutable answers (see the module docstring)."""

    __slots__ = ("_bound", "_entries", "_order", "evictions", "max_bytes", "max_entries", "nbytes")

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries <= 0 or max_bytes <= 0:
            raise ValueError("a TaskReads needs max_entries and max_bytes > 0")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: dict[str, _Entry] = {}
        #: The live entries oldest first, and dead ones (replaced or dropped).
        self._order: deque[_Entry] = deque()
        #: The answers kept now: :data:`FIRST_ENTRIES` until the first hit.
        self._bound = min(max_entries, FIRST_ENTRIES)
        self.nbytes = 0
        self.evictions = 0

    def __repr__(self) -> str:
        return (
            f"TaskReads({len(self._entries)}/{self.max_entries} entries, "
            f"{self.nbytes}/{self.max_bytes} bytes)"
        )

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Any:
        """The answer kept under ``key`` (a fresh copy of an object or array), or :data:`MISS`."""
        entry = self._entries.get(key)
        if entry is None:
            return MISS
        self._bound = self.max_entries
        if entry.encoded:
            return orjson.loads(entry.value)
        return entry.value

    def put(self, key: str, value: Any) -> bool:
        """Keep ``value`` (an answer the worker marked immutable) under ``key``; False
        when it cannot be kept (too large, or not exact as JSON)."""
        kind = type(value)
        if value is None or kind is bool or kind is float:
            stored: Any = value
            encoded = False
            size = ENTRY_OVERHEAD + len(key)
        elif kind is str:
            stored = value
            encoded = False
            size = ENTRY_OVERHEAD + len(key) + len(value)
        elif kind is int:
            if not -(2**63) <= value < 2**64:
                return False
            stored = value
            encoded = False
            size = ENTRY_OVERHEAD + len(key)
        else:
            try:
                stored = orjson.dumps(value)
            except TypeError:  # bytes (a sidecar), an integer beyond 64 bits, ...
                return False
            encoded = True
            size = ENTRY_OVERHEAD + len(key) + len(stored)
        if size > self.max_bytes // 4:
            return False
        entries = self._entries
        old = entries.get(key)
        if old is not None:
            self._drop(old)
        order = self._order
        bound = self._bound
        while entries and (len(entries) >= bound or self.nbytes + size > self.max_bytes):
            oldest = order.popleft()
            if oldest.alive:
                self._drop(oldest)
                self.evictions += 1
        entry = _Entry(key, stored, encoded, size)
        entries[key] = entry
        order.append(entry)
        self.nbytes += size
        if len(order) > 2 * len(entries) + 64:
            self._order = deque([e for e in order if e.alive])
        return True

    def _drop(self, entry: _Entry) -> None:
        entry.alive = False
        del self._entries[entry.key]
        self.nbytes -= entry.size

    def drop_backend(self, backend: str) -> int:
        """Forget every answer of ``backend`` (a write to it); how many were dropped."""
        entries = self._entries
        if not entries:
            return 0
        prefix = backend + "\x00"
        doomed = [entry for key, entry in entries.items() if key.startswith(prefix)]
        for entry in doomed:
            self._drop(entry)
        return len(doomed)

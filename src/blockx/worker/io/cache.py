"""The per-task read cache: answers by request bytes, bounded, invalidated by the task's writes.

Theory of operation
-------------------
One :class:`ReadCache` per task scope. An entry maps the *request bytes* of a
read (see :func:`request_key`) to the :class:`~blockx.worker.io.IOResult` that
answered it, and remembers the entry's *domain*: ``(backend, domain)`` where
the domain is what the backend named in its prepared request (the table of a
``blockdb`` read, the chain of an ``rpc`` read).

Bounds: at most ``max_entries`` entries and ``max_bytes`` estimated bytes
(the answer's size plus the key's plus a fixed overhead) -- and at most
:data:`READ_CACHE_FIRST_ENTRIES` entries until the task shows it repeats a
read: a hit, or a read joining an equal one in flight (:meth:`ReadCache.grow`,
called by the scope). A cache that never answers still kept every answer, its
key and its entry alive for 10,000 reads: a whole ``blockx run`` of distinct
chain reads spent 10-31% more CPU per call with it than with no cache at all, in three rounds
(the objects of every new read were allocated in memory the CPU's caches no
longer held). What that gives up: a task whose only repeated reads lie more
than 1,024 reads apart reads them again. Eviction is CLOCK
(second chance), which approximates least-recently-used: a hit only sets the
entry's ``referenced`` bit (no reordering on the hot path); eviction walks
from the oldest entry, gives a referenced one a second chance (clears the bit,
moves it to the back) and drops the first unreferenced one. The order is a
deque of the entries beside the dict (an ``OrderedDict`` is no dict to compiled
code: each of its ``pop`` / ``popitem`` was a generic method call); an entry
replaced or dropped is marked dead and skipped when the hand reaches it, and
the deque is compacted when dead entries outnumber the live ones.
``max_entries == 0`` or ``max_bytes == 0`` disables caching (singleflight
still works: it lives in the scope). An answer larger than ``max_bytes`` alone
is never stored.

Invalidation by generations: every ``(backend, domain)`` has a generation
number, and every backend one more (the ``None`` domain). :meth:`invalidate`
bumps the domain's generation (``domain=None``: the backend's, which every
domain of the backend counts). An entry remembers the generation pair it was
stored under; a lookup that finds it older than the current pair drops it and
misses, so no entry stored before a write answers after it (and nothing walks
the entries of a domain at a write: a table written by every call cost a set
per domain, and one ``add`` and one ``discard`` per read). A read records the
generation it started under (:meth:`generation`); :meth:`put` stores its
answer only when the generation has not moved since, so an answer that may
predate a write is never cached after that write. The scope invalidates at a
write's start *and* at its end: reads that overlapped the write in any way are
not stored, and later reads go to the backend. Stale entries keep their room
until a lookup or the hand drops them.

Invariants: ``_bytes`` is the sum of the sizes of the entries of ``_entries``;
those are exactly the live entries, and each is in ``_order`` once. Only the
event loop thread touches a cache.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

import orjson

from .handler import IOResult

__all__ = [
    "READ_CACHE_FIRST_ENTRIES",
    "DomainKey",
    "ReadCache",
    "RequestKey",
    "canonical_params",
    "estimate_size",
    "request_head",
    "request_key",
]

#: ``(backend, domain)``; ``domain`` None only in generation lookups (the whole backend).
DomainKey = tuple[str, "str | None"]
#: A request key: a str, or ``(head, sidecar bytes)`` for a sidecar request.
RequestKey = "str | tuple[str, bytes]"

#: Bytes charged per entry on top of its key and answer (dict slot, objects).
ENTRY_OVERHEAD: Final = 160
#: The entries a task's cache keeps until the task repeats a read (a hit or a join).
READ_CACHE_FIRST_ENTRIES: Final = 1024

_SORTED: Final = orjson.OPT_SORT_KEYS
#: The generation pair of every (backend, domain) before the task's first write.
_NO_WRITES: Final = (0, 0)


def canonical_params(params: Any) -> bytes:
    """JSON bytes of ``params`` with sorted keys: equal params give equal bytes."""
    try:
        return orjson.dumps(params, option=_SORTED)
    except TypeError:
        # Integers beyond 64 bits (uint256 values): the stdlib encoder keeps them exact.
        import json

        return json.dumps(
            params, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        ).encode("utf-8")


def request_head(backend: str, operation: str) -> str:
    """``backend NUL operation NUL``: the start of every request key of that operation."""
    return f"{backend}\x00{operation}\x00"


def request_key(
    backend: str, operation: str, params: Any, cache_key: str | None, sidecar: bytes | None
) -> str | tuple[str, bytes]:
    """The request bytes a read is cached and de-duplicated by.

    ``backend NUL operation NUL`` followed by ``k`` + the executor's ``cacheKey``
    when it sent one, else ``p`` + the canonical JSON of ``params``; a request
    whose body is a sidecar is keyed by ``(head + "s", the raw sidecar bytes)``.
    The tag keeps the forms apart. (Kept as text rather than bytes: the
    ``cacheKey`` path then costs one string concatenation.)
    """
    head = request_head(backend, operation)
    if cache_key:
        return head + "k" + cache_key
    if sidecar is not None:
        return (head + "s", sidecar)
    return head + "p" + canonical_params(params).decode("utf-8")


def key_size(key: str | tuple[str, bytes]) -> int:
    if type(key) is tuple:
        return len(key[0]) + len(key[1])
    return len(key)


def estimate_size(result: Any, sidecar: bytes | None) -> int:
    """Bytes an answer takes, estimated by its JSON length (plus the sidecar)."""
    size = 0 if sidecar is None else len(sidecar)
    if result is None:
        return size + 4
    if type(result) is str:
        return size + len(result) + 2
    try:
        return size + len(orjson.dumps(result))
    except TypeError:
        return size + len(canonical_params(result))


class _Entry:
    __slots__ = ("alive", "answer", "domain", "generation", "key", "referenced", "size")

    def __init__(
        self,
        key: Any,
        answer: IOResult,
        domain: tuple[str, str | None],
        generation: tuple[int, int],
        size: int,
    ) -> None:
        self.key = key
        self.answer = answer
        self.domain = domain
        self.generation = generation
        self.size = size
        self.referenced = False
        #: False once replaced or dropped: the hand skips it.
        self.alive = True


class ReadCache:
    """CLOCK cache of read answers by request bytes, invalidated by generations (see the
    module doc)."""

    __slots__ = (
        "_bound",
        "_bytes",
        "_entries",
        "_generations",
        "_order",
        "evictions",
        "invalidations",
        "max_bytes",
        "max_entries",
    )

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("cache bounds must be non-negative")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        #: The entries kept now: the first bound until :meth:`grow`, then ``max_entries``.
        self._bound = min(max_entries, READ_CACHE_FIRST_ENTRIES)
        self._entries: dict[Any, _Entry] = {}
        #: The live entries oldest first (the CLOCK hand at the left), and dead ones.
        self._order: deque[_Entry] = deque()
        self._generations: dict[tuple[str, str | None], int] = {}
        self._bytes = 0
        self.evictions = 0
        self.invalidations = 0

    def __repr__(self) -> str:
        return (
            f"ReadCache(entries={len(self._entries)}/{self._bound} of {self.max_entries}, "
            f"bytes={self._bytes}/{self.max_bytes}, evictions={self.evictions})"
        )

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def grown(self) -> bool:
        """True once the task repeated a read: the cache keeps up to ``max_entries``."""
        return self._bound == self.max_entries

    def grow(self) -> None:
        """The task repeats reads: keep up to ``max_entries`` from now on."""
        self._bound = self.max_entries

    def get(self, key: Any) -> IOResult | None:
        """The cached answer of ``key`` (marked referenced), or None -- also for an entry
        stored before a write to its domain (dropped here)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._generations:
            backend, domain = entry.domain
            if entry.generation != self.generation(backend, domain):
                self._drop(entry)
                return None
        entry.referenced = True
        self._bound = self.max_entries
        return entry.answer

    def generation(self, backend: str, domain: str | None) -> tuple[int, int]:
        """The (backend, domain) generation pair a read starting now records."""
        generations = self._generations
        if not generations:  # no write yet in this task: the common case of a read
            return _NO_WRITES
        return (generations.get((backend, None), 0), generations.get((backend, domain), 0))

    def put(
        self,
        key: Any,
        answer: IOResult,
        backend: str,
        domain: str | None,
        generation: tuple[int, int],
        nbytes: int,
    ) -> bool:
        """Store ``answer`` unless a write moved the generation since the read started.

        Returns whether it was stored.
        """
        if not self.enabled or self.generation(backend, domain) != generation:
            return False
        size = nbytes + key_size(key) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return False
        entries = self._entries
        old = entries.get(key)
        if old is not None:
            self._drop(old)
        entry = _Entry(key, answer, (backend, domain), generation, size)
        entries[key] = entry
        order = self._order
        order.append(entry)
        self._bytes += size
        bound = self._bound
        while len(entries) > bound or self._bytes > self.max_bytes:
            oldest = order.popleft()
            if not oldest.alive:
                continue
            if oldest.referenced and oldest is not entry:
                oldest.referenced = False  # second chance: to the back
                order.append(oldest)
                continue
            self._drop(oldest)
            self.evictions += 1
        if len(order) > 2 * len(entries) + 64:
            self._order = deque([e for e in order if e.alive])
        return True

    def invalidate(self, backend: str, domain: str | None) -> None:
        """Bump the generation of (backend, domain) -- of the whole ``backend`` when
        ``domain`` is None: every entry stored before is stale from now on."""
        generations = self._generations
        domain_key = (backend, domain)
        generations[domain_key] = generations.get(domain_key, 0) + 1
        self.invalidations += 1

    def clear(self) -> None:
        self._entries.clear()
        self._order.clear()
        self._bytes = 0

    def _drop(self, entry: _Entry) -> None:
        entry.alive = False
        del self._entries[entry.key]
        self._bytes -= entry.size

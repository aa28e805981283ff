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
chain reads spent 10-25% more CPU per call with it than with no cache at all
(the objects of every new read were allocated in memory the CPU's caches no
longer held). What that gives up: a task whose only repeated reads lie more
than 1,024 reads apart reads them again. Eviction is CLOCK
(second chance), which approximates least-recently-used: a hit only sets the
entry's ``referenced`` bit (no reordering on the hot path); eviction walks
from the oldest entry, gives a referenced one a second chance (clears the bit,
moves it to the back) and drops the first unreferenced one.
``max_entries == 0`` or ``max_bytes == 0`` disables caching (singleflight
still works: it lives in the scope). An answer larger than ``max_bytes`` alone
is never stored.

Invalidation by generations: every ``(backend, domain)`` has a generation
number, and every backend one more (the ``None`` domain). :meth:`invalidate`
drops the domain's entries and bumps its generation (``domain=None``: every
entry of the backend, and the backend's generation). A read records the
generation it started under (:meth:`generation`); :meth:`put` stores its
answer only when the generation has not moved since, so an answer that may
predate a write is never cached after that write. The scope invalidates at a
write's start *and* at its end: reads that overlapped the write in any way are
not stored, and later reads go to the backend.

Invariants: ``_bytes`` is the sum of the entries' sizes; every key of
``_entries`` is in ``_by_domain[entry.domain]`` and vice versa. Only the event
loop thread touches a cache.
"""

from __future__ import annotations

from collections import OrderedDict
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
    __slots__ = ("answer", "domain", "referenced", "size")

    def __init__(self, answer: IOResult, domain: tuple[str, str | None], size: int) -> None:
        self.answer = answer
        self.domain = domain
        self.size = size
        self.referenced = False


class ReadCache:
    """LRU of read answers by request bytes, with domain invalidation (see the module doc)."""

    __slots__ = (
        "_bound",
        "_by_domain",
        "_bytes",
        "_entries",
        "_generations",
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
        # OrderedDict: evicting from the front is O(1) (a plain dict walks its deleted slots)
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        self._by_domain: dict[tuple[str, str | None], set[Any]] = {}
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
        """The cached answer of ``key`` (marked referenced), or None."""
        entry = self._entries.get(key)
        if entry is None:
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
        old = self._entries.pop(key, None)
        if old is not None:
            self._forget(key, old)
        domain_key = (backend, domain)
        self._entries[key] = _Entry(answer, domain_key, size)
        self._by_domain.setdefault(domain_key, set()).add(key)
        self._bytes += size
        entries = self._entries
        bound = self._bound
        while len(entries) > bound or self._bytes > self.max_bytes:
            oldest, entry = entries.popitem(last=False)
            if entry.referenced and oldest != key:
                entry.referenced = False  # second chance: to the back
                entries[oldest] = entry
                continue
            self._forget(oldest, entry)
            self.evictions += 1
        return True

    def invalidate(self, backend: str, domain: str | None) -> int:
        """Drop the entries of (backend, domain) — every entry of ``backend`` when
        ``domain`` is None — and bump the generation. Returns how many were dropped."""
        generations = self._generations
        domain_key = (backend, domain)
        generations[domain_key] = generations.get(domain_key, 0) + 1
        self.invalidations += 1
        if domain is None:
            doomed = [k for k in self._by_domain if k[0] == backend]
        else:
            doomed = [domain_key] if domain_key in self._by_domain else []
        dropped = 0
        entries = self._entries
        for k in doomed:
            for key in self._by_domain.pop(k, ()):
                entry = entries.pop(key, None)
                if entry is not None:
                    self._bytes -= entry.size
                    dropped += 1
        return dropped

    def clear(self) -> None:
        self._entries.clear()
        self._by_domain.clear()
        self._bytes = 0

    def _forget(self, key: Any, entry: _Entry) -> None:
        self._bytes -= entry.size
        keys = self._by_domain.get(entry.domain)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_domain[entry.domain]

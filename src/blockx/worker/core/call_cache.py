"""A task's call cache: successful outputs by call key, bounded, the oldest dropped first.

Theory of operation
-------------------
One :class:`CallCache` per task (``TaskDispatchState.call_cache``), written and read
only by the dispatcher core: ``lifecycle.finish_call`` puts a succeeded call's output,
``release.dispatch_decisions`` and ``lifecycle.start_subcall`` answer an equal call
(or sub-call) from it, and ``lifecycle.add_waiter`` grows it when a call joins an
equal one in flight. The bound (``call_cache_max_entries``) is the core's, passed to
:meth:`CallCache.put`.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["CALL_CACHE_FIRST_ENTRIES", "CallCache"]

#: What a task's call cache keeps until the task shows a repeated call (a cache hit or
#: a call joining another in flight): then up to ``call_cache_max_entries``.
CALL_CACHE_FIRST_ENTRIES: Final = 4096


class CallCache:
    """A task's successful outputs by call key, the oldest dropped first: at most
    :data:`CALL_CACHE_FIRST_ENTRIES` until the task repeats a call, then at most the
    ``limit`` :meth:`put` is given (``call_cache_max_entries``).

    Why the first bound: a cache that never answers costs more than its lookups.
    Each output it keeps keeps its key (a 64-character digest) and its bytes alive,
    so a task of distinct calls held 65,536 of each, ~13 MB, and every call's new
    objects were allocated in memory the CPU's caches no longer held: in a whole
    ``blockx run`` of 200,000 distinct trivial calls the engine spent 18.5 µs of
    CPU per call with a 65,536-entry cache against 15.1 µs with 4,096 and 16.2 µs
    with none (medians of 5 interleaved runs, all processes counted). A task that
    repeats calls shows it early -- a hit within the last 4,096 outputs, or a call
    joining an equal one in flight (:meth:`grow`) -- and from then on keeps up to
    ``limit``. What that gives up: a task whose only repeats lie more than 4,096
    calls apart recomputes them.

    A plain dict for the lookups and a deque of the keys in insertion order for the
    eviction (an ``OrderedDict`` did an ``in``, an insert with its linked node and a
    ``popitem`` per end; here an end is one ``setdefault`` and, when full, a
    ``popleft`` and one ``del``).
    """

    __slots__ = ("_bound", "_entries", "_order")

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}
        self._order: deque[str] = deque()
        self._bound = CALL_CACHE_FIRST_ENTRIES

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    @property
    def grown(self) -> bool:
        """True once the task repeated a call: the cache keeps up to its full limit."""
        return self._bound < 0

    def get(self, key: str) -> bytes | None:
        """The output kept under ``key``, or None; a hit grows the cache (:meth:`grow`)."""
        output = self._entries.get(key)
        if output is not None:
            self._bound = -1
        return output

    def grow(self) -> None:
        """The task repeats calls: keep up to the full limit from now on."""
        self._bound = -1

    def put(self, key: str, output: bytes, limit: int) -> None:
        """Keep ``output`` under ``key`` unless the key is kept already (the first
        output stays); past the bound (``limit``, or the first bound while smaller and
        the cache has not grown) the oldest is dropped."""
        entries = self._entries
        size = len(entries)
        entries.setdefault(key, output)
        if len(entries) != size:
            order = self._order
            order.append(key)
            bound = self._bound
            if bound < 0 or bound > limit:
                bound = limit
            while len(order) > bound:
                del entries[order.popleft()]

    def __repr__(self) -> str:
        size = "grown" if self._bound < 0 else f"first {self._bound:,}"
        return f"<CallCache {len(self._entries)} entries, {size}>"

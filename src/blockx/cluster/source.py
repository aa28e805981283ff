"""An async call source for the cluster driver, read ahead so the driver never waits on it.

Theory of operation
-------------------
``blockx serve --ray`` hands the driver (:mod:`blockx.cluster.driver`) its calls as an
async iterable fed from the service's store -- a streamed task's calls as clients post
them, with ``FLUSH`` markers when the store has nothing more for now. The driver's
loop must keep answering nodes while that source waits, so :class:`AsyncSource` reads
it from a task of its own into a bounded queue (:attr:`AsyncSource.limit` items: the
source is not read further while the queue is full), and the driver takes what
arrived without waiting (:meth:`AsyncSource.take`), waiting on :attr:`AsyncSource.ready`
together with the nodes' replies when it has nothing to place.

The driver places calls one at a time: a :class:`~blockx.worker.api.CallBatch` item of
either kind of source is read as its ``(function_id, args)`` pairs, in order
(:func:`each_call` for an iterable; :meth:`AsyncSource._pump` for an async one).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Final

from blockx.worker.api import CallBatch

__all__ = ["EMPTY", "AsyncSource", "each_call"]


class AsyncSource:
    """An async call source (``blockx serve``'s, fed from its store) read ahead into a
    bounded queue by a task of its own, so that the driver never waits on it while
    nodes answer: :meth:`take` gives what arrived, ``FLUSH`` markers included."""

    def __init__(self, source: Any, limit: int) -> None:
        self.items: deque[Any] = deque()
        self.limit = limit
        self.ended = False
        self.error: BaseException | None = None
        #: Set when items arrived or the source ended; cleared by the reader.
        self.ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.pump = asyncio.get_running_loop().create_task(self._pump(source))

    def __repr__(self) -> str:
        return f"_AsyncSource(queued={len(self.items)}, ended={self.ended})"

    async def _pump(self, source: Any) -> None:
        try:
            async for item in source:
                if type(item) is CallBatch:
                    self.items.extend(item.pairs)
                else:
                    self.items.append(item)
                self.ready.set()
                if len(self.items) >= self.limit:
                    self._room.clear()
                    await self._room.wait()
        except Exception as exc:
            self.error = exc
        finally:
            self.ended = True
            self.ready.set()

    def take(self) -> Any:
        """The next item, or :data:`EMPTY` (nothing now; :attr:`ready` is cleared)."""
        if self.items:
            item = self.items.popleft()
            if len(self.items) < self.limit:
                self._room.set()
            return item
        if not self.ended:
            self.ready.clear()
        return EMPTY

    def close(self) -> None:
        self.pump.cancel()


#: What :meth:`AsyncSource.take` gives when nothing arrived (yet).
EMPTY: Final = object()


def each_call(calls: Iterable[Any]) -> Iterator[Any]:
    """The items of ``calls``, each :class:`~blockx.worker.api.CallBatch` replaced by its
    ``(function_id, args)`` pairs."""
    for item in calls:
        if type(item) is CallBatch:
            yield from item.pairs
        else:
            yield item

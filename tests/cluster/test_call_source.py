"""blockx.cluster.source, without Ray: the driver places calls one at a time, so a
``CallBatch`` item (``blockx run``'s calls file, ``blockx serve``'s stored chunks) is read
as its pairs, in order, from an iterable and from an async source alike."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from blockx.cluster.source import EMPTY, AsyncSource, each_call
from blockx.worker.api import FLUSH, Call, CallBatch


def _items() -> list[Any]:
    return [
        Call("f", 0),
        CallBatch([("f", 1), ("g", 2)]),
        FLUSH,
        ("f", 3),
        CallBatch([]),
        CallBatch([("g", 4)]),
    ]


EXPECTED = [Call("f", 0), ("f", 1), ("g", 2), FLUSH, ("f", 3), ("g", 4)]


def test_each_call_reads_a_call_batch_as_its_pairs() -> None:
    assert list(each_call(_items())) == EXPECTED


def test_an_async_source_queues_a_call_batchs_pairs() -> None:
    async def source() -> AsyncIterator[Any]:
        for item in _items():
            await asyncio.sleep(0)
            yield item

    async def scenario() -> list[Any]:
        reader = AsyncSource(source(), limit=100)
        taken: list[Any] = []
        while True:
            item = reader.take()
            if item is EMPTY:
                if reader.ended and not reader.items:
                    return taken
                await reader.ready.wait()
                continue
            taken.append(item)

    assert asyncio.run(scenario()) == EXPECTED

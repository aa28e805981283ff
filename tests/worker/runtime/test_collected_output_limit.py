"""``dispatcher.max_collected_output_bytes`` limits outputs kept for the whole task only.

A one-shot task (its outputs held to convergence) and a stream run with ``run_task``
(``collect=True``: every row kept for the result) stop with ``OUTPUT_BYTES_EXCEEDED``
once their outputs pass the limit. A stream whose rows are handed out batch by batch
(``submit(collect=False)`` and ``settled_batches()``/``rows()``: ``blockx run`` with a
calls file, ``blockx serve``, the cluster's node workers) keeps no outputs, so the limit
does not apply: it gets every output however many bytes they add up to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.app import Worker
from blockx.worker.config import WorkerConfig, load_config

pytestmark = [pytest.mark.timeout(180)]

ECHO = "def echo(p):\n    return {'i': p['i'], 'pad': 'x' * 100}\n"
CALLS = 300
LIMIT = 1_000  # bytes: ~9 outputs' worth


def _config() -> WorkerConfig:
    return load_config(env={}).replace(
        **{"pool.executor_count": 1, "dispatcher.max_collected_output_bytes": LIMIT}
    )


async def _stream() -> AsyncIterator[Call]:
    for i in range(CALLS):
        yield Call("echo", {"i": i})


def _task(calls: object) -> Task:
    return Task(functions={"echo": ECHO}, calls=calls, policy=TaskPolicy(failure="continue"))


def test_a_stream_handed_out_batch_by_batch_gets_every_output() -> None:
    async def scenario() -> None:
        async with Worker(_config()) as worker:
            await worker.wait_ready(timeout=60)
            handle = worker.submit(_task(_stream()), collect=False)
            rows = [row async for row in handle.rows()]
            result = await handle.result()
            assert result.success, result.failure
            assert rows == [{"i": i, "pad": "x" * 100} for i in range(CALLS)]
            assert result.stats.succeeded == CALLS

    asyncio.run(scenario())


def test_collected_tasks_still_stop_at_the_limit() -> None:
    async def scenario() -> None:
        async with Worker(_config()) as worker:
            await worker.wait_ready(timeout=60)
            one_shot = await worker.run_task(_task([Call("echo", {"i": i}) for i in range(CALLS)]))
            stream = await worker.run_task(_task(_stream()))
            for result in (one_shot, stream):
                assert not result.success
                assert result.failure is not None
                assert result.failure.kind == "OUTPUT_BYTES_EXCEEDED", result.failure
                assert result.outputs == []

    asyncio.run(scenario())

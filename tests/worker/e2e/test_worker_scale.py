"""End to end at scale: 10,000 calls, every output exactly once (one-shot and streamed)."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest
from e2e_support import WorkerSession, e2e_config

from blockx.worker.api import Call, Task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

IDENTITY = "def _(p):\n    return {'i': p['i']}\n"
N = 10_000


def test_ten_thousand_calls_every_output_exactly_once() -> None:
    config = e2e_config(**{"stream_build.batch_max_rows": 1000})
    with WorkerSession(config) as session:

        async def scenario() -> None:
            worker = session.worker
            one_shot = await worker.run_task(
                Task(
                    functions={"identity": IDENTITY},
                    calls=[Call("identity", {"i": i}) for i in range(N)],
                )
            )
            assert one_shot.success and one_shot.errors == []
            assert one_shot.outputs == [{"i": i} for i in range(N)]
            assert one_shot.stats.succeeded == N and one_shot.stats.retries == 0

            def calls() -> Iterator[Call]:
                for i in range(N):
                    yield Call("identity", {"i": i})

            handle = worker.submit(
                Task(functions={"identity": IDENTITY}, calls=calls()), collect=False
            )
            seen = collections.Counter()
            async for row in handle.rows():
                seen[row["i"]] += 1
            streamed = await handle.result()
            assert streamed.success and streamed.stats.succeeded == N
            assert len(seen) == N and set(seen.values()) == {1}
            assert worker.orchestrator.live_task_ids == []
            assert worker.orchestrator.core.task_ids() == []

        session.run(scenario(), timeout=120)

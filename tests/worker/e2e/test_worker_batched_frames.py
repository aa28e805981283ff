"""End to end with batched frames on (docs/protocol.md "Batched frames"): real executor
processes announce ``features: ["batch"]``, the worker acks it and batches its writes,
and a task's rows all arrive, each exactly once, in call order."""

from __future__ import annotations

import pytest
from e2e_support import WorkerSession, e2e_config, eventually

from blockx.worker.api import Call, Task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROWS = """
def _(p):
    i = p["i"]
    if i % 3 == 0:
        return [{"i": i, "k": 0}, {"i": i, "k": 1}]
    if i % 3 == 1:
        return None
    return {"i": i, "k": 0}
"""

CALLS = 600


def _expected() -> list[dict[str, int]]:
    rows: list[dict[str, int]] = []
    for i in range(CALLS):
        if i % 3 == 0:
            rows += [{"i": i, "k": 0}, {"i": i, "k": 1}]
        elif i % 3 == 2:
            rows.append({"i": i, "k": 0})
    return rows


def test_a_tasks_rows_arrive_exactly_once_with_batching_on() -> None:
    with WorkerSession(e2e_config()) as session:

        async def scenario() -> None:
            adapter = session.worker.adapter
            # Every executor's attaching Heartbeat announced the feature.
            await eventually(
                lambda: (
                    len(adapter._connections) == 2
                    and all(conn.batching for conn in adapter._connections)
                ),
                timeout=30,
            )
            for round_ in range(2):
                task = Task(
                    task_id=f"batched-{round_}",
                    functions={"rows": ROWS},
                    calls=[Call("rows", {"i": i}) for i in range(CALLS)],
                )
                result = await session.worker.run_task(task)
                assert result.success, result.failure
                assert result.outputs == _expected()
                assert result.stats.succeeded == CALLS
            # The worker's writes did go out as batched frames.
            assert sum(conn.batches_sent for conn in adapter._connections) > 0

        session.run(scenario(), timeout=90)

"""A node worker queues a driver task's batches in the driver's order (``seq``), whatever
order they come in: Ray runs an async actor's method calls out of order, and a stream
has two batches committed and unsettled at most -- two later batches of long-waiting
calls queued first held the earlier batch back until they ended (the Ray metrics
test's gate waited for that batch's calls: it hung).

No Ray needed: the actor's class (:class:`~blockx.cluster.node.NodeWorker`) runs on this
test's loop with a real worker and real executor processes.
"""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import orjson
import pytest

from blockx.cluster.node import NodeTaskSpec, NodeWorker
from blockx.worker.api import TaskPolicy
from blockx.worker.config import load_config
from blockx.worker.io.config import IOConfig

pytestmark = pytest.mark.timeout(120)


def _spec(gate: Path) -> NodeTaskSpec:
    source = (
        "import os, time\n"
        "def g(i):\n"
        "    if i >= 100:\n"
        f"        while not os.path.exists({str(gate)!r}):\n"
        "            time.sleep(0.05)\n"
        "    return {'i': i}\n"
    )
    return NodeTaskSpec(
        key="ordered@1",
        task_id="ordered",
        functions={"g": source},
        instance=None,
        policy=TaskPolicy(call_budget_ms=600_000),
        audit=False,
    )


def _calls(indices: range) -> list[tuple[str, Any]]:
    return [("g", i) for i in indices]


async def _node() -> NodeWorker:
    node = NodeWorker("a" * 56, load_config(overrides={"pool.executor_count": 2}), IOConfig())
    await node.start()
    return node


def test_batches_join_the_stream_in_the_drivers_order_not_as_they_come(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    spec = _spec(gate)

    async def scenario() -> None:
        node = await _node()
        try:
            # The driver's batches 0 (quick calls), 1 and 2 (calls that wait at the gate)
            # come in as 2, 1, 0 -- and batch 2's calls as the driver's pickle.
            late = [
                asyncio.ensure_future(
                    node.run_batch(spec, 12, pickle.dumps(_calls(range(110, 120))), 2)
                ),
                asyncio.ensure_future(node.run_batch(spec, 11, _calls(range(100, 110)), 1)),
            ]
            await asyncio.sleep(0.2)  # both queued ahead of batch 0 before this change
            first = await asyncio.wait_for(node.run_batch(spec, 10, _calls(range(100)), 0), 60)
            assert first.batch_id == 10 and first.succeeded == 100
            assert [orjson.loads(o or b"null")["i"] for o in first.outputs] == list(range(100))
            assert not any(f.done() for f in late)  # still at the gate
            gate.touch()
            replies = await asyncio.wait_for(asyncio.gather(*late), 60)
            assert [r.batch_id for r in replies] == [12, 11]
            for reply, indices in zip(replies, (range(110, 120), range(100, 110)), strict=True):
                assert [orjson.loads(o or b"null")["i"] for o in reply.outputs] == list(indices)
            done = await node.finish(spec.key)
            assert done is not None and done["stats"]["succeeded"] == 120
        finally:
            gate.touch()
            await node.close()

    asyncio.run(scenario())


def test_an_unreadable_batch_does_not_hold_the_next_and_a_late_one_is_answered(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    spec = _spec(gate)

    async def scenario() -> None:
        node = await _node()
        try:
            later = asyncio.ensure_future(node.run_batch(spec, 2, _calls(range(5)), 1))
            await asyncio.sleep(0.1)
            with pytest.raises(pickle.UnpicklingError):
                await node.run_batch(spec, 1, b"not a pickle", 0)
            reply = await asyncio.wait_for(later, 60)
            assert reply.succeeded == 5
            twice = node.run_batch(spec, 3, _calls(range(5)), 1)
            with pytest.raises(ValueError, match="came twice"):
                await asyncio.wait_for(twice, 10)
            # Once the stream ended (cancelled), a batch is answered at once: cancelled.
            await node.cancel(spec.key, "the driver stopped")
            await asyncio.wait_for(node.tasks[spec.key].consumer, 30)
            after = await asyncio.wait_for(node.run_batch(spec, 4, _calls(range(3)), 2), 10)
            assert (after.succeeded, after.cancelled, after.outputs) == (0, 3, [None] * 3)
        finally:
            await node.close()

    asyncio.run(scenario())

"""No configuration makes the worker's own outbox fail calls: it back-pressures instead.

``executor_max_inflight=0`` (unlimited) binds every call of a big task to the executors at
once; their ExecuteCall frames back up behind a socket the executor reads at its own pace.
They wait in the outbox until it drains -- none fails ``outbox_full`` (which 1,232 of 2,000
such calls did when the outbox refused frames past 256).
"""

from __future__ import annotations

import asyncio

import pytest

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.app import Worker
from blockx.worker.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SLEEPER = "import time\n\ndef _(p):\n    time.sleep(p['s'])\n    return {'i': p['i']}\n"


def test_unlimited_inflight_with_2000_calls_and_one_attempt_fails_none() -> None:
    config = load_config(env={}).replace(
        **{
            "pool.executor_count": 2,
            "pool.heartbeat_interval_s": 0.2,
            "dispatcher.executor_max_inflight": 0,
            "dispatcher.default_max_attempts": 1,
            "dispatcher.call_deadline_ms": 60_000,
            "dispatcher.task_max_inflight_calls": 2000,
        }
    )

    async def scenario() -> None:
        async with Worker(config) as worker:
            await worker.wait_ready(timeout=60)
            calls = [Call("sleeper", {"i": i, "s": 0.05, "pad": "x" * 4000}) for i in range(2000)]
            task = Task(
                functions={"sleeper": SLEEPER},
                calls=calls,
                policy=TaskPolicy(max_attempts=1, failure="continue"),
            )
            result = await worker.run_task(task)
            assert result.errors == [], result.errors[:3]
            assert result.outputs == [{"i": i} for i in range(2000)]
            assert worker.orchestrator.stats.send_failures == 0

    asyncio.run(scenario())

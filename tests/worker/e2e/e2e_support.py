"""Shared helpers of the worker end-to-end tests: a worker with real executor processes.

:class:`WorkerSession` runs a :class:`~blockx.worker.app.Worker` on its own
uvloop event loop (``asyncio.Runner``), so a test module can keep one worker
across several tests (start-up costs two interpreter boots) while each test
still runs its scenario with ``session.run(coro)``. Closing a session checks
what every test needs: every executor process the pool ever started is gone
(reaped, not orphaned) and the socket directory is removed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Coroutine
from typing import Any

from tests.helpers.processes import process_is_gone

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.app import Worker
from blockx.worker.config import WorkerConfig, load_config
from blockx.worker.pool.spawner import ExecutorLaunchSpec, ProcessSpawner

try:
    import uvloop

    _LOOP_FACTORY: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
except ImportError:  # pragma: no cover
    _LOOP_FACTORY = None

#: Small knobs: fast restarts, frequent heartbeats, short backoff.
E2E_KNOBS: dict[str, Any] = {
    "pool.executor_count": 2,
    "pool.heartbeat_interval_s": 0.2,
    "pool.restart_delay_ms": 50,
    "pool.stop_grace_ms": 3000,
    "dispatcher.base_backoff_ms": 5,
}


def e2e_config(**overrides: Any) -> WorkerConfig:
    """A config from defaults (the environment ignored) with :data:`E2E_KNOBS` and ``overrides``
    (dotted names: ``e2e_config(**{"pool.executor_count": 1})``)."""
    return load_config(env={}).replace(**{**E2E_KNOBS, **overrides})


class RecordingSpawner(ProcessSpawner):
    """The ``process`` spawner, remembering every pid it started (for the orphan check)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pids: list[int] = []

    def spawn(self, spec: ExecutorLaunchSpec) -> subprocess.Popen[bytes]:
        process = super().spawn(spec)
        self.pids.append(process.pid)
        return process


class WorkerSession:
    """A started worker on its own event loop; see the module docstring."""

    def __init__(self, config: WorkerConfig | None = None, **worker_kwargs: Any) -> None:
        self.config = config or e2e_config()
        self.spawner: RecordingSpawner = worker_kwargs.pop("spawner", None) or RecordingSpawner()
        self.runner = asyncio.Runner(loop_factory=_LOOP_FACTORY)
        self.worker = Worker(self.config, spawner=self.spawner, **worker_kwargs)
        self.socket_dir: str | None = None
        self._closed = False

    def start(self, wait_ready: bool = True) -> WorkerSession:
        async def start() -> None:
            await self.worker.start()
            self.socket_dir = self.worker.adapter.socket_dir
            if wait_ready:
                await self.worker.wait_ready(timeout=60)

        self.runner.run(start())
        return self

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        """Run one scenario on the worker's loop (with a timeout)."""
        return self.runner.run(asyncio.wait_for(coro, timeout))

    def close(self) -> None:
        """Stop the worker and check: no executor process left, socket directory removed."""
        if self._closed:
            return
        self._closed = True
        try:
            self.runner.run(self.worker.close())
        finally:
            self.runner.close()
        assert_no_orphans(self.spawner.pids)
        if self.socket_dir is not None:
            assert not os.path.exists(self.socket_dir), f"{self.socket_dir} was not removed"

    def __enter__(self) -> WorkerSession:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()


def assert_no_orphans(pids: list[int], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if not process_is_gone(pid)]
        if not alive:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"executor processes still running after the worker closed: {alive}"
            )
        time.sleep(0.05)


async def eventually(
    predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.01
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        await asyncio.sleep(step)


ADDER = "def _(p):\n    return {'y': p['x'] + 1}\n"
SLEEPER = "import time\n\ndef _(p):\n    time.sleep(p['s'])\n    return {'i': p['i']}\n"

# The executor's deadline alarm re-fires every 100 ms, and a signal handler runs at a
# loop's back edge: a single `while True: try/except BaseException` loop is ended by
# the executor within a few alarms (deadline_exceeded), because the back edge lies
# outside its `try`. A second loop around it keeps every back edge inside a `try`
# and really wedges the executor: only the worker's wedge backstop can end it.
WEDGE = """
def _(p):
    while True:
        try:
            while True:
                try:
                    pass
                except BaseException:
                    pass
        except BaseException:
            pass
"""

#: Knobs for the wedge scenario: a short budget and a stall timeout the test can wait out.
WEDGE_KNOBS: dict[str, Any] = {
    "dispatcher.call_deadline_ms": 300,
    "dispatcher.scheduler_stall_timeout_ms": 1500,
}


async def wedge_is_killed(worker: Any, sleepers: int) -> None:
    """Run one wedging call among ``sleepers`` short ones (``WEDGE_KNOBS`` config): the
    wedged executor is killed, the wedging call becomes a suspect and runs alone, wedges
    again and fails ``executor_wedged`` at once; every other call succeeds, unblamed
    (docs/security.md, "Blame")."""
    calls = [Call("wedge", {})] + [Call("sleeper", {"i": i, "s": 0.01}) for i in range(sleepers)]
    task = Task(
        functions={"wedge": WEDGE, "sleeper": SLEEPER},
        calls=calls,
        policy=TaskPolicy(failure="continue", max_attempts=2),
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await worker.run_task(task)
    elapsed = loop.time() - started
    [error] = result.errors
    assert error.index == 0 and error.kind == "executor_wedged"
    assert not error.retryable and error.attempts == 1
    assert "killed" in error.message
    assert result.outputs == [{"i": i} for i in range(sleepers)]
    assert result.stats.retries == 0
    assert worker.orchestrator.stats.wedged_calls == 2  # once among others, once alone
    assert worker.orchestrator.stats.executors_killed == 2
    assert 3.0 <= elapsed < 40

"""Executors started before their worker (``blockx/worker/pool/early.py``): a worker built
with them serves their socket and adopts their processes; what no worker took is killed,
reaped and its socket directory removed. Real executor processes, a real socket."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from e2e_support import ADDER, e2e_config
from tests.helpers.processes import process_is_gone

from blockx.worker.api import Call, Task
from blockx.worker.app import Worker
from blockx.worker.pool.early import EarlyExecutors

pytestmark = [pytest.mark.timeout(120)]

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None

LOOPS = {"asyncio": asyncio.new_event_loop}
if uvloop is not None:
    LOOPS["uvloop"] = uvloop.new_event_loop


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_worker_takes_the_early_executors_and_runs_its_tasks_on_them(loop: str) -> None:
    config = e2e_config()
    early = EarlyExecutors(config)
    pids = sorted(early.pids)
    assert len(pids) == config.pool.executor_count
    # The socket listens before any event loop runs: a connection waits in its backlog.
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.connect(early.socket_path)
    probe.close()

    async def scenario() -> None:
        async with Worker(config, early=early) as worker:
            assert early.taken and worker.pool is early.pool
            assert worker.socket_path == early.socket_path
            await worker.wait_ready(timeout=60)
            assert sorted(worker.pool.pids().values()) == pids  # no other process spawned
            calls = [Call("adder", {"x": i}) for i in range(50)]
            result = await worker.run_task(Task(functions={"adder": ADDER}, calls=calls))
            assert result.success and [r["y"] for r in result.outputs] == list(range(1, 51))

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(scenario())
    assert all(process_is_gone(pid) for pid in pids)
    assert not os.path.exists(early.socket_dir)


def test_early_executors_no_worker_took_are_killed_and_their_directory_removed() -> None:
    early = EarlyExecutors(e2e_config())
    pids = early.pids
    assert pids and not any(process_is_gone(pid) for pid in pids)
    early.discard()
    early.discard()  # idempotent
    assert all(process_is_gone(pid) for pid in pids)
    assert not os.path.exists(early.socket_dir)
    with pytest.raises(RuntimeError, match="taken or discarded"):
        early.take()


def test_a_worker_closed_before_it_started_discards_its_early_executors() -> None:
    config = e2e_config()
    early = EarlyExecutors(config)
    pids = early.pids

    async def scenario() -> None:
        worker = Worker(config, early=early)
        await worker.close()

    asyncio.run(scenario())
    assert pids and all(process_is_gone(pid) for pid in pids)
    assert not os.path.exists(early.socket_dir)


def test_a_worker_refuses_early_executors_started_for_another_configuration() -> None:
    early = EarlyExecutors(e2e_config(**{"pool.executor_count": 1}))
    pids = early.pids
    try:
        with pytest.raises(ValueError, match="another configuration"):
            Worker(e2e_config(**{"pool.executor_count": 2}), early=early)
    finally:
        early.discard()
    assert pids and all(process_is_gone(pid) for pid in pids)


def test_an_interrupt_between_two_early_spawns_leaves_no_executor_and_no_socket() -> None:
    from blockx.worker.pool.spawner import ProcessSpawner

    class InterruptedSecond(ProcessSpawner):
        def __init__(self) -> None:
            super().__init__()
            self.started: list[int] = []

        def begin(self, spec):  # type: ignore[no-untyped-def]
            if self.started:
                raise KeyboardInterrupt  # Ctrl-C while blockx run spawns its second executor
            process = self.spawn_cold(spec)
            self.started.append(process.pid)
            return lambda: process

    spawner = InterruptedSecond()
    before = set(os.listdir(e2e_config().adapter.socket_dir or "/tmp"))
    with pytest.raises(KeyboardInterrupt):
        EarlyExecutors(e2e_config(), spawner=spawner)
    assert len(spawner.started) == 1 and process_is_gone(spawner.started[0])
    after = set(os.listdir(e2e_config().adapter.socket_dir or "/tmp"))
    assert not {name for name in after - before if name.startswith("blockx-worker-")}

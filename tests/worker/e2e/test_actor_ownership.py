"""Only the dispatch actor mutates the DispatcherCore (seed: ``actor_invariants_test.go``).

The worker's core is wrapped in a proxy that checks, on every call of a core
entry point, that the orchestrator's actor is running at that moment on the
event loop's thread (``Orchestrator.in_actor``). The pure ``prepare_*``
methods are the documented exception: they may run anywhere. A mixed workload
— sub-calls, IO waits through a future-returning backend and a coroutine
backend, retries after an executor is killed, a streamed task and a
cancellation — must produce no violation.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from e2e_support import SLEEPER, WorkerSession, e2e_config, eventually
from tests.helpers.compiled import skip_if_compiled

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.app import Worker
from blockx.worker.core import DispatcherCore
from blockx.worker.io import IOResult

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    skip_if_compiled(
        "blockx.worker.actor.orchestrator",
        "it keeps a DispatcherCore and refuses the checking proxy",
    ),
]

PARENT = "def _(p):\n    return {'c': function.call('child', p)['v']}\n"
CHILD = "def _(p):\n    return {'v': p['x'] * 2}\n"
READER = "from blockx.sdk import db\n\ndef _(p):\n    return db.get('t', p['x'])\n"


class OwnershipCheckingCore:
    """Forwards to the real core; records every entry-point call made outside the actor."""

    def __init__(self, core: DispatcherCore, worker: Callable[[], Worker]) -> None:
        self._core = core
        self._worker = worker
        self.violations: list[tuple[str, int, str | None]] = []
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._core, name)
        if not callable(attr) or name.startswith("prepare_"):
            return attr

        def checked(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            orchestrator = self._worker()._orchestrator
            if orchestrator is None or not orchestrator.in_actor:
                try:
                    task = asyncio.current_task()
                except RuntimeError:
                    task = None
                self.violations.append(
                    (name, threading.get_ident(), None if task is None else task.get_name())
                )
            return attr(*args, **kwargs)

        return checked


class FutureBackend:
    """Answers through a future resolved by a timer (no task per request)."""

    def handle_io(self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        loop.call_later(0.002, future.set_result, IOResult(result={"x": payload["params"]["key"]}))
        return future


class CoroutineBackend:
    async def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: Any
    ) -> IOResult:
        await asyncio.sleep(0.002)
        return IOResult(result={"x": payload["params"]["key"]})


def test_nothing_but_the_actor_touches_the_core() -> None:
    proxies: list[OwnershipCheckingCore] = []

    def wrap(core: DispatcherCore) -> OwnershipCheckingCore:
        proxy = OwnershipCheckingCore(core, lambda: session.worker)
        proxies.append(proxy)
        return proxy

    config = e2e_config(**{"stream_build.batch_max_rows": 50})
    session = WorkerSession(config, core_wrapper=wrap, io_handlers={"blockdb": FutureBackend()})
    with session:
        [proxy] = proxies

        async def scenario() -> None:
            worker = session.worker
            subcalls = Task(
                functions={"parent": PARENT, "child": CHILD},
                calls=[Call("parent", {"x": i}) for i in range(100)],
            )
            io_future = Task(
                functions={"reader": READER}, calls=[Call("reader", {"x": i}) for i in range(100)]
            )
            io_coroutine = Task(
                functions={"reader": READER},
                calls=[Call("reader", {"x": i}) for i in range(100)],
                io_handler=CoroutineBackend(),
            )
            stream = Task(
                functions={"sleeper": SLEEPER},
                calls=(Call("sleeper", {"i": i, "s": 0.001}) for i in range(300)),
            )
            retried = Task(
                functions={"sleeper": SLEEPER},
                calls=[Call("sleeper", {"i": i, "s": 0.2}) for i in range(100)],
                policy=TaskPolicy(max_attempts=3),
            )
            cancelled = worker.submit(
                Task(functions={"sleeper": SLEEPER}, calls=[Call("sleeper", {"i": 0, "s": 30})])
            )
            handles = [
                worker.submit(t) for t in (subcalls, io_future, io_coroutine, stream, retried)
            ]
            adapter = worker.adapter
            await eventually(lambda: len(adapter.reserved_calls("exec-1")) >= 20, timeout=20)
            os.kill(worker.pool.pid("exec-1") or 0, signal.SIGKILL)
            cancelled.cancel()
            results = [await h.result() for h in handles]
            assert all(r.success for r in results), [r.errors[:2] for r in results]
            assert results[0].outputs == [{"c": i * 2} for i in range(100)]
            assert results[1].outputs == results[2].outputs == [{"x": i} for i in range(100)]
            assert len(results[3].outputs) == 300
            assert results[4].outputs == [{"i": i} for i in range(100)]
            assert (await cancelled.result()).failure.kind == "CANCELLED"  # type: ignore[union-attr]

        session.run(scenario())
        assert proxy.violations == []
        # An event with a batch entry point may arrive either way (the actor batches
        # what one read or one flush delivered).
        batch_forms = {
            "handle_executor_bound": "handle_executors_bound",
            "handle_call_completed": "handle_calls_completed",
            "handle_call_waiting": "handle_calls_waiting",
            "handle_call_resumed": "handle_calls_resumed",
        }
        for entry_point in (
            "commit_call_phase",
            "commit_call_stream",
            "commit_call_batch",
            "finish_call_stream",
            "dispatch_ready",
            "handle_executor_bound",
            "handle_call_completed",
            "handle_call_waiting",
            "handle_call_resumed",
            "handle_subcall_request",
            "handle_attempt_failure",
            "handle_executor_lost",
            "handle_executor_snapshot_updated",
            "handle_task_cancelled",
            "flush_dirty_tasks",
        ):
            batch = batch_forms.get(entry_point, entry_point)
            assert proxy.calls[entry_point] + proxy.calls[batch] > 0, entry_point


def test_the_guard_sees_a_call_from_outside_the_actor() -> None:
    """The check itself works: a direct call from a test coroutine is a violation."""
    proxies: list[OwnershipCheckingCore] = []

    def wrap(core: DispatcherCore) -> OwnershipCheckingCore:
        proxies.append(OwnershipCheckingCore(core, lambda: session.worker))
        return proxies[-1]

    session = WorkerSession(e2e_config(**{"pool.executor_count": 1}), core_wrapper=wrap)
    with session:
        [proxy] = proxies

        async def outside() -> None:
            proxy.flush_dirty_tasks()

        session.run(outside())
        assert [name for name, _, _ in proxy.violations] == ["flush_dirty_tasks"]

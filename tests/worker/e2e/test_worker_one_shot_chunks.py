"""End to end: a long one-shot list is checked and registered in chunks, not in one loop turn.

One worker (two executors, the product's chunk size) serves the module. A
:class:`TurnWatcher` runs once per event-loop turn (a ``call_soon`` chain) and
records what the dispatcher core holds of the task: it proves, without timing
anything, that other callbacks run while a list is being checked and
registered, and it is where the cancellation test cancels a task whose
registration is half done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import ADDER, WorkerSession, e2e_config

from blockx.worker.actor import task_run as task_run_module
from blockx.worker.actor.one_shot import ONE_SHOT_CHUNK_CALLS as CHUNK
from blockx.worker.actor.one_shot import OneShotCalls
from blockx.worker.api import Call, Task, TaskPolicy, TaskSpecError
from blockx.worker.app import TaskHandle
from blockx.worker.core import DispatcherCore

pytestmark = [pytest.mark.timeout(180)]

FAILS_ON_0 = """
def _(p):
    if p["x"] == 0:
        raise ValueError("call zero fails")
    return {"y": p["x"] + 1}
"""


class CoreSession(WorkerSession):
    """A worker session that keeps a reference to its dispatcher core (read-only use)."""

    def __init__(self) -> None:
        self.cores: list[DispatcherCore] = []
        super().__init__(e2e_config(), core_wrapper=self._keep)

    def _keep(self, core: DispatcherCore) -> DispatcherCore:
        self.cores.append(core)
        return core

    @property
    def core(self) -> DispatcherCore:
        return self.cores[0]


@pytest.fixture(scope="module")
def session() -> Iterator[CoreSession]:
    with CoreSession() as s:
        yield s


class TurnWatcher:
    """Once per loop turn, until the handle is done: how many of the task's calls the
    core holds (``None``: the core does not know the task). ``on_turn(registered)``
    runs at each turn too."""

    def __init__(self, core: DispatcherCore, on_turn: Any = None) -> None:
        self.core = core
        self.on_turn = on_turn
        self.handle: TaskHandle | None = None
        self.seen: list[int | None] = []
        self.turns = 0
        self.finished = asyncio.get_running_loop().create_future()

    def start(self, handle: TaskHandle) -> None:
        self.handle = handle
        asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        handle = self.handle
        assert handle is not None
        self.turns += 1
        state = self.core.task_state(handle.run_state.task_id)
        registered = None if state is None else state.next_index
        self.seen.append(registered)
        if self.on_turn is not None:
            self.on_turn(registered)
        if handle.done():
            self.finished.set_result(None)
        else:
            asyncio.get_running_loop().call_soon(self._turn)

    def partial(self, total: int) -> list[int]:
        """The distinct partial registrations seen (0 < registered < total), in order."""
        return sorted({n for n in self.seen if n is not None and 0 < n < total})


def test_a_long_list_is_registered_over_several_loop_turns_in_call_order(
    session: CoreSession,
) -> None:
    n = 3 * CHUNK + 5

    async def scenario() -> None:
        watcher = TurnWatcher(session.core)
        handle = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": i}) for i in range(n)])
        )
        watcher.start(handle)
        result = await handle.result()
        await watcher.finished
        # Other callbacks ran while the core held part of the list, at chunk boundaries
        # (a watcher's turn may fall after two commits: at least two are seen).
        partial = watcher.partial(n)
        assert len(partial) >= 2 and all(k % CHUNK == 0 for k in partial), partial
        assert result.success
        assert result.outputs == [{"y": i + 1} for i in range(n)]  # each once, in call order
        assert (result.stats.calls, result.stats.succeeded) == (n, n)

    session.run(scenario())


def test_cancelling_while_registration_is_in_progress_ends_the_task_cleanly(
    session: CoreSession,
) -> None:
    n = 12 * CHUNK
    core = session.core

    async def scenario() -> None:
        cancelled_at: list[int] = []
        handle_box: list[TaskHandle] = []

        def cancel_midway(registered: int | None) -> None:
            if not cancelled_at and registered is not None and 0 < registered < n:
                cancelled_at.append(registered)
                handle_box[0].cancel("cancelled while registering")

        watcher = TurnWatcher(core, cancel_midway)
        handle = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": i}) for i in range(n)])
        )
        handle_box.append(handle)
        watcher.start(handle)
        result = await asyncio.wait_for(handle.result(), 30)
        await watcher.finished
        assert cancelled_at, "the watcher never saw the list partly registered"
        assert result.failure is not None and result.failure.kind == "CANCELLED"
        stats = result.stats
        assert stats.calls == n and stats.cancelled > 0
        assert stats.succeeded + stats.failed + stats.cancelled == n
        # The calls that succeeded before the cancel: each output once, in call order.
        ys = [row["y"] for row in result.outputs]
        assert len(ys) == stats.succeeded and ys == sorted(set(ys))
        # Nothing of the task is left in the core, and registration stopped.
        task_id = handle.run_state.task_id
        assert core.task_state(task_id) is None
        assert not [c for c in core.call_contexts if c.startswith(f"{task_id}/")]
        assert max(s for s in watcher.seen if s is not None) < n
        # The worker is fine: a task after it runs to its end.
        after = await session.worker.run_task(
            Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": i}) for i in range(50)])
        )
        assert after.success and len(after.outputs) == 50

    session.run(scenario())


@pytest.mark.parametrize(
    ("bad_index", "bad_item", "message"),
    [
        (5 * CHUNK - 3, Call("adder", {"x": float("nan")}), r"call #{i} \(adder\): args"),
        (4 * CHUNK + 1, 42, r"call #{i} must be a Call or a \(function_id, args\) pair, not int"),
        (3 * CHUNK, Call("nope", {"x": 1}), r"not define: \['nope'\] \(first: call #{i}\)"),
    ],
)
def test_a_bad_call_deep_in_a_long_list_fails_the_task_and_registers_nothing(
    session: CoreSession, bad_index: int, bad_item: Any, message: str
) -> None:
    n = 5 * CHUNK
    core = session.core

    async def scenario() -> None:
        calls: list[Any] = [Call("adder", {"x": i}) for i in range(n)]
        calls[bad_index] = bad_item
        binds_before = core.stats.binds
        watcher = TurnWatcher(core)
        handle = session.worker.submit(Task(functions={"adder": ADDER}, calls=calls))
        watcher.start(handle)
        with pytest.raises(TaskSpecError, match=message.format(i=bad_index)):
            await handle.result()
        await watcher.finished
        # Checked over several loop turns, and not one call registered or run.
        assert watcher.turns >= 3
        assert set(watcher.seen) == {None}
        assert core.stats.binds == binds_before
        # run_task raises the same error; the worker is fine afterwards.
        with pytest.raises(TaskSpecError, match=message.format(i=bad_index)):
            await session.worker.run_task(Task(functions={"adder": ADDER}, calls=calls))
        after = await session.worker.run_task(
            Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": 1})])
        )
        assert after.outputs == [{"y": 2}]

    session.run(scenario())


def test_fast_fail_during_registration_counts_every_call_of_the_list(
    session: CoreSession,
) -> None:
    n = 6 * CHUNK

    async def scenario() -> None:
        result = await session.worker.run_task(
            Task(
                functions={"f": FAILS_ON_0},
                calls=[Call("f", {"x": i}) for i in range(n)],
                policy=TaskPolicy(max_attempts=1),
            )
        )
        assert result.failure is not None and result.failure.kind == "CALL_FAILED"
        assert result.failure.call_index == 0
        [error] = result.errors
        assert error.index == 0 and error.function_id == "f" and error.args == {"x": 0}
        stats = result.stats
        assert stats.calls == n and stats.failed == 1
        assert stats.succeeded + stats.failed + stats.cancelled == n

    session.run(scenario())


def test_rows_of_a_long_list_with_a_bad_call_raise_its_error_and_do_not_hang(
    session: CoreSession,
) -> None:
    """The check fails after ``submit`` returned: an iteration of ``rows()`` already
    waiting for the first rows gets the error (it waited forever before)."""
    n = 3 * CHUNK
    bad_index = 2 * CHUNK + 5

    async def scenario() -> None:
        calls: list[Any] = [Call("adder", {"x": i}) for i in range(n)]
        calls[bad_index] = Call("adder", {"x": float("inf")})
        handle = session.worker.submit(Task(functions={"adder": ADDER}, calls=calls), collect=False)
        rows: list[Any] = []

        async def iterate() -> None:
            async for row in handle.rows():
                rows.append(row)

        with pytest.raises(TaskSpecError, match=rf"call #{bad_index} \(adder\): args"):
            await asyncio.wait_for(iterate(), 30)
        assert rows == []
        with pytest.raises(TaskSpecError):
            await handle.result()

    session.run(scenario())


def test_cancelling_a_long_list_before_admission_reports_cancelled(
    session: CoreSession,
) -> None:
    """``cancel()`` while the list's chunks are still being checked (before admission:
    a long list spends ~n/CHUNK loop turns there) ends the task CANCELLED with no call
    run -- ``result()`` reports it as for any cancelled task instead of raising
    ``CancelledError`` (which ``blockx run`` took for a task that did not end: an
    early Ctrl-C printed "the task did not end in time after it was cancelled"). So
    does a cancel in the turn of ``submit`` (before the driver ran at all)."""
    n = 8 * CHUNK
    core = session.core

    async def scenario() -> None:
        binds_before = core.stats.binds
        for collect in (True, False):
            handle = session.worker.submit(
                Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": i}) for i in range(n)]),
                collect=collect,
            )
            await asyncio.sleep(0)  # the driver checks its second chunk
            assert not handle.registered and not handle.done()
            handle.cancel("changed my mind")
            rows = [row async for row in handle.rows()]
            result = await asyncio.wait_for(handle.result(), 30)
            assert rows == [] and result.outputs == []
            assert not result.success
            assert result.failure is not None and result.failure.kind == "CANCELLED"
            assert "changed my mind" in result.failure.message
            stats = result.stats
            assert (stats.calls, stats.succeeded, stats.failed, stats.cancelled) == (n, 0, 0, n)
            assert core.task_state(handle.run_state.task_id) is None
        # A caller cancelled itself while it awaits result() still gets CancelledError.
        handle = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": i}) for i in range(n)])
        )
        waiter = asyncio.ensure_future(handle.result())
        await asyncio.sleep(0)  # the waiter awaits the driver
        handle.cancel()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (await handle.result()).failure is not None
        short = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": 1})])
        )
        short.cancel()
        result = await asyncio.wait_for(short.result(), 30)
        assert result.failure is not None and result.failure.kind == "CANCELLED"
        assert (result.stats.calls, result.stats.cancelled) == (1, 1)
        stream = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=iter([Call("adder", {"x": 1})]))
        )
        stream.cancel()
        result = await asyncio.wait_for(stream.result(), 30)
        assert result.failure is not None and result.failure.kind == "CANCELLED"
        assert result.stats.calls == 0  # a stream's: none read
        assert core.stats.binds == binds_before  # nothing ran
        after = await session.worker.run_task(
            Task(functions={"adder": ADDER}, calls=[Call("adder", {"x": 1})])
        )
        assert after.outputs == [{"y": 2}]

    session.run(scenario())


@pytest.mark.parametrize("collect", [True, False])
def test_a_long_lists_rows_are_decoded_off_the_actor_over_several_loop_turns(
    session: CoreSession, collect: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The core converges the task with its outputs still encoded; they become rows in
    slices of DECODE_SLICE, one per loop turn, when the caller takes them -- every row
    once, in call order."""
    monkeypatch.setattr(task_run_module, "DECODE_SLICE", 100)
    n = 1050

    async def scenario() -> None:
        calls = [Call("adder", {"x": i}) for i in range(n)]
        handle = session.worker.submit(
            Task(functions={"adder": ADDER}, calls=calls), collect=collect
        )
        run = handle.run_state
        await run.done  # converged: nothing decoded yet
        assert run.outputs_pending and run.rows == []
        pending_seen: list[bool] = []

        def tick() -> None:
            pending_seen.append(run.outputs_pending)
            if run.outputs_pending:
                asyncio.get_running_loop().call_soon(tick)

        asyncio.get_running_loop().call_soon(tick)
        if collect:
            rows = (await handle.result()).outputs
        else:
            rows = [row async for row in handle.rows()]
            await handle.result()
        assert rows == [{"y": i + 1} for i in range(n)]
        assert not run.outputs_pending
        # Another callback ran between the slices (11 of them): not one turn.
        assert pending_seen.count(True) >= 5

    session.run(scenario())


def test_a_bad_call_found_late_lets_go_of_what_was_prepared(session: CoreSession) -> None:
    """The error's traceback keeps the list's preparer alive as long as the caller keeps
    the error: it holds nothing of the list any more."""
    n = 5 * CHUNK

    async def scenario() -> None:
        calls: list[Any] = [Call("adder", {"x": i}) for i in range(n)]
        calls[4 * CHUNK + 7] = Call("adder", {"x": float("nan")})
        handle = session.worker.submit(Task(functions={"adder": ADDER}, calls=calls))
        with pytest.raises(TaskSpecError) as info:
            await handle.result()
        preparers = []
        tb = info.value.__traceback__
        while tb is not None:
            candidate = tb.tb_frame.f_locals.get("self")
            if isinstance(candidate, OneShotCalls):
                preparers.append(candidate)
            tb = tb.tb_next
        assert preparers, "the traceback passes through OneShotCalls.prepare_rest"
        for preparer in preparers:
            assert not preparer._chunks and preparer._items is None and not preparer.calls
        assert handle.run_state.calls == []

    session.run(scenario())

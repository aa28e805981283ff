"""TaskHandle: what ``Worker.submit`` returns -- the caller's side of one running task.

The handle waits for the task's end (:meth:`TaskHandle.result`), hands its rows
over as batches settle (:meth:`TaskHandle.rows`, :meth:`TaskHandle.row_batches`,
:meth:`TaskHandle.settled_batches`) and cancels it (:meth:`TaskHandle.cancel`). It
holds the task's :class:`~blockx.worker.actor.task_run.TaskRun` and its driver (the
asyncio task :class:`~blockx.worker.app.Worker` runs it with); everything it asks of
the worker goes through two of the worker's methods (posting an event to the dispatch
actor, building the result), so this module never imports the worker at run time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from blockx.worker.actor.events import TaskCancelRequested
from blockx.worker.actor.task_run import SettledRows, TaskRun
from blockx.worker.api import TaskResult
from blockx.worker.core import ConvergeTaskCalls, TaskFailure

__all__ = ["TaskHandle", "WorkerSide"]


class WorkerSide(Protocol):
    """What a handle asks of its :class:`~blockx.worker.app.Worker` (never imported here:
    the worker imports this module)."""

    def _orchestrator_post(self, event: Any) -> None: ...

    def _result(self, run: TaskRun) -> TaskResult: ...


class TaskHandle:
    """A submitted task: await :meth:`result`, iterate :meth:`rows`, or :meth:`cancel` it."""

    def __init__(
        self, worker: WorkerSide, run: TaskRun, driver: asyncio.Task[None], *, calls: int = 0
    ) -> None:
        self._worker = worker
        self._run = run
        self._driver = driver
        #: The task's calls as far as known before it runs (a one-shot list's length).
        self._calls = calls
        self.registered = False
        self.producer_error: BaseException | None = None
        #: Set by a cancel() that came before admission (the run ended there).
        self.cancel_reason: str | None = None

    def __repr__(self) -> str:
        return f"TaskHandle({self._run!r})"

    @property
    def task_id(self) -> str:
        return self._run.user_task_id

    @property
    def run_state(self) -> TaskRun:
        """The runtime state (for tests and introspection)."""
        return self._run

    def done(self) -> bool:
        return self._driver.done()

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Cancel the task: in-flight calls are cancelled on their executors; the result
        reports ``CANCELLED``. Idempotent."""
        if self._driver.done():
            return
        if self.registered:
            self._worker._orchestrator_post(
                TaskCancelRequested(task_id=self._run.task_id, reason=reason)
            )
        elif self.cancel_reason is None:
            # Not admitted yet (a long one-shot list's chunks still being checked, or no
            # slot free): nothing of it reached the core, so the run ends here as the
            # core ends a task cancelled before its calls ran -- CANCELLED, every call of
            # the list counted cancelled (a stream's: none read) -- and the driver stops.
            self.cancel_reason = reason
            calls = self._calls
            self._run.converged(
                ConvergeTaskCalls(
                    task_id=self._run.task_id,
                    mode=self._run.mode,
                    success=False,
                    failure=TaskFailure(kind="CANCELLED", message=reason),
                    outputs=(),
                    failed_calls=(),
                    total_count=calls,
                    succeeded_count=0,
                    failed_count=0,
                    cancelled_count=calls,
                    retry_count=0,
                    cache_hit_count=0,
                    singleflight_hit_count=0,
                )
            )
            self._driver.cancel()

    async def result(self) -> TaskResult:
        """Wait for the task to end and return its result."""
        try:
            await asyncio.shield(self._driver)
        except asyncio.CancelledError:
            # The driver cancelled by cancel() before admission: the run ended CANCELLED
            # there (reported as any cancelled task's); any other cancel -- the
            # caller's own included -- propagates.
            current = asyncio.current_task()
            if (
                self.cancel_reason is None
                or not self._driver.cancelled()
                or (current is not None and current.cancelling())
            ):
                raise
        if self.producer_error is not None:
            raise self.producer_error
        await self._run.decode_outputs()
        return self._worker._result(self._run)

    def __await__(self) -> Any:
        return self.result().__await__()

    async def rows(self) -> AsyncIterator[Any]:
        """The task's rows as they settle (submit with ``collect=False``).

        A stream's producer waits while rows it produced are not taken, so
        memory stays flat; iterate to the end before awaiting :meth:`result`.
        An error :meth:`result` raises is raised here too, once every row that
        came before it was yielded: a stream whose call source raised (the task
        was cancelled), a long one-shot list with a bad call past its first chunk.
        """
        async for rows in self.row_batches():
            for row in rows:
                yield row

    async def row_batches(self) -> AsyncIterator[list[Any]]:
        """:meth:`rows`, a settled batch's rows at a time (a one-shot task's: all of them,
        once it ends): a consumer that handles rows in bulk -- ``blockx run`` encodes a
        batch with one call -- does nothing per row here. Never an empty list."""
        async for settled in self.settled_batches():
            if settled.rows:
                yield settled.rows

    async def settled_batches(self) -> AsyncIterator[SettledRows]:
        """:meth:`row_batches` with each batch's call range, failures and counts
        (:class:`~blockx.worker.actor.task_run.SettledRows`), batches without rows
        included: what a consumer that records outcomes durably needs (``blockx serve``
        persists one of these per transaction). A stream's come in call order."""
        run = self._run
        driver = self._driver
        while True:
            settled = run.take_settled()
            if settled is not None:
                yield settled
                continue
            if run.done.done():
                if run.outputs_pending:  # a one-shot task's rows, decoded off the actor
                    await run.decode_outputs()
                    continue
                if self.producer_error is not None:  # not a quiet end: the source broke
                    raise self.producer_error
                return
            if driver.done():
                error = None if driver.cancelled() else driver.exception()
                if error is not None:
                    raise error
                return
            await run.wait_changed()

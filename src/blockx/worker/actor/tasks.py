"""Task events: registering tasks and streams with the core, and their outcome commands.

Theory of operation
-------------------
(seed: ``orchestrator_phases.go``, the actor's side.) A task reaches the actor
as :class:`TaskSubmitted` (a one-shot phase, prepared off the actor; a long
list's first chunk, its other chunks following as :class:`CallChunkPrepared`,
one per loop turn: see ``blockx/worker/actor/one_shot.py``) or :class:`StreamOpened`
followed by :class:`StreamBatchProduced` per batch and :class:`StreamFinished`.
Registering pins the task's code view (the adapter's function-code resolver
answers from it) and files its :class:`~blockx.worker.actor.task_run.TaskRun` under
the task id the core and the executors see; committing hands the calls to the
core.

The core's verdicts on a task come back as commands and are handed to the
run: ``StopCallProduction`` (the producer stops), ``BatchSettled`` (a stream
batch's rows and failures; one credit back) and, exactly once,
``ConvergeTaskCalls`` — after which the run is forgotten and the code view
released. :class:`TaskCancelRequested` is ``handle_task_cancelled``.

A commit the core refuses (a duplicate task id, a batch past the credit
window, a chunk the phase has no room for) fails the run or cancels the task;
it never stops the actor. A chunk or batch arriving after its task converged
(cancelled meanwhile) is dropped.

**Who owns what.** :class:`Tasks` is a part of the
:class:`~blockx.worker.actor.orchestrator.Orchestrator`, built by it with the
core, the function code view (pinned per task), the live tasks table
(:class:`~blockx.worker.actor.runs.TaskRuns`, of which it is the only writer)
and the orchestrator's ``run``. The orchestrator calls its ``apply_*`` methods
for the task events and its ``execute_*`` methods for the task commands; it
runs on the actor only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from blockx.worker.actor.stats import OrchestratorStats
from blockx.worker.core import (
    BatchSettled,
    ConvergeTaskCalls,
    DispatcherError,
    StopCallProduction,
)

if TYPE_CHECKING:
    from blockx.observability.tracing import CallTracer
    from blockx.worker.actor.events import (
        CallChunkPrepared,
        StreamBatchProduced,
        StreamFinished,
        StreamOpened,
        TaskCancelRequested,
        TaskSubmitted,
    )
    from blockx.worker.actor.runs import TaskRuns
    from blockx.worker.actor.task_run import TaskRun
    from blockx.worker.code import FunctionCodeView
    from blockx.worker.core import DispatchCommand, DispatcherCore

__all__ = ["Tasks"]

_log = logging.getLogger("blockx.worker.orchestrator")


class Tasks:
    """Task registration and outcomes (see the module docstring); a part of the
    :class:`~blockx.worker.actor.orchestrator.Orchestrator`, which builds it.

    ``run`` executes the commands the core answers with (the orchestrator's).
    """

    def __init__(
        self,
        core: DispatcherCore,
        code_view: FunctionCodeView,
        runs: TaskRuns,
        *,
        run: Callable[[list[DispatchCommand]], None],
        stats: OrchestratorStats | None = None,
    ) -> None:
        self._core = core
        self._code_view = code_view
        self._runs = runs
        self._run = run
        #: The span recorder (None: tracing off; set by ``Orchestrator.set_tracer``).
        self.tracer: CallTracer | None = None
        #: The rows handed to the runs are counted here (``rows``).
        self._stats = stats if stats is not None else OrchestratorStats()

    def __repr__(self) -> str:
        return f"Tasks({self._runs!r})"

    # --- commands -------------------------------------------------------------------------

    def execute_stop_production(self, cmd: StopCallProduction) -> None:
        run = self._runs.by_id.get(cmd.task_id)
        if run is not None:
            run.production_stopped(cmd.failure)

    def execute_batch_settled(self, cmd: BatchSettled) -> None:
        self._stats.rows += len(cmd.outputs)
        run = self._runs.by_id.get(cmd.task_id)
        if run is not None:
            run.batch_settled(cmd)

    def execute_converge(self, cmd: ConvergeTaskCalls) -> None:
        self._stats.rows += len(cmd.outputs)
        run = self._runs.remove(cmd.task_id)
        tracer = self.tracer
        if tracer is not None:
            tracer.task_finished(cmd.task_id, "succeeded" if cmd.success else "failed")
        self._code_view.release(cmd.task_id)
        if run is not None:
            run.converged(cmd)

    # --- events -----------------------------------------------------------------------------

    def _register(self, run: TaskRun) -> bool:
        if run.task_id in self._runs.by_id:
            run.done.set_exception(DispatcherError(f"task {run.task_id!r} is already running"))
            return False
        self._code_view.pin(run.task_id, run.code)
        self._runs.add(run)
        tracer = self.tracer
        if tracer is not None:
            tracer.task_started(run.task_id, run.user_task_id)
        return True

    def _unregister(self, run: TaskRun, error: BaseException) -> None:
        self._runs.remove(run.task_id)
        tracer = self.tracer
        if tracer is not None:
            tracer.task_finished(run.task_id, "refused")
        self._code_view.release(run.task_id)
        if not run.done.done():
            run.done.set_exception(error)
        run.changed.set()

    def apply_task_submitted(self, event: TaskSubmitted) -> None:
        run = event.run
        if not self._register(run):
            return
        try:
            self._run(self._core.commit_call_phase(event.prepared))
        except DispatcherError as exc:
            self._unregister(run, exc)

    def apply_call_chunk(self, event: CallChunkPrepared) -> None:
        run = event.run
        if self._runs.by_id.get(run.task_id) is not run:
            return  # refused or converged (cancelled) meanwhile
        try:
            self._run(self._core.commit_call_chunk(event.prepared))
        except DispatcherError as exc:
            _log.error("task %s: call chunk refused: %s", run.user_task_id, exc)
            self._run(self._core.handle_task_cancelled(run.task_id, f"call chunk refused: {exc}"))

    def apply_stream_opened(self, event: StreamOpened) -> None:
        run = event.run
        if not self._register(run):
            return
        try:
            self._run(
                self._core.commit_call_stream(run.task_id, instance=run.instance, policy=run.policy)
            )
        except DispatcherError as exc:
            self._unregister(run, exc)

    def apply_stream_batch(self, event: StreamBatchProduced) -> None:
        run = event.run
        if self._runs.by_id.get(run.task_id) is not run:
            return  # converged (cancelled) meanwhile
        try:
            self._run(self._core.commit_call_batch(event.prepared))
        except DispatcherError as exc:
            _log.error("task %s: stream batch refused: %s", run.user_task_id, exc)
            self._run(self._core.handle_task_cancelled(run.task_id, f"stream batch refused: {exc}"))

    def apply_stream_finished(self, event: StreamFinished) -> None:
        run = event.run
        if self._runs.by_id.get(run.task_id) is not run:
            return
        self._run(self._core.finish_call_stream(run.task_id))

    def apply_task_cancel(self, event: TaskCancelRequested) -> None:
        self._run(self._core.handle_task_cancelled(event.task_id, event.reason))

"""The live tasks table: every :class:`~blockx.worker.actor.task_run.TaskRun` the actor serves.

Owned by the :class:`~blockx.worker.actor.orchestrator.Orchestrator`, which
builds one and hands it to the parts that look runs up: the dispatch path (a
task's ExecuteCall prefix), :class:`~blockx.worker.actor.waits.Waits` (the
task's IO handler and code view), :class:`~blockx.worker.actor.attempts.AttemptEnds`
(debug output, output limits). Only :class:`~blockx.worker.actor.tasks.Tasks`
adds and removes runs (a task registered; its ``ConvergeTaskCalls``, or a
refused commit), so the invariant below has one writer. Actor only.

Invariant: ``output_limited`` is the number of runs in ``by_id`` with a
``max_output_bytes`` of their own (while it is 0, a completion skips the
per-task output count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blockx.worker.actor.task_run import TaskRun

__all__ = ["TaskRuns"]


class TaskRuns:
    """Live task runs by the task id the core and the executors see."""

    def __init__(self) -> None:
        #: Task id -> its run; read directly on the hot paths (a dict lookup).
        self.by_id: dict[str, TaskRun] = {}
        #: Runs in ``by_id`` with a ``max_output_bytes`` (counted on completion).
        self.output_limited = 0

    def __repr__(self) -> str:
        return f"TaskRuns(live={len(self.by_id)}, output_limited={self.output_limited})"

    def get(self, task_id: str) -> TaskRun | None:
        return self.by_id.get(task_id)

    def add(self, run: TaskRun) -> None:
        """File ``run`` (its task id must not be live: the caller checked)."""
        self.by_id[run.task_id] = run
        if run.max_output_bytes is not None:
            self.output_limited += 1

    def remove(self, task_id: str) -> TaskRun | None:
        """Forget the run of ``task_id``; returns it (None: it was not live)."""
        run = self.by_id.pop(task_id, None)
        if run is not None and run.max_output_bytes is not None:
            self.output_limited -= 1
        return run

"""The dispatch actor's counters, shared by the orchestrator and its parts.

One :class:`OrchestratorStats` per :class:`~blockx.worker.actor.orchestrator.Orchestrator`,
built by it and handed to each part it composes (waits, attempt ends, the tick),
which count into it directly. Plain integers, written on the actor only; read
anywhere (tests, benches, logs). It lives apart from the orchestrator so that a
part never imports the module that builds it.
"""

from __future__ import annotations

__all__ = ["OrchestratorStats"]


class OrchestratorStats:
    """Counters, for tests, benches and logs."""

    __slots__ = (
        "actor_runs",
        "bind_failures",
        "commands",
        "events",
        "executors_killed",
        "handler_errors",
        "io_waits",
        "io_waits_released",
        "resume_send_failures",
        "rows",
        "send_failures",
        "stale_waits",
        "subcall_waits",
        "wedged_calls",
    )

    def __init__(self) -> None:
        self.actor_runs = 0
        self.bind_failures = 0
        self.commands = 0
        self.events = 0
        self.executors_killed = 0
        self.handler_errors = 0
        self.io_waits = 0
        #: IO waits left unanswered whose future was cancelled (ReleaseWait).
        self.io_waits_released = 0
        self.resume_send_failures = 0
        #: Rows (successful root calls' outputs) handed to the task runs.
        self.rows = 0
        self.send_failures = 0
        self.stale_waits = 0
        self.subcall_waits = 0
        self.wedged_calls = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"OrchestratorStats({self.as_dict()})"

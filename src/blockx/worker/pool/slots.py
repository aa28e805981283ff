"""The pool's slot records: a slot's state, its public snapshot, and its mutable record.

:class:`SlotState` is the slot state machine of :mod:`.pool` (its table is there);
:class:`SlotInfo` is what ``PoolManager.slots()`` shows; ``_Slot`` is the pool's own
record of one slot (its process, timers, restart history, the exits the adapter asks
about). Only :class:`~blockx.worker.pool.manager.PoolManager` changes a ``_Slot``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blockx.worker.pool.exits import LossCause, ProcessExit
from blockx.worker.pool.output import OutputReader

if TYPE_CHECKING:
    from blockx.worker.pool.launch import ExecutorProcess

__all__ = ["SlotInfo", "SlotState"]


class SlotState(enum.Enum):
    """Where one executor slot is in its life."""

    #: A process is running (it may not have attached to the adapter yet).
    RUNNING = "RUNNING"
    #: The process exited; a restart is due after ``restart_delay_ms``.
    WAITING = "WAITING"
    #: Restarted too often; the next start is after ``backoff_ms``.
    BACKOFF = "BACKOFF"
    #: Not started, or the pool stopped.
    STOPPED = "STOPPED"


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """A slot at one instant (for status pages, logs and tests)."""

    executor_id: str
    state: SlotState
    pid: int | None
    #: Restarts counted in the current restart window.
    restarts_in_window: int
    restarts_total: int
    exits_total: int
    #: Exit status of the last process (negative: killed by that signal).
    last_returncode: int | None
    last_exit_reason: str | None


class _Slot:
    __slots__ = (
        "blackbox_path",
        "early",
        "executor_id",
        "exits",
        "exits_total",
        "generation",
        "killed",
        "last_exit_reason",
        "last_returncode",
        "outputs",
        "pidfd",
        "process",
        "restart_times",
        "restarts_total",
        "spawning",
        "started_at",
        "state",
        "timer",
    )

    def __init__(self, executor_id: str) -> None:
        self.executor_id = executor_id
        self.state = SlotState.STOPPED
        self.process: ExecutorProcess | None = None
        self.pidfd = -1
        self.timer: asyncio.TimerHandle | None = None
        self.restart_times: deque[float] = deque()
        self.restarts_total = 0
        self.exits_total = 0
        self.last_returncode: int | None = None
        self.last_exit_reason: str | None = None
        self.started_at = 0.0
        self.outputs: list[OutputReader] = []
        #: The spawn in flight on the spawner thread, if any.
        self.spawning: asyncio.Future[ExecutorProcess] | None = None
        #: A spawn started before the pool's loop (PoolManager.spawn_early), not adopted yet.
        self.early: concurrent.futures.Future[ExecutorProcess] | None = None
        #: Spawns so far; the running process's is its generation.
        self.generation = 0
        #: The last few exits, by generation (the adapter asks for its era's).
        self.exits: dict[int, ProcessExit] = {}
        #: Why the pool killed the running process on the worker's order, and the cause.
        self.killed: tuple[str, LossCause] | None = None
        self.blackbox_path: str | None = None

    def __repr__(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"_Slot({self.executor_id!r}, {self.state.name}, pid={pid})"

    def info(self, window_start: float) -> SlotInfo:
        """The slot now; restarts after ``window_start`` are the window's."""
        return SlotInfo(
            executor_id=self.executor_id,
            state=self.state,
            pid=None if self.process is None else self.process.pid,
            restarts_in_window=sum(1 for t in self.restart_times if t > window_start),
            restarts_total=self.restarts_total,
            exits_total=self.exits_total,
            last_returncode=self.last_returncode,
            last_exit_reason=self.last_exit_reason,
        )

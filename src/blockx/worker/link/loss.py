"""Why an executor's connection era ended, as the link and the pool found it.

Theory of operation
-------------------
The adapter builds one :class:`ExecutorLoss` for every era that ends while the
adapter is open, once it knows what it can about the process: its exit status
(the pool's :class:`~blockx.worker.pool.exits.ProcessExit`), the call its black box names
(``blockx.wire.blackbox``), its cgroup's OOM count. The actor turns it into the
blame rules of docs/security.md: calls that had not started are dispatched
again without spending an attempt; suspects are retried alone; the call found
guilty fails with ``cause`` as its error kind.

How the cause is decided (:func:`loss_from_exit` for a process that exited;
the adapter decides the others where the era ends):

* ``protocol_error`` -- the worker closed the connection for a malformed frame;
* ``shutdown`` -- the worker or its pool was stopping the executor;
* ``transport_lost`` -- heartbeat timeout, a reconnect, a disconnect without a
  cause, a connection that ended while the process had not exited within the
  adapter's wait, or no pool to ask;
* ``memory_exceeded`` -- exit status 87 (``EXIT_MEMORY_EXCEEDED``), a black box
  cause of ``CAUSE_MEMORY_EXCEEDED``, or the sandbox cgroup's OOM killer;
* ``executor_wedged`` (or whatever the caller named) -- the pool killed it on
  the worker's order (``PoolManager.kill_executor``);
* ``executor_crashed`` -- any other exit status or signal.

This module is pure: no clock, no IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from blockx.wire.blackbox import (
    CAUSE_DESCRIPTORS_EXHAUSTED,
    CAUSE_MEMORY_EXCEEDED,
    EXIT_DESCRIPTORS_EXHAUSTED,
    EXIT_MEMORY_EXCEEDED,
)

# The pool's facts, re-exported: the link's modules name them from here.
from blockx.worker.pool.exits import (
    LossCause,
    ProcessExit,
    describe_returncode,
)

if TYPE_CHECKING:
    from blockx.worker.link.reservations import LostCall

__all__ = ["EraEnd", "ExecutorLoss", "loss_from_exit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorLoss:
    """What is known of one lost era (see the module docstring)."""

    cause: LossCause
    #: For people: "exited with status 1", "killed by SIGSEGV", "over its memory
    #: limit of 512 MB", "no heartbeat for 15.0 s".
    message: str
    #: The call that held the executor's thread when it died (its black box, or the
    #: last heartbeat when the box could not be read); None: none, or unknown.
    running_call_id: str | None = None
    #: Whether ``running_call_id`` is certain (from the black box) rather than a guess.
    running_call_known: bool = False
    #: Calls of the era that had sent at least one frame from user code (an io or
    #: sub-call ``CallWaiting``; a ``function_code`` wait comes before user code runs, a
    #: terminal frame ends the call). A call that only computed or slept locally sent
    #: none: the black box's ``running_call_id`` is the one that held the thread.
    started_call_ids: frozenset[str] = frozenset()
    #: From the era's last heartbeat: how long its running call had run since it was
    #: last switched into, and that call's budget then (0: none runs / unlimited). With
    #: ``transport_lost`` after a heartbeat timeout they say whether the silent executor
    #: was stuck in a call past its budget (a wedge in C code).
    running_for_ms: int = 0
    running_call_budget_ms: int = 0
    #: The process's exit status when it was known (negative: killed by that signal).
    returncode: int | None = None


def loss_from_exit(
    exit_: ProcessExit,
    *,
    started_call_ids: frozenset[str],
    heartbeat_running_call_id: str | None,
    running_for_ms: int = 0,
    running_call_budget_ms: int = 0,
) -> ExecutorLoss:
    """The :class:`ExecutorLoss` of an era whose process is known to have exited."""
    box = exit_.blackbox
    if box is not None:
        running, known = box.call_id, True
    else:
        running, known = heartbeat_running_call_id, False
    returncode = exit_.returncode
    what = describe_returncode(returncode)
    cause: LossCause
    if exit_.stopping:
        cause, message = "shutdown", f"the pool stopped it ({what})"
    elif exit_.killed_why is not None:
        cause = exit_.killed_cause or "executor_wedged"
        message = f"killed by the worker: {exit_.killed_why} ({what})"
    elif (
        returncode == EXIT_MEMORY_EXCEEDED
        or (box is not None and box.cause == CAUSE_MEMORY_EXCEEDED)
        or exit_.memory_killed
    ):
        cause = "memory_exceeded"
        if exit_.memory_killed and exit_.note:
            message = exit_.note
        elif exit_.memory_limit_mb:
            message = f"over its memory limit of {exit_.memory_limit_mb} MB ({what})"
        else:
            message = f"over its memory limit ({what})"
    elif returncode == EXIT_DESCRIPTORS_EXHAUSTED or (
        box is not None and box.cause == CAUSE_DESCRIPTORS_EXHAUSTED
    ):
        cause = "executor_crashed"
        message = f"ran out of file descriptors and recycled itself ({what})"
    else:
        cause, message = "executor_crashed", what
        if exit_.note:
            message = f"{what} ({exit_.note})"
    return ExecutorLoss(
        cause=cause,
        message=message,
        running_call_id=running,
        running_call_known=known,
        started_call_ids=started_call_ids,
        running_for_ms=running_for_ms,
        running_call_budget_ms=running_call_budget_ms,
        returncode=returncode,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class EraEnd:
    """What the link knew when an era ended: its report is built from this and, when the
    process's exit is known, the pool's :class:`ProcessExit`."""

    executor_id: str
    era: int
    #: The pool's generation of the process that attached the era (None: no pool).
    generation: int | None
    lost: tuple[LostCall, ...]
    reason: str
    started: frozenset[str]
    #: From the era's last heartbeat.
    running_call_id: str | None
    running_for_ms: int
    running_call_budget_ms: int

    def __repr__(self) -> str:
        return (
            f"EraEnd({self.executor_id!r}, era={self.era}, gen={self.generation}, "
            f"lost={len(self.lost)}, {self.reason!r})"
        )

    def link_loss(self, cause: LossCause, message: str) -> ExecutorLoss:
        """The loss as the link alone knows it (the running call: the last heartbeat's)."""
        return ExecutorLoss(
            cause=cause,
            message=message,
            running_call_id=self.running_call_id,
            running_call_known=False,
            started_call_ids=self.started,
            running_for_ms=self.running_for_ms,
            running_call_budget_ms=self.running_call_budget_ms,
        )

    def exit_loss(self, exit_: ProcessExit) -> ExecutorLoss:
        """The loss once the process's exit is known (:func:`loss_from_exit`)."""
        return loss_from_exit(
            exit_,
            started_call_ids=self.started,
            heartbeat_running_call_id=self.running_call_id,
            running_for_ms=self.running_for_ms,
            running_call_budget_ms=self.running_call_budget_ms,
        )

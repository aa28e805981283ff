"""How an executor process ended, as its pool saw it after reaping it.

Theory of operation
-------------------
The pool (:mod:`.manager`) builds one :class:`ProcessExit` per reaped process
— exit status, black box, OOM note, whether the pool itself killed it and
why — and offers them through :class:`ProcessExitSource`. The link
(``blockx.worker.link.loss``) turns an exit into the lost era's
``ExecutorLoss``; the pool never needs the link for that, so these facts live
on the pool's side and the link imports them (pool ← link, never back).

:data:`LossCause` names why an era ended (the error kinds of docs/security.md);
the pool uses it for the cause it was told to report when it kills a process
on the worker's order (``PoolManager.kill_executor``).

This module is pure: no clock, no IO.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from blockx.wire.blackbox import BlackboxRecord

__all__ = [
    "LOSS_CAUSES",
    "LossCause",
    "ProcessExit",
    "ProcessExitSource",
    "describe_returncode",
    "shell_status_as_signal",
]

LossCause = Literal[
    "transport_lost",  # the connection ended; nothing says a call caused it
    "executor_crashed",  # the process died of itself: an exit status or a signal
    "memory_exceeded",  # over its memory limit (its own watchdog, the cgroup, the OOM killer)
    "executor_wedged",  # killed by the worker for a call that outran its budget
    "protocol_error",  # the executor sent a malformed frame; the worker closed it
    "shutdown",  # the worker or the pool stopped it on purpose
]
LOSS_CAUSES: Final[frozenset[str]] = frozenset(LossCause.__args__)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessExit:
    """One executor process's end, as its pool saw it (after reaping it)."""

    executor_id: str
    #: The pool slot's spawn count when this process started (1, 2, ...).
    generation: int
    pid: int
    #: ``Popen.returncode``: the exit status, or minus the killing signal; None: unknown.
    returncode: int | None
    #: The process's black box, read after it exited (None: missing or never written).
    blackbox: BlackboxRecord | None = None
    #: The sandbox's cgroup counted an OOM kill during this process's life.
    memory_killed: bool = False
    #: The memory limit the process ran under, MB (0: none).
    memory_limit_mb: int = 0
    #: Why the pool killed it on the worker's order, and the cause to report then.
    killed_why: str | None = None
    killed_cause: LossCause | None = None
    #: The pool was stopping (SIGTERM to every executor).
    stopping: bool = False
    #: The spawner's note on the exit (the sandbox: the OOM killer's verdict).
    note: str | None = None


class ProcessExitSource(Protocol):
    """Where the adapter learns how an executor process ended (the pool implements it)."""

    def running_generation(self, executor_id: str) -> int | None:
        """The generation of the slot's running process (None: none runs)."""
        ...

    def exit_of(self, executor_id: str, generation: int) -> ProcessExit | None:
        """That process's exit, once it has been reaped; None while it runs."""
        ...

    def add_exit_listener(self, listener: Callable[[ProcessExit], None]) -> None:
        """Call ``listener(exit)`` on the event loop thread after every reaped process."""
        ...


def shell_status_as_signal(returncode: int | None) -> int | None:
    """bubblewrap (a spawner with ``signals_as_exit_status``) reports its child's death by a
    signal as 128 + the signal, as a shell does: 139 is a SIGSEGV, ``-11`` here."""
    if returncode is not None and 129 <= returncode <= 128 + 64:
        return 128 - returncode
    return returncode


def describe_returncode(returncode: int | None) -> str:
    """``exited with status 1`` / ``killed by SIGSEGV`` / ``exited (status unknown)``."""
    if returncode is None:
        return "exited (status unknown)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"

"""Why an executor's connection era ended, as the link and the pool found it.

The adapter builds one :class:`ExecutorLoss` for every era that ends with calls on
it, once it knows what it can about the process: its exit status (the pool), the
call its black box names (``blockx.wire.blackbox``), its cgroup's OOM count. The
actor turns it into the blame rules of docs/security.md: calls that had not
started are dispatched again without spending an attempt; suspects are retried
alone; the call found guilty fails with ``cause`` as its error kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["LOSS_CAUSES", "ExecutorLoss", "LossCause"]

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
    #: Calls of the era that had sent at least one frame (they ran user code).
    started_call_ids: frozenset[str] = frozenset()

"""Reservations: which calls hold an executor context, per connection era.

Theory of operation
-------------------
The dispatcher picks an executor from a snapshot; the adapter is the truth of
what that executor holds. Every call the dispatcher binds to an executor takes
a *reservation* on that executor's current connection until one of:

* the executor's terminal frame for the call arrives (``CallCompleted`` /
  ``CallFailed``: transport truth, :meth:`Reservations.release_on_terminal`);
* the dispatcher unbinds it (:meth:`Reservations.unbind`; idempotent with the
  terminal release);
* the connection's era ends (reconnect, heartbeat timeout, protocol error):
  :meth:`Reservations.take_all` hands every call to the lost path.

A reserved call that sent an io or sub-call ``CallWaiting`` has *started*: it ran user
code on that executor. :attr:`Reservations.started` holds them until their
reservation goes; :meth:`Reservations.take_all` says which lost calls had
(the blame rules of docs/security.md retry the others without spending an attempt).

A reservation marked *draining* (the call was cancelled; a ``CancelCall`` is on
its way) keeps its context until the executor's terminal frame: ``unbind``
leaves it in place, because the executor still runs the call until it sees
the cancel. Draining reservations are not *live*: no sub-call may bind under
them and no ``ExecuteCall`` is sent for them.

Attempts: a new ``ExecuteCall`` for a live call id with a higher ``attemptSeq``
replaces the old attempt in the executor, which then sends no terminal frame
for the old one. A terminal frame whose ``attemptSeq`` is lower than the last
dispatched attempt is therefore stale and releases nothing.

This module is sans-IO and clock-free; the adapter owns one instance per
connection era and calls it on its event loop thread only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from blockx.worker.errors import CallDrainingError, CallNotBoundError, ParentNotResidentError

__all__ = ["LostCall", "Reservations"]


class LostCall(NamedTuple):
    """A call that held a reservation on a connection whose era ended."""

    call_id: str
    #: ``attemptSeq`` of the last ``ExecuteCall`` sent for it on that connection
    #: (``None``: bound, never sent).
    attempt_seq: int | None
    #: The parent call of a sub-call, ``None`` for a root call.
    parent_call_id: str | None
    #: The reservation was draining (cancelled) when the era ended.
    draining: bool
    #: The call had sent an io / sub-call wait on that connection (it ran user code).
    started: bool = False


class Reservations:
    """The reservations of one connection era of one executor."""

    __slots__ = ("_attempts", "_draining", "_parents", "era", "executor_id", "started")

    def __init__(self, executor_id: str, era: int) -> None:
        self.executor_id = executor_id
        self.era = era
        # call id -> parent call id (None for a root call). Invariant: every call
        # in _draining and _attempts is a key here.
        self._parents: dict[str, str | None] = {}
        self._draining: set[str] = set()
        # call id -> attemptSeq of the last ExecuteCall queued for it.
        self._attempts: dict[str, int] = {}
        #: Reserved calls that sent a frame here (a subset of the reserved ones; the
        #: adapter adds them, every release removes them).
        self.started: set[str] = set()

    def __repr__(self) -> str:
        return (
            f"Reservations({self.executor_id!r}, era={self.era}, "
            f"reserved={len(self._parents)}, draining={len(self._draining)})"
        )

    def __len__(self) -> int:
        return len(self._parents)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._parents

    @property
    def reserved(self) -> Mapping[str, str | None]:
        """The reserved call ids (-> parent call id), read-only: ``call_id in r.reserved``
        is ``call_id in r`` without a Python call (the ResumeCall hot path)."""
        return self._parents

    @property
    def draining_count(self) -> int:
        return len(self._draining)

    def call_ids(self) -> tuple[str, ...]:
        return tuple(self._parents)

    def is_live(self, call_id: str) -> bool:
        """Reserved and not draining."""
        return call_id in self._parents and call_id not in self._draining

    def is_draining(self, call_id: str) -> bool:
        return call_id in self._draining

    def parent_of(self, call_id: str) -> str | None:
        return self._parents.get(call_id)

    def dispatched_attempt(self, call_id: str) -> int | None:
        return self._attempts.get(call_id)

    def check_sendable(self, call_id: str) -> None:
        """Raise unless an ``ExecuteCall`` may go out for ``call_id``: it must be reserved
        (:class:`CallNotBoundError`) and not draining (:class:`CallDrainingError`)."""
        if call_id not in self._parents:
            raise CallNotBoundError(self.executor_id, call_id=call_id)
        if call_id in self._draining:
            raise CallDrainingError(self.executor_id, call_id=call_id)

    def bind(self, call_id: str) -> None:
        """Reserve a context for a root call. Re-binding a reserved call is a new attempt on
        the same executor: it keeps the one reservation and clears draining."""
        self._parents[call_id] = None
        self._draining.discard(call_id)

    def bind_within(self, call_id: str, capacity: int) -> bool:
        """:meth:`bind` a root call unless that would pass ``capacity`` reservations
        (a call already reserved is re-bound at any count); False: nothing changed."""
        parents = self._parents
        if call_id not in parents and len(parents) >= capacity:
            return False
        parents[call_id] = None
        self._draining.discard(call_id)
        return True

    def bind_subcall(self, call_id: str, parent_call_id: str) -> None:
        """Reserve a context for a sub-call; its parent must hold a live reservation here.

        Raises :class:`ParentNotResidentError` (nothing reserved) otherwise.
        """
        if not self.is_live(parent_call_id):
            raise ParentNotResidentError(
                self.executor_id, call_id=call_id, parent_call_id=parent_call_id
            )
        self._parents[call_id] = parent_call_id
        self._draining.discard(call_id)

    def unbind(self, call_id: str) -> bool:
        """Release a reservation the dispatcher is done with; True if one was released.

        A draining reservation stays until the executor's terminal frame; an
        unknown call (already released by its terminal frame) is a no-op.
        """
        if call_id in self._draining or call_id not in self._parents:
            return False
        del self._parents[call_id]
        self._attempts.pop(call_id, None)
        self.started.discard(call_id)
        return True

    def mark_draining(self, call_id: str) -> bool:
        """Mark a reservation draining; False when the call holds none (nothing to drain)."""
        if call_id not in self._parents:
            return False
        self._draining.add(call_id)
        return True

    def note_dispatched(self, call_id: str, attempt_seq: int) -> None:
        """Record the attempt of an ``ExecuteCall`` just queued for a reserved call."""
        if call_id in self._parents:
            self._attempts[call_id] = attempt_seq

    def release_on_terminal(self, call_id: str, attempt_seq: object) -> bool:
        """The executor ended an attempt; release unless the frame is for a replaced attempt.

        ``attempt_seq`` comes off the wire as is: anything but an int releases
        (the executor is the truth about its contexts). True if released.
        """
        if call_id not in self._parents:
            return False
        dispatched = self._attempts.get(call_id)
        if dispatched is not None and type(attempt_seq) is int and attempt_seq < dispatched:
            return False
        del self._parents[call_id]
        self._draining.discard(call_id)
        self._attempts.pop(call_id, None)
        self.started.discard(call_id)
        return True

    def attempt_ahead(self, call_id: str, attempt_seq: int) -> int | None:
        """The last attempt dispatched for ``call_id`` when ``attempt_seq`` is *later* than
        it (a terminal frame for an attempt the worker never sent: a protocol error), else
        None (no such call here, nothing dispatched yet, or an attempt that was sent)."""
        dispatched = self._attempts.get(call_id)
        if dispatched is not None and attempt_seq > dispatched:
            return dispatched
        return None

    def take_all(self) -> tuple[LostCall, ...]:
        """End the era: return every reservation (in bind order) and hold none."""
        started = self.started
        lost = tuple(
            LostCall(
                call_id,
                self._attempts.get(call_id),
                parent,
                call_id in self._draining,
                call_id in started,
            )
            for call_id, parent in self._parents.items()
        )
        started.clear()
        self._parents.clear()
        self._draining.clear()
        self._attempts.clear()
        return lost

"""Resident greenlets: each runs one call at a time, then waits for the next.

Theory of operation
-------------------
A fresh greenlet costs ~8 µs (CPython allocates and frees a 16 KiB stack
block per greenlet), a reused one ~0.5 µs (docs/operations.md, "The figures
the design is built on"). The seed's "one
greenlet per context" is kept with a pool: a context gets a greenlet when it
is first switched in (:meth:`ResidentGreenletPool.take`) and holds it until its
call ends.

Each pool greenlet loops: receive a context, ``run_call(ctx)`` (which sends
the call's one terminal frame), switch :data:`CALL_FINISHED` back to the
scheduler, receive the next context. ``run_call`` handles every outcome of
the call itself; what escapes it (a preemption signal that landed in
framework code after the call's own handlers) goes to ``fail_call``, so the
call still gets its terminal frame. Switching :data:`RETIRE` in ends the loop. The loop itself is
:func:`.greenlet_loop.resident_loop`, interpreted: this module is compiled (it runs
twice per call), and a greenlet's ``run`` needs a frame of its own.
(Both markers live in :mod:`.markers`; this module names contexts only under
``TYPE_CHECKING``, and :mod:`.context` imports nothing of the executor's but
:mod:`.errors`: no import cycle.)

Invariants: an idle greenlet is suspended at the top of its loop, holding no
call; at most ``max_idle`` greenlets are idle (the rest are retired when their
call ends); a greenlet whose call misbehaved is discarded (:meth:`discard`),
never reused. Only the scheduler switches into pool greenlets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Final

from greenlet import GreenletExit, greenlet

from .greenlet_loop import resident_loop
from .markers import CALL_FINISHED, RETIRE

if TYPE_CHECKING:
    from .context import ExecContext

__all__ = ["CALL_FINISHED", "POOL_MAX_IDLE", "RETIRE", "ResidentGreenletPool"]

_log = logging.getLogger("blockx.executor")

#: Idle resident greenlets kept for reuse; the rest are retired when their call ends.
POOL_MAX_IDLE: Final = 256


class ResidentGreenletPool:
    """Idle resident greenlets, and the loop each of them runs.

    ``run_call(ctx)`` runs one call to its terminal frame on the pool greenlet;
    ``fail_call(ctx, exc)`` fails a call when ``exc`` escaped ``run_call``.
    ``created`` / ``retired`` / ``discarded`` count greenlets for ``stats()``.
    """

    __slots__ = (
        "_fail_call",
        "_idle",
        "_run_call",
        "closed",
        "created",
        "discarded",
        "max_idle",
        "retired",
    )

    def __init__(
        self,
        run_call: Callable[[ExecContext], None],
        fail_call: Callable[[ExecContext, BaseException], None],
        *,
        max_idle: int = POOL_MAX_IDLE,
    ) -> None:
        self._run_call = run_call
        self._fail_call = fail_call
        self._idle: list[greenlet] = []
        self.max_idle = max_idle
        self.closed = False  # once closed, finished greenlets are retired, not kept
        self.created = 0
        self.retired = 0
        self.discarded = 0

    def __repr__(self) -> str:
        return (
            f"ResidentGreenletPool(idle={len(self._idle)}/{self.max_idle}, "
            f"created={self.created}, discarded={self.discarded}"
            f"{', closed' if self.closed else ''})"
        )

    def __len__(self) -> int:
        """Idle greenlets."""
        return len(self._idle)

    def take(self) -> greenlet:
        """An idle greenlet, or a new one; switch a context into it to run its call."""
        idle = self._idle
        if idle:
            return idle.pop()
        self.created += 1
        return greenlet(partial(resident_loop, self._run_call, self._fail_call))

    def release(self, glet: greenlet) -> None:
        """``glet`` switched back :data:`CALL_FINISHED`: keep it idle, or retire it."""
        if len(self._idle) < self.max_idle and not self.closed:
            self._idle.append(glet)
        else:
            self.retire(glet)

    def retire(self, glet: greenlet) -> None:
        """End an idle greenlet's loop."""
        self.retired += 1
        if not glet.dead:
            glet.switch(RETIRE)

    def close(self) -> None:
        """Retire every idle greenlet; later releases retire theirs too. Idempotent."""
        self.closed = True
        idle = self._idle
        while idle:
            self.retire(idle.pop())

    def discard(self, glet: greenlet) -> None:
        """Never reuse a greenlet whose call misbehaved; try once to end it."""
        self.discarded += 1
        if glet.dead:
            return
        try:
            glet.throw(GreenletExit)
        except BaseException:
            _log.exception("discarded call greenlet raised while ending")
        if not glet.dead:
            _log.error("a call greenlet refused to end; abandoning it")

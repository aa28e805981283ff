"""ReadAnswer: one waiter's answer future of a flight (:mod:`.scope`).

It lives apart from :mod:`.scope` so that the scope can be compiled with mypyc
while this class stays interpreted: a native class cannot subclass the C
``asyncio.Future`` (awaiting the compiled subclass fails), and mypyc cannot
build it as a non-native class either. Keep this module out of the compiled set.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .handler import IOResult

if TYPE_CHECKING:
    from .scope import _Flight

__all__ = ["ReadAnswer"]


class ReadAnswer(asyncio.Future[IOResult]):
    """One waiter's answer future.

    Cancelling it (the worker does when the call no longer waits) takes this waiter
    off its flight and nothing else: the other waiters still get the answer; when
    none is left, a read's flight stops its backend call (a write's never does).
    """

    __slots__ = ("flight",)
    #: The flight while it runs; None once it ended (see :meth:`_Flight.let_go`).
    flight: _Flight | None

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False  # answered already, or cancelled before
        flight = self.flight
        if flight is not None:
            flight.waiter_left()
        return True

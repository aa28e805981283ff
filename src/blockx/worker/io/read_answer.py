"""ReadAnswer: one waiter's answer future of a flight (:mod:`.scope`).

It lives apart from :mod:`.scope` so that the scope can be compiled with mypyc
while this class stays interpreted: a native class cannot subclass the C
``asyncio.Future`` (awaiting the compiled subclass fails), and mypyc cannot
build it as a non-native class either. Keep this module out of the compiled set.

The scope imports this module, never the reverse: what a ReadAnswer needs of
its flight (to leave it) is :class:`FlightWaiters`, which the scope's flight
implements.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from .handler import IOResult

__all__ = ["FlightWaiters", "ReadAnswer"]


class FlightWaiters(Protocol):
    """What an answer future needs of its flight (the scope's ``_Flight``)."""

    def waiter_left(self) -> None:
        """This waiter's future was cancelled: one waiter fewer."""
        ...


class ReadAnswer(asyncio.Future[IOResult]):
    """One waiter's answer future.

    Cancelling it (the worker does when the call no longer waits) takes this waiter
    off its flight and nothing else: the other waiters still get the answer; when
    none is left, a read's flight stops its backend call (a write's never does).
    """

    __slots__ = ("direct", "flight")
    #: The flight while it runs; None once it ended (the scope's ``_Flight.let_go``).
    flight: FlightWaiters | None
    #: The callback :meth:`deliver_to` registered, until it is called.
    direct: Callable[[ReadAnswer], object] | None

    def deliver_to(self, callback: Callable[[ReadAnswer], object]) -> None:
        """Call ``callback(self)`` once this future is done, as ``add_done_callback`` would
        -- but when the flight answers, at once, from the flight's own callback, rather
        than one event-loop turn later: the worker's IO answer path (a ``call_soon``
        handle fewer per read). A cancelled future's callback still runs from the loop
        (``call_soon``), as a done callback would. One such callback per future; a
        second one, or one given after the answer, is an ordinary done callback.

        Only its flight answers a ReadAnswer (``_Flight.finish``, which then calls
        this callback); resolving it any other way would skip the callback. The worker's
        wait path (``blockx/worker/actor/waits.py``) writes this method out, to spare an
        interpreted call per read: keep the two in step.
        """
        if getattr(self, "direct", None) is None and not self.done():
            self.direct = callback
        else:
            self.add_done_callback(callback)

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False  # answered already, or cancelled before
        # getattr: a ReadAnswer built outside a flight (its flight sets both slots).
        direct = getattr(self, "direct", None)
        if direct is not None:
            self.direct = None
            self.get_loop().call_soon(direct, self)
        flight = getattr(self, "flight", None)
        if flight is not None:
            flight.waiter_left()
        return True

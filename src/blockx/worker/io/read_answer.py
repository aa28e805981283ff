"""ReadAnswer: one waiter's answer future of a flight (:mod:`.scope`); BackendAnswer:
a backend's answer future that reaches its flight without an event-loop turn.

They live apart from :mod:`.scope` so that the scope can be compiled with mypyc
while these classes stay interpreted: a native class cannot subclass the C
``asyncio.Future`` (awaiting the compiled subclass fails), and mypyc cannot
build it as a non-native class either. Keep this module out of the compiled set.

The scope imports this module, never the reverse: what a ReadAnswer needs of
its flight (to leave it) is :class:`FlightWaiters`, which the scope's flight
implements.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from .handler import IOResult

__all__ = ["BackendAnswer", "FlightWaiters", "ReadAnswer"]

_log = logging.getLogger("blockx.worker.io")


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
        this callback); resolving it any other way would skip the callback.
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


class BackendAnswer(asyncio.Future[Any]):
    """A backend's answer future that hands its answer to the flight at once.

    A backend (the ``rpc`` one; ``blockdb`` on SQLite) returns one from ``execute``.
    The scope's flight registers its callback with :meth:`deliver_to`; when the backend
    resolves the future (``set_result``, or ``set_exception``), the callback runs right
    there, not one event-loop turn later as a done callback would -- a ``call_soon``
    handle fewer per backend call on the IO answer path. A cancelled future's callback
    runs from the loop, as a done callback's would.

    ``on_cancel`` (optional) is called at once when the future is cancelled (the
    ``rpc`` backend stops a batch whose every request is gone): the backend's own
    cancellation hook, instead of a done callback on every request.
    """

    __slots__ = ("direct", "on_cancel")
    direct: Callable[[BackendAnswer], object] | None
    on_cancel: Callable[[BackendAnswer], object] | None

    def deliver_to(self, callback: Callable[[BackendAnswer], object]) -> None:
        """Call ``callback(self)`` once done (at once when resolved; see the class). One
        such callback per future; a second one, or one given when the future is done
        already, is an ordinary done callback."""
        if getattr(self, "direct", None) is None and not self.done():
            self.direct = callback
        else:
            self.add_done_callback(callback)

    def forget_delivery(self) -> None:
        """Drop the callback :meth:`deliver_to` registered (its flight was abandoned)."""
        self.direct = None

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self._deliver()

    def set_exception(self, exception: type | BaseException) -> None:
        super().set_exception(exception)
        self._deliver()

    def _deliver(self) -> None:
        callback = getattr(self, "direct", None)
        if callback is not None:
            self.direct = None
            try:
                callback(self)
            except Exception:  # as the event loop reports a done callback that raised
                _log.exception("the answer callback of an IO backend raised")

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        direct = getattr(self, "direct", None)
        if direct is not None:
            self.direct = None
            self.get_loop().call_soon(direct, self)
        hook = getattr(self, "on_cancel", None)
        if hook is not None:
            self.on_cancel = None
            hook(self)
        return True

"""Budget preemption: ``SIGALRM`` ends a call stuck in pure CPU work.

Theory of operation
-------------------
Safe points (``ExecContext.check_safe_point``) catch every call that waits,
sleeps or returns; only a call that computes without pause needs a signal.
Before every switch into a budgeted call the scheduler asks
:meth:`DeadlineAlarm.arm` to make sure ``ITIMER_REAL`` fires by the time that
call's budget (or its call-timeout deadline) runs out. Re-arming costs two
syscalls, more than the switch itself, so the timer is re-armed only when this
call needs an *earlier* expiry than the one armed; a timer that fires early
finds nothing expired and its 0.1 s interval re-checks. The scheduler disarms
it when it goes idle.

:func:`on_deadline_signal` raises :class:`~blockx.executor.errors.DeadlineSignalExpired`
only when a call is ``RUNNING`` on the current greenlet and
:meth:`ExecContext.deadline_expired_reason` (the one expiry judge) says it
really expired: framework code (waits, terminal frames) runs in other states
and is never interrupted.

**A cancel reaches a call stuck in pure CPU work the same way.** A ``CancelCall``
is handled on the scheduler thread, which such a call never gives back: the
cancel would wait for the call forever (and with it every other call of the
executor, and any task whose calls were placed there). So the socket's reader
thread, which sees every frame first, notes each ``CancelCall`` here
(:func:`note_cancel_request`: ``CANCEL_REQUESTS``, by call id) and raises
``SIGALRM`` in the main thread at once (``_thread.interrupt_main``; only while
our handler is installed). The handler ends the running call as cancelled when
a request names it (and its attempt, or any attempt), exactly as its next safe
point would; otherwise it does what it does for budgets. The scheduler's own
handling of the frame takes the request back (:func:`take_cancel_request`), so
a call that waits or is queued is cancelled there, as before.

Only the main thread may own a signal handler: off it the alarm stays
disabled (budgets still hold at safe points). Someone else may take
``SIGALRM`` later (a test runner's timeout); :meth:`DeadlineAlarm.refresh`
notices and the alarm is never armed for a handler that is not ours.

Who calls it: ``ExecutorRuntime`` builds one, refreshes it once per
``run_until_idle``, arms it from ``CallRunner._run_slice``, restores the
previous handler at shutdown. Scheduler thread only.
"""

from __future__ import annotations

import _thread
import math
import signal
import threading
import time

# signal.getsignal wraps this one and turns its result into an enum: 0.55 µs
# against 17 ns, and refresh() runs on every scheduler wake-up.
from _signal import getsignal as _getsignal
from typing import Any, Final

from greenlet import getcurrent

from .containment import PAUSE_CLOCK
from .context import ExecState, running
from .errors import DeadlineSignalExpired, termination_exception

__all__ = [
    "ALARM_INTERVAL_S",
    "CANCEL_REQUESTS",
    "MAX_TIMER_S",
    "DeadlineAlarm",
    "note_cancel_request",
    "on_deadline_signal",
    "take_cancel_request",
]

#: SIGALRM re-fires this often while a call overruns (the handler re-checks).
ALARM_INTERVAL_S: Final = 0.1
#: The longest timer ever armed (a day): a longer budget is re-aimed when it fires.
MAX_TIMER_S: Final = 86_400.0


#: ``CancelCall`` requests the reader thread saw and the scheduler has not handled yet:
#: call id -> (attempt, 0 = whichever is resident; reason). Written by the reader thread,
#: taken by the main thread; each single dict operation is atomic under the GIL.
CANCEL_REQUESTS: Final[dict[str, tuple[int, str]]] = {}


def note_cancel_request(call_id: str, attempt_seq: int, reason: str) -> None:
    """Reader thread: a ``CancelCall`` for ``call_id`` arrived. Note it and raise SIGALRM
    in the main thread, so a call stuck in pure CPU work ends now rather than never."""
    CANCEL_REQUESTS[call_id] = (attempt_seq, reason)
    if _getsignal(signal.SIGALRM) is on_deadline_signal:
        _thread.interrupt_main(signal.SIGALRM)


def take_cancel_request(call_id: str) -> None:
    """Scheduler thread: the ``CancelCall`` of ``call_id`` is being handled."""
    CANCEL_REQUESTS.pop(call_id, None)


def on_deadline_signal(signum: int, frame: Any) -> None:
    """SIGALRM: end a call stuck in pure CPU work once its budget really expired, or once
    a ``CancelCall`` names it (:func:`note_cancel_request`)."""
    ctx = running.ctx
    if ctx is None or ctx.state is not ExecState.RUNNING or ctx.greenlet is not getcurrent():
        return
    if CANCEL_REQUESTS:
        request = CANCEL_REQUESTS.get(ctx.call_id)
        if request is not None and (request[0] == 0 or request[0] == ctx.attempt_seq):
            del CANCEL_REQUESTS[ctx.call_id]
            if ctx.cancel_reason is None:
                ctx.cancel_reason = request[1]
            raise termination_exception(ctx.cancel_reason, retryable=ctx.cancel_retryable)
    reason = ctx.deadline_expired_reason()
    if reason is None:
        # Armed for an earlier call of this pass (or the budget moved): aim at this
        # call's own expiry rather than waiting for the next interval tick.
        remaining = ctx.remaining_s()
        if remaining is not None:
            signal.setitimer(
                signal.ITIMER_REAL, min(max(remaining, 0.001), MAX_TIMER_S), ALARM_INTERVAL_S
            )
        return
    if PAUSE_CLOCK.stale(time.monotonic()):
        # The watchdog's ticks stopped: the process may have been stopped (SIGSTOP), and
        # SIGCONT's handler, which credits that time back, runs just after this one. Hold
        # fire for one interval; a C call that held the GIL is judged at the next tick.
        signal.setitimer(signal.ITIMER_REAL, ALARM_INTERVAL_S, ALARM_INTERVAL_S)
        return
    raise DeadlineSignalExpired(reason, used_ms=ctx.budget_used_ms(), budget_ms=ctx.budget_ms)


class DeadlineAlarm:
    """The process's ``ITIMER_REAL``, armed for the running call's budget.

    ``enabled``: the handler was installed (main thread only). ``ready``: it is
    still ours (checked by :meth:`refresh`); the alarm is armed only when ready.
    ``due``: the monotonic time the armed timer fires; ``math.inf`` = disarmed.
    """

    __slots__ = ("_previous_handler", "due", "enabled", "ready")

    def __init__(self) -> None:
        self.enabled = threading.current_thread() is threading.main_thread()
        self._previous_handler: Any = None
        if self.enabled:
            self._previous_handler = signal.signal(signal.SIGALRM, on_deadline_signal)
        self.ready = self.enabled
        self.due = math.inf

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else "ready" if self.ready else "not ours"
        armed = "disarmed" if self.due == math.inf else f"due at {self.due:.3f}"
        return f"DeadlineAlarm({state}, {armed})"

    def refresh(self) -> None:
        """Re-check that SIGALRM is still ours (someone else may have taken it)."""
        if self.enabled:
            self.ready = _getsignal(signal.SIGALRM) is on_deadline_signal

    def arm(self, due: float, now: float) -> None:
        """Make sure SIGALRM fires by ``due`` (monotonic seconds): when the call about
        to run would overrun its budget or deadline (``ExecContext.expires_at``, computed
        by the scheduler as the slice starts at ``now``). Call only when :attr:`ready`.
        """
        # Earlier than the armed expiry, or that one already fired (the timer is then
        # only ticking every ALARM_INTERVAL_S): aim at this call's expiry.
        if due < self.due or self.due <= now:
            # Bounded: setitimer raises OverflowError past ~292 years, and a timer that
            # fires early only finds the budget not yet spent and re-aims.
            remaining = min(max(due - now, 0.001), MAX_TIMER_S)
            signal.setitimer(signal.ITIMER_REAL, remaining, ALARM_INTERVAL_S)
            self.due = now + remaining

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
        self.due = math.inf

    def restore(self) -> None:
        """Disarm and put the previous SIGALRM handler back, if ours is still installed.

        The alarm stays disabled afterwards. Idempotent.
        """
        if self.enabled and _getsignal(signal.SIGALRM) is on_deadline_signal:
            self.disarm()
            previous = self._previous_handler
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        self.enabled = self.ready = False

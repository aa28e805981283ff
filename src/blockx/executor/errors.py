"""The executor's own errors, split by who they are aimed at.

* **Framework signals** — :class:`CallCancelledError` and
  :class:`CallDeadlineExceededError` end a call from inside its greenlet. They
  derive from :class:`BaseException` so a user's ``except Exception`` does not
  swallow them; each carries the terminal ``errorKind`` and ``retryable`` flag
  the call ends with. They are raised at safe points (``ExecContext.check_safe_point``),
  thrown into a suspended greenlet (cancel, attempt replacement, transport loss),
  raised by the ``SIGALRM`` handler (:class:`DeadlineSignalExpired`) or by a
  wait on the worker that outlasted the budget (:class:`WaitDeadlineExceededError`).
* **Admission refusals** — :class:`AdmissionError` and its subclasses: an
  ``ExecuteCall`` the runtime will not run. They become one ``CallFailed`` for
  that call; nothing else is affected.
* **Loading failures** — :class:`UserCodeError`: the user's module does not
  compile, or has no entry function. Reported as ``user_error``.
* **Start-up** — :class:`SessionConnectError`: the worker's socket could not be
  reached (``python -m blockx.executor`` exits non-zero).

Errors that user code may catch on purpose (a failed IO, a failed sub-call)
are the ``RemoteCallError`` family, defined here and raised (and re-exported) by
:mod:`blockx.executor.sdk_bridge`.
"""

from __future__ import annotations

import re
from typing import Final

from blockx.wire import keys

__all__ = [
    "REASON_ATTEMPT_REPLACED",
    "REASON_BUDGET_EXHAUSTED",
    "REASON_CALL_TIMEOUT",
    "REASON_DEADLINE_PASSED",
    "REASON_EXECUTOR_SHUTDOWN",
    "REASON_TRANSPORT_LOST",
    "AdmissionError",
    "CallCancelledError",
    "CallDeadlineExceededError",
    "DeadlineSignalExpired",
    "ExecutorCapacityExhausted",
    "ExecutorClosedError",
    "FunctionCodeFetchError",
    "InvalidExecuteCall",
    "NoEntryFunctionError",
    "RemoteCallError",
    "RemoteIOError",
    "SessionConnectError",
    "SubcallCycleDetectedError",
    "SubcallDepthExceededError",
    "SubcallFailedError",
    "SubcallParentNotResident",
    "UserCodeError",
    "UserCodeSyntaxError",
    "WaitDeadlineExceededError",
    "chain_subcall_error",
    "termination_exception",
]

#: ``cancel_reason`` of an attempt replaced by a newer one: ends without a terminal frame.
REASON_ATTEMPT_REPLACED: Final = "attempt_replaced"
#: ``cancel_reason`` after the connection to the worker is gone: ends without a frame.
REASON_TRANSPORT_LOST: Final = "transport_lost"
#: The local timeout latch: the call ends as ``deadline_exceeded``, not ``cancelled``.
REASON_CALL_TIMEOUT: Final = "call_timeout"
#: ``cancel_reason`` prefix used by :meth:`ExecutorRuntime.shutdown`.
REASON_EXECUTOR_SHUTDOWN: Final = "executor_shutdown"
#: Why ``ExecContext.deadline_expired_reason`` ends a call: the budget is used up ...
REASON_BUDGET_EXHAUSTED: Final = "budget_exhausted"
#: ... or the absolute deadline (the local call-timeout latch) passed.
REASON_DEADLINE_PASSED: Final = "deadline_passed"


# --- framework signals (BaseException: user `except Exception` cannot stop them) ---


class CallCancelledError(BaseException):
    """The call was cancelled (CancelCall, shutdown, replacement, transport loss).

    ``error_kind`` is the terminal ``errorKind``: ``cancelled`` for a cancel,
    ``transport_lost`` when the connection is gone. ``suppress_terminal`` is
    True when no terminal frame may be sent (attempt replaced, transport lost).
    """

    #: How the last line of the user's traceback names it (not the internal class path).
    display_name: str = "Cancelled"

    def __init__(
        self,
        reason: str,
        *,
        error_kind: str = keys.ERR_CANCELLED,
        retryable: bool = False,
    ) -> None:
        super().__init__(f"call cancelled: {reason}")
        self.reason = reason
        self.error_kind = error_kind
        self.retryable = retryable

    @property
    def suppress_terminal(self) -> bool:
        return self.reason in (REASON_ATTEMPT_REPLACED, REASON_TRANSPORT_LOST)


class CallDeadlineExceededError(BaseException):
    """The call used up its budget (or hit its deadline). Ends as ``deadline_exceeded``."""

    error_kind: str = keys.ERR_DEADLINE_EXCEEDED
    retryable: bool = False
    #: How the last line of the user's traceback names it (not the internal class path).
    display_name: str = "DeadlineExceeded"

    def __init__(self, reason: str, *, used_ms: float = 0.0, budget_ms: int = 0) -> None:
        if reason == REASON_BUDGET_EXHAUSTED and budget_ms:
            text = (
                f"call budget of {budget_ms} ms used up: {used_ms:.1f} ms of CPU, sleeps, IO "
                "and sub-calls"
            )
        elif reason == REASON_DEADLINE_PASSED:
            text = "call deadline passed"
            if budget_ms:
                text += f": used {used_ms:.1f} ms of a {budget_ms} ms budget"
        elif budget_ms:
            text = f"call {reason}: used {used_ms:.1f} ms of a {budget_ms} ms budget"
        else:
            text = f"call {reason}"
        super().__init__(text)
        self.reason = reason
        self.used_ms = used_ms
        self.budget_ms = budget_ms


class DeadlineSignalExpired(CallDeadlineExceededError):
    """Raised by the ``SIGALRM`` handler into a call stuck in pure CPU work."""


class WaitDeadlineExceededError(CallDeadlineExceededError):
    """An IO or sub-call wait outlasted the call's budget (or its deadline): the
    executor cut it off instead of waiting for an answer that could only come late.

    ``waited_ms``: how long the wait lasted (charged to the budget);
    ``request_id``: the ``requestId`` whose late answer will be dropped;
    ``waiting_on``: what the call waited for (``IO blockdb.get_row``,
    ``sub-call pricer``), filled in by the SDK entry point the wait came from.
    """

    def __init__(
        self,
        reason: str,
        *,
        used_ms: float,
        budget_ms: int,
        waited_ms: int,
        request_id: str,
        waiting_on: str = "",
    ) -> None:
        super().__init__(reason, used_ms=used_ms, budget_ms=budget_ms)
        self.waited_ms = waited_ms
        self.request_id = request_id
        self.waiting_on = waiting_on

    def __str__(self) -> str:
        what = self.waiting_on or "the worker"
        where = f"after waiting {self.waited_ms} ms on {what} (request {self.request_id})"
        if self.reason == REASON_BUDGET_EXHAUSTED:
            return f"call budget of {self.budget_ms} ms ran out {where}: used {self.used_ms:.1f} ms"
        text = f"call deadline passed {where}"
        if self.budget_ms:
            text += f": used {self.used_ms:.1f} ms of a {self.budget_ms} ms budget"
        return text


def termination_exception(reason: str, *, retryable: bool = False) -> BaseException:
    """The exception that ends a call whose ``cancel_reason`` is ``reason``."""
    if reason == REASON_CALL_TIMEOUT:
        return CallDeadlineExceededError(REASON_CALL_TIMEOUT)
    if reason == REASON_TRANSPORT_LOST:
        return CallCancelledError(
            reason,
            error_kind=keys.ERR_TRANSPORT_LOST,
            retryable=keys.RETRYABLE_BY_DEFAULT[keys.ERR_TRANSPORT_LOST],
        )
    return CallCancelledError(reason, retryable=retryable)


# --- admission refusals -------------------------------------------------------------


class AdmissionError(Exception):
    """An ExecuteCall the runtime refuses; answered with one ``CallFailed``."""

    error_kind: str = keys.ERR_INTERNAL_ERROR
    retryable: bool = False


class ExecutorCapacityExhausted(AdmissionError):
    """A top-level call arrived while ``inflight >= max_inflight``."""

    error_kind = keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED
    retryable = True


class SubcallParentNotResident(AdmissionError):
    """A sub-call whose parent context is not resident in this executor."""

    error_kind = keys.ERR_SUBCALL_PARENT_NOT_RESIDENT
    retryable = False


class ExecutorClosedError(AdmissionError):
    """An ExecuteCall that arrived after :meth:`ExecutorRuntime.shutdown` began."""

    error_kind = keys.ERR_EXECUTOR_CAPACITY_EXHAUSTED
    retryable = True


class InvalidExecuteCall(AdmissionError):
    """An ExecuteCall whose payload misses a key or has a wrong type (the peer's fault).

    ``task_id`` / ``attempt_seq`` are what the payload said, where it said it
    validly (else ``""`` / 1): the ``CallFailed`` echoes them.
    """

    error_kind = keys.ERR_PROTOCOL_ERROR  # the worker's bug: the same frame fails again
    retryable = False

    def __init__(self, message: str, *, task_id: str = "", attempt_seq: int = 1) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.attempt_seq = attempt_seq


# --- loading the user's module ------------------------------------------------------


class UserCodeError(Exception):
    """The user's module cannot give an entry function. Reported as ``user_error``."""

    error_kind: str = keys.ERR_USER_ERROR
    retryable: bool = False


class UserCodeSyntaxError(UserCodeError):
    """The module does not compile. ``lineno`` / ``offset`` locate the error (1-based)."""

    def __init__(self, error: SyntaxError) -> None:
        where = f"line {error.lineno}, column {error.offset}"
        super().__init__(f"SyntaxError: {error.msg} ({error.filename}, {where})")
        self.syntax_error = error
        self.lineno = error.lineno
        self.offset = error.offset


class NoEntryFunctionError(UserCodeError):
    """The module defines no function the entry rules can pick."""


# --- the RemoteCallError family: waits that failed, for user code to catch -----------
# (re-exported by .sdk_bridge, which raises them; here, in a module that stays pure
# Python, they are ordinary exception classes: a mypyc-compiled class would reject
# attributes user code sets on them, and their class-level overrides.)


class RemoteCallError(Exception):
    """A wait the worker answered with ``ResumeCall.error``.

    ``kind`` / ``message`` / ``retryable`` are the remote error's fields.
    ``error_kind`` is the ``errorKind`` the call fails with when user code does
    not catch this exception.
    """

    error_kind_override: str | None = None

    def __init__(self, kind: str, message: str = "", retryable: bool = False) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind
        self.message = message
        self.retryable = retryable

    @property
    def error_kind(self) -> str:
        return self.error_kind_override or self.kind


class RemoteIOError(RemoteCallError):
    """An IO wait (read, write, capability) failed; uncaught, the call fails with ``kind``."""


class SubcallFailedError(RemoteCallError):
    """The child call failed. ``kind`` is the child's ``errorKind``; uncaught, the
    caller fails as ``subcall_failed`` with the child's ``retryable`` flag."""

    error_kind_override = keys.ERR_SUBCALL_FAILED

    @property
    def child_error_kind(self) -> str:
        return self.kind


class SubcallDepthExceededError(RemoteCallError):
    """The worker refused the sub-call: the call chain is too deep."""

    error_kind_override = keys.ERR_SUBCALL_DEPTH_EXCEEDED


class SubcallCycleDetectedError(RemoteCallError):
    """The worker refused the sub-call: its callKey is already in the ancestry."""

    error_kind_override = keys.ERR_SUBCALL_CYCLE_DETECTED


#: A sub-call failure's message that already carries its chain of functions (made by
#: :func:`chain_subcall_error` one level down): ``SubcallFailedError: b → a: user_error: ...``.
_CHAINED_RE: Final = re.compile(r"Subcall\w*Error: ((?:\S+ → )+\S+): (.*)", re.DOTALL)


def chain_subcall_error(exc: RemoteCallError, caller: str, callee: str) -> None:
    """Give a sub-call error raised in ``caller`` (calling ``callee``) the chain of
    functions instead of one more prefix per level: its text becomes
    ``caller → callee → ...: <innermost kind>: <innermost message>`` (``kind`` and
    ``retryable`` unchanged)."""
    match = _CHAINED_RE.fullmatch(exc.message)
    if match is not None:
        chain, inner = f"{caller} → {match.group(1)}", match.group(2)
    else:
        chain, inner = f"{caller} → {callee}", f"{exc.kind}: {exc.message}"
    exc.message = f"{chain}: {inner}"
    exc.args = (exc.message,)


class FunctionCodeFetchError(RemoteCallError):
    """The module's source could not be fetched or did not match its digest."""

    error_kind_override = keys.ERR_FUNCTION_CODE_FETCH_FAILED


# --- start-up -----------------------------------------------------------------------


class SessionConnectError(ConnectionError):
    """The worker's socket could not be reached within the connect timeout.

    Defined here, not in :mod:`.uds_session` (which re-exports it), so that module
    holds no exception subclass and compiles with mypyc.
    """

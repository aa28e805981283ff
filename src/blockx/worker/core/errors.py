"""The dispatcher core's exceptions: one hierarchy, split by whose fault it is.

Theory of operation
-------------------
The core raises for exactly two reasons:

* :class:`DispatcherUsageError` -- the caller (the worker runtime) misused the
  core: a bad config or policy, a task id committed twice, a stream batch beyond
  the credit window, a handler entered while another one runs. The call that
  raised changed nothing; fix the caller.
* :class:`DispatcherInvariantError` -- the core found its own state impossible
  (a bug). It is raised before the offending mutation, so the state it leaves
  is the one before the call.

Peers cannot make the core raise. Whatever an executor reports -- a late, a
duplicate or a stale completion, a sub-call request from a replaced attempt --
arrives as an event, is judged against the call's state and is either applied
or dropped and counted (``DispatcherCore.stats.stale_events``). IO outcomes come
in as events too (``handle_bind_failed``, ``handle_attempt_failure`` with
``resume_send_failed``), never as exceptions.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CreditWindowExceededError",
    "DispatcherError",
    "DispatcherInvariantError",
    "DispatcherUsageError",
    "DuplicateTaskError",
    "InvalidCallSpecError",
    "InvalidTransitionError",
    "MissingFunctionDigestError",
    "PhaseStateError",
    "ReentrantCallError",
    "StreamStateError",
    "UnknownTaskError",
]


class DispatcherError(Exception):
    """Base of every exception the dispatcher core raises."""


class DispatcherUsageError(DispatcherError):
    """The caller misused the core; the failed call changed no state."""


class ConfigError(DispatcherUsageError, ValueError):
    """A ``DispatcherConfig`` or ``CallRetryPolicy`` field has a bad value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"{field} {reason}, got {value!r}")
        self.field = field
        self.value = value
        self.reason = reason


class InvalidCallSpecError(DispatcherUsageError, ValueError):
    """A call given for registration is malformed (e.g. args not bytes)."""

    def __init__(self, task_id: str, index: int, reason: str) -> None:
        super().__init__(f"task {task_id!r} call #{index}: {reason}")
        self.task_id = task_id
        self.index = index
        self.reason = reason


class MissingFunctionDigestError(DispatcherUsageError, KeyError):
    """A call names a function whose code digest was not resolved."""

    def __init__(self, task_id: str, function_id: str) -> None:
        super().__init__(f"task {task_id!r}: no code digest for function {function_id!r}")
        self.task_id = task_id
        self.function_id = function_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class UnknownTaskError(DispatcherUsageError, KeyError):
    """The task id is not registered (never committed, or already converged)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"unknown task {task_id!r}")
        self.task_id = task_id

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateTaskError(DispatcherUsageError):
    """A call phase or stream was committed for a task id that is still live."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} already has a live call phase")
        self.task_id = task_id


class StreamStateError(DispatcherUsageError):
    """A stream entry point was used on a task that is not an open stream."""

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id!r}: {reason}")
        self.task_id = task_id
        self.reason = reason


class PhaseStateError(DispatcherUsageError):
    """A one-shot chunk was committed to a task that is not a one-shot phase still
    being registered, or with more calls than the phase has left to register."""

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id!r}: {reason}")
        self.task_id = task_id
        self.reason = reason


class CreditWindowExceededError(DispatcherUsageError):
    """A stream batch was committed while every credit was outstanding.

    The producer must wait for a ``BatchSettled`` before committing again.
    """

    def __init__(self, task_id: str, outstanding: int, limit: int) -> None:
        super().__init__(f"task {task_id!r}: {outstanding} batches outstanding, window is {limit}")
        self.task_id = task_id
        self.outstanding = outstanding
        self.limit = limit


class ReentrantCallError(DispatcherUsageError, RuntimeError):
    """A core entry point was entered while another one was running.

    The core has a single writer (the dispatch actor); this is raised when a
    second caller -- another thread, or a command executor calling back into
    the core before the handler returned -- breaks that rule.
    """

    def __init__(self, method: str, running: str) -> None:
        super().__init__(f"DispatcherCore.{method} entered while {running} is running")
        self.method = method
        self.running = running


class DispatcherInvariantError(DispatcherError, AssertionError):
    """The core's state broke one of its own invariants (a bug in the core)."""


class InvalidTransitionError(DispatcherInvariantError):
    """A call context was asked to move along an edge the state table lacks."""

    def __init__(self, call_id: str, current: str, target: str) -> None:
        super().__init__(f"call {call_id!r}: no transition {current} -> {target}")
        self.call_id = call_id
        self.current = current
        self.target = target

"""The Worker Python API's values: what a task is, and what running it gives back.

::

    from blockx.worker import Call, Task, TaskPolicy, Worker

    task = Task(
        functions={"adder": "def _(p):\\n    return {'y': p['x'] + 1}\\n"},
        calls=[Call("adder", {"x": i}) for i in range(1000)],
        policy=TaskPolicy(max_attempts=3, failure="continue"),
    )
    async with Worker() as worker:
        result = await worker.run_task(task)
    result.outputs      # [{'y': 1}, {'y': 2}, ...] in call order
    result.errors       # [CallFailure(index=..., kind='user_error', ...), ...]
    result.stats        # TaskStats(calls=1000, succeeded=1000, ..., calls_per_s=...)

A task's ``calls`` is either a list/tuple (a *one-shot* task: one call phase,
outputs in call order; registered chunk by chunk so that a long list does not
hold the event loop, see :mod:`blockx.worker.actor.one_shot`) or any other
iterable or async iterable (a *stream*: registered in batches of
``StreamBuild.BatchMaxRows`` under the
``MaxOutstandingBatches`` credit window; :meth:`TaskHandle.rows
<blockx.worker.app.TaskHandle.rows>` yields its rows as batches settle, so
memory stays flat however long the stream).

Rows: a call returning a ``dict`` gives one row, a ``list`` one row per item,
``None`` none (any other value is one row as it is).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Literal

from blockx.worker.config import MAX_DURATION_MS
from blockx.worker.core import CallRetryPolicy, FailurePolicy

if TYPE_CHECKING:
    from blockx.worker.io import IOHandler

__all__ = [
    "FLUSH",
    "Call",
    "CallBatch",
    "CallFailure",
    "Task",
    "TaskFailureInfo",
    "TaskPolicy",
    "TaskResult",
    "TaskSpec",
    "TaskSpecError",
    "TaskStats",
    "policy_problems",
]


class TaskSpecError(ValueError):
    """The task is malformed (unknown function in a one-shot call list, bad policy, ...).

    Raised by ``Worker.submit`` / ``run_task`` before anything runs (for a bad
    call past the first chunk of a long one-shot list, by ``TaskHandle.result``
    and ``run_task``: still before any call of the task is registered).
    """


@dataclass(frozen=True, slots=True)
class Call:
    """One call: a function of the task and its arguments.

    ``args`` follows the wire rule: a list is spread as positional arguments,
    anything else is the one argument (``Call("f", {"x": 1})`` runs ``f({"x": 1})``).
    """

    function_id: str
    args: Any = None


class CallBatch:
    """Several calls of a stream at once: ``(function_id, args)`` pairs, in call order.

    A streamed task's source may yield one in place of as many :class:`Call` items;
    the worker then checks and encodes the pairs in one loop instead of taking an item
    at a time (``blockx run`` yields one per chunk of its calls file: ~2 µs less per
    call). The calls are the same calls: batches of ``StreamBuild.BatchMaxRows`` calls
    are cut across ``CallBatch`` items as across ``Call`` items, and a failure report
    names a call's ``function_id`` and ``args`` alike. ``pairs`` is taken as it is, not
    copied: the source must not change it afterwards.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __repr__(self) -> str:
        return f"CallBatch({len(self.pairs)} calls)"


class _Flush:
    """The type of :data:`FLUSH` (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FLUSH"


#: An item of a streamed task's call source that is not a call: "commit the calls read
#: so far as a batch now". A stream's calls are sent to the executors a batch at a time
#: (``StreamBuild.BatchMaxRows`` calls, or the source's end); a source that is about to
#: wait for more calls (a service's task fed over HTTP) yields ``FLUSH`` first, so the
#: calls it has are not held back until a batch fills. Ignored when no call is pending.
FLUSH: Final = _Flush()


#: The values of ``TaskPolicy.failure``.
FAILURE_POLICIES: Final = ("fast_fail", "continue")
_DAY: Final = f"{MAX_DURATION_MS:,} (24 h)"
#: Integer fields of a policy: (least, greatest or None, what is expected). ``None`` is
#: always allowed: it takes the worker's configuration. Times are bounded to a day like
#: the worker's duration knobs: larger ones overflow the executors' timers.
POLICY_INTEGERS: Final[dict[str, tuple[int, int | None, str]]] = {
    "max_attempts": (1, None, "a positive integer"),
    "call_budget_ms": (0, MAX_DURATION_MS, f"an integer from 0 to {_DAY} (ms; 0 = unlimited)"),
    "base_backoff_ms": (0, MAX_DURATION_MS, f"an integer from 0 to {_DAY} (ms)"),
    "max_output_bytes": (1, None, "a positive integer (bytes)"),
    "deadline_ms": (
        1,
        MAX_DURATION_MS,
        f"an integer from 1 to {_DAY} (ms, the whole task's wall-clock limit)",
    ),
}


def policy_problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(field, what was expected)`` for every bad value among ``TaskPolicy`` fields.

    The one check of a task's policy: :class:`TaskPolicy` runs it when built, and the
    task-file checker (:func:`blockx.cli.taskfile_checks.check_policy`) runs it on the
    file's ``policy:`` section and only maps each line to its YAML path. Fields not in
    ``values`` are not checked; unknown names are the caller's concern.
    """
    problems: list[tuple[str, str]] = []
    for name, value in values.items():
        if name in POLICY_INTEGERS:
            least, greatest, expected = POLICY_INTEGERS[name]
            if value is None:
                continue
            if (
                type(value) is not int
                or value < least
                or (greatest is not None and value > greatest)
            ):
                problems.append((name, expected))
        elif name == "failure" and value not in FAILURE_POLICIES:
            problems.append((name, "fast_fail or continue"))
        elif name == "debug" and type(value) is not bool:
            problems.append((name, "true or false"))
    return problems


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPolicy:
    """How a task's calls are run. ``None`` fields take the worker's configuration."""

    #: Attempts per call (``CALL_RETRY_MAX_ATTEMPTS``, default 3).
    max_attempts: int | None = None
    #: ``fast_fail``: the first call that finally fails stops the task (calls in
    #: flight finish, the rest are cancelled) and the task fails.
    #: ``continue``: failures are listed and the task succeeds with the other outputs.
    failure: Literal["fast_fail", "continue"] = "fast_fail"
    #: Execution budget of every attempt in ms, 0 = unlimited (``CALL_DEADLINE_MS``).
    call_budget_ms: int | None = None
    #: Retry backoff base in ms (``CALL_RETRY_BASE_BACKOFF_MS``).
    base_backoff_ms: int | None = None
    #: Stop the task with ``OUTPUT_BYTES_EXCEEDED`` once its outputs pass this many
    #: bytes (``None``: the worker's ``MAX_COLLECTED_OUTPUT_BYTES``).
    max_output_bytes: int | None = None
    #: Capture each call's stdout/stderr (``TaskResult.debug_output``).
    debug: bool = False
    #: Wall-clock limit of the whole task in ms, from its admission (``None``: none). When
    #: it passes, the task is cancelled (``CANCELLED``, "task deadline ... passed"): the
    #: outer guard over calls that wait without spending budget (seed 000).
    deadline_ms: int | None = None

    def __post_init__(self) -> None:
        problems = policy_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            raise TaskSpecError(
                "; ".join(
                    f"policy.{name}: expected {expected}, got {getattr(self, name)!r}"
                    for name, expected in problems
                )
            )

    def core_policy(self) -> CallRetryPolicy:
        """The dispatcher core's form of this policy."""
        return CallRetryPolicy(
            max_attempts=self.max_attempts,
            base_backoff_ms=self.base_backoff_ms,
            failure=FailurePolicy(self.failure),
            call_budget_ms=self.call_budget_ms,
        )


def _new_task_id() -> str:
    return f"task-{uuid.uuid4().hex[:12]}"


@dataclass(kw_only=True)
class Task:
    """A set of functions and the calls to run (see the module docstring)."""

    #: ``{function_id: source or path}``; each source is a Python module with an entry
    #: ``def``. A value that is the path of a ``.py`` file (one line ending in ``.py``,
    #: or a ``pathlib.Path``; relative to the current directory) is read at construction
    #: and replaced by its source (:mod:`blockx.function_files`); a missing file raises
    #: :class:`TaskSpecError`.
    functions: Mapping[str, str]
    #: A list/tuple (one-shot) or any (async) iterable (stream) of :class:`Call`
    #: (or ``(function_id, args)`` pairs).
    calls: Sequence[Call] | Iterable[Call] | AsyncIterable[Call]
    #: Generated when not given (``task-<12 hex>``).
    task_id: str = field(default_factory=_new_task_id)
    #: Fairness key (tenant); tasks of one instance share its fair share.
    instance: str | None = None
    policy: TaskPolicy = field(default_factory=TaskPolicy)
    #: Answers this task's IO waits; default: the worker's ``io_handlers``.
    io_handler: IOHandler | None = None
    #: Audit every function before its first dispatch and run the accepted ones
    #: restricted; a rejected function's calls fail with ``audit_rejected``
    #: (``docs/security.md``). Use it for any code you did not write.
    audit: bool = False
    #: Resolve path values of ``functions`` (above). False: every value is source text --
    #: for a server building tasks from its clients' documents, whose strings must never
    #: name a file on the server.
    function_paths: bool = True

    def __post_init__(self) -> None:
        if self.function_paths and isinstance(self.functions, Mapping):
            self.functions = _read_function_paths(self.functions)

    @property
    def is_stream(self) -> bool:
        return not isinstance(self.calls, (list, tuple))


def _read_function_paths(functions: Mapping[str, Any]) -> Mapping[str, str]:
    """``functions`` with each path value replaced by its file's source (unchanged
    when no value is a path)."""
    from blockx.function_files import FunctionFileError, is_function_path, read_function_source

    if not any(
        isinstance(v, (str, os.PathLike)) and is_function_path(v) for v in functions.values()
    ):
        return functions
    resolved: dict[str, str] = {}
    for function_id, value in functions.items():
        if isinstance(value, (str, os.PathLike)) and is_function_path(value):
            try:
                resolved[function_id] = read_function_source(value, function_id=function_id)[0]
            except FunctionFileError as exc:
                raise TaskSpecError(str(exc)) from None
        else:
            resolved[function_id] = value
    return resolved


#: The task spec (the seed's name for it).
TaskSpec = Task


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFailure:
    """A call that finally failed (after its attempts), as the task result lists it."""

    #: Position of the call in the task's call list (or stream).
    index: int
    call_id: str
    function_id: str
    args: Any
    #: Error kind: ``user_error``, ``deadline_exceeded``, ``transport_lost``, ...
    kind: str
    message: str
    #: The user's traceback (user frames only), when the executor sent one.
    stack: str | None
    attempts: int
    retryable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFailureInfo:
    """Why a task failed: ``CALL_FAILED`` (fast-fail), ``CANCELLED``, ``OUTPUT_BYTES_EXCEEDED``."""

    kind: str
    message: str
    #: The call whose failure stopped the task (``CALL_FAILED``).
    call_index: int | None = None
    error_kind: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStats:
    """What running the task took."""

    calls: int
    succeeded: int
    failed: int
    cancelled: int
    #: Attempts beyond the first, over all calls.
    retries: int
    #: Calls answered from the task's call cache / by a running equal call.
    cache_hits: int
    singleflight_hits: int
    subcalls: int
    io_calls: int
    wall_time_s: float

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_time_s if self.wall_time_s > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskResult:
    """The outcome of one task."""

    task_id: str
    success: bool
    failure: TaskFailureInfo | None
    #: Rows in call order (one-shot). Empty when the rows were consumed through
    #: ``TaskHandle.rows()`` or dropped (``OUTPUT_BYTES_EXCEEDED``).
    outputs: list[Any]
    #: Every call that finally failed, by index.
    errors: list[CallFailure]
    stats: TaskStats
    #: Functions that could not run (syntax error, no entry ``def``), by id.
    code_errors: dict[str, str] = field(default_factory=dict)
    #: Captured stdout/stderr by call index (``policy.debug``).
    debug_output: dict[int, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        status = "ok" if self.success else f"FAILED({self.failure.kind if self.failure else '?'})"
        s = self.stats
        return (
            f"TaskResult({self.task_id!r}, {status}, rows={len(self.outputs)}, "
            f"calls={s.calls} ok={s.succeeded} failed={s.failed} cancelled={s.cancelled}, "
            f"{s.calls_per_s:,.0f} calls/s)"
        )

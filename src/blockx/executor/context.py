"""One call attempt's local record: :class:`ExecContext` and its :class:`ExecState`.

Theory of operation
-------------------
The runtime keeps one ``ExecContext`` per resident call attempt (keyed by
``callId``). Its state follows the seed's diagram::

    RUNNABLE ──switch──▶ RUNNING ──wait──▶ WAITING_IO / WAITING_SUBCALL /
                            │               WAITING_FUNCTION_CODE / WAITING_SLEEP
                            │                 │ (ResumeCall, leader wake-up, timer)
                            │                 └──▶ RUNNING (on the next switch)
                            └──return / exception / cancel / deadline──▶ DONE

A resumed context does not go back to ``RUNNABLE``: ``resume_payload`` is set
and ``queued`` says it sits in a run queue; the state turns ``RUNNING`` when
the scheduler switches into it. ``RUNNABLE`` therefore only means "admitted,
never run". A ``DONE`` context is removed from the table at once.

Budget accounting (docs/protocol.md invariant 4: CPU + IO wait + sub-call + sleep,
never queueing): ``cpu_s`` sums the slices the scheduler ran the greenlet,
``wait_ms`` sums ``ResumeCall.budgetUsedMs`` of IO and sub-call waits,
``sleep_s`` sums cooperative sleeps. Time spent queued (``queue_wait_s``) is
reported but never charged. :meth:`ExecContext.deadline_expired_reason` is the
ONLY judge of expiry; everything else asks it.

Since the worker charges an IO wait to the budget, a wait that
outlasts what is left of it can only end in ``deadline_exceeded``: a budgeted
call's IO wait is cut off when the budget runs out (a sub-call's is not: it is
charged the child's own used budget, never the wall time, see
:data:`BUDGET_CUT_OFF_STATES`)
(:meth:`ExecContext.budget_runs_out_at`, timed by
:class:`~blockx.executor.timers.CallTimers`), an absolute deadline cuts it off
when it passes, and the time waited is charged as if the worker had answered
then (:data:`CUT_OFF_STATES`).

Who touches it: the scheduler (main thread) and the call's own greenlet; the
heartbeat thread only reads ``state`` and ``queued``.

Imports: this module imports nothing of the executor's but :mod:`.errors` and
:mod:`.local_reads` (a leaf: the read cache a context points at); the
bridge a context carries (for the ``time.sleep`` patch) is typed by the
:class:`SleepBridge` Protocol, so :mod:`.sdk_bridge`, which imports this module,
is not imported back.

:func:`current_context` answers "which call is running on this greenlet?" for
the SDK seam, the sleep patch and debug capture; it is None on any other
greenlet or thread.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
from greenlet import getcurrent

from blockx.wire.errors import PayloadError
from blockx.wire.keys import (
    ERR_INTERNAL_ERROR,
    FP_ANCESTRY,
    FP_ARGS,
    FP_ATTEMPT_SEQ,
    FP_AUDIT,
    FP_BUDGET_USED_MS,
    FP_CALL_BUDGET_MS,
    FP_CALL_KEY,
    FP_DEBUG,
    FP_ENTRY_SELECTOR,
    FP_ERROR,
    FP_ERROR_KIND_FIELD,
    FP_ERROR_MESSAGE_FIELD,
    FP_ERROR_RETRYABLE_FIELD,
    FP_FUNCTION_CODE_DIGEST,
    FP_FUNCTION_ID,
    FP_IMMUTABLE,
    FP_PARENT_CALL_ID,
    FP_RESULT,
    FP_RESULT_DATA,
    FP_RESUME_KIND,
    FP_TASK_ID,
    MT_EXECUTE_CALL,
    RETRYABLE_BY_DEFAULT,
    WAIT_FUNCTION_CODE,
    WAIT_IO,
    WAIT_SUBCALL,
)
from blockx.wire.messages import RemoteError, validate
from blockx.wire.schema import ExecuteCallPayload

from .errors import (
    REASON_BUDGET_EXHAUSTED,
    REASON_DEADLINE_PASSED,
    CallDeadlineExceededError,
    InvalidExecuteCall,
    termination_exception,
)

if TYPE_CHECKING:
    from greenlet import greenlet

    from .local_reads import TaskReads
    from .tracing import ExecuteSpan

__all__ = [
    "BUDGET_CUT_OFF_STATES",
    "CUT_OFF_STATES",
    "MAX_BUDGET_MS",
    "RESUME_KIND_BY_STATE",
    "WAITING_STATES",
    "DebugCapture",
    "ExecContext",
    "ExecState",
    "ResumePayload",
    "SleepBridge",
    "current_context",
    "running",
]


#: The largest budget (``callBudgetMs``) and wait charge (``budgetUsedMs``) taken as
#: given (30 days): a larger number is clamped to it, so no number a peer sends can
#: overflow a float or a timer (issue 15: one bad number must not crash-loop executors).
MAX_BUDGET_MS: Final = 30 * 24 * 3600 * 1000


class ExecState(enum.Enum):
    """The seed's states; the value is the name used in ``Heartbeat.callStateCounts``."""

    RUNNABLE = "RUNNABLE"
    RUNNING = "RUNNING"
    WAITING_IO = "WAITING_IO"
    WAITING_SUBCALL = "WAITING_SUBCALL"
    WAITING_FUNCTION_CODE = "WAITING_FUNCTION_CODE"
    WAITING_SLEEP = "WAITING_SLEEP"
    DONE = "DONE"

    # Members are singletons compared by identity: hash them in C, not with Enum's
    # Python-level __hash__ (one Python call per WAITING_STATES / RESUME_KIND_BY_STATE
    # lookup, i.e. per ResumeCall).
    __hash__ = object.__hash__


WAITING_STATES: Final = frozenset(
    {
        ExecState.WAITING_IO,
        ExecState.WAITING_SUBCALL,
        ExecState.WAITING_FUNCTION_CODE,
        ExecState.WAITING_SLEEP,
    }
)

#: The waits on the worker that are charged to the budget, and cut off when they
#: outlast the call's deadline (a code fetch is never charged; a sleep is
#: shortened to the budget up front).
CUT_OFF_STATES: Final = frozenset({ExecState.WAITING_IO, ExecState.WAITING_SUBCALL})

#: The waits also cut off when they outlast what is left of the *budget* in wall
#: time: IO only. A sub-call's wait is charged only the child's own ``budgetUsedMs``
#: (docs/protocol.md "Budgets"), never the wall time the caller spent suspended —
#: the child may queue behind a CPU-bound neighbour, and queueing is never charged.
#: The child's granted budget bounds it instead: it fails itself when that runs out.
BUDGET_CUT_OFF_STATES: Final = frozenset({ExecState.WAITING_IO})

#: The ``resumeKind`` a ResumeCall must carry for a context in each waiting state.
RESUME_KIND_BY_STATE: Final = {
    ExecState.WAITING_IO: WAIT_IO,
    ExecState.WAITING_SUBCALL: WAIT_SUBCALL,
    ExecState.WAITING_FUNCTION_CODE: WAIT_FUNCTION_CODE,
}


class ResumePayload:
    """A validated ResumeCall, handed to the waiting greenlet by ``switch``.

    ``error`` is the raw ``{"kind", "message", "retryable"}`` object (validated);
    ``result`` already holds the sidecar bytes under ``"data"`` when one came.
    ``resume_kind`` is None only for a payload too malformed to name one.
    """

    __slots__ = ("budget_used_ms", "error", "immutable", "result", "resume_kind")

    def __init__(
        self,
        resume_kind: str | None,
        result: Any,
        error: dict[str, Any] | None,
        budget_used_ms: int,
        immutable: bool = False,
    ) -> None:
        self.resume_kind = resume_kind
        self.result = result
        self.error = error
        self.budget_used_ms = budget_used_ms
        # The worker marked the answer as one that never changes (docs/protocol.md).
        self.immutable = immutable

    @classmethod
    def from_wire(cls, payload: Any, sidecar: bytes | None = None) -> ResumePayload:
        """Validate a ResumeCall payload. Never raises: a malformed one becomes an
        ``internal_error`` (retryable) delivered to the wait it answers."""
        if type(payload) is not dict:
            return cls.malformed(None, "payload must be an object")
        resume_kind = payload.get(FP_RESUME_KIND)
        if type(resume_kind) is not str:
            return cls.malformed(None, f"{FP_RESUME_KIND} must be a string")
        used = payload.get(FP_BUDGET_USED_MS, 0)
        if type(used) is not int or used < 0:
            return cls.malformed(resume_kind, f"{FP_BUDGET_USED_MS} must be an integer >= 0")
        if used > MAX_BUDGET_MS:
            used = MAX_BUDGET_MS  # more than any budget: the wait used it all up
        error = payload.get(FP_ERROR)
        if error is not None:
            try:
                RemoteError.from_wire(error)
            except PayloadError as exc:
                return cls.malformed(resume_kind, str(exc))
            return cls(resume_kind, None, error, used)
        result = payload.get(FP_RESULT)
        if sidecar is not None:
            if result is None:
                result = {}
            elif type(result) is not dict:
                return cls.malformed(resume_kind, "a sidecar needs an object result")
            result[FP_RESULT_DATA] = sidecar
            return cls(resume_kind, result, None, used)  # never kept: the bytes are not JSON
        return cls(resume_kind, result, None, used, payload.get(FP_IMMUTABLE) is True)

    def charged_ms(self) -> int:
        """What this resume charges to the call's budget: its ``budgetUsedMs``, except
        for a code fetch (never charged)."""
        return 0 if self.resume_kind == WAIT_FUNCTION_CODE else self.budget_used_ms

    @classmethod
    def malformed(cls, resume_kind: str | None, problem: str) -> ResumePayload:
        error = {
            FP_ERROR_KIND_FIELD: ERR_INTERNAL_ERROR,
            FP_ERROR_MESSAGE_FIELD: f"malformed ResumeCall: {problem}",
            FP_ERROR_RETRYABLE_FIELD: RETRYABLE_BY_DEFAULT[ERR_INTERNAL_ERROR],
        }
        return cls(resume_kind, None, error, 0)

    def __repr__(self) -> str:
        outcome = f"error={self.error!r}" if self.error is not None else "result"
        return f"ResumePayload({self.resume_kind}, {outcome}, budgetUsedMs={self.budget_used_ms})"


class DebugCapture:
    """What one debug call wrote to stdout/stderr, bounded to ``limit`` characters."""

    __slots__ = ("_chunks", "_size", "limit", "truncated")

    DEFAULT_LIMIT: Final = 1 << 20

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._chunks: list[str] = []
        self._size = 0
        self.limit = limit
        self.truncated = 0  # characters dropped past the limit

    def write(self, text: str) -> None:
        room = self.limit - self._size
        if len(text) > room:
            self.truncated += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        if text:
            self._chunks.append(text)
            self._size += len(text)

    def getvalue(self) -> str:
        text = "".join(self._chunks)
        if self.truncated:
            text += f"\n…[debug output truncated: {self.truncated} more characters]"
        return text

    def __repr__(self) -> str:
        return f"DebugCapture({self._size} chars, truncated={self.truncated})"


class SleepBridge(Protocol):
    """A context's ``bridge`` (``sdk_bridge.SdkBridge``), as the global ``time.sleep``
    patch reaches it through the running context. A Protocol: the bridge module
    imports this one, so this one does not import it (no cycle, even for typing)."""

    def do_sleep(self, seconds: float) -> None: ...


class _Running:
    """The context whose greenlet the scheduler switched into (None between switches)."""

    __slots__ = ("ctx",)

    def __init__(self) -> None:
        self.ctx: ExecContext | None = None


#: Set by the scheduler around every switch; read through :func:`current_context`.
running: Final = _Running()


def current_context() -> ExecContext | None:
    """The call running on the current greenlet, or None (other greenlet or thread)."""
    ctx = running.ctx
    if ctx is not None and ctx.greenlet is getcurrent():
        return ctx
    return None


def _is_str_list(value: Any) -> bool:
    if type(value) is not list:
        return False
    for item in value:  # a loop, not all(<genexpr>): no generator per sub-call
        if type(item) is not str:
            return False
    return True


def _execute_call_defaults() -> dict[str, Any]:
    """What each ExecuteCall payload key means when it is left out: the wire schema's
    default (:class:`~blockx.wire.schema.ExecuteCallPayload`), None for a required key
    (the type check refuses it), ``()`` for an empty-list default (no list shared)."""
    defaults: dict[str, Any] = {}
    for member in msgspec.structs.fields(ExecuteCallPayload):
        if member.required:
            default: Any = None
        elif member.default_factory is list:
            default = ()
        else:
            default = member.default
        defaults[member.encode_name] = default
    return defaults


_EXECUTE_CALL_DEFAULTS: Final = _execute_call_defaults()


class ExecContext:
    """One call attempt. Built by :meth:`from_execute_call`; owned by ``ExecutorRuntime``."""

    __slots__ = (
        "admitted_at",
        "ancestry",
        "args",
        "attempt_seq",
        "audit",
        "blackbox_record",
        "bridge",
        "budget_ms",
        "call_id",
        "call_key",
        "cancel_reason",
        "cancel_retryable",
        "clock",
        "code_fetch_follower",
        "cpu_s",
        "deadline_at",
        "debug_capture",
        "enqueued_at",
        "entry_selector",
        "execute_span",
        "expires_at",
        "finished",
        "function_code_digest",
        "function_id",
        "greenlet",
        "local_hits",
        "local_reads",
        "parent_call_id",
        "pending_request_id",
        "queue_wait_s",
        "queued",
        "resume_payload",
        "sleep_s",
        "sleep_token",
        "slice_started",
        "stale",
        "state",
        "suppress_terminal_emit",
        "suspended_at",
        "task_id",
        "wait_ms",
        "wait_timer_due",
    )

    def __init__(
        self,
        call_id: str,
        task_id: str,
        function_id: str,
        function_code_digest: str,
        clock: Callable[[], float],
        entry_selector: str = "",
        args: Any = None,
        parent_call_id: str | None = None,
        call_key: str = "",
        ancestry: Sequence[str] = (),
        budget_ms: int = 0,
        attempt_seq: int = 1,
        audit: dict[str, Any] | None = None,
        debug: bool = False,
    ) -> None:
        self.call_id = call_id
        # What the black box writes for this call, packed at its first switch (if kept).
        self.blackbox_record: tuple[bytes, int] | None = None
        self.task_id = task_id
        self.function_id = function_id
        self.function_code_digest = function_code_digest
        self.entry_selector = entry_selector
        self.args = args
        self.parent_call_id = parent_call_id
        self.call_key = call_key
        self.ancestry = ancestry
        self.budget_ms = budget_ms  # 0 = unlimited
        self.attempt_seq = attempt_seq
        self.audit = audit
        self.debug_capture: DebugCapture | None = DebugCapture() if debug else None
        # Scheduling. Invariant: queued is True iff this context sits (live) in a run queue.
        self.state = ExecState.RUNNABLE
        self.queued = False
        self.resume_payload: Any = None
        self.cancel_reason: str | None = None
        self.cancel_retryable = False
        self.stale = False
        self.suppress_terminal_emit = False
        self.finished = False  # the terminal outcome was decided (sent or suppressed)
        self.greenlet: greenlet | None = None
        self.bridge: SleepBridge | None = None  # set on admission (sdk_bridge.SdkBridge)
        # At most one pending request per context (docs/protocol.md invariant 2).
        self.pending_request_id: str | None = None
        self.code_fetch_follower = False  # WAITING_FUNCTION_CODE without a request of its own
        self.sleep_token = 0
        # Budget accounting, in the runtime's monotonic seconds (wait_ms: worker-reported ms).
        self.clock = clock
        now = clock()
        self.admitted_at = now
        self.enqueued_at = now
        self.cpu_s = 0.0
        self.sleep_s = 0.0
        self.wait_ms = 0
        self.slice_started = 0.0  # non-zero while the greenlet runs
        self.queue_wait_s = 0.0
        self.deadline_at: float | None = None  # the local call-timeout latch, if armed
        # When the budget (or the deadline) runs out if the running slice goes on: set by
        # the scheduler as each slice starts (inf: unlimited). Safe points compare the
        # clock with it and ask deadline_expired_reason, the judge, only once it passed.
        self.expires_at = math.inf
        self.suspended_at = 0.0  # when the last slice ended: the wait in progress began
        # The due time of this call's one live wait-limit timer (0.0: none; see timers.py).
        self.wait_timer_due = 0.0
        # The task's immutable-read cache (set on admission; None: off) and the reads it
        # answered for this attempt, per (backend, operation) (None: none yet).
        self.local_reads: TaskReads | None = None
        self.local_hits: dict[tuple[str, str], int] | None = None
        # The traced attempt's ``execute`` span (None: not traced; executor/tracing.py).
        self.execute_span: ExecuteSpan | None = None

    def local_hits_wire(self) -> dict[str, dict[str, int]] | None:
        """``localReadHits`` of this attempt's terminal frame: ``{backend: {operation: n}}``."""
        hits = self.local_hits
        if hits is None:
            return None
        wire: dict[str, dict[str, int]] = {}
        for (backend, operation), count in hits.items():
            wire.setdefault(backend, {})[operation] = count
        return wire

    @classmethod
    def from_execute_call(
        cls, call_id: str, payload: Any, *, clock: Callable[[], float]
    ) -> ExecContext:
        """Validate an ExecuteCall payload and build the context.

        Raises :class:`InvalidExecuteCall` naming the bad key (and carrying the
        ``taskId`` / ``attemptSeq`` it could read); nothing is kept.
        The common case is checked inline (no dataclass per frame); a failure
        is re-checked against the wire schema (:func:`blockx.wire.messages.validate`)
        for its message.
        """
        fields = payload
        while type(fields) is dict:
            # The worker writes every key: subscripts cost half of .get calls. A key
            # left out sends us round again with the defaults filled in.
            try:
                task_id = fields[FP_TASK_ID]
                function_id = fields[FP_FUNCTION_ID]
                digest = fields[FP_FUNCTION_CODE_DIGEST]
                entry_selector = fields[FP_ENTRY_SELECTOR]
                args = fields[FP_ARGS]
                parent_call_id = fields[FP_PARENT_CALL_ID]
                call_key = fields[FP_CALL_KEY]
                ancestry = fields[FP_ANCESTRY]
                budget_ms = fields[FP_CALL_BUDGET_MS]
                attempt_seq = fields[FP_ATTEMPT_SEQ]
                audit = fields[FP_AUDIT]
                debug = fields[FP_DEBUG]
            except KeyError:
                fields = {**_EXECUTE_CALL_DEFAULTS, **fields}
                continue
            if (
                type(task_id) is str
                and type(function_id) is str
                and type(digest) is str
                and type(entry_selector) is str
                and (parent_call_id is None or type(parent_call_id) is str)
                and type(call_key) is str
                and (ancestry == () or ancestry == [] or _is_str_list(ancestry))
                and type(budget_ms) is int
                and budget_ms >= 0
                and type(attempt_seq) is int
                and attempt_seq >= 1
                and (audit is None or type(audit) is dict)
                and type(debug) is bool
            ):
                if budget_ms > MAX_BUDGET_MS:
                    budget_ms = MAX_BUDGET_MS  # a huge budget is as good as this one
                return cls(  # positional: measurably cheaper on the per-call path
                    call_id,
                    task_id,
                    function_id,
                    digest,
                    clock,
                    entry_selector,
                    args,
                    parent_call_id,
                    call_key,
                    ancestry,
                    budget_ms,
                    attempt_seq,
                    audit,
                    debug,
                )
            break
        task_id, attempt_seq = "", 1
        if type(payload) is dict:
            if type(payload.get(FP_TASK_ID)) is str:
                task_id = payload[FP_TASK_ID]
            seq = payload.get(FP_ATTEMPT_SEQ)
            if type(seq) is int and seq >= 1:
                attempt_seq = seq
        raise InvalidExecuteCall(
            _describe_invalid_execute_call(payload), task_id=task_id, attempt_seq=attempt_seq
        )

    # --- budget and deadline: the one judge ----------------------------------------

    def budget_used_ms(self, now: float | None = None) -> float:
        """CPU (including the slice running now) + sleep + worker-reported wait time, in ms.

        ``now`` saves a clock read when the caller has one.
        """
        used = self.cpu_s + self.sleep_s
        if self.slice_started:
            used += (self.clock() if now is None else now) - self.slice_started
        return used * 1000.0 + self.wait_ms

    def budget_runs_out_at(self, since: float) -> float:
        """When the budget runs out if all time from ``since`` on is charged (monotonic
        seconds; budgeted calls only). ``since``: the start of the running slice, or,
        between slices, ``suspended_at`` (the slices, sleeps and waits before it are
        the ones already counted)."""
        return since + (self.budget_ms - self.wait_ms) / 1000.0 - self.cpu_s - self.sleep_s

    def wait_cut_off_at(self) -> float:
        """Until when the IO / sub-call wait in progress may last (between slices):
        until the budget runs out or the deadline passes, whichever comes first
        (``math.inf`` without either)."""
        cut = self.budget_runs_out_at(self.suspended_at) if self.budget_ms else math.inf
        deadline = self.deadline_at
        return deadline if deadline is not None and deadline < cut else cut

    def remaining_s(self, now: float | None = None) -> float | None:
        """Seconds left before expiry (budget or deadline, whichever is first); None = unlimited.

        ``now`` saves a clock read when the caller has one.
        """
        remaining: float | None = None
        if self.budget_ms:
            remaining = (self.budget_ms - self.budget_used_ms(now)) / 1000.0
        if self.deadline_at is not None:
            until_deadline = self.deadline_at - (self.clock() if now is None else now)
            if remaining is None or until_deadline < remaining:
                remaining = until_deadline
        return remaining

    def deadline_expired_reason(self) -> str | None:
        """Why this call may not continue, or None. The ONLY expiry judge.

        The budget (``callBudgetMs``: CPU + IO + sub-call + sleep) wins over the
        absolute deadline of the local call-timeout latch.
        """
        budget = self.budget_ms
        if budget:
            used = self.cpu_s + self.sleep_s
            started = self.slice_started
            if started:
                used += self.clock() - started
            if used * 1000.0 + self.wait_ms >= budget:
                return REASON_BUDGET_EXHAUSTED
        deadline = self.deadline_at
        if deadline is not None and self.clock() >= deadline:
            return REASON_DEADLINE_PASSED
        return None

    def raise_if_deadline_expired(self) -> None:
        """Safe point: raise :class:`CallDeadlineExceededError` when expired."""
        reason = self.deadline_expired_reason()
        if reason is not None:
            raise CallDeadlineExceededError(
                reason, used_ms=self.budget_used_ms(), budget_ms=self.budget_ms
            )

    def raise_if_cancelled(self) -> None:
        """Safe point: raise the exception matching ``cancel_reason`` when one is set."""
        if self.cancel_reason is not None:
            raise termination_exception(self.cancel_reason, retryable=self.cancel_retryable)

    def check_safe_point(self) -> None:
        """Cancellation first, then expiry. Called before the user function, around
        every wait, after sleep wakes and before return."""
        if self.cancel_reason is not None:
            raise termination_exception(self.cancel_reason, retryable=self.cancel_retryable)
        if (self.budget_ms or self.deadline_at is not None) and self.deadline_expired_reason():
            self.raise_if_deadline_expired()

    # --- reporting -----------------------------------------------------------------

    def log_fields(self) -> dict[str, Any]:
        """The call fields a log record about this call carries."""
        return {
            "callId": self.call_id,
            "taskId": self.task_id,
            "attemptSeq": self.attempt_seq,
            "functionId": self.function_id,
        }

    def __repr__(self) -> str:
        extra = ""
        if self.pending_request_id is not None:
            extra += f", pending={self.pending_request_id!r}"
        if self.queued:
            extra += ", queued"
        if self.cancel_reason is not None:
            extra += f", cancel={self.cancel_reason!r}"
        if self.stale:
            extra += ", stale"
        return (
            f"ExecContext({self.call_id!r}, attempt={self.attempt_seq}, "
            f"{self.state.value}, task={self.task_id!r}, fn={self.function_id!r}{extra})"
        )


def _describe_invalid_execute_call(payload: Any) -> str:
    """The precise reason an ExecuteCall payload was refused (slow path only)."""
    try:
        parsed = validate(ExecuteCallPayload, payload)
    except PayloadError as exc:
        return str(exc)
    if parsed.callBudgetMs < 0:
        return f"{MT_EXECUTE_CALL}: {FP_CALL_BUDGET_MS}: must be >= 0"
    if parsed.attemptSeq < 1:
        return f"{MT_EXECUTE_CALL}: {FP_ATTEMPT_SEQ}: must be >= 1"
    return f"{MT_EXECUTE_CALL}: malformed payload"

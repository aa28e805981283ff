"""SdkBridge: every SDK call becomes ``CallWaiting`` → suspend → ``ResumeCall``.

Theory of operation
-------------------
User code calls the SDK synchronously (``Table(...).get_row``, ``function.call``,
``time.sleep``). The provider forwards to this bridge, which runs on the call's
own greenlet:

1. :meth:`SdkBridge._perform_wait` — the ONLY suspend path for worker round
   trips — checks the safe point, takes a fresh ``requestId``, sends one
   ``CallWaiting``, records the pending request and switches to the scheduler.
   The scheduler switches back with the validated :class:`ResumePayload` when
   the matching ``ResumeCall`` arrives (or throws a framework exception into
   the greenlet to end the call). Back on the call's greenlet the wait's
   ``budgetUsedMs`` is charged, the safe point is checked again, and the result
   is returned or ``ResumeCall.error`` is raised as a :class:`RemoteCallError`.
   An IO wait of a call with a budget arms the runtime's wait
   timer (``BridgeHost.limit_wait``) for the moment the budget runs out: the
   worker charges the wait to the budget, so an answer that comes later can
   only end in ``deadline_exceeded``. When that moment (or the call's deadline)
   comes first, the runtime cuts the wait off and switches ``WAIT_CUT_OFF`` in:
   the time waited is charged and :class:`WaitDeadlineExceededError` ends the
   call, naming what it waited for. A sub-call's wait is charged only the
   child's own ``budgetUsedMs``, never the wall time this call spent suspended
   (the child may queue behind a CPU-bound neighbour: queueing is never
   charged); its granted budget bounds it, and only a deadline cuts it off.
2. :meth:`SdkBridge.do_sleep` suspends on a local timer: no frame is sent.
3. :meth:`SdkBridge.do_function_code_req` fetches a module's source by digest
   with a local singleflight: the first call missing a digest (the leader)
   sends ``CallWaiting(function_code)``; later ones (followers) wait in
   ``WAITING_FUNCTION_CODE`` without a request and are woken by the leader with
   its outcome. A leader that is cancelled hands the fetch to a follower.

Errors raised into user code are the :class:`RemoteCallError` family (plain
``Exception`` subclasses: user code may catch them). Uncaught, each fails the
call with its :attr:`RemoteCallError.error_kind` and ``retryable`` flag. A
backend may register its own IO error classes with :func:`register_io_error_kinds`.

Invariants: at most one pending ``requestId`` per context; a context whose
``cancel_reason`` is set never suspends again (the safe point re-raises, so
user code that swallowed a cancellation cannot wait its way back to life).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from greenlet import getcurrent

from blockx.sdk.runtime import NoProviderError
from blockx.wire import encode_frame
from blockx.wire.frames import encode_frame_with_value
from blockx.wire.keys import (
    ERR_DEADLINE_EXCEEDED,
    ERR_FUNCTION_CODE_FETCH_FAILED,
    ERR_INTERNAL_ERROR,
    ERR_SUBCALL_CYCLE_DETECTED,
    ERR_SUBCALL_DEPTH_EXCEEDED,
    F_CALL_ID,
    F_EXECUTOR_ID,
    F_MESSAGE_TYPE,
    F_PAYLOAD,
    F_REQUEST_ID,
    FP_ANCESTRY,
    FP_ARGS,
    FP_ATTEMPT_SEQ,
    FP_BACKEND,
    FP_CACHE_KEY,
    FP_ERROR_KIND_FIELD,
    FP_ERROR_MESSAGE_FIELD,
    FP_ERROR_RETRYABLE_FIELD,
    FP_FUNCTION_CODE_DIGEST,
    FP_FUNCTION_ID,
    FP_GRANTED_BUDGET_MS,
    FP_IO_KIND,
    FP_OPERATION,
    FP_PARAMS,
    FP_SOURCE,
    FP_TASK_ID,
    FP_WAIT_KIND,
    IO_CAPABILITY,
    IO_READ,
    IO_WRITE,
    MT_CALL_WAITING,
    RETRYABLE_BY_DEFAULT,
    WAIT_FUNCTION_CODE,
    WAIT_IO,
    WAIT_SUBCALL,
)

from .context import ExecState, ResumePayload, current_context, running

# Re-exported: the framework signals where the seed keeps them, and the RemoteCallError
# family this module raises (defined in .errors, which stays pure Python).
from .errors import (
    REASON_BUDGET_EXHAUSTED,
    REASON_DEADLINE_PASSED,
    REASON_TRANSPORT_LOST,
    CallCancelledError,
    CallDeadlineExceededError,
    FunctionCodeFetchError,
    RemoteCallError,
    RemoteIOError,
    SubcallCycleDetectedError,
    SubcallDepthExceededError,
    SubcallFailedError,
    WaitDeadlineExceededError,
    chain_subcall_error,
)
from .local_reads import MISS, read_key
from .markers import SLEEP_WAKE, SUSPENDED, WAIT_CUT_OFF, Marker
from .outbox import Outbox

if TYPE_CHECKING:
    from .context import ExecContext

__all__ = [
    "SLEEP_WAKE",
    "SUSPENDED",
    "WAIT_CUT_OFF",
    "BridgeHost",
    "CallCancelledError",
    "CallDeadlineExceededError",
    "FunctionCodeFetchError",
    "RemoteCallError",
    "RemoteIOError",
    "SdkBridge",
    "SubcallCycleDetectedError",
    "SubcallDepthExceededError",
    "SubcallFailedError",
    "WaitDeadlineExceededError",
    "io_error_class",
    "register_io_error_kinds",
    "verify_fetched_source",
]


#: A code-fetch follower's resume value when its leader ended without an outcome.
_RETRY_FETCH: Final = Marker("retry-fetch")

_ceil: Final = math.ceil
#: Float noise tolerated when rounding the time a cut-off wait is charged up to whole
#: ms (sums and differences of clock readings are off by ~1e-10 ms): 280.0000000001
#: is 280.
_CLOCK_NOISE_MS: Final = 1e-6


_IO_ERROR_KINDS: dict[str, type[RemoteCallError]] = {}


def register_io_error_kinds(kinds: Mapping[str, type[RemoteCallError]]) -> None:
    """Map backend-specific IO error kinds to exception classes (later wins).

    The classes must derive from :class:`RemoteCallError` (usually
    :class:`RemoteIOError`) and accept ``(kind, message, retryable)``.
    """
    for kind, cls in kinds.items():
        if not (isinstance(cls, type) and issubclass(cls, RemoteCallError)):
            raise TypeError(f"IO error kind {kind!r}: {cls!r} is not a RemoteCallError subclass")
    _IO_ERROR_KINDS.update(kinds)


def io_error_class(kind: str) -> type[RemoteCallError]:
    """The class an IO error of ``kind`` is raised as."""
    return _IO_ERROR_KINDS.get(kind, RemoteIOError)


def _map_resume_error(wait_kind: str, error: Mapping[str, Any]) -> RemoteCallError:
    """Turn a validated ``ResumeCall.error`` into the exception raised in user code."""
    kind = error.get(FP_ERROR_KIND_FIELD) or ERR_INTERNAL_ERROR
    message = error.get(FP_ERROR_MESSAGE_FIELD) or ""
    retryable = error.get(FP_ERROR_RETRYABLE_FIELD)
    if retryable is None:
        retryable = RETRYABLE_BY_DEFAULT.get(kind, False)
    if wait_kind == WAIT_FUNCTION_CODE:
        if error.get(FP_ERROR_RETRYABLE_FIELD) is None:
            retryable = RETRYABLE_BY_DEFAULT[ERR_FUNCTION_CODE_FETCH_FAILED]
        return FunctionCodeFetchError(kind, message, retryable)
    if wait_kind == WAIT_SUBCALL:
        if kind == ERR_SUBCALL_DEPTH_EXCEEDED:
            return SubcallDepthExceededError(kind, message, retryable)
        if kind == ERR_SUBCALL_CYCLE_DETECTED:
            return SubcallCycleDetectedError(kind, message, retryable)
        return SubcallFailedError(kind, message, retryable)
    return io_error_class(kind)(kind, message, retryable)


def verify_fetched_source(result: Any, digest: str) -> str:
    """The source in a ``ResumeCall(function_code)`` result, checked against ``digest``.

    Raises :class:`FunctionCodeFetchError` when the result is malformed, names
    another digest, or the source does not hash to ``sha256:<hex>``.
    """
    fail = ERR_FUNCTION_CODE_FETCH_FAILED
    if type(result) is not dict:
        raise FunctionCodeFetchError(fail, "function_code result must be an object", True)
    source = result.get(FP_SOURCE)
    if type(source) is not str:
        raise FunctionCodeFetchError(fail, "function_code result has no source string", True)
    named = result.get(FP_FUNCTION_CODE_DIGEST)
    if named is not None and named != digest:
        raise FunctionCodeFetchError(fail, f"asked for {digest}, the worker sent {named}", True)
    algorithm, _, expected = digest.partition(":")
    if algorithm != "sha256" or len(expected) != 64:
        raise FunctionCodeFetchError(
            fail, f"unsupported function code digest {digest!r} (want sha256:<64 hex>)", False
        )
    import hashlib  # here, at a function's first fetch: ~3 ms off the executor's start

    try:
        actual = hashlib.sha256(source.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:
        raise FunctionCodeFetchError(fail, "source is not valid UTF-8 text", True) from None
    if actual != expected.lower():
        raise FunctionCodeFetchError(
            fail, f"fetched source hashes to sha256:{actual}, not {digest}", True
        )
    return source


# --- the host: what the bridge needs from the runtime ----------------------------------


class BridgeHost(Protocol):
    """The runtime as the bridge sees it (``ExecutorRuntime`` implements it). Frames go
    out through the :class:`~.outbox.Outbox` the bridge is given beside it."""

    executor_id: str

    def next_request_id(self) -> str: ...

    def limit_wait(self, ctx: ExecContext) -> None:
        """Arm ``ctx``'s wait-limit timer for when its budget runs out (``ctx`` is
        budgeted, about to suspend on IO or a sub-call, and has no such timer)."""
        ...

    def schedule_sleep(self, ctx: ExecContext, duration_s: float) -> None:
        """Arm ``ctx``'s sleep timer and mark it ``WAITING_SLEEP``."""
        ...

    def wake_context(self, ctx: ExecContext, value: Any) -> None:
        """Queue ``ctx`` to be switched into with ``value`` (code-fetch followers)."""
        ...


class _CodeFetch:
    """One in-flight fetch of a digest: its leader and the contexts waiting on it."""

    __slots__ = ("followers", "leader")

    def __init__(self, leader: ExecContext) -> None:
        self.leader = leader
        self.followers: list[ExecContext] = []

    def __repr__(self) -> str:
        return f"_CodeFetch(leader={self.leader.call_id!r}, followers={len(self.followers)})"


class _FetchFailed:
    """A leader's fetch failure, replayed as a fresh exception in every follower."""

    __slots__ = ("kind", "message", "retryable")

    def __init__(self, error: RemoteCallError) -> None:
        self.kind = error.kind
        self.message = error.message
        self.retryable = error.retryable

    def exception(self) -> FunctionCodeFetchError:
        return FunctionCodeFetchError(self.kind, self.message, self.retryable)


def _sleep_seconds(seconds: Any) -> float:
    """``time.sleep``'s argument rules: a real number (``__float__``/``__index__``),
    not negative, not NaN."""
    if isinstance(seconds, (int, float)):
        value = float(seconds)
    elif hasattr(type(seconds), "__float__"):
        value = float(seconds)
    elif hasattr(type(seconds), "__index__"):
        value = float(operator.index(seconds))
    else:
        raise TypeError(
            f"'{type(seconds).__name__}' object cannot be interpreted as an integer or float"
        )
    if math.isnan(value):
        raise ValueError("Invalid value NaN (not a number)")
    if value < 0:
        raise ValueError("sleep length must be non-negative")
    return value


class SdkBridge:
    """The synchronous SDK contract on top of greenlet suspension (see the module doc).

    ``host`` (the runtime) numbers requests, arms timers and wakes code-fetch
    followers; ``outbox`` sends the ``CallWaiting`` frames.
    """

    __slots__ = ("_function_code_fetches", "_host", "_outbox")

    def __init__(self, host: BridgeHost, outbox: Outbox) -> None:
        self._host = host
        self._outbox = outbox  # a concrete class: a native call per CallWaiting, compiled
        self._function_code_fetches: dict[str, _CodeFetch] = {}

    def __repr__(self) -> str:
        return f"SdkBridge(code_fetches={len(self._function_code_fetches)})"

    @staticmethod
    def _require_context() -> ExecContext:
        ctx = current_context()
        if ctx is None:
            raise NoProviderError(
                "the executor's SDK bridge only works on a call's greenlet, inside a BlockX call"
            )
        return ctx

    # --- IO --------------------------------------------------------------------------

    def do_read_req(
        self, backend: str, operation: str, params: Any, *, cache_key: str | None = None
    ) -> Any:
        """A read: ``CallWaiting(io, ioKind=read)``; equal ``cache_key`` values may share one."""
        return self.io_wait(IO_READ, backend, operation, params, cache_key)

    def do_write_req(self, backend: str, operation: str, params: Any) -> Any:
        """A write: ``CallWaiting(io, ioKind=write)``; never cached."""
        return self.io_wait(IO_WRITE, backend, operation, params, None)

    def do_capability_req(
        self, backend: str, operation: str, params: Any, *, cache_key: str = ""
    ) -> Any:
        """A capability call: ``CallWaiting(io, ioKind=capability)``; ``""`` means no cache key."""
        return self.io_wait(IO_CAPABILITY, backend, operation, params, cache_key or None)

    def io_wait(
        self, io_kind: str, backend: str, operation: str, params: Any, cache_key: str | None
    ) -> Any:
        """Any IO wait (``io_kind``: read, write, capability); the ``do_*_req`` methods
        name it. The provider calls this directly (one Python call fewer per IO)."""
        # current_context(), inline: two Python calls fewer per IO wait.
        ctx = running.ctx
        if ctx is None or ctx.greenlet is not getcurrent():
            ctx = self._require_context()  # raises
        if type(backend) is not str or type(operation) is not str:
            raise TypeError("backend and operation must be strings")
        if cache_key is not None and type(cache_key) is not str:
            raise TypeError("cache_key must be a string or None")
        local_key: str | None = None
        reads = ctx.local_reads
        if reads is not None:
            if cache_key is not None and io_kind == IO_READ:
                # An immutable answer kept from an earlier identical read (local_reads.py):
                # answered here, no frame. A cancelled or out-of-budget call still stops.
                local_key = read_key(backend, operation, cache_key)
                kept = reads.get(local_key)
                if kept is not MISS:
                    if ctx.cancel_reason is not None or ctx.expires_at <= ctx.clock():
                        ctx.check_safe_point()
                    hits = ctx.local_hits
                    if hits is None:
                        hits = ctx.local_hits = {}
                    op = (backend, operation)
                    hits[op] = hits.get(op, 0) + 1
                    return kept
            elif io_kind == IO_WRITE and len(reads):
                reads.drop_backend(backend)
        sidecar: bytes | None = None
        if type(params) is dict:
            pass  # the common case, without the isinstance checks below
        elif isinstance(params, (bytes, bytearray, memoryview)):
            sidecar = bytes(params)  # the request body travels raw; params stays null
            params = None
        elif params is not None and not isinstance(params, dict) and isinstance(params, Mapping):
            params = dict(params)
        # The payload is built in the call expression: no frame of ours keeps it
        # alive while the call is suspended (see _perform_wait).
        try:
            return self._perform_wait(
                ctx,
                ExecState.WAITING_IO,
                WAIT_IO,
                {
                    FP_TASK_ID: ctx.task_id,
                    FP_WAIT_KIND: WAIT_IO,
                    FP_ATTEMPT_SEQ: ctx.attempt_seq,
                    FP_IO_KIND: io_kind,
                    FP_BACKEND: backend,
                    FP_OPERATION: operation,
                    FP_PARAMS: params,
                    FP_CACHE_KEY: cache_key,
                },
                sidecar,
                value_key=None if params is None else FP_PARAMS,
                skeleton_nulls=1 if cache_key is None else 0,
                local_key=local_key,
            )
        except WaitDeadlineExceededError as exc:
            # Named here, not per wait in _perform_wait: free unless a wait is cut off.
            exc.waiting_on = f"IO {backend}.{operation}"
            raise

    # --- sub-calls ---------------------------------------------------------------------

    def do_subcall(self, function_id: str, args: Any) -> Any:
        """Run ``function_id`` as a child call and return its output.

        ``grantedBudgetMs`` is this call's remaining budget (0 when unlimited);
        ``ancestry`` is this call's ancestry plus its own ``callKey``.
        """
        ctx = self._require_context()
        if type(function_id) is not str or not function_id:
            raise TypeError("function_id must be a non-empty string")
        ctx.check_safe_point()
        granted = 0
        if ctx.budget_ms:
            granted = max(1, round(ctx.budget_ms - ctx.budget_used_ms()))
        try:
            return self._perform_wait(
                ctx,
                ExecState.WAITING_SUBCALL,
                WAIT_SUBCALL,
                {
                    FP_TASK_ID: ctx.task_id,
                    FP_WAIT_KIND: WAIT_SUBCALL,
                    FP_ATTEMPT_SEQ: ctx.attempt_seq,
                    FP_FUNCTION_ID: function_id,
                    FP_ARGS: args,
                    FP_ANCESTRY: (
                        [*ctx.ancestry, ctx.call_key] if ctx.call_key else list(ctx.ancestry)
                    ),
                    FP_GRANTED_BUDGET_MS: granted,
                },
                value_key=FP_ARGS,
            )
        except WaitDeadlineExceededError as exc:
            exc.waiting_on = f"sub-call {function_id}"
            raise
        except (SubcallFailedError, SubcallDepthExceededError, SubcallCycleDetectedError) as failed:
            # (its own name: mypyc types a name once per function)
            chain_subcall_error(failed, ctx.function_id, function_id)  # one prefix, the chain
            raise

    # --- code fetch --------------------------------------------------------------------

    def do_function_code_req(self, function_id: str, digest: str) -> str:
        """The verified source of ``digest``, fetched once per digest however many calls miss it.

        Raises :class:`FunctionCodeFetchError` when the fetch fails (every
        follower of that fetch fails the same way).
        """
        ctx = self._require_context()
        while True:
            fetch = self._function_code_fetches.get(digest)
            if fetch is None:
                return self._lead_code_fetch(ctx, function_id, digest)
            outcome = self._follow_code_fetch(ctx, fetch)
            if type(outcome) is str:
                return outcome
            if type(outcome) is _FetchFailed:
                raise outcome.exception()
            # _RETRY_FETCH: the leader ended without an outcome; the loop elects a new one.

    def _lead_code_fetch(self, ctx: ExecContext, function_id: str, digest: str) -> str:
        fetch = _CodeFetch(ctx)
        fetches = self._function_code_fetches
        fetches[digest] = fetch
        outcome: Any = _RETRY_FETCH
        try:
            payload = {
                FP_TASK_ID: ctx.task_id,
                FP_WAIT_KIND: WAIT_FUNCTION_CODE,
                FP_ATTEMPT_SEQ: ctx.attempt_seq,
                FP_FUNCTION_ID: function_id,
                FP_FUNCTION_CODE_DIGEST: digest,
            }
            result = self._perform_wait(
                ctx, ExecState.WAITING_FUNCTION_CODE, WAIT_FUNCTION_CODE, payload
            )
            source = verify_fetched_source(result, digest)
            outcome = source
            return source
        except FunctionCodeFetchError as exc:
            outcome = _FetchFailed(exc)
            raise
        finally:
            # Not preemptible while it hands the outcome on: a SIGALRM raising here would
            # strand the followers not yet woken (the handler acts on RUNNING calls only;
            # the interval timer re-fires once the state is back).
            state = ctx.state
            ctx.state = ExecState.WAITING_FUNCTION_CODE
            try:
                if fetches.get(digest) is fetch:
                    del fetches[digest]
                wake = self._host.wake_context
                for follower in fetch.followers:
                    wake(follower, outcome)
                fetch.followers.clear()
            finally:
                ctx.state = state

    def _follow_code_fetch(self, ctx: ExecContext, fetch: _CodeFetch) -> Any:
        ctx.check_safe_point()
        fetch.followers.append(ctx)
        ctx.state = ExecState.WAITING_FUNCTION_CODE
        ctx.code_fetch_follower = True
        greenlet = ctx.greenlet
        assert greenlet is not None and greenlet.parent is not None
        try:
            outcome = greenlet.parent.switch(SUSPENDED)
        finally:
            ctx.code_fetch_follower = False
            if ctx in fetch.followers:
                fetch.followers.remove(ctx)
        ctx.check_safe_point()
        return outcome

    # --- sleep -------------------------------------------------------------------------

    def do_sleep(self, seconds: float) -> None:
        """Suspend this call on a local timer (no frame); the sleep is charged to the budget.

        A sleep longer than the remaining budget wakes when the budget runs out
        and ends the call as ``deadline_exceeded``.
        """
        ctx = self._require_context()
        duration = _sleep_seconds(seconds)
        ctx.check_safe_point()
        remaining = ctx.remaining_s()
        if remaining is not None and remaining < duration:
            duration = max(remaining, 0.0)
        host = self._host
        started = ctx.clock()
        host.schedule_sleep(ctx, duration)
        # Charged up front (waking late is queueing, never charged): the budget alarm is
        # armed for the slice after the wake before this frame runs again, and must count
        # it; so must a signal landing as the call resumes.
        ctx.sleep_s += duration
        greenlet = ctx.greenlet
        assert greenlet is not None and greenlet.parent is not None
        try:
            greenlet.parent.switch(SUSPENDED)
        except BaseException:
            # Ended mid-sleep: charge only what actually elapsed.
            ctx.sleep_s -= duration - min(max(ctx.clock() - started, 0.0), duration)
            raise
        ctx.check_safe_point()

    # --- the one suspend path ---------------------------------------------------------

    def _perform_wait(
        self,
        ctx: ExecContext,
        state: ExecState,
        wait_kind: str,
        payload: dict[str, Any],
        sidecar: bytes | None = None,
        *,
        value_key: str | None = None,
        skeleton_nulls: int = 0,
        local_key: str | None = None,
    ) -> Any:
        """Send one ``CallWaiting``, suspend, and return the result of its ``ResumeCall``.

        ``payload[value_key]``, if named, is a raw user value (IO params, sub-call
        args), encoded with ``dumps_wire``'s rules in the frame's one orjson pass;
        ``skeleton_nulls`` counts the ``null`` the rest of the frame writes.
        ``local_key`` names a read the task's immutable-read cache may keep: an
        answer the worker marked ``immutable`` is kept under it.
        Raises the mapped :class:`RemoteCallError` for a ``ResumeCall.error``,
        an ``EncodeError`` when the request cannot be framed (nothing sent), or
        a framework exception when the call is cancelled or out of budget
        (:class:`WaitDeadlineExceededError` when the wait itself was cut off).
        """
        # Safe points, tested inline: check_safe_point (and its judge) only once the call
        # is cancelled or its slice's expiry passed (ExecContext.expires_at); then it raises.
        if ctx.cancel_reason is not None or ctx.expires_at <= ctx.clock():
            ctx.check_safe_point()
        host = self._host
        request_id = host.next_request_id()
        envelope = {
            F_MESSAGE_TYPE: MT_CALL_WAITING,
            F_CALL_ID: ctx.call_id,
            F_REQUEST_ID: request_id,
            F_EXECUTOR_ID: host.executor_id,
            F_PAYLOAD: payload,
        }
        # Not RUNNING from here on: the SIGALRM handler leaves framework code alone.
        ctx.state = state
        try:
            if value_key is None:
                frame = encode_frame(envelope, sidecar)
            else:
                frame = encode_frame_with_value(
                    envelope, payload, value_key, skeleton_nulls, sidecar
                )
            self._outbox.send_encoded(frame)
        except ConnectionError:
            ctx.state = ExecState.RUNNING
            self._outbox.note_transport_lost()
            if ctx.cancel_reason is None:
                ctx.cancel_reason = REASON_TRANSPORT_LOST
            ctx.check_safe_point()
            raise
        except BaseException:
            ctx.state = ExecState.RUNNING
            raise
        ctx.pending_request_id = request_id
        # Sent: drop the request, which a suspended frame would keep for the whole wait.
        del envelope, payload, frame
        sidecar = None
        if ctx.budget_ms and not ctx.wait_timer_due and wait_kind == WAIT_IO:
            # No answer can come in time once the budget is used up (the worker charges
            # the IO wait): the runtime cuts the wait off then. One timer serves every
            # later wait too (see timers.py); a deadline is timed by the call-timeout
            # latch. A sub-call is charged only its child's own budgetUsedMs (never the
            # wall time this call spends suspended): its granted budget bounds it.
            host.limit_wait(ctx)
        greenlet = ctx.greenlet
        assert greenlet is not None and greenlet.parent is not None
        try:
            resumed = greenlet.parent.switch(SUSPENDED)
        finally:
            ctx.pending_request_id = None
        # The scheduler set RUNNING before switching back in.
        if type(resumed) is not ResumePayload:
            if resumed is WAIT_CUT_OFF:
                raise self._cut_off(ctx, state, request_id)
            raise RemoteCallError(
                ERR_INTERNAL_ERROR, f"call resumed with {resumed!r} instead of a ResumeCall"
            )
        if resumed.budget_used_ms and wait_kind != WAIT_FUNCTION_CODE:
            ctx.wait_ms += resumed.budget_used_ms  # code fetches are not charged
        if ctx.cancel_reason is not None or ctx.expires_at <= ctx.clock():
            ctx.check_safe_point()
        if resumed.error is not None:
            if (
                wait_kind == WAIT_SUBCALL
                and ctx.budget_ms
                and resumed.error.get(FP_ERROR_KIND_FIELD) == ERR_DEADLINE_EXCEEDED
            ):
                raise self._grant_spent(ctx, request_id, resumed.budget_used_ms)
            raise _map_resume_error(wait_kind, resumed.error)
        if resumed.immutable and local_key is not None:
            reads = ctx.local_reads
            if reads is not None:
                reads.put(local_key, resumed.result)
        return resumed.result

    @staticmethod
    def _grant_spent(
        ctx: ExecContext, request_id: str, child_used_ms: int
    ) -> WaitDeadlineExceededError:
        """A child that ran out of its budget used up what this call granted it: all the
        budget this call had left. So this call's budget is used up too, whatever the
        rounding of the two figures says: it ends as ``deadline_exceeded`` (not as
        ``subcall_failed``, which would depend on a fraction of a millisecond)."""
        ctx.expires_at = -math.inf  # every later safe point trips
        return WaitDeadlineExceededError(
            REASON_BUDGET_EXHAUSTED,
            used_ms=ctx.budget_used_ms(),
            budget_ms=ctx.budget_ms,
            waited_ms=child_used_ms,
            request_id=request_id,
        )

    @staticmethod
    def _cut_off(ctx: ExecContext, state: ExecState, request_id: str) -> WaitDeadlineExceededError:
        """The error that ends a call whose wait the runtime cut off (``WAIT_CUT_OFF``);
        the wait is charged as if the worker had answered at the cut-off."""
        # Not preemptible while the outcome is settled: the SIGALRM handler acts on
        # RUNNING calls only, and would replace this error with one that names no cause.
        ctx.state = state
        waited_s = ctx.wait_cut_off_at() - ctx.suspended_at
        waited_ms = max(_ceil(waited_s * 1000.0 - _CLOCK_NOISE_MS), 0)
        if state is ExecState.WAITING_IO:
            ctx.wait_ms += waited_ms  # a sub-call's wall time is never charged (deadline)
        ctx.expires_at = -math.inf  # used up within this slice: every later safe point trips
        reason = ctx.deadline_expired_reason()
        if reason is None:  # float rounding at the very edge: the budget ran out all the same
            reason = REASON_BUDGET_EXHAUSTED if ctx.budget_ms else REASON_DEADLINE_PASSED
        error = WaitDeadlineExceededError(
            reason,
            used_ms=ctx.budget_used_ms(),
            budget_ms=ctx.budget_ms,
            waited_ms=waited_ms,
            request_id=request_id,
        )
        ctx.state = ExecState.RUNNING
        return error

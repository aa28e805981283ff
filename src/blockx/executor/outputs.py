"""Terminal frames: ``CallCompleted`` / ``CallFailed`` envelopes and failure reports.

* ``CallCompleted`` frames are encoded with the output inline in one orjson
  pass (``blockx.wire.frames.encode_frame_with_value``, with exactly
  ``dumps_wire``'s rules: ``NotSerializableError`` →
  ``output_not_serializable``). The frame size is checked exactly, so an
  output over 16 MiB fails that call as ``payload_too_large`` instead of
  reaching the session (docs/protocol.md: never the connection).
* :func:`describe_failure` classifies an exception that ended a call into
  ``(errorKind, retryable, errorMessage, errorStack, localVars)``. The stack
  shows the user's frames only (``<blockx:functionId>`` with their source
  lines): executor, SDK-seam and scheduler frames are trimmed. ``localVars``
  are short reprs of the innermost user frame's locals. Everything is bounded
  so a failure frame always fits.

Envelopes are plain dicts built with :mod:`blockx.wire.keys` (no dataclass per
frame on the hot path).
"""

from __future__ import annotations

import os
import re
import reprlib
import traceback
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import blockx.function
import blockx.sdk
from blockx.wire import PayloadTooLargeError
from blockx.wire.errors import EncodeError
from blockx.wire.keys import (
    ERR_USER_ERROR,
    F_CALL_ID,
    F_EXECUTOR_ID,
    F_MESSAGE_TYPE,
    F_PAYLOAD,
    FP_ATTEMPT_SEQ,
    FP_BUDGET_USED_MS,
    FP_DEBUG_OUTPUT,
    FP_EFFECTIVE_EXECUTION_DURATION_US,
    FP_ERROR_KIND,
    FP_ERROR_MESSAGE,
    FP_ERROR_STACK,
    FP_LOCAL_READ_HITS,
    FP_LOCAL_VARS,
    FP_OUTPUT,
    FP_QUEUE_WAIT_US,
    FP_RETRYABLE,
    FP_TASK_ID,
    MT_CALL_COMPLETED,
    MT_CALL_FAILED,
    RETRYABLE_BY_DEFAULT,
)

from .errors import (
    CallCancelledError,
    CallDeadlineExceededError,
    UserCodeError,
    UserCodeSyntaxError,
)
from .sdk_bridge import RemoteCallError

if TYPE_CHECKING:
    from .context import ExecContext

__all__ = [
    "MAX_ERROR_MESSAGE_CHARS",
    "MAX_ERROR_STACK_CHARS",
    "MAX_LOCAL_VARS",
    "MAX_LOCAL_VAR_REPR_CHARS",
    "Failure",
    "call_completed_envelope",
    "call_failed_envelope",
    "describe_failure",
    "format_user_stack",
    "innermost_user_locals",
    "round_half_even",
]

MAX_ERROR_MESSAGE_CHARS: Final = 8 * 1024
MAX_ERROR_STACK_CHARS: Final = 64 * 1024
MAX_LOCAL_VARS: Final = 32
MAX_LOCAL_VAR_REPR_CHARS: Final = 256
_MAX_CHAINED_EXCEPTIONS: Final = 5

_USER_FILE_PREFIX: Final = "<blockx:"
_INTERNAL_DIRS: Final = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.dirname(os.path.abspath(blockx.sdk.__file__)) + os.sep,
)
_INTERNAL_FILES: Final = frozenset({os.path.abspath(blockx.function.__file__)})
#: A mypyc-compiled module's traceback entries carry its source path as it was given to
#: mypyc ("blockx/executor/runtime.py", "src/blockx/executor/runtime.py", ...), not the
#: installed file's: those are internal too.
_COMPILED_INTERNAL_FILE: Final = re.compile(
    r"(?:^|/)blockx/(?:(?:executor|sdk)/[^/]+|function)\.py$"
)

_CAUSE_TEXT: Final = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT_TEXT: Final = "\nDuring handling of the above exception, another exception occurred:\n\n"

#: ``(errorKind, retryable, errorMessage, errorStack, localVars)``
Failure = tuple[str, bool, str, str | None, dict[str, str] | None]

_repr = reprlib.Repr()
_repr.maxstring = MAX_LOCAL_VAR_REPR_CHARS
_repr.maxother = MAX_LOCAL_VAR_REPR_CHARS
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 10
_repr.maxlevel = 3


# --- outputs -------------------------------------------------------------------------


def _truncate_head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"…[truncated {len(text) - limit} characters]"


def _truncate_tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[truncated {len(text) - limit} characters]…" + text[-limit:]


def call_completed_envelope(
    ctx: ExecContext,
    executor_id: str,
    output: Any,
    *,
    budget_used_ms: int,
    effective_us: int,
    queue_wait_us: int,
    debug_output: str | None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        FP_TASK_ID: ctx.task_id,
        FP_ATTEMPT_SEQ: ctx.attempt_seq,
        FP_OUTPUT: output,
        FP_BUDGET_USED_MS: budget_used_ms,
        FP_EFFECTIVE_EXECUTION_DURATION_US: effective_us,
        FP_QUEUE_WAIT_US: queue_wait_us,
        FP_DEBUG_OUTPUT: debug_output,
    }
    if ctx.local_hits is not None:  # reads answered by the task's immutable-read cache
        payload[FP_LOCAL_READ_HITS] = ctx.local_hits_wire()
    return {
        F_MESSAGE_TYPE: MT_CALL_COMPLETED,
        F_CALL_ID: ctx.call_id,
        F_EXECUTOR_ID: executor_id,
        F_PAYLOAD: payload,
    }


def call_failed_envelope(
    call_id: str,
    task_id: str,
    attempt_seq: int,
    executor_id: str,
    failure: Failure,
    *,
    budget_used_ms: int = 0,
    debug_output: str | None = None,
    local_read_hits: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    error_kind, retryable, message, stack, local_vars = failure
    payload: dict[str, Any] = {
        FP_TASK_ID: task_id,
        FP_ATTEMPT_SEQ: attempt_seq,
        FP_ERROR_KIND: error_kind,
        FP_RETRYABLE: retryable,
        FP_ERROR_MESSAGE: _truncate_head(message, MAX_ERROR_MESSAGE_CHARS),
        FP_ERROR_STACK: (None if stack is None else _truncate_tail(stack, MAX_ERROR_STACK_CHARS)),
        FP_LOCAL_VARS: local_vars,
        FP_BUDGET_USED_MS: budget_used_ms,
    }
    if debug_output is not None:  # a debug call's captured stdout/stderr, as CallCompleted's
        payload[FP_DEBUG_OUTPUT] = debug_output
    if local_read_hits is not None:
        payload[FP_LOCAL_READ_HITS] = local_read_hits
    return {
        F_MESSAGE_TYPE: MT_CALL_FAILED,
        F_CALL_ID: call_id,
        F_EXECUTOR_ID: executor_id,
        F_PAYLOAD: payload,
    }


# --- failures ------------------------------------------------------------------------


def _exception_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<exception str() failed>"
    name = type(exc).__qualname__
    return f"{name}: {text}" if text else name


def describe_failure(
    exc: BaseException, refresh_linecache: Callable[[Mapping[str, Any]], None] | None = None
) -> Failure:
    """Classify the exception that ended a call (see the module doc)."""
    if isinstance(exc, CallCancelledError):
        return (
            exc.error_kind,
            exc.retryable,
            str(exc),
            _stack_or_none(exc, refresh_linecache),
            None,
        )
    if isinstance(exc, CallDeadlineExceededError):
        stack = _stack_or_none(exc, refresh_linecache)
        return (exc.error_kind, exc.retryable, str(exc), stack, None)
    if isinstance(exc, UserCodeSyntaxError):
        stack = "".join(traceback.format_exception_only(SyntaxError, exc.syntax_error))
        return (exc.error_kind, exc.retryable, str(exc), stack, None)
    if isinstance(exc, UserCodeError):
        return (exc.error_kind, exc.retryable, str(exc), None, None)
    if isinstance(exc, RemoteCallError):
        stack = _stack_or_none(exc, refresh_linecache)
        return (
            exc.error_kind,
            exc.retryable,
            _exception_text(exc),
            stack,
            innermost_user_locals(exc),
        )
    if isinstance(exc, EncodeError) and not isinstance(exc, TypeError):
        # A request frame over the limit (a NotSerializableError from user code is a user_error).
        kind = exc.error_kind
        stack = _stack_or_none(exc, refresh_linecache)
        return (kind, RETRYABLE_BY_DEFAULT.get(kind, False), _exception_text(exc), stack, None)
    return (
        ERR_USER_ERROR,
        False,
        _exception_text(exc),
        format_user_stack(exc, refresh_linecache),
        innermost_user_locals(exc),
    )


def _stack_or_none(
    exc: BaseException, refresh_linecache: Callable[[Mapping[str, Any]], None] | None
) -> str | None:
    if not any(_is_user_frame(frame) for frame, _ in traceback.walk_tb(exc.__traceback__)):
        return None
    return format_user_stack(exc, refresh_linecache)


def _is_user_frame(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_USER_FILE_PREFIX)


def _is_internal_frame(frame: types.FrameType) -> bool:
    filename = frame.f_code.co_filename
    return (
        filename.startswith(_INTERNAL_DIRS)
        or filename in _INTERNAL_FILES
        or _COMPILED_INTERNAL_FILE.search(filename) is not None
    )


def _user_frames(tb: types.TracebackType | None) -> list[tuple[types.FrameType, int]]:
    """The traceback from the first user frame on, without executor/SDK frames."""
    frames = list(traceback.walk_tb(tb))
    for index, (frame, _) in enumerate(frames):
        if _is_user_frame(frame):
            return [item for item in frames[index:] if not _is_internal_frame(item[0])]
    return []


def _format_one(
    exc: BaseException, refresh_linecache: Callable[[Mapping[str, Any]], None] | None
) -> str:
    summaries: list[traceback.FrameSummary] = []
    for frame, lineno in _user_frames(exc.__traceback__):
        if refresh_linecache is not None and _is_user_frame(frame):
            refresh_linecache(frame.f_globals)
        summaries.extend(traceback.StackSummary.extract([(frame, lineno)], lookup_lines=True))
    text = ""
    if summaries:
        text = "Traceback (most recent call last):\n"
        text += "".join(traceback.StackSummary.from_list(summaries).format())
    display_name = getattr(type(exc), "display_name", None)
    if display_name is not None:  # the executor ended the call: its name, not our class path
        return f"{text}{display_name}: {exc}\n"
    return text + "".join(traceback.format_exception_only(type(exc), exc))


def format_user_stack(
    exc: BaseException, refresh_linecache: Callable[[Mapping[str, Any]], None] | None = None
) -> str:
    """A traceback of the user's frames, with chained causes, like Python prints it."""
    chain: list[tuple[BaseException, str | None]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link: str | None = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if len(chain) >= _MAX_CHAINED_EXCEPTIONS:
            break
        if current.__cause__ is not None:
            link, current = _CAUSE_TEXT, current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            link, current = _CONTEXT_TEXT, current.__context__
        else:
            break
    parts: list[str] = []
    for item, item_link in reversed(chain):
        parts.append(_format_one(item, refresh_linecache))
        if item_link is not None:
            parts.append(item_link)
    return "".join(parts)


def _short_repr(value: Any) -> str:
    try:
        text = _repr.repr(value)
    except Exception as exc:  # a user __repr__ that raises
        text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    if len(text) > MAX_LOCAL_VAR_REPR_CHARS:
        text = text[:MAX_LOCAL_VAR_REPR_CHARS] + "…"
    return text


def innermost_user_locals(exc: BaseException) -> dict[str, str] | None:
    """Short reprs of the innermost user frame's locals (at most 32), or None."""
    innermost: types.FrameType | None = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if _is_user_frame(frame):
            innermost = frame
    if innermost is None:
        return None
    result: dict[str, str] = {}
    for name, value in innermost.f_locals.items():
        if name.startswith("__"):
            continue
        if len(result) >= MAX_LOCAL_VARS:
            result["…"] = f"{len(innermost.f_locals) - MAX_LOCAL_VARS} more"
            break
        result[name] = _short_repr(value)
    return result


def output_failure(exc: EncodeError) -> Failure:
    """An output the wire cannot carry: ``output_not_serializable`` or ``payload_too_large``."""
    kind = exc.error_kind
    text = str(exc)
    if isinstance(exc, PayloadTooLargeError):
        text = f"call output too large for one frame: {text}"
    else:
        text = f"call output is not JSON-serializable: {text}"
    return (kind, RETRYABLE_BY_DEFAULT.get(kind, False), text, None, None)


#: Past 2**52 every float is a whole number: ``round`` is then ``int``.
_WHOLE_FROM: Final = 2.0**52


def round_half_even(x: float) -> int:
    """``round(x)`` -- to the nearest int, a tie to the even one -- in compiled code.

    The builtin stays a generic call once compiled (~1,000 instructions each, the call
    included); a completed call rounds three timings for its ``CallCompleted``. The
    same int for every float: ``x - int(x)`` is exact below 2**52 (Sterbenz), so the
    tie test is; NaN and the infinities go to ``round`` (which raises, as before).
    """
    if not -_WHOLE_FROM < x < _WHOLE_FROM:
        return round(x)
    whole = int(x)  # toward zero
    rest = x - whole
    if rest > 0.5 or (rest == 0.5 and whole % 2 == 1):
        return whole + 1
    if rest < -0.5 or (rest == -0.5 and whole % 2 == 1):
        return whole - 1
    return whole

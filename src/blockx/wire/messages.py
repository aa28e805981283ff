"""Typed messages: one frozen dataclass per payload of docs/protocol.md.

The hot paths of the worker and the executor read envelopes as plain dicts with
the constants of :mod:`blockx.wire.keys` (bench/wire_codec.py measured building
a dataclass per frame at several times the cost of decoding it). These classes
are the checked, documented form of the same messages: ``to_wire()`` gives the
payload dict, ``from_wire(payload)`` validates one and raises
:class:`~blockx.wire.errors.PayloadError` naming the key. Unknown keys are
ignored, as the protocol says.

:class:`Message` bundles an envelope with its typed payload;
:func:`parse_message` turns a decoded :class:`~blockx.wire.frames.Frame` into
one, and :func:`build_envelope` is the one place envelopes are assembled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from . import keys
from .errors import PayloadError, UnknownMessageTypeError
from .frames import Frame

__all__ = [
    "PAYLOAD_TYPES",
    "CallCompleted",
    "CallFailed",
    "CallWaiting",
    "CancelCall",
    "ExecuteCall",
    "Heartbeat",
    "HeartbeatAck",
    "Message",
    "Payload",
    "RemoteError",
    "ResumeCall",
    "build_envelope",
    "parse_message",
]

_MISSING: Any = dataclasses.MISSING


# --- value checks ----------------------------------------------------------------

Check = Callable[[Any], bool]


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_any(v: Any) -> bool:
    return True


def _is_object(v: Any) -> bool:
    return isinstance(v, dict)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_int_map(v: Any) -> bool:
    return isinstance(v, dict) and all(_is_int(x) for x in v.values())


def _optional(check: Check) -> Check:
    def optional_check(v: Any) -> bool:
        return v is None or check(v)

    optional_check.__name__ = f"{check.__name__} or null"
    return optional_check


_DESCRIPTIONS = {
    _is_str: "a string",
    _is_int: "an integer",
    _is_number: "a number",
    _is_bool: "a boolean",
    _is_any: "any JSON value",
    _is_object: "an object",
    _is_str_list: "a list of strings",
    _is_int_map: "an object of integers",
}


def _describe(check: Check) -> str:
    if check in _DESCRIPTIONS:
        return _DESCRIPTIONS[check]
    return check.__name__.replace("_is_", "").replace("_", " ")


def wire(key: str, check: Check, default: Any = _MISSING) -> Any:
    """A dataclass field travelling under ``key``; required unless it has a default."""
    if isinstance(default, (list, dict)):
        value = default
        return field(
            default_factory=lambda: type(value)(value), metadata={"key": key, "check": check}
        )
    return field(default=default, metadata={"key": key, "check": check})


T = TypeVar("T", bound="Payload")


class Payload:
    """Base of the typed payloads. Subclasses are frozen slotted dataclasses."""

    __slots__ = ()
    message_type: ClassVar[str]
    _wire_fields: ClassVar[tuple[tuple[str, str, Check, bool], ...]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)

    @classmethod
    def _fields(cls) -> tuple[tuple[str, str, Check, bool], ...]:
        cached: tuple[tuple[str, str, Check, bool], ...] | None = cls.__dict__.get("_wire_cache")
        if cached is None:
            cached = tuple(
                (
                    f.name,
                    f.metadata["key"],
                    f.metadata["check"],
                    f.default is _MISSING and f.default_factory is _MISSING,
                )
                for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            )
            type.__setattr__(cls, "_wire_cache", cached)
        return cached

    def to_wire(self) -> dict[str, Any]:
        """The payload as a dict with docs/protocol.md's keys."""
        return {key: getattr(self, name) for name, key, _check, _required in self._fields()}

    @classmethod
    def from_wire(cls: type[T], payload: Mapping[str, Any]) -> T:
        """Validate and convert a received payload. Unknown keys are ignored."""
        if not isinstance(payload, Mapping):
            raise PayloadError(cls.message_type, keys.F_PAYLOAD, "must be an object")
        values: dict[str, Any] = {}
        for name, key, check, required in cls._fields():
            if key in payload:
                value = payload[key]
                if not check(value):
                    raise PayloadError(
                        cls.message_type,
                        key,
                        f"must be {_describe(check)}, got {type(value).__name__}",
                    )
                values[name] = value
            elif required:
                raise PayloadError(cls.message_type, key, "is required")
        return cls(**values)


# --- worker → executor -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteCall(Payload):
    """Run one attempt of a call. The source is not sent: only its digest."""

    message_type: ClassVar[str] = keys.MT_EXECUTE_CALL
    task_id: str = wire(keys.FP_TASK_ID, _is_str)
    function_id: str = wire(keys.FP_FUNCTION_ID, _is_str)
    function_code_digest: str = wire(keys.FP_FUNCTION_CODE_DIGEST, _is_str)
    entry_selector: str = wire(keys.FP_ENTRY_SELECTOR, _is_str, "")
    args: Any = wire(keys.FP_ARGS, _is_any, None)
    parent_call_id: str | None = wire(keys.FP_PARENT_CALL_ID, _optional(_is_str), None)
    call_key: str = wire(keys.FP_CALL_KEY, _is_str, "")
    ancestry: list[str] = wire(keys.FP_ANCESTRY, _is_str_list, [])
    call_budget_ms: int = wire(keys.FP_CALL_BUDGET_MS, _is_int, 0)
    attempt_seq: int = wire(keys.FP_ATTEMPT_SEQ, _is_int, 1)
    audit: dict[str, Any] | None = wire(keys.FP_AUDIT, _optional(_is_object), None)
    debug: bool = wire(keys.FP_DEBUG, _is_bool, False)


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteError:
    """``ResumeCall.error``: why a wait failed."""

    kind: str
    message: str
    retryable: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            keys.FP_ERROR_KIND_FIELD: self.kind,
            keys.FP_ERROR_MESSAGE_FIELD: self.message,
            keys.FP_ERROR_RETRYABLE_FIELD: self.retryable,
        }

    @classmethod
    def from_wire(cls, error: Any) -> RemoteError:
        if not isinstance(error, dict):
            raise PayloadError(keys.MT_RESUME_CALL, keys.FP_ERROR, "must be an object")
        kind = error.get(keys.FP_ERROR_KIND_FIELD)
        if not isinstance(kind, str):
            raise PayloadError(keys.MT_RESUME_CALL, "error.kind", "must be a string")
        message = error.get(keys.FP_ERROR_MESSAGE_FIELD, "")
        retryable = error.get(keys.FP_ERROR_RETRYABLE_FIELD, False)
        if not isinstance(message, str):
            raise PayloadError(keys.MT_RESUME_CALL, "error.message", "must be a string")
        if not isinstance(retryable, bool):
            raise PayloadError(keys.MT_RESUME_CALL, "error.retryable", "must be a boolean")
        return cls(kind=kind, message=message, retryable=retryable)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeCall(Payload):
    """The answer to a CallWaiting: a result or an error (envelope requestId = the pending one)."""

    message_type: ClassVar[str] = keys.MT_RESUME_CALL
    resume_kind: str = wire(keys.FP_RESUME_KIND, _is_str)
    result: Any = wire(keys.FP_RESULT, _is_any, None)
    error: dict[str, Any] | None = wire(keys.FP_ERROR, _optional(_is_object), None)
    budget_used_ms: int = wire(keys.FP_BUDGET_USED_MS, _is_int, 0)

    def remote_error(self) -> RemoteError | None:
        return None if self.error is None else RemoteError.from_wire(self.error)


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelCall(Payload):
    """Best-effort cancellation of one attempt."""

    message_type: ClassVar[str] = keys.MT_CANCEL_CALL
    reason: str = wire(keys.FP_REASON, _is_str, keys.DEFAULT_CANCEL_REASON)
    attempt_seq: int = wire(keys.FP_ATTEMPT_SEQ, _is_int, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAck(Payload):
    """Empty; losing it is harmless."""

    message_type: ClassVar[str] = keys.MT_HEARTBEAT_ACK


# --- executor → worker -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CallWaiting(Payload):
    """A call suspended on IO, a sub-call or a code fetch."""

    message_type: ClassVar[str] = keys.MT_CALL_WAITING
    task_id: str = wire(keys.FP_TASK_ID, _is_str)
    wait_kind: str = wire(keys.FP_WAIT_KIND, _is_str)
    attempt_seq: int = wire(keys.FP_ATTEMPT_SEQ, _is_int, 1)
    # io
    io_kind: str | None = wire(keys.FP_IO_KIND, _optional(_is_str), None)
    backend: str | None = wire(keys.FP_BACKEND, _optional(_is_str), None)
    operation: str | None = wire(keys.FP_OPERATION, _optional(_is_str), None)
    params: Any = wire(keys.FP_PARAMS, _is_any, None)
    cache_key: str | None = wire(keys.FP_CACHE_KEY, _optional(_is_str), None)
    # subcall (functionId also names the function to fetch for function_code)
    function_id: str | None = wire(keys.FP_FUNCTION_ID, _optional(_is_str), None)
    args: Any = wire(keys.FP_ARGS, _is_any, None)
    ancestry: list[str] = wire(keys.FP_ANCESTRY, _is_str_list, [])
    granted_budget_ms: int = wire(keys.FP_GRANTED_BUDGET_MS, _is_int, 0)
    # function_code
    function_code_digest: str | None = wire(keys.FP_FUNCTION_CODE_DIGEST, _optional(_is_str), None)

    def __post_init__(self) -> None:
        if self.wait_kind not in keys.WAIT_KINDS:
            raise PayloadError(self.message_type, keys.FP_WAIT_KIND, f"unknown {self.wait_kind!r}")
        if self.wait_kind == keys.WAIT_IO:
            if self.io_kind not in keys.IO_KINDS:
                raise PayloadError(
                    self.message_type, keys.FP_IO_KIND, "must be read, write or capability"
                )
            if self.backend is None or self.operation is None:
                raise PayloadError(
                    self.message_type, keys.FP_BACKEND, "io waits need backend and operation"
                )
        elif self.wait_kind == keys.WAIT_SUBCALL:
            if self.function_id is None:
                raise PayloadError(self.message_type, keys.FP_FUNCTION_ID, "subcall waits need it")
        elif self.function_id is None or self.function_code_digest is None:
            raise PayloadError(
                self.message_type,
                keys.FP_FUNCTION_CODE_DIGEST,
                "function_code waits need functionId and digest",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CallCompleted(Payload):
    """The attempt returned; ``output`` is its JSON value."""

    message_type: ClassVar[str] = keys.MT_CALL_COMPLETED
    task_id: str = wire(keys.FP_TASK_ID, _is_str)
    attempt_seq: int = wire(keys.FP_ATTEMPT_SEQ, _is_int, 1)
    output: Any = wire(keys.FP_OUTPUT, _is_any, None)
    budget_used_ms: int = wire(keys.FP_BUDGET_USED_MS, _is_int, 0)
    effective_execution_duration_us: int = wire(keys.FP_EFFECTIVE_EXECUTION_DURATION_US, _is_int, 0)
    queue_wait_us: int = wire(keys.FP_QUEUE_WAIT_US, _is_int, 0)
    debug_output: str | None = wire(keys.FP_DEBUG_OUTPUT, _optional(_is_str), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFailed(Payload):
    """The attempt ended without an output."""

    message_type: ClassVar[str] = keys.MT_CALL_FAILED
    task_id: str = wire(keys.FP_TASK_ID, _is_str)
    attempt_seq: int = wire(keys.FP_ATTEMPT_SEQ, _is_int, 1)
    error_kind: str = wire(keys.FP_ERROR_KIND, _is_str)
    retryable: bool = wire(keys.FP_RETRYABLE, _is_bool, False)
    error_message: str = wire(keys.FP_ERROR_MESSAGE, _is_str, "")
    error_stack: str | None = wire(keys.FP_ERROR_STACK, _optional(_is_str), None)
    local_vars: dict[str, Any] | None = wire(keys.FP_LOCAL_VARS, _optional(_is_object), None)
    budget_used_ms: int = wire(keys.FP_BUDGET_USED_MS, _is_int, 0)
    debug_output: str | None = wire(keys.FP_DEBUG_OUTPUT, _optional(_is_str), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Payload):
    """The executor's periodic report; the first valid one attaches a connection."""

    message_type: ClassVar[str] = keys.MT_HEARTBEAT
    executor_id: str = wire(keys.FP_EXECUTOR_ID, _is_str)
    heartbeat_seq: int = wire(keys.FP_HEARTBEAT_SEQ, _is_int)
    runnable_count: int = wire(keys.FP_RUNNABLE_COUNT, _is_int, 0)
    inflight_count: int = wire(keys.FP_INFLIGHT_COUNT, _is_int, 0)
    available_contexts: int = wire(keys.FP_AVAILABLE_CONTEXTS, _is_int, 0)
    memory_bytes: int = wire(keys.FP_MEMORY_BYTES, _is_int, 0)
    executor_cpu_utilization: float = wire(keys.FP_EXECUTOR_CPU_UTILIZATION, _is_number, 0.0)
    executor_cpu_seconds_total: float = wire(keys.FP_EXECUTOR_CPU_SECONDS_TOTAL, _is_number, 0.0)
    executor_process_instance_id: str = wire(keys.FP_EXECUTOR_PROCESS_INSTANCE_ID, _is_str, "")
    last_scheduler_active_at_ms: int = wire(keys.FP_LAST_SCHEDULER_ACTIVE_AT_MS, _is_int, 0)
    running_call_id: str | None = wire(keys.FP_RUNNING_CALL_ID, _optional(_is_str), None)
    running_for_ms: int = wire(keys.FP_RUNNING_FOR_MS, _is_int, 0)
    running_call_budget_ms: int = wire(keys.FP_RUNNING_CALL_BUDGET_MS, _is_int, 0)
    call_state_counts: dict[str, int] = wire(keys.FP_CALL_STATE_COUNTS, _is_int_map, {})
    sent_at_ms: int = wire(keys.FP_SENT_AT_MS, _is_int, 0)


PAYLOAD_TYPES: dict[str, type[Payload]] = {
    cls.message_type: cls
    for cls in (
        ExecuteCall,
        ResumeCall,
        CancelCall,
        HeartbeatAck,
        CallWaiting,
        CallCompleted,
        CallFailed,
        Heartbeat,
    )
}

#: Message types whose envelope must carry a callId.
_CALL_MESSAGES = frozenset(
    {
        keys.MT_EXECUTE_CALL,
        keys.MT_RESUME_CALL,
        keys.MT_CANCEL_CALL,
        keys.MT_CALL_WAITING,
        keys.MT_CALL_COMPLETED,
        keys.MT_CALL_FAILED,
    }
)


# --- envelopes ---------------------------------------------------------------------


def build_envelope(
    message_type: str,
    payload: Mapping[str, Any] | Payload,
    *,
    call_id: str | None = None,
    request_id: str | None = None,
    executor_id: str | None = None,
    sent_at_ms: int | None = None,
    trace: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Assemble an envelope dict; absent optional keys are left out."""
    envelope: dict[str, Any] = {
        keys.F_MESSAGE_TYPE: message_type,
        keys.F_PAYLOAD: payload.to_wire() if isinstance(payload, Payload) else payload,
    }
    if call_id is not None:
        envelope[keys.F_CALL_ID] = call_id
    if request_id is not None:
        envelope[keys.F_REQUEST_ID] = request_id
    if executor_id is not None:
        envelope[keys.F_EXECUTOR_ID] = executor_id
    if sent_at_ms is not None:
        envelope[keys.F_SENT_AT_MS] = sent_at_ms
    if trace is not None:
        envelope[keys.F_TRACE] = dict(trace)
    return envelope


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded, validated envelope with its typed payload."""

    message_type: str
    payload: Payload
    call_id: str | None = None
    request_id: str | None = None
    executor_id: str | None = None
    sent_at_ms: int | None = None
    trace: dict[str, Any] | None = None
    sidecar: bytes | None = None

    def to_envelope(self) -> dict[str, Any]:
        return build_envelope(
            self.message_type,
            self.payload,
            call_id=self.call_id,
            request_id=self.request_id,
            executor_id=self.executor_id,
            sent_at_ms=self.sent_at_ms,
            trace=self.trace,
        )


def _optional_key(message_type: str, envelope: Mapping[str, Any], key: str, check: Check) -> Any:
    value = envelope.get(key)
    if value is not None and not check(value):
        raise PayloadError(message_type, key, f"must be {_describe(check)}")
    return value


def parse_message(frame: Frame) -> Message:
    """Validate a decoded frame into a :class:`Message`.

    Raises :class:`~blockx.wire.errors.UnknownMessageTypeError` for a type this
    version does not know (log and drop it) and
    :class:`~blockx.wire.errors.PayloadError` for a known one of the wrong shape.
    """
    envelope = frame.envelope
    message_type = envelope[keys.F_MESSAGE_TYPE]
    payload_type = PAYLOAD_TYPES.get(message_type)
    if payload_type is None:
        raise UnknownMessageTypeError(message_type)
    if keys.F_PAYLOAD not in envelope and message_type != keys.MT_HEARTBEAT_ACK:
        raise PayloadError(message_type, keys.F_PAYLOAD, "is required")
    raw_payload = envelope.get(keys.F_PAYLOAD)
    payload = payload_type.from_wire({} if raw_payload is None else raw_payload)
    call_id = _optional_key(message_type, envelope, keys.F_CALL_ID, _is_str)
    if call_id is None and message_type in _CALL_MESSAGES:
        raise PayloadError(message_type, keys.F_CALL_ID, "is required")
    request_id = _optional_key(message_type, envelope, keys.F_REQUEST_ID, _is_str)
    if request_id is None and message_type == keys.MT_RESUME_CALL:
        raise PayloadError(message_type, keys.F_REQUEST_ID, "is required")
    return Message(
        message_type=message_type,
        payload=payload,
        call_id=call_id,
        request_id=request_id,
        executor_id=_optional_key(message_type, envelope, keys.F_EXECUTOR_ID, _is_str),
        sent_at_ms=_optional_key(message_type, envelope, keys.F_SENT_AT_MS, _is_int),
        trace=_optional_key(message_type, envelope, keys.F_TRACE, _is_object),
        sidecar=frame.sidecar,
    )

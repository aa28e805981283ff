"""Checked messages: a received payload validated into its wire-schema Struct; envelopes.

Theory of operation
-------------------
Every message is defined once, in :mod:`blockx.wire.schema` (a ``msgspec.Struct``
per payload, members named by docs/protocol.md's keys, with their types,
defaults and required-ness). This module defines no message again; it holds what
the slow paths do with them:

* :func:`validate` turns a received payload (a decoded dict) into its schema
  Struct, exactly as msgspec would decode those bytes (so a bool is not an int, an
  int is a float, unknown keys are ignored), plus the checks a type cannot say
  (:func:`_check_call_waiting`: what each ``waitKind`` needs). A bad payload raises
  :class:`~blockx.wire.errors.PayloadError` naming the key (``is required``, or
  msgspec's ``Expected `int`, got `bool```);
* :func:`to_wire` gives a Struct back as the payload dict (``output`` decoded);
* :class:`RemoteError` is the value of ``ResumeCall.error`` (``{"kind",
  "message", "retryable"}``), which the worker passes around as an error, not a
  message;
* :func:`build_envelope` assembles an envelope dict; :func:`parse_message`
  validates a decoded :class:`~blockx.wire.frames.Frame` into a :class:`Message`.

The hot paths never come here: they read dicts with :mod:`blockx.wire.keys` or
decode straight into the schema's Structs (``blockx/executor/execute_frames.py``,
``blockx/worker/link/completed_frames.py``). The users are the worker's Heartbeat
(once a second per executor), the executor's refusal of a malformed
``ExecuteCall`` (its message) and of a malformed ``ResumeCall.error``, and tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec

from . import keys, schema
from .errors import PayloadError, UnknownMessageTypeError
from .frames import Frame
from .values import loads_wire

__all__ = [
    "Message",
    "RemoteError",
    "build_envelope",
    "parse_message",
    "to_wire",
    "validate",
    "validate_payload",
]

S = TypeVar("S", bound=msgspec.Struct)

#: Payload Struct → its ``messageType`` (for the errors' messages).
_MESSAGE_TYPE_OF: Final[dict[type[Any], str]] = {
    payload: message_type for message_type, payload in schema.PAYLOADS.items()
}
_MESSAGE_TYPE_OF[schema.CallCompletedPayload] = keys.MT_CALL_COMPLETED

# msgspec's messages, parsed only on the error path: compiled there, on first use (re's
# cache), not at every worker's and executor's start.
_MISSING: Final = r"missing required field `(\w+)`"
_AT_KEY: Final = r"(.*) - at `\$\.(\w+)"

# One decoder per payload Struct, made on first use.
_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _payload_error(message_type: str, exc: msgspec.ValidationError) -> PayloadError:
    text = str(exc)
    missing = re.search(_MISSING, text)
    if missing is not None and " - at `" not in text:
        return PayloadError(message_type, missing.group(1), "is required")
    at = re.match(_AT_KEY, text)
    if at is not None:
        return PayloadError(message_type, at.group(2), at.group(1))
    return PayloadError(message_type, keys.F_PAYLOAD, text)


def validate(cls: type[S], payload: Any) -> S:
    """``payload`` (a received payload object) as the schema Struct ``cls``.

    Raises :class:`~blockx.wire.errors.PayloadError` naming the key at fault.
    """
    message_type = _MESSAGE_TYPE_OF[cls]
    if not isinstance(payload, Mapping):
        raise PayloadError(message_type, keys.F_PAYLOAD, "must be an object")
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = msgspec.json.Decoder(cls)
    try:
        # Through JSON, not msgspec.convert: the value is what its bytes decode to,
        # a CallCompleted's output (a msgspec.Raw) included.
        body = msgspec.json.encode(dict(payload))
    except (TypeError, msgspec.EncodeError) as exc:
        raise PayloadError(message_type, keys.F_PAYLOAD, f"is not JSON: {exc}") from None
    try:
        value: S = decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _payload_error(message_type, exc) from None
    if cls is schema.CallWaitingPayload:
        _check_call_waiting(value)  # type: ignore[arg-type]
    return value


def validate_payload(message_type: str, payload: Any) -> Any:
    """:func:`validate` for the payload Struct of ``message_type`` (a known one)."""
    return validate(schema.PAYLOADS[message_type], payload)


def _check_call_waiting(payload: schema.CallWaitingPayload) -> None:
    """What each ``waitKind`` needs (docs/protocol.md, ``CallWaiting``)."""
    mt = keys.MT_CALL_WAITING
    wait_kind = payload.waitKind
    if wait_kind not in keys.WAIT_KINDS:
        raise PayloadError(mt, keys.FP_WAIT_KIND, f"unknown {wait_kind!r}")
    if wait_kind == keys.WAIT_IO:
        if payload.ioKind not in keys.IO_KINDS:
            raise PayloadError(mt, keys.FP_IO_KIND, "must be read, write or capability")
        if payload.backend is None or payload.operation is None:
            raise PayloadError(mt, keys.FP_BACKEND, "io waits need backend and operation")
    elif wait_kind == keys.WAIT_SUBCALL:
        if payload.functionId is None:
            raise PayloadError(mt, keys.FP_FUNCTION_ID, "subcall waits need it")
    elif payload.functionId is None or payload.functionCodeDigest is None:
        raise PayloadError(
            mt, keys.FP_FUNCTION_CODE_DIGEST, "function_code waits need functionId and digest"
        )


def to_wire(payload: msgspec.Struct) -> dict[str, Any]:
    """A schema payload Struct as the payload dict (docs/protocol.md's keys; a
    ``msgspec.Raw`` member decoded)."""
    wire = msgspec.structs.asdict(payload)
    for key, value in wire.items():
        if type(value) is msgspec.Raw:
            wire[key] = None if value is schema.MISSING_OUTPUT else loads_wire(value)
    return wire


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


#: Message types whose envelope must carry a callId.
_CALL_MESSAGES: Final = frozenset(
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
    payload: Mapping[str, Any] | msgspec.Struct,
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
        keys.F_PAYLOAD: to_wire(payload) if isinstance(payload, msgspec.Struct) else payload,
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
    """A decoded, validated envelope with its payload as the schema's Struct."""

    message_type: str
    payload: Any
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


def _optional_key(message_type: str, envelope: Mapping[str, Any], key: str, kind: type) -> Any:
    value = envelope.get(key)
    if value is not None and (type(value) is not kind):
        raise PayloadError(message_type, key, f"must be {kind.__name__}")
    return value


def parse_message(frame: Frame) -> Message:
    """Validate a decoded frame into a :class:`Message`.

    Raises :class:`~blockx.wire.errors.UnknownMessageTypeError` for a type this
    version does not know (log and drop it) and
    :class:`~blockx.wire.errors.PayloadError` for a known one of the wrong shape.
    """
    envelope = frame.envelope
    message_type = envelope[keys.F_MESSAGE_TYPE]
    payload_type = schema.PAYLOADS.get(message_type)
    if payload_type is None:
        raise UnknownMessageTypeError(message_type)
    if keys.F_PAYLOAD not in envelope and message_type != keys.MT_HEARTBEAT_ACK:
        raise PayloadError(message_type, keys.F_PAYLOAD, "is required")
    raw_payload = envelope.get(keys.F_PAYLOAD)
    payload = validate(payload_type, {} if raw_payload is None else raw_payload)
    call_id = _optional_key(message_type, envelope, keys.F_CALL_ID, str)
    if call_id is None and message_type in _CALL_MESSAGES:
        raise PayloadError(message_type, keys.F_CALL_ID, "is required")
    request_id = _optional_key(message_type, envelope, keys.F_REQUEST_ID, str)
    if request_id is None and message_type == keys.MT_RESUME_CALL:
        raise PayloadError(message_type, keys.F_REQUEST_ID, "is required")
    return Message(
        message_type=message_type,
        payload=payload,
        call_id=call_id,
        request_id=request_id,
        executor_id=_optional_key(message_type, envelope, keys.F_EXECUTOR_ID, str),
        sent_at_ms=_optional_key(message_type, envelope, keys.F_SENT_AT_MS, int),
        trace=_optional_key(message_type, envelope, keys.F_TRACE, dict),
        sidecar=frame.sidecar,
    )

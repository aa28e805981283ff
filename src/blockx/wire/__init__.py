"""The worker⇄executor wire protocol (docs/protocol.md), shared by both sides.

IO-free: frames are built and parsed here, sockets live with their owners.

* :mod:`~blockx.wire.keys` — message types, envelope and payload keys, error kinds.
* :mod:`~blockx.wire.frames` — ``encode_frame``, ``FrameDecoder`` (sans-IO),
  ``decode_frame``.
* :mod:`~blockx.wire.values` — ``dumps_wire`` / ``loads_wire``: strict JSON for user values.
* :mod:`~blockx.wire.schema` — every message as a ``msgspec.Struct``, defined once: what
  the typed decoders decode into and the worker's pre-encoded ``ExecuteCall`` is cut from.
* :mod:`~blockx.wire.messages` — validated payload dataclasses, ``build_envelope``,
  ``parse_message`` (the slow paths').
* :mod:`~blockx.wire.errors` — ``ProtocolError`` (peer misbehaved) and
  ``EncodeError`` (caller misused us).
"""

from . import keys, schema
from .errors import (
    EncodeError,
    EnvelopeNotObjectError,
    FrameEncodingError,
    FrameJSONError,
    FrameTooLargeError,
    MissingMessageTypeError,
    NotSerializableError,
    PayloadError,
    PayloadTooLargeError,
    ProtocolError,
    SidecarHeaderError,
    TruncatedFrameError,
    UnknownMessageTypeError,
    WireError,
)
from .frames import (
    HEADER_SIZE,
    MAX_FRAME_BYTES,
    SIDECAR_MAGIC,
    Frame,
    FrameDecoder,
    decode_body,
    decode_frame,
    encode_envelope,
    encode_frame,
)
from .messages import (
    PAYLOAD_TYPES,
    CallCompleted,
    CallFailed,
    CallWaiting,
    CancelCall,
    ExecuteCall,
    Heartbeat,
    HeartbeatAck,
    Message,
    Payload,
    RemoteError,
    ResumeCall,
    build_envelope,
    parse_message,
)
from .values import dumps_wire, loads_wire

__all__ = [
    "HEADER_SIZE",
    "MAX_FRAME_BYTES",
    "PAYLOAD_TYPES",
    "SIDECAR_MAGIC",
    "CallCompleted",
    "CallFailed",
    "CallWaiting",
    "CancelCall",
    "EncodeError",
    "EnvelopeNotObjectError",
    "ExecuteCall",
    "Frame",
    "FrameDecoder",
    "FrameEncodingError",
    "FrameJSONError",
    "FrameTooLargeError",
    "Heartbeat",
    "HeartbeatAck",
    "Message",
    "MissingMessageTypeError",
    "NotSerializableError",
    "Payload",
    "PayloadError",
    "PayloadTooLargeError",
    "ProtocolError",
    "RemoteError",
    "ResumeCall",
    "SidecarHeaderError",
    "TruncatedFrameError",
    "UnknownMessageTypeError",
    "WireError",
    "build_envelope",
    "decode_body",
    "decode_frame",
    "dumps_wire",
    "encode_envelope",
    "encode_frame",
    "keys",
    "loads_wire",
    "parse_message",
    "schema",
]

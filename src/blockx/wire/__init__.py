"""The worker⇄executor wire protocol (docs/protocol.md), shared by both sides.

IO-free: frames are built and parsed here, sockets live with their owners.

* :mod:`~blockx.wire.keys` — message types, envelope and payload keys, error kinds.
* :mod:`~blockx.wire.frames` — ``encode_frame``, ``FrameDecoder`` (sans-IO),
  ``decode_frame``.
* :mod:`~blockx.wire.values` — ``dumps_wire`` / ``loads_wire``: strict JSON for user values.
* :mod:`~blockx.wire.schema` — every message as a ``msgspec.Struct``, defined once: what
  the typed decoders decode into, what received payloads are validated into, and what
  the worker's pre-encoded ``ExecuteCall`` is cut from.
* :mod:`~blockx.wire.messages` — no message of its own: ``validate`` (a payload dict
  into its schema Struct, errors naming the key), ``RemoteError`` (the value of
  ``ResumeCall.error``), ``build_envelope``, ``parse_message`` (the slow paths').
* :mod:`~blockx.wire.errors` — ``ProtocolError`` (peer misbehaved) and
  ``EncodeError`` (caller misused us).
"""

from . import keys, schema
from .errors import (
    BatchFrameError,
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
    BATCH_MAGIC,
    FEATURE_BATCH,
    HEADER_SIZE,
    MAX_FRAME_BYTES,
    SIDECAR_MAGIC,
    Frame,
    FrameDecoder,
    batch_frames,
    decode_body,
    decode_frame,
    decode_frames,
    encode_batch,
    encode_envelope,
    encode_frame,
)
from .messages import (
    Message,
    RemoteError,
    build_envelope,
    parse_message,
    validate,
    validate_payload,
)
from .values import dumps_wire, loads_wire

__all__ = [
    "BATCH_MAGIC",
    "FEATURE_BATCH",
    "HEADER_SIZE",
    "MAX_FRAME_BYTES",
    "SIDECAR_MAGIC",
    "BatchFrameError",
    "EncodeError",
    "EnvelopeNotObjectError",
    "Frame",
    "FrameDecoder",
    "FrameEncodingError",
    "FrameJSONError",
    "FrameTooLargeError",
    "Message",
    "MissingMessageTypeError",
    "NotSerializableError",
    "PayloadError",
    "PayloadTooLargeError",
    "ProtocolError",
    "RemoteError",
    "SidecarHeaderError",
    "TruncatedFrameError",
    "UnknownMessageTypeError",
    "WireError",
    "batch_frames",
    "build_envelope",
    "decode_body",
    "decode_frame",
    "decode_frames",
    "dumps_wire",
    "encode_batch",
    "encode_envelope",
    "encode_frame",
    "keys",
    "loads_wire",
    "parse_message",
    "schema",
    "validate",
    "validate_payload",
]

"""The wire layer's one error hierarchy.

Two branches, never mixed:

* :class:`ProtocolError` — the *peer* misbehaved: a frame that is too large,
  truncated, not UTF-8, not JSON, not an envelope, or a payload of the wrong
  shape. The receiver logs it and closes the connection; the transport-lost
  path does the rest (docs/protocol.md, "Frames").
* :class:`EncodeError` — *our caller* handed us something that cannot go on the
  wire: a value JSON cannot hold, or a frame over the size limit. Nothing was
  sent; the caller fails that one call with :attr:`EncodeError.error_kind`.
"""

from __future__ import annotations

from typing import ClassVar


class WireError(Exception):
    """Base of every error raised by :mod:`blockx.wire`."""


# --- the peer misbehaved -----------------------------------------------------


class ProtocolError(WireError):
    """A malformed inbound frame. The connection it came from is unusable."""


class FrameTooLargeError(ProtocolError):
    """The length prefix announces more than the frame limit (checked before the body is read)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame length {length} exceeds the limit of {limit} bytes")
        self.length = length
        self.limit = limit


class TruncatedFrameError(ProtocolError):
    """The stream or buffer ended inside a frame's header or body."""


class SidecarHeaderError(ProtocolError):
    """A ``BXB1`` frame whose JSON length J does not fit the body (J > N-8 or N < 8)."""


class BatchFrameError(ProtocolError):
    """A ``BXM1`` batched frame that does not hold K >= 1 whole inner bodies exactly
    (K = 0, an inner length past the end, bytes left over, or a batch inside a batch)."""


class FrameEncodingError(ProtocolError):
    """The envelope bytes are not valid UTF-8."""


class FrameJSONError(ProtocolError):
    """The envelope bytes are UTF-8 but not JSON."""


class EnvelopeNotObjectError(ProtocolError):
    """The envelope is valid JSON but not a JSON object."""


class MissingMessageTypeError(ProtocolError):
    """The envelope has no ``messageType`` string."""


class PayloadError(ProtocolError):
    """A known message whose envelope or payload misses a required key or has a wrong type."""

    def __init__(self, message_type: str, key: str, problem: str) -> None:
        super().__init__(f"{message_type}: {key}: {problem}")
        self.message_type = message_type
        self.key = key
        self.problem = problem


class UnknownMessageTypeError(WireError):
    """A well-formed envelope of a type this version does not know.

    Not a :class:`ProtocolError`: docs/protocol.md says such frames are logged and
    dropped, and the connection carries on.
    """

    def __init__(self, message_type: str) -> None:
        super().__init__(f"unknown messageType {message_type!r}")
        self.message_type = message_type


# --- our caller misused us ---------------------------------------------------


class EncodeError(WireError):
    """A value or frame that cannot be sent. Nothing was written."""

    error_kind: ClassVar[str] = "internal_error"


class NotSerializableError(EncodeError, TypeError):
    """A value JSON cannot represent (``Decimal``, ``set``, NaN, a non-string key, ...).

    ``path`` locates the offending value inside the encoded object, as
    ``$['rows'][3]['price']``.
    """

    error_kind: ClassVar[str] = "output_not_serializable"

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"value at {path} {problem}")
        self.path = path
        self.problem = problem


class PayloadTooLargeError(EncodeError, ValueError):
    """The encoded frame would exceed the frame limit."""

    error_kind: ClassVar[str] = "payload_too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"encoded frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit

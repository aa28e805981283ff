"""Frames: the length-prefixed envelopes that cross the Unix socket.

::

    uint32 big-endian N | N bytes body                       (N <= 16 MiB)
    body = JSON envelope                                      plain frame
    body = b"BXB1" | uint32 BE J | J bytes JSON | N-8-J bytes sidecar frame
    body = b"BXM1" | uint32 BE K | K x (uint32 BE L | L bytes body)  batched frame

:func:`encode_frame` builds one frame; :class:`FrameDecoder` is an incremental,
sans-IO decoder: feed it whatever bytes arrived (a whole buffer, one byte, a
split at any boundary) and it returns every frame completed so far. It never
reads a socket, so the executor's reader thread and the worker's asyncio
protocol use the same code. The length limit is checked as soon as the 4-byte
prefix is in, before any of the body is buffered.

A batched frame (v1.1, negotiated: docs/protocol.md "Batched frames") carries K
inner bodies, each exactly the body its own frame would have; the decoder yields
them in order as if K frames had arrived, the ``typed`` hook applying to each.
Its inner entries have the frame layout (``uint32 L | L bytes``), so
:func:`batch_frames` builds one from already encoded frames by writing a 12-byte
header before their concatenation: no frame is re-encoded.

A body nested too deeply to decode (a "depth bomb": msgspec's recursion limit)
is malformed JSON like any other, a :class:`~blockx.wire.errors.FrameJSONError`,
never a ``RecursionError`` escaping into the reader.

After a :class:`~blockx.wire.errors.ProtocolError` a decoder is *poisoned*: the
stream has lost framing and every later ``feed`` raises the same error. The
owner closes the connection.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final, Generic, NamedTuple

import msgspec
import orjson

from . import keys
from .errors import (
    BatchFrameError,
    EnvelopeNotObjectError,
    FrameEncodingError,
    FrameJSONError,
    FrameTooLargeError,
    MissingMessageTypeError,
    PayloadTooLargeError,
    ProtocolError,
    SidecarHeaderError,
    TruncatedFrameError,
)
from .type_params import E, T
from .values import dumps_wire, loads_wire

__all__ = [
    "BATCH_MAGIC",
    "FEATURE_BATCH",
    "HEADER_SIZE",
    "MAX_FRAME_BYTES",
    "SIDECAR_MAGIC",
    "Frame",
    "FrameDecoder",
    "TypedHook",
    "batch_frames",
    "decode_body",
    "decode_frame",
    "decode_frames",
    "encode_batch",
    "encode_envelope",
    "encode_frame",
    "encode_frame_with_value",
    "typed_hook",
]

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
HEADER_SIZE: Final = 4
SIDECAR_MAGIC: Final = b"BXB1"
_SIDECAR_HEADER_SIZE: Final = 8
#: The body of a batched frame (docs/protocol.md "Batched frames"); shares its first
#: byte with SIDECAR_MAGIC, so a plain frame still costs one byte compare.
BATCH_MAGIC: Final = b"BXM1"
#: The ``features`` entry peers announce (Heartbeat / HeartbeatAck) to receive batches.
FEATURE_BATCH: Final = "batch"
_BATCH_HEADER_SIZE: Final = 8
_MAGIC_FIRST: Final = SIDECAR_MAGIC[0]

_U32 = struct.Struct(">I")
_U32_PAIR = struct.Struct(">4sI")
# Final: a compiled module reads these from C statics, not from its globals dict (a
# dict lookup, plus an attribute lookup for ``orjson.dumps``, per frame otherwise).
_u32_pack: Final = _U32.pack
_dumps: Final = orjson.dumps
_PASSTHROUGH_DATACLASS: Final = orjson.OPT_PASSTHROUGH_DATACLASS
# The decoder behind loads_wire, called directly on FrameDecoder's fast path.
_json_decode: Final = msgspec.json.Decoder().decode
# Frame(...) runs namedtuple's Python-level __new__; this is the same tuple, built in C.
_new_frame: Final = tuple.__new__
#: Frame bodies up to this size are sliced out as bytes; bigger ones are read through
#: a memoryview of the received bytes (no copy).
_COPIED_BODY_MAX: Final = 64 * 1024


class Frame(NamedTuple, Generic[E]):
    """One decoded frame: the envelope object and the raw sidecar bytes, if any.

    A named tuple: decoders build one per frame, and a tuple is the cheapest
    immutable record Python has. ``envelope`` is the decoded JSON object (a
    ``dict``) or, from a :class:`FrameDecoder` with a ``typed`` hook, possibly the
    :mod:`blockx.wire.schema` envelope the hook decoded: ``decode_frame`` gives a
    ``Frame[dict[str, Any]]``, ``FrameDecoder(typed=hook).feed`` a
    ``Frame[dict[str, Any] | ExecuteCall | ResumeCall]`` for the executor's hook.
    """

    envelope: E
    sidecar: bytes | None = None

    @property
    def message_type(self) -> str:
        envelope: Any = self.envelope
        if type(envelope) is dict:
            mt: str = envelope[keys.F_MESSAGE_TYPE]
            return mt
        tag: str = type(envelope).__struct_config__.tag  # a schema Struct's messageType
        return tag

    def __repr__(self) -> str:
        envelope: Any = self.envelope
        side = "" if self.sidecar is None else f", sidecar={len(self.sidecar)}B"
        if type(envelope) is dict:
            call = envelope.get(keys.F_CALL_ID)
        else:
            call = getattr(envelope, keys.F_CALL_ID, None)
        return f"Frame({self.message_type}, callId={call!r}{side})"


# --- encoding ------------------------------------------------------------------


def encode_envelope(envelope: dict[str, Any]) -> bytes:
    """Encode an envelope object to JSON bytes.

    Values from user code (outputs, args, params) should already be
    ``orjson.Fragment(dumps_wire(value))`` so they are validated once; anything
    else the envelope holds goes through the same strict rules.
    """
    try:
        return _dumps(envelope)
    except TypeError:
        return dumps_wire(envelope)


def encode_frame(
    envelope: dict[str, Any] | bytes,
    sidecar: bytes | bytearray | memoryview | None = None,
    *,
    limit: int = MAX_FRAME_BYTES,
) -> bytes:
    """Build one frame from an envelope (an object, or its encoded JSON bytes).

    Raises :class:`~blockx.wire.errors.PayloadTooLargeError` when the body would
    exceed ``limit``, and :class:`~blockx.wire.errors.NotSerializableError` when
    the envelope holds a value JSON cannot represent. Nothing is half-written.
    """
    body = envelope if isinstance(envelope, bytes) else encode_envelope(envelope)
    if sidecar is None:
        size = len(body)
        if size > limit:
            raise PayloadTooLargeError(size, limit)
        return _u32_pack(size) + body
    size = _SIDECAR_HEADER_SIZE + len(body) + len(sidecar)
    if size > limit:
        raise PayloadTooLargeError(size, limit)
    return b"".join((_u32_pack(size), _U32_PAIR.pack(SIDECAR_MAGIC, len(body)), body, sidecar))


def encode_frame_with_value(
    envelope: dict[str, Any],
    holder: dict[str, Any],
    key: str,
    skeleton_nulls: int,
    sidecar: bytes | bytearray | memoryview | None = None,
) -> bytes:
    """:func:`encode_frame` for an envelope where ``holder[key]`` is a raw user value.

    One ``orjson.dumps`` of the whole envelope instead of ``dumps_wire(value)``
    plus a second pass over its ``Fragment`` (about 1.7 µs a frame), and the
    same bytes: orjson is ``dumps_wire``'s own fast path. ``skeleton_nulls`` is
    how many ``null`` the envelope writes outside the value; more than that and
    the value may hold a NaN or an infinity (orjson writes them as ``null``), so
    ``dumps_wire`` checks it. What orjson refuses (a big int, a dataclass, a
    non-string key) is encoded by ``dumps_wire`` into ``holder[key]`` as a
    ``Fragment``. Raises what ``dumps_wire`` and :func:`encode_frame` raise.
    """
    try:
        body = _dumps(envelope, option=_PASSTHROUGH_DATACLASS)
    except TypeError:
        holder[key] = orjson.Fragment(dumps_wire(holder[key]))
        return encode_frame(envelope, sidecar)
    if body.count(b"null") > skeleton_nulls:
        dumps_wire(holder[key])  # raises for a NaN or an infinity
    size = len(body)
    if sidecar is None and size <= MAX_FRAME_BYTES:
        return _u32_pack(size) + body  # encode_frame's common case, one call fewer
    return encode_frame(body, sidecar)


def batch_frames(frames: list[bytes], *, limit: int = MAX_FRAME_BYTES) -> bytes:
    """The bytes to write for ``frames`` (each a complete frame, length prefix
    included, as :func:`encode_frame` builds it), batched: every run of two or
    more consecutive frames whose batch body fits ``limit`` becomes one ``BXM1``
    frame; a run of one (or a frame too big to share a batch) stays a plain frame.

    Order is kept. Send this only to a peer that announced
    :data:`FEATURE_BATCH` (docs/protocol.md "Batched frames").
    """
    count = len(frames)
    if count < 2:
        return frames[0] if count else b""
    room = limit - _BATCH_HEADER_SIZE
    total: int = sum(map(len, frames))
    if total <= room:  # the common case: one batch
        header = _u32_pack(total + _BATCH_HEADER_SIZE) + BATCH_MAGIC + _u32_pack(count)
        return b"".join((header, *frames))
    parts: list[bytes] = []
    run: list[bytes] = []
    run_size = 0
    for frame in frames:
        if run and run_size + len(frame) > room:
            _append_run(parts, run, run_size)
            run = []
            run_size = 0
        run.append(frame)
        run_size += len(frame)
    _append_run(parts, run, run_size)
    return b"".join(parts)


def _append_run(parts: list[bytes], run: list[bytes], run_size: int) -> None:
    if len(run) == 1:
        parts.append(run[0])
        return
    parts.append(_u32_pack(run_size + _BATCH_HEADER_SIZE))
    parts.append(BATCH_MAGIC)
    parts.append(_u32_pack(len(run)))
    parts.extend(run)


def encode_batch(bodies: list[bytes], *, limit: int = MAX_FRAME_BYTES) -> bytes:
    """:func:`batch_frames` for frame bodies (plain or sidecar, without their prefix)."""
    return batch_frames([_u32_pack(len(body)) + body for body in bodies], limit=limit)


# --- decoding ------------------------------------------------------------------


class TypedHook(Generic[T]):
    """A :class:`FrameDecoder` ``typed`` hook for one or more message types
    (``{messageType: tagged msgspec.Struct}``, :mod:`blockx.wire.schema`'s envelopes;
    :func:`typed_hook` for one). ``T`` is what it decodes to: the union of those Structs.

    Callable on a frame body; :class:`FrameDecoder` also reads :attr:`prefix` and
    checks it inline, so a frame of another type costs no Python call. With
    several types the prefix is what their bodies have in common, and a frame
    of another type that shares it costs one failed decode (meant for rare ones).
    """

    __slots__ = ("_accept", "_decode", "prefix", "size")

    def __init__(self, structs: dict[str, type[T]], accept: Callable[[T], bool]) -> None:
        prefixes = [
            b'{"' + keys.F_MESSAGE_TYPE.encode() + b'":"' + message_type.encode() + b'",'
            for message_type in structs
        ]
        prefix = prefixes[0]
        for other in prefixes[1:]:
            while not other.startswith(prefix):
                prefix = prefix[:-1]
        self.prefix = prefix
        self.size = len(prefix)
        types = tuple(structs.values())
        union: Any = types[0]
        for other_type in types[1:]:
            union = union | other_type
        self._decode = msgspec.json.Decoder(union).decode
        self._accept = accept

    def __call__(self, body: bytes | memoryview) -> T | None:
        if body[: self.size] != self.prefix:
            return None
        return self.decode_matching(body)

    def decode_matching(self, body: bytes | memoryview) -> T | None:
        """Decode a body known to start with :attr:`prefix` (None: take the generic path)."""
        try:
            decoded: T = self._decode(body)
        except (msgspec.DecodeError, RecursionError):  # also msgspec.ValidationError;
            return None  # a depth bomb too: the generic path raises its ProtocolError
        return decoded if self._accept(decoded) else None


def typed_hook(message_type: str, struct: type[T], accept: Callable[[T], bool]) -> TypedHook[T]:
    """A :class:`FrameDecoder` ``typed`` hook for one message type.

    It takes a plain body that starts the way our own encoders write that type
    (``{"messageType":"<type>",``), decodes it into ``struct`` (a tagged
    ``msgspec.Struct``, which checks every member's type) and keeps it when
    ``accept(decoded)`` (the range checks msgspec cannot express). Anything else
    returns None: the frame is then decoded the generic way, with its errors.
    """
    return TypedHook({message_type: struct}, accept)


def _decode_json(data: bytes | memoryview) -> dict[str, Any]:
    try:
        envelope = loads_wire(data)
    except msgspec.DecodeError as exc:
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as utf_exc:
            raise FrameEncodingError(f"envelope is not valid UTF-8: {utf_exc}") from None
        raise FrameJSONError(f"envelope is not valid JSON: {exc}") from None
    if not isinstance(envelope, dict):
        raise EnvelopeNotObjectError(
            f"envelope must be a JSON object, got {type(envelope).__name__}"
        )
    if not isinstance(envelope.get(keys.F_MESSAGE_TYPE), str):
        raise MissingMessageTypeError("envelope has no messageType string")
    return envelope


def decode_body(body: bytes | memoryview) -> Frame[dict[str, Any]]:
    """Decode one plain or sidecar frame body (without its length prefix).

    A batched body is refused (:class:`BatchFrameError`): it holds several frames
    (:func:`decode_frames`); inside a batch, a batch is a protocol error.
    """
    # A JSON envelope starts with "{" or blank space, never "B": one byte decides.
    if len(body) >= 4 and body[0] == _MAGIC_FIRST and body[:4] == BATCH_MAGIC:
        raise BatchFrameError("a batched frame where one frame body was expected")
    if len(body) >= 4 and body[0] == _MAGIC_FIRST and body[:4] == SIDECAR_MAGIC:
        size = len(body)
        if size < _SIDECAR_HEADER_SIZE:
            raise SidecarHeaderError(f"sidecar frame of {size} bytes has no JSON length")
        (json_len,) = _U32.unpack_from(body, 4)
        if json_len > size - _SIDECAR_HEADER_SIZE:
            raise SidecarHeaderError(
                f"sidecar JSON length {json_len} exceeds the {size - 8} body bytes after the header"
            )
        view = memoryview(body)
        end = _SIDECAR_HEADER_SIZE + json_len
        return Frame(_decode_json(view[_SIDECAR_HEADER_SIZE:end]), view[end:].tobytes())
    return Frame(_decode_json(body))


def _decode_batch(
    buf: bytes,
    begin: int,
    stop: int,
    typed: Callable[[bytes | memoryview], Any] | None,
    typed_prefix: bytes,
) -> list[Frame[Any]]:
    """The frames of the ``BXM1`` body ``buf[begin:stop]``, in order (``typed``: a hook's
    ``decode_matching``). Each inner body takes :meth:`FrameDecoder.feed`'s path: the
    typed hook, then the inline JSON fast path, then :func:`decode_body` and its errors."""
    size = stop - begin
    if size < _BATCH_HEADER_SIZE:
        raise BatchFrameError(f"batched frame of {size} bytes has no count")
    count = (buf[begin + 4] << 24) | (buf[begin + 5] << 16) | (buf[begin + 6] << 8) | buf[begin + 7]
    if count == 0:
        raise BatchFrameError("batched frame holds no frames (K = 0)")
    # Each inner frame needs its 4-byte length at least: a K no body could hold is
    # refused before any list of that size is built.
    if count > (size - _BATCH_HEADER_SIZE) // HEADER_SIZE:
        raise BatchFrameError(f"batched frame announces {count} frames in {size} bytes")
    typed_size = len(typed_prefix)
    frames: list[Frame[Any]] = []
    offset = begin + _BATCH_HEADER_SIZE
    for index in range(count):
        if stop - offset < HEADER_SIZE:
            raise BatchFrameError(f"batched frame ends before inner frame {index} of {count}")
        length = (
            (buf[offset] << 24) | (buf[offset + 1] << 16) | (buf[offset + 2] << 8) | buf[offset + 3]
        )
        start = offset + HEADER_SIZE
        end = start + length
        if end > stop:
            raise BatchFrameError(
                f"inner frame {index} of {length} bytes runs past the batch's end"
                f" ({stop - start} bytes left)"
            )
        plain = length != 0 and buf[start] != _MAGIC_FIRST
        if not plain and length >= 4 and buf[start : start + 4] == BATCH_MAGIC:
            raise BatchFrameError(f"inner frame {index} is itself a batch")
        # As in feed: small plain bodies are sliced out, the rest read through a view.
        inner: bytes | memoryview = (
            buf[start:end] if plain and length <= _COPIED_BODY_MAX else memoryview(buf)[start:end]
        )
        envelope: Any = None
        if plain:
            if (
                typed is not None
                and length >= typed_size
                and buf[start : start + typed_size] == typed_prefix
            ):
                envelope = typed(inner)
                if envelope is not None:
                    frames.append(_new_frame(Frame, (envelope, None)))
                    offset = end
                    continue
            try:
                envelope = _json_decode(inner)
            except (msgspec.DecodeError, RecursionError):
                pass  # decode_body raises the precise ProtocolError
        if type(envelope) is dict and type(envelope.get(keys.F_MESSAGE_TYPE)) is str:
            frames.append(_new_frame(Frame, (envelope, None)))
        else:
            frames.append(decode_body(inner))
        offset = end
    if offset != stop:
        raise BatchFrameError(f"{stop - offset} bytes after the last of {count} inner frames")
    return frames


def decode_frames(data: bytes, *, limit: int = MAX_FRAME_BYTES) -> list[Frame[dict[str, Any]]]:
    """Decode exactly one whole frame (prefix included): its one frame, or a batch's frames."""
    body = _frame_body(data, limit)
    if len(body) >= 4 and body[:4].tobytes() == BATCH_MAGIC:
        return _decode_batch(bytes(data), HEADER_SIZE, len(data), None, b"")
    return [decode_body(body)]


def decode_frame(data: bytes, *, limit: int = MAX_FRAME_BYTES) -> Frame[dict[str, Any]]:
    """Decode exactly one whole plain or sidecar frame (prefix included); extra bytes
    are an error, and so is a batched frame (:func:`decode_frames` takes those)."""
    return decode_body(_frame_body(data, limit))


def _frame_body(data: bytes, limit: int) -> memoryview:
    if len(data) < HEADER_SIZE:
        raise TruncatedFrameError(f"frame header needs 4 bytes, got {len(data)}")
    (size,) = _U32.unpack_from(data, 0)
    if size > limit:
        raise FrameTooLargeError(size, limit)
    if len(data) - HEADER_SIZE < size:
        raise TruncatedFrameError(f"frame body needs {size} bytes, got {len(data) - HEADER_SIZE}")
    if len(data) - HEADER_SIZE > size:
        raise ProtocolError(f"{len(data) - HEADER_SIZE - size} bytes after the frame")
    return memoryview(data)[HEADER_SIZE:]


class FrameDecoder(Generic[T]):
    """Incremental frame decoder: ``feed(bytes) -> list[Frame[dict[str, Any] | T]]``
    (``T``: what its ``typed`` hook decodes to; none without one).

    One per connection, reused for its whole life. Not thread-safe: the owner
    (a reader thread or an asyncio protocol) is its only caller.

    ``typed``, a :class:`TypedHook`, sees each plain frame body that starts with
    its prefix (compared inline: a frame of another type costs no call) and may
    return an object standing for the whole envelope (a ``msgspec.Struct``
    decoded and validated in one C pass); that object is the frame's
    ``envelope``. It returns None for anything it does not take, and the frame
    is decoded as usual, so every error is still the generic path's. The
    executor uses it for ExecuteCall and ResumeCall, the worker for CallCompleted and
    CallWaiting.
    """

    __slots__ = ("_buffer", "_error", "_limit", "_need", "_typed", "_typed_prefix")

    def __init__(self, *, limit: int = MAX_FRAME_BYTES, typed: TypedHook[T] | None = None) -> None:
        self._buffer = bytearray()
        self._typed = None if typed is None else typed.decode_matching
        self._typed_prefix = b"" if typed is None else typed.prefix
        self._limit = limit
        self._error: ProtocolError | None = None
        # Bytes needed before the next frame can complete (a hint for readers).
        self._need = HEADER_SIZE

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buffer)

    @property
    def bytes_needed(self) -> int:
        """At least this many more bytes are needed to complete the next frame."""
        return max(self._need - len(self._buffer), 1)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame[dict[str, Any] | T]]:
        """Add received bytes; return the frames they completed, in order.

        Raises a :class:`~blockx.wire.errors.ProtocolError` for a malformed frame;
        frames completed before it in the same call are lost with the connection.
        """
        if self._error is not None:
            raise self._error
        buf: bytes
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return []
            buf = bytes(self._buffer)
            self._buffer.clear()
        elif type(data) is bytes:
            buf = data
        else:
            # One copy of a read into a reused buffer (the executor's reader): every
            # operation below is then a native bytes one when compiled.
            buf = bytes(data)
        total = len(buf)
        offset = 0
        limit = self._limit
        typed = self._typed
        typed_prefix = self._typed_prefix
        typed_size = len(typed_prefix)
        frames: list[Frame[dict[str, Any] | T]] = []
        self._need = HEADER_SIZE
        try:
            while total - offset >= HEADER_SIZE:
                # The big-endian length, byte by byte: native int ops when compiled,
                # cheaper than a Struct method call and the int it boxes.
                size = (
                    (buf[offset] << 24)
                    | (buf[offset + 1] << 16)
                    | (buf[offset + 2] << 8)
                    | buf[offset + 3]
                )
                if size > limit:
                    raise FrameTooLargeError(size, limit)
                start = offset + HEADER_SIZE
                end = start + size
                if end > total:
                    self._need = HEADER_SIZE + size
                    break
                plain = size != 0 and buf[start] != _MAGIC_FIRST
                # A plain body up to _COPIED_BODY_MAX is sliced out as its own bytes (a copy
                # of a few hundred bytes costs less than a memoryview slice, and compiled
                # code slices bytes natively); a bigger one, or a sidecar frame (whose bytes
                # decode_body copies out), is read through a view: never copied twice.
                body: bytes | memoryview = (
                    buf[start:end]
                    if plain and size <= _COPIED_BODY_MAX
                    else memoryview(buf)[start:end]
                )
                # Fast path, inline: a plain JSON envelope that decodes to an object with a
                # messageType. Anything else goes through decode_body, which raises the
                # precise ProtocolError. Saves four Python calls per frame.
                envelope: Any = None
                if plain:
                    if (
                        typed is not None
                        and size >= typed_size
                        and buf[start : start + typed_size] == typed_prefix
                    ):
                        envelope = typed(body)
                        if envelope is not None:
                            frames.append(_new_frame(Frame, (envelope, None)))
                            offset = end
                            continue
                    try:
                        envelope = _json_decode(body)
                    except (msgspec.DecodeError, RecursionError):
                        pass  # decode_body raises the precise ProtocolError
                if type(envelope) is dict and type(envelope.get(keys.F_MESSAGE_TYPE)) is str:
                    frames.append(_new_frame(Frame, (envelope, None)))
                elif not plain and size >= 4 and buf[start : start + 4] == BATCH_MAGIC:
                    frames.extend(_decode_batch(buf, start, end, typed, typed_prefix))
                else:
                    frames.append(decode_body(body))
                offset = end
        except ProtocolError as exc:
            self._error = exc
            raise
        if offset < total:
            self._buffer += memoryview(buf)[offset:] if offset else buf
        return frames

    def close(self) -> None:
        """The stream ended: raise :class:`TruncatedFrameError` if a frame was cut off."""
        if self._error is not None:
            raise self._error
        if self._buffer:
            what = "header" if len(self._buffer) < HEADER_SIZE else "body"
            raise TruncatedFrameError(
                f"stream ended inside a frame {what} ({len(self._buffer)} bytes buffered)"
            )

"""Frames: encode/decode round trips fed whole, byte by byte and split anywhere; every malformed input."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import struct
import uuid

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx import wire
from blockx.wire import (
    MAX_FRAME_BYTES,
    EnvelopeNotObjectError,
    FrameDecoder,
    FrameEncodingError,
    FrameJSONError,
    FrameTooLargeError,
    MissingMessageTypeError,
    NotSerializableError,
    PayloadTooLargeError,
    ProtocolError,
    SidecarHeaderError,
    TruncatedFrameError,
    decode_frame,
    dumps_wire,
    encode_frame,
)
from blockx.wire.frames import _COPIED_BODY_MAX, TypedHook, encode_frame_with_value

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
message_types = st.sampled_from(sorted(wire.keys.MESSAGE_TYPES)) | st.text(min_size=1, max_size=12)
envelopes = st.fixed_dictionaries(
    {"messageType": message_types, "payload": json_values},
    optional={
        "callId": st.text(max_size=20),
        "requestId": st.none() | st.text(max_size=20),
        "executorId": st.text(max_size=10),
        "sentAtMs": st.integers(min_value=0, max_value=2**53),
    },
)
sidecars = st.none() | st.binary(max_size=3000)
frame_lists = st.lists(st.tuples(envelopes, sidecars), min_size=1, max_size=8)


def _encode_all(items: list[tuple[dict, bytes | None]]) -> bytes:
    return b"".join(encode_frame(env, side) for env, side in items)


def _as_pairs(frames: list[wire.Frame]) -> list[tuple[dict, bytes | None]]:
    return [(f.envelope, f.sidecar) for f in frames]


@settings(max_examples=150, deadline=None)
@given(frame_lists)
def test_round_trip_fed_whole(items):
    decoder = FrameDecoder()
    assert _as_pairs(decoder.feed(_encode_all(items))) == items
    assert decoder.buffered == 0
    decoder.close()


@settings(max_examples=40, deadline=None)
@given(frame_lists)
def test_round_trip_fed_byte_by_byte(items):
    data = _encode_all(items)
    decoder = FrameDecoder()
    frames: list[wire.Frame] = []
    for i in range(len(data)):
        frames.extend(decoder.feed(data[i : i + 1]))
    assert _as_pairs(frames) == items
    decoder.close()


@settings(max_examples=150, deadline=None)
@given(frame_lists, st.data())
def test_round_trip_split_at_random_boundaries(items, data):
    encoded = _encode_all(items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(encoded)), max_size=12)))
    decoder = FrameDecoder()
    frames: list[wire.Frame] = []
    start = 0
    for cut in [*cuts, len(encoded)]:
        frames.extend(decoder.feed(memoryview(encoded)[start:cut]))
        start = cut
    assert _as_pairs(frames) == items


def test_plain_frame_layout_is_byte_exact():
    frame = encode_frame({"messageType": "HeartbeatAck", "payload": {}})
    body = b'{"messageType":"HeartbeatAck","payload":{}}'
    assert frame == struct.pack(">I", len(body)) + body


def test_sidecar_frame_layout_is_byte_exact():
    frame = encode_frame({"messageType": "ResumeCall", "payload": {}}, b"\x00\x01raw")
    body_json = b'{"messageType":"ResumeCall","payload":{}}'
    expected_body = b"BXB1" + struct.pack(">I", len(body_json)) + body_json + b"\x00\x01raw"
    assert frame == struct.pack(">I", len(expected_body)) + expected_body
    decoded = decode_frame(frame)
    assert decoded.sidecar == b"\x00\x01raw"
    assert decoded.envelope == {"messageType": "ResumeCall", "payload": {}}


def test_empty_sidecar_is_still_a_sidecar():
    decoded = decode_frame(encode_frame({"messageType": "ResumeCall"}, b""))
    assert decoded.sidecar == b""


# --- malformed input -----------------------------------------------------------


def _raw(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("size", [0, 1, 2, 3])
def test_short_header_is_truncated(size):
    with pytest.raises(TruncatedFrameError):
        decode_frame(b"\x00" * size)
    decoder = FrameDecoder()
    assert decoder.feed(b"\x00" * size) == []
    if size == 0:
        decoder.close()  # a stream that ends between frames ends cleanly
        return
    with pytest.raises(TruncatedFrameError, match="header"):
        decoder.close()


def test_short_body_is_truncated():
    data = _raw(b'{"messageType":"X"}')[:-3]
    with pytest.raises(TruncatedFrameError):
        decode_frame(data)
    decoder = FrameDecoder()
    assert decoder.feed(data) == []
    with pytest.raises(TruncatedFrameError, match="body"):
        decoder.close()


def test_oversize_length_is_rejected_before_the_body_arrives():
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLargeError) as info:
        decoder.feed(struct.pack(">I", MAX_FRAME_BYTES + 1))  # only the header: no body sent
    assert info.value.length == MAX_FRAME_BYTES + 1
    assert decoder.buffered == 0
    # the decoder is poisoned: framing is lost for good
    with pytest.raises(FrameTooLargeError):
        decoder.feed(_raw(b'{"messageType":"HeartbeatAck"}'))


def test_exactly_the_limit_is_accepted():
    limit = 64
    body = b'{"messageType":"HeartbeatAck","payload":{"p":"' + b"x" * 10 + b'"}}'
    body = body + b" " * (limit - len(body))
    decoder = FrameDecoder(limit=limit)
    assert len(decoder.feed(_raw(body))) == 1
    with pytest.raises(FrameTooLargeError):
        FrameDecoder(limit=limit).feed(_raw(body + b" "))


def test_sidecar_json_length_beyond_body_is_rejected():
    body = b"BXB1" + struct.pack(">I", 100) + b'{"messageType":"X"}'
    with pytest.raises(SidecarHeaderError):
        FrameDecoder().feed(_raw(body))


def test_sidecar_without_json_length_is_rejected():
    with pytest.raises(SidecarHeaderError):
        decode_frame(_raw(b"BXB1\x00"))


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"messageType":"X","p":"\xff\xfe"}', FrameEncodingError),
        (b'{"messageType":"X",', FrameJSONError),
        (b"not json", FrameJSONError),
        (b"", FrameJSONError),
        (b"[1,2]", EnvelopeNotObjectError),
        (b'"str"', EnvelopeNotObjectError),
        (b"null", EnvelopeNotObjectError),
        (b'{"payload":{}}', MissingMessageTypeError),
        (b'{"messageType":7}', MissingMessageTypeError),
        (b'{"messageType":null}', MissingMessageTypeError),
    ],
)
def test_malformed_bodies_raise_their_documented_error(body, error):
    assert issubclass(error, ProtocolError)
    with pytest.raises(error):
        decode_frame(_raw(body))
    decoder = FrameDecoder()
    with pytest.raises(error):
        for i in range(len(_raw(body))):
            decoder.feed(_raw(body)[i : i + 1])


def test_sidecar_with_bad_json_raises_json_error():
    body = b"BXB1" + struct.pack(">I", 3) + b"{{{" + b"raw"
    with pytest.raises(FrameJSONError):
        decode_frame(_raw(body))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_hang_and_raise_only_protocol_errors(data):
    decoder = FrameDecoder(limit=1024)
    try:
        decoder.feed(data)
        decoder.close()
    except ProtocolError:
        pass


def test_frames_before_a_bad_one_in_separate_feeds_are_delivered():
    decoder = FrameDecoder()
    good = encode_frame({"messageType": "HeartbeatAck", "payload": {}})
    assert len(decoder.feed(good)) == 1
    with pytest.raises(FrameJSONError):
        decoder.feed(_raw(b"{oops"))


def test_encoder_refuses_oversize_frames_and_writes_nothing():
    big = {"messageType": "CallCompleted", "payload": {"output": "x" * 200}}
    with pytest.raises(PayloadTooLargeError) as info:
        encode_frame(big, limit=100)
    assert info.value.error_kind == "payload_too_large"
    with pytest.raises(PayloadTooLargeError):
        encode_frame({"messageType": "ResumeCall"}, b"x" * 200, limit=100)


def test_encoder_accepts_pre_encoded_envelope_bytes():
    body = b'{"messageType":"HeartbeatAck","payload":{}}'
    assert encode_frame(body) == _raw(body)


def test_bytes_needed_hint():
    decoder = FrameDecoder()
    frame = encode_frame({"messageType": "HeartbeatAck", "payload": {}})
    assert decoder.bytes_needed == 4
    decoder.feed(frame[:4])
    assert decoder.bytes_needed == len(frame) - 4
    decoder.feed(frame[4:10])
    assert decoder.bytes_needed == len(frame) - 10


# --- encode_frame_with_value: one orjson pass, dumps_wire's rules ----------------------


def _two_pass_frame(value, *, sidecar=None, cache_key=None):
    """What the executor sent before: dumps_wire(value) as a Fragment, then the envelope."""
    envelope = _waiting_envelope(orjson.Fragment(dumps_wire(value)), cache_key)
    return encode_frame(envelope, sidecar)


def _waiting_envelope(value, cache_key=None):
    return {
        "messageType": "CallWaiting",
        "callId": "t/c1",
        "requestId": "req-x-1",
        "executorId": "e1",
        "payload": {"taskId": "t", "params": value, "cacheKey": cache_key},
    }


def _one_pass_frame(value, *, sidecar=None, cache_key=None):
    envelope = _waiting_envelope(value, cache_key)
    nulls = 1 if cache_key is None else 0
    return encode_frame_with_value(envelope, envelope["payload"], "params", nulls, sidecar)


@settings(max_examples=300, deadline=None)
@given(json_values, st.none() | st.text(max_size=8), sidecars)
def test_one_pass_frames_are_byte_identical_to_two_passes(value, cache_key, sidecar):
    expected = _two_pass_frame(value, sidecar=sidecar, cache_key=cache_key)
    assert _one_pass_frame(value, sidecar=sidecar, cache_key=cache_key) == expected


@dataclasses.dataclass
class _Point:
    x: int
    y: float


@pytest.mark.parametrize(
    "value",
    [
        {"big": 2**70, "n": None},
        [_Point(1, 2.5)],
        {"when": datetime.datetime(2024, 1, 2, 3, 4, 5), "id": uuid.UUID(int=7)},
        {"s": "null", "nested": [None, "nullable"]},
    ],
)
def test_one_pass_frames_take_dumps_wire_paths_for_what_orjson_refuses(value):
    assert _one_pass_frame(value) == _two_pass_frame(value)


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        {"a": [1.0, float("inf")]},
        {"a": None, "b": -float("inf")},
        {1: "non-string key"},
        {"d": decimal.Decimal("1.5")},
    ],
)
def test_one_pass_frames_refuse_what_dumps_wire_refuses(value):
    with pytest.raises(NotSerializableError):
        dumps_wire(value)
    with pytest.raises(NotSerializableError):
        _one_pass_frame(value)
    with pytest.raises(NotSerializableError):
        _one_pass_frame(value, cache_key="k")  # no null outside the value


def test_one_pass_frames_refuse_oversize_frames():
    with pytest.raises(PayloadTooLargeError):
        _one_pass_frame("x" * MAX_FRAME_BYTES)
    with pytest.raises(PayloadTooLargeError):
        _one_pass_frame({"k": 1}, sidecar=b"x" * MAX_FRAME_BYTES)


@pytest.mark.parametrize("received_as", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("typed", [False, True])
@pytest.mark.parametrize("with_sidecar", [False, True])
def test_big_frames_decode_like_small_ones(typed, with_sidecar, received_as):
    # Bodies above 64 KiB are read through a view of the received bytes, smaller ones are
    # copied out (the sizes straddle the limit: bodies of exactly 64 KiB and one byte more):
    # both ways must give the same frames, whole or fed in pieces.

    class Big(msgspec.Struct, tag="Big", tag_field="messageType"):
        text: str

    hook = TypedHook({"Big": Big}, lambda decoded: True) if typed else None
    items = []
    for size in (10, _COPIED_BODY_MAX - 200, _COPIED_BODY_MAX - 31, _COPIED_BODY_MAX - 30, 200_000):
        envelope = {"messageType": "Big", "text": "x" * size}
        sidecar = bytes(range(256)) * (size // 256 + 1) if with_sidecar else None
        items.append((envelope, sidecar))
    stream = b"".join(encode_frame(envelope, sidecar) for envelope, sidecar in items)
    for piece in (len(stream), 50_000, 4_093):
        decoder = FrameDecoder(typed=hook)
        frames = [
            f
            for i in range(0, len(stream), piece)
            for f in decoder.feed(received_as(stream[i : i + piece]))
        ]
        assert len(frames) == len(items)
        for frame, (envelope, sidecar) in zip(frames, items, strict=True):
            assert frame.sidecar == sidecar
            if typed and sidecar is None:
                assert type(frame.envelope) is Big and frame.envelope.text == envelope["text"]
            else:
                assert frame.envelope == envelope


# --- depth bombs: a protocol error, never a RecursionError (issue 15) ------------------

_DEEP = 100_000


def _bomb(depth: int = _DEEP) -> bytes:
    return (
        b'{"messageType":"ExecuteCall","callId":"c","payload":' + b"[" * depth + b"]" * depth + b"}"
    )


def _prefixed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_a_depth_bomb_decodes_to_a_protocol_error():
    with pytest.raises(FrameJSONError, match="nests too deeply"):
        decode_frame(_prefixed(_bomb()))


def test_a_depth_bomb_fed_to_a_decoder_poisons_it_with_a_protocol_error():
    decoder = FrameDecoder()
    good = encode_frame({"messageType": "X"})
    with pytest.raises(FrameJSONError):
        decoder.feed(good + _prefixed(_bomb()))
    with pytest.raises(FrameJSONError):
        decoder.feed(good)  # poisoned: the connection is closed


def test_a_depth_bomb_arriving_in_pieces_is_a_protocol_error():
    decoder = FrameDecoder()
    data = _prefixed(_bomb())
    with pytest.raises(ProtocolError):
        for start in range(0, len(data), 4096):
            decoder.feed(data[start : start + 4096])


def test_a_depth_bomb_behind_a_typed_hook_is_a_protocol_error():
    from blockx.executor.execute_frames import decode_inbound

    with pytest.raises(FrameJSONError):
        FrameDecoder(typed=decode_inbound).feed(_prefixed(_bomb()))


def test_a_depth_bomb_in_a_sidecar_frame_is_a_protocol_error():
    envelope = _bomb()
    body = b"BXB1" + struct.pack(">I", len(envelope)) + envelope + b"raw"
    with pytest.raises(FrameJSONError):
        FrameDecoder().feed(_prefixed(body))


def test_a_depth_bomb_is_malformed_input_to_loads_wire():
    with pytest.raises(msgspec.DecodeError, match="nests too deeply"):
        wire.loads_wire(b"[" * _DEEP + b"]" * _DEEP)


def test_ordinary_nesting_still_decodes():
    (frame,) = FrameDecoder().feed(_prefixed(_bomb(200)))
    assert frame.envelope["callId"] == "c"

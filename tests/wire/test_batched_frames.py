"""Batched frames (docs/protocol.md "Batched frames"): a batch decodes to exactly the
frames it was built from, however it is split on the way; every malformed batch is a
protocol error that poisons the decoder like any malformed frame."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.wire import (
    BATCH_MAGIC,
    MAX_FRAME_BYTES,
    BatchFrameError,
    FrameDecoder,
    ProtocolError,
    batch_frames,
    decode_frame,
    decode_frames,
    encode_batch,
    encode_frame,
    schema,
)
from blockx.wire.frames import TypedHook

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)
envelopes = st.fixed_dictionaries(
    {
        "messageType": st.sampled_from(["CallCompleted", "HeartbeatAck", "CancelCall", "X"]),
        "payload": json_values,
    },
    optional={"callId": st.text(max_size=12)},
)
sidecars = st.none() | st.binary(max_size=600)
frame_lists = st.lists(st.tuples(envelopes, sidecars), min_size=1, max_size=10)


def _pairs(frames):
    return [(f.envelope, f.sidecar) for f in frames]


def _feed_in_chunks(data: bytes, cuts: list[int], decoder: FrameDecoder | None = None):
    decoder = decoder or FrameDecoder()
    out = []
    start = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out.extend(decoder.feed(data[start:cut]))
        start = cut
    decoder.close()
    return out


@settings(max_examples=200, deadline=None)
@given(frame_lists, st.data())
def test_a_batch_split_anywhere_yields_what_its_frames_one_by_one_yield(items, data):
    frames = [encode_frame(env, side) for env, side in items]
    one_by_one = []
    for frame in frames:
        one_by_one.extend(FrameDecoder().feed(frame))
    batched = batch_frames(frames)
    if len(frames) > 1:
        assert batched[4:8] == BATCH_MAGIC
    else:
        assert batched == frames[0]  # a single frame stays a plain frame
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(batched)), max_size=12))
    assert _pairs(_feed_in_chunks(batched, cuts)) == _pairs(one_by_one)
    assert _pairs(decode_frames(batched)) == _pairs(one_by_one)


@settings(max_examples=50, deadline=None)
@given(frame_lists, st.integers(min_value=0, max_value=5))
def test_runs_over_the_limit_split_into_several_batches(items, limit_slack):
    frames = [encode_frame(env, side) for env, side in items]
    # A limit a little over the biggest frame: batches must split, a frame never does.
    limit = max(len(frame) for frame in frames) + 8 + limit_slack
    data = batch_frames(frames, limit=limit)
    decoder = FrameDecoder(limit=limit)
    got = decoder.feed(data)
    assert _pairs(got) == _pairs([decode_frame(frame) for frame in frames])
    offset = 0
    while offset < len(data):  # every outer frame is within the limit
        (size,) = struct.unpack_from(">I", data, offset)
        assert size <= limit
        offset += 4 + size


def test_a_frame_too_big_to_share_a_batch_goes_alone_between_batches():
    small = encode_frame({"messageType": "HeartbeatAck", "payload": {}})
    big = encode_frame({"messageType": "HeartbeatAck", "payload": {"x": "y" * 100}})
    limit = len(big) - 4 + 2  # big fits as a frame, not with a batch header around it
    data = batch_frames([small, small, big, small, small], limit=limit)
    decoder = FrameDecoder(limit=limit)
    assert len(decoder.feed(data)) == 5
    assert data.count(BATCH_MAGIC) == 2
    assert big in data


def test_the_whole_16_mib_run_is_one_frame_at_most():
    body = b'{"messageType":"HeartbeatAck","payload":{"pad":"' + b"x" * (6 * 1024 * 1024) + b'"}}'
    data = encode_batch([body, body, body])
    (first,) = struct.unpack_from(">I", data, 0)
    assert first <= MAX_FRAME_BYTES
    assert data[4:8] == BATCH_MAGIC and struct.unpack_from(">I", data, 8)[0] == 2
    assert len(FrameDecoder().feed(data)) == 3


def test_the_typed_hook_applies_to_inner_bodies():
    hook = TypedHook({"HeartbeatAck": schema.HeartbeatAck}, lambda decoded: True)
    ack = encode_frame({"messageType": "HeartbeatAck", "payload": {"features": ["batch"]}})
    other = encode_frame({"messageType": "CancelCall", "callId": "c", "payload": {}})
    frames = FrameDecoder(typed=hook).feed(batch_frames([ack, other, ack]))
    assert [type(frame.envelope) for frame in frames] == [
        schema.HeartbeatAck,
        dict,
        schema.HeartbeatAck,
    ]
    assert frames[0].envelope.payload.features == ["batch"]


def _batch(*inner: bytes, count: int | None = None) -> bytes:
    body = BATCH_MAGIC + struct.pack(">I", len(inner) if count is None else count)
    body += b"".join(inner)
    return struct.pack(">I", len(body)) + body


def _entry(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


_OK = b'{"messageType":"HeartbeatAck","payload":{}}'


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_batch(count=0), id="K=0"),
        pytest.param(struct.pack(">I", 4) + BATCH_MAGIC, id="no-count"),
        pytest.param(struct.pack(">I", 6) + BATCH_MAGIC + b"\0\0", id="short-count"),
        pytest.param(_batch(_entry(_OK), count=2), id="K-more-than-entries"),
        pytest.param(_batch(_entry(_OK), count=1000), id="K-more-than-could-fit"),
        pytest.param(_batch(_entry(_OK), _entry(_OK), count=1), id="bytes-after-K-entries"),
        pytest.param(_batch(_entry(_OK), b"\0\0"), id="trailing-bytes"),
        pytest.param(_batch(struct.pack(">I", 1000) + _OK), id="inner-length-past-end"),
        pytest.param(_batch(_entry(_OK), b"\0\0\0"), id="inner-header-cut"),
        pytest.param(_batch(_entry(_batch(_entry(_OK))[4:])), id="batch-in-batch"),
        pytest.param(_batch(_entry(_OK), _entry(_batch(_entry(_OK), _entry(_OK))[4:])), id="nested-later"),
    ],
)  # fmt: skip
def test_malformed_batches_are_protocol_errors_that_poison_the_decoder(data):
    decoder = FrameDecoder()
    with pytest.raises(BatchFrameError):
        decoder.feed(data)
    with pytest.raises(BatchFrameError):
        decoder.feed(encode_frame({"messageType": "HeartbeatAck", "payload": {}}))
    with pytest.raises(BatchFrameError):
        decode_frames(data)
    # Fed byte by byte, the same error.
    decoder = FrameDecoder()
    with pytest.raises(BatchFrameError):
        for index in range(len(data)):
            decoder.feed(data[index : index + 1])


@pytest.mark.parametrize(
    "inner",
    [b"", b"not json", b"[1]", b'{"payload":{}}', b"BXB1\0\0\0\xff{}"],
    ids=["empty", "not-json", "not-object", "no-type", "bad-sidecar"],
)
def test_a_malformed_inner_body_raises_what_the_same_frame_would(inner):
    with pytest.raises(ProtocolError) as alone:
        FrameDecoder().feed(_entry(inner))
    with pytest.raises(ProtocolError) as batched:
        FrameDecoder().feed(_batch(_entry(_OK), _entry(inner)))
    assert type(batched.value) is type(alone.value)


def test_decode_frame_refuses_a_batch_and_decode_frames_takes_one():
    data = _batch(_entry(_OK), _entry(_OK))
    with pytest.raises(BatchFrameError):
        decode_frame(data)
    assert len(decode_frames(data)) == 2
    assert len(decode_frames(_entry(_OK))) == 1


def test_an_oversize_batch_is_refused_by_its_length_like_any_frame():
    decoder = FrameDecoder(limit=100)
    with pytest.raises(ProtocolError):
        decoder.feed(struct.pack(">I", 101) + BATCH_MAGIC)


def test_batching_nothing_or_one_frame_writes_it_as_is():
    frame = _entry(_OK)
    assert batch_frames([]) == b""
    assert batch_frames([frame]) == frame
    assert encode_batch([_OK]) == frame

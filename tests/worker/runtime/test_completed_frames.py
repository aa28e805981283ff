"""CallCompleted and CallWaiting decoded typed: the executor's frames (a CallCompleted's output
kept as the executor's JSON, a CallWaiting's payload a dict); anything the typed path does not
take goes the generic way."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from blockx.wire import FrameDecoder, encode_frame, keys, loads_wire
from blockx.worker.link.completed_frames import (
    CompletedFrame,
    CompletedPayload,
    WaitingFrame,
    decode_call_frames,
)

BIG = 123456789012345678901234567890


def executor_body(output: Any, **payload: Any) -> bytes:
    """A CallCompleted as the executor writes it (key order included)."""
    envelope = {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
        keys.F_CALL_ID: "t#1/c3",
        keys.F_EXECUTOR_ID: "exec-0",
        keys.F_PAYLOAD: {
            keys.FP_TASK_ID: "t#1",
            keys.FP_ATTEMPT_SEQ: 2,
            keys.FP_OUTPUT: output,
            keys.FP_BUDGET_USED_MS: 7,
            keys.FP_EFFECTIVE_EXECUTION_DURATION_US: 120,
            keys.FP_QUEUE_WAIT_US: 3,
            keys.FP_DEBUG_OUTPUT: None,
            **payload,
        },
    }
    return encode_frame(envelope)[4:]


@pytest.mark.parametrize(
    "output",
    [{"y": 1}, [1, "é", None, 2.5], None, "text", {"big": BIG, "nested": {"a": [{}]}}],
)
def test_the_executors_call_completed_decodes_typed_with_its_output_as_json(output: Any) -> None:
    body = executor_body(output)
    frame = decode_call_frames(memoryview(body))
    assert isinstance(frame, CompletedFrame)
    assert frame.callId == "t#1/c3"
    payload = frame.payload
    assert (payload.taskId, payload.attemptSeq, payload.budgetUsedMs) == ("t#1", 2, 7)
    assert payload.debugOutput is None
    assert loads_wire(bytes(payload.output)) == output  # big ints exact
    dict_payload = loads_wire(body)[keys.F_PAYLOAD]
    wire = payload.to_wire()
    for key in (keys.FP_TASK_ID, keys.FP_ATTEMPT_SEQ, keys.FP_OUTPUT, keys.FP_BUDGET_USED_MS):
        assert wire[key] == dict_payload[key]


def test_debug_output_rides_along() -> None:
    frame = decode_call_frames(memoryview(executor_body({"y": 1}, debugOutput="hi\n")))
    assert frame is not None and frame.payload.debugOutput == "hi\n"


def _reordered() -> bytes:
    envelope = loads_wire(executor_body({"y": 1}))
    return orjson.dumps({keys.F_CALL_ID: envelope[keys.F_CALL_ID], **envelope})


@pytest.mark.parametrize(
    "body",
    [
        executor_body({"y": 1}, attemptSeq="2"),
        executor_body({"y": 1}, attemptSeq=True),
        executor_body({"y": 1}, budgetUsedMs=1.5),
        executor_body({"y": 1}, debugOutput=3),
        _reordered(),
        b'{"messageType":"CallCompleted","callId":"","payload":{"attemptSeq":1}}',
        b'{"messageType":"CallCompleted","callId":"c","payload":[]}',
        b'{"messageType":"CallFailed","callId":"c","payload":{"attemptSeq":1}}',
        b'{"messageType":"CallCompleted", broken',
    ],
)
def test_what_the_typed_path_does_not_take_goes_the_generic_way(body: bytes) -> None:
    assert decode_call_frames(memoryview(body)) is None


def test_a_connection_decoder_mixes_typed_and_dict_frames_in_order() -> None:
    completed = executor_body({"y": 1})
    waiting = {keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING, keys.F_CALL_ID: "c", "payload": {}}
    stream = len(completed).to_bytes(4, "big") + completed + encode_frame(waiting)
    for chunk in (len(stream), 1):
        decoder = FrameDecoder(typed=decode_call_frames)
        frames = [
            f for i in range(0, len(stream), chunk) for f in decoder.feed(stream[i : i + chunk])
        ]
        assert [type(f.envelope) for f in frames] == [CompletedFrame, dict]
        assert isinstance(frames[0].envelope.payload, CompletedPayload)
        assert frames[1].envelope == waiting


# --- CallWaiting -------------------------------------------------------------------------


def executor_waiting_body(**payload: Any) -> bytes:
    """A CallWaiting(io) as the executor's SDK bridge writes it (key order included)."""
    envelope = {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING,
        keys.F_CALL_ID: "t#1/c3",
        keys.F_REQUEST_ID: "req-77-5",
        keys.F_EXECUTOR_ID: "exec-0",
        keys.F_PAYLOAD: {
            keys.FP_TASK_ID: "t#1",
            keys.FP_WAIT_KIND: keys.WAIT_IO,
            keys.FP_ATTEMPT_SEQ: 2,
            keys.FP_IO_KIND: "read",
            keys.FP_BACKEND: "blockdb",
            keys.FP_OPERATION: "get_row",
            keys.FP_PARAMS: {"table": "t", "key": BIG},
            keys.FP_CACHE_KEY: None,
            **payload,
        },
    }
    return encode_frame(envelope)[4:]


def test_the_executors_call_waiting_decodes_typed_with_its_payload_as_a_dict() -> None:
    body = executor_waiting_body()
    frame = decode_call_frames(body)
    assert isinstance(frame, WaitingFrame)
    assert (frame.callId, frame.requestId) == ("t#1/c3", "req-77-5")
    generic = loads_wire(body)
    assert type(frame.payload) is dict
    assert frame.payload == generic[keys.F_PAYLOAD]  # big ints exact, nulls kept
    generic.pop(keys.F_EXECUTOR_ID)  # the worker reads the executor from its connection
    assert frame.to_dict() == generic


def _waiting(**envelope: Any) -> bytes:
    base = loads_wire(executor_waiting_body())
    return encode_frame({**base, **envelope})[4:]


@pytest.mark.parametrize(
    "body",
    [
        _waiting(requestId=None),
        _waiting(requestId=5),
        _waiting(callId=""),
        _waiting(callId=7),
        _waiting(payload=[]),
        _waiting(payload=None),
        b'{"messageType":"CallWaiting","callId":"c","payload":{"taskId":"t"}}',  # no requestId
        encode_frame({keys.F_CALL_ID: "c", **loads_wire(executor_waiting_body())})[4:],  # reordered
        b'{"messageType":"CallFailed","callId":"c","requestId":"r","payload":{}}',
        b'{"messageType":"CallWaiting", broken',
    ],
)
def test_what_the_typed_waiting_path_does_not_take_goes_the_generic_way(body: bytes) -> None:
    assert decode_call_frames(body) is None


def test_a_connection_decoder_types_both_kinds_and_keeps_the_rest_generic() -> None:
    failed = {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_FAILED,
        keys.F_CALL_ID: "c",
        keys.F_PAYLOAD: {keys.FP_ATTEMPT_SEQ: 1},
    }
    with_sidecar = loads_wire(executor_waiting_body(params=None))
    stream = b"".join(
        [
            encode_frame(loads_wire(executor_waiting_body())),
            len(executor_body({"y": 1})).to_bytes(4, "big") + executor_body({"y": 1}),
            encode_frame(failed),
            encode_frame(with_sidecar, b"\x00raw"),
            encode_frame(loads_wire(executor_waiting_body(waitKind="sleep"))),
        ]
    )
    for chunk in (len(stream), 7, 1):
        decoder = FrameDecoder(typed=decode_call_frames)
        frames = [
            f for i in range(0, len(stream), chunk) for f in decoder.feed(stream[i : i + chunk])
        ]
        assert [type(f.envelope) for f in frames] == [
            WaitingFrame,
            CompletedFrame,
            dict,
            dict,
            WaitingFrame,  # typed: the adapter judges the waitKind (and refuses this one)
        ]
        assert frames[2].envelope == failed
        assert frames[3].envelope == with_sidecar and frames[3].sidecar == b"\x00raw"
        assert frames[4].envelope.payload[keys.FP_WAIT_KIND] == "sleep"

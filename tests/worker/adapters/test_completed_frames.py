"""CallCompleted decoded typed: the executor's frame, its output kept as the executor's JSON;
anything the typed path does not take goes the generic way."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from blockx.wire import FrameDecoder, encode_frame, keys, loads_wire
from blockx.worker.adapters.completed_frames import (
    CompletedFrame,
    CompletedPayload,
    decode_call_completed,
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
    frame = decode_call_completed(memoryview(body))
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
    frame = decode_call_completed(memoryview(executor_body({"y": 1}, debugOutput="hi\n")))
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
    assert decode_call_completed(memoryview(body)) is None


def test_a_connection_decoder_mixes_typed_and_dict_frames_in_order() -> None:
    completed = executor_body({"y": 1})
    waiting = {keys.F_MESSAGE_TYPE: keys.MT_CALL_WAITING, keys.F_CALL_ID: "c", "payload": {}}
    stream = len(completed).to_bytes(4, "big") + completed + encode_frame(waiting)
    for chunk in (len(stream), 1):
        decoder = FrameDecoder(typed=decode_call_completed)
        frames = [
            f for i in range(0, len(stream), chunk) for f in decoder.feed(stream[i : i + chunk])
        ]
        assert [type(f.envelope) for f in frames] == [CompletedFrame, dict]
        assert isinstance(frames[0].envelope.payload, CompletedPayload)
        assert frames[1].envelope == waiting

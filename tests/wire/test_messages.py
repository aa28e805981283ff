"""Received payloads validated into the wire schema's Structs; envelopes, unknown keys and
unknown message types."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from blockx import wire
from blockx.wire import (
    PayloadError,
    UnknownMessageTypeError,
    build_envelope,
    decode_frame,
    encode_frame,
    keys,
    parse_message,
    schema,
    validate,
)
from blockx.wire.messages import to_wire
from blockx.wire.schema import CallWaitingPayload, ExecuteCallPayload, HeartbeatPayload

PROTOCOL = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()


def _roundtrip(envelope, sidecar=None):
    return parse_message(decode_frame(encode_frame(envelope, sidecar)))


def test_every_message_type_of_the_protocol_has_a_payload_class():
    documented = set(re.findall(r"^### `(\w+)`", PROTOCOL, re.M))
    assert documented == set(schema.PAYLOADS) == keys.MESSAGE_TYPES


def test_every_payload_key_is_documented_in_the_protocol():
    for cls in schema.PAYLOADS.values():
        for member in msgspec.structs.fields(cls):
            key = member.encode_name
            assert f"`{key}`" in PROTOCOL or f'"{key}"' in PROTOCOL, (cls.__name__, key)


def test_envelope_keys_match_the_protocol_table():
    table = PROTOCOL.split("## Envelope", 1)[1].split("##", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    assert documented == {
        keys.F_MESSAGE_TYPE,
        keys.F_CALL_ID,
        keys.F_REQUEST_ID,
        keys.F_EXECUTOR_ID,
        keys.F_SENT_AT_MS,
        keys.F_TRACE,
        keys.F_PAYLOAD,
    }


def test_execute_call_round_trip_with_defaults_and_exact_keys():
    payload = ExecuteCallPayload(
        taskId="t1",
        functionId="adder",
        functionCodeDigest="sha256:" + "0" * 64,
        entrySelector="_",
        args=[1, 2**100],
        callKey="k",
        callBudgetMs=5000,
    )
    env = build_envelope(
        keys.MT_EXECUTE_CALL, payload, call_id="t1/c1", executor_id="exec-1", sent_at_ms=7
    )
    assert set(env["payload"]) == {
        "taskId", "functionId", "functionCodeDigest", "entrySelector", "args", "parentCallId",
        "callKey", "ancestry", "callBudgetMs", "attemptSeq", "audit", "debug",
    }  # fmt: skip
    message = _roundtrip(env)
    assert message.payload == payload
    assert message.call_id == "t1/c1"
    assert message.to_envelope() == env


def test_unknown_keys_are_ignored():
    env = {
        "messageType": "CancelCall",
        "callId": "c",
        "payload": {"reason": "x", "attemptSeq": 2, "futureKey": [1]},
        "futureEnvelopeKey": True,
    }
    message = _roundtrip(env)
    assert message.payload == schema.CancelCallPayload(reason="x", attemptSeq=2)


def test_cancel_reason_defaults_to_worker_shutdown():
    message = _roundtrip({"messageType": "CancelCall", "callId": "c", "payload": {}})
    assert message.payload.reason == "worker_shutdown"


def test_unknown_message_type_is_not_a_protocol_error():
    frame = decode_frame(encode_frame({"messageType": "FutureThing", "payload": {}}))
    with pytest.raises(UnknownMessageTypeError) as info:
        parse_message(frame)
    assert not isinstance(info.value, wire.ProtocolError)
    assert info.value.message_type == "FutureThing"


@pytest.mark.parametrize(
    ("envelope", "key"),
    [
        ({"messageType": "ExecuteCall", "callId": "c", "payload": {"taskId": "t"}}, "functionId"),
        ({"messageType": "ExecuteCall", "payload": {"taskId": "t", "functionId": "f", "functionCodeDigest": "d"}}, "callId"),
        ({"messageType": "ExecuteCall", "callId": "c", "payload": {"taskId": 3, "functionId": "f", "functionCodeDigest": "d"}}, "taskId"),
        ({"messageType": "ResumeCall", "callId": "c", "payload": {"resumeKind": "io"}}, "requestId"),
        ({"messageType": "ResumeCall", "callId": "c", "requestId": "r"}, "payload"),
        ({"messageType": "CallFailed", "callId": "c", "payload": {"taskId": "t", "attemptSeq": 1, "retryable": "yes", "errorKind": "x"}}, "retryable"),
        ({"messageType": "CallFailed", "callId": "c", "payload": {"taskId": "t", "errorKind": "x"}}, "attemptSeq"),
        ({"messageType": "CallCompleted", "callId": "c", "payload": {"taskId": "t", "output": 1}}, "attemptSeq"),
        ({"messageType": "ExecuteCall", "callId": "c", "payload": {"taskId": "t", "functionId": "f", "functionCodeDigest": "d", "ancestry": ["k", 1]}}, "ancestry"),
        ({"messageType": "Heartbeat", "payload": {"executorId": "e", "heartbeatSeq": 1, "callStateCounts": {"RUNNING": "1"}}}, "callStateCounts"),
        ({"messageType": "Heartbeat", "payload": {"executorId": "e"}}, "heartbeatSeq"),
        ({"messageType": "Heartbeat", "payload": {"executorId": "e", "heartbeatSeq": True}}, "heartbeatSeq"),
        ({"messageType": "CancelCall", "callId": "c", "payload": []}, "payload"),
        ({"messageType": "CallWaiting", "callId": "c", "payload": {"taskId": "t", "waitKind": "nap"}}, "waitKind"),
        ({"messageType": "CallWaiting", "callId": "c", "payload": {"taskId": "t", "waitKind": "io", "ioKind": "read"}}, "backend"),
    ],
)  # fmt: skip
def test_wrong_payloads_raise_payload_error_naming_the_key(envelope, key):
    with pytest.raises(PayloadError) as info:
        _roundtrip(envelope)
    assert info.value.key == key
    assert isinstance(info.value, wire.ProtocolError)


def test_call_waiting_io_with_sidecar():
    payload = CallWaitingPayload(
        taskId="t",
        waitKind="io",
        ioKind="read",
        backend="blockdb",
        operation="get_row",
        cacheKey="k",
    )
    env = build_envelope(keys.MT_CALL_WAITING, payload, call_id="c", request_id="req-p-1")
    message = _roundtrip(env, b"\x08\x96\x01")
    assert message.payload == payload
    assert message.sidecar == b"\x08\x96\x01"


def test_heartbeat_with_every_field():
    hb = HeartbeatPayload(
        executorId="exec-1",
        heartbeatSeq=1,
        runnableCount=2,
        inflightCount=3,
        availableContexts=125,
        memoryBytes=10_000_000,
        executorCpuUtilization=0.25,
        executorCpuSecondsTotal=1.5,
        executorProcessInstanceId="p1",
        lastSchedulerActiveAtMs=99,
        runningCallId=None,
        runningForMs=0,
        runningCallBudgetMs=0,
        callStateCounts={"RUNNABLE": 2, "WAITING_IO": 1},
        sentAtMs=100,
        features=["batch"],
    )
    message = _roundtrip(build_envelope(keys.MT_HEARTBEAT, hb, executor_id="exec-1"))
    assert message.payload == hb
    assert set(to_wire(hb)) == {
        "executorId", "heartbeatSeq", "runnableCount", "inflightCount", "availableContexts",
        "memoryBytes", "executorCpuUtilization", "executorCpuSecondsTotal",
        "executorProcessInstanceId", "lastSchedulerActiveAtMs", "runningCallId",
        "runningForMs", "runningCallBudgetMs", "callStateCounts", "sentAtMs",
        "features",
    }  # fmt: skip


def test_resume_error_maps_to_remote_error():
    env = {
        "messageType": "ResumeCall",
        "callId": "c",
        "requestId": "r",
        "payload": {
            "resumeKind": "subcall",
            "error": {"kind": "subcall_failed", "message": "boom", "retryable": True},
        },
    }
    error = wire.RemoteError.from_wire(_roundtrip(env).payload.error)
    assert error == wire.RemoteError(kind="subcall_failed", message="boom", retryable=True)


def test_heartbeat_ack_without_payload():
    message = _roundtrip({"messageType": "HeartbeatAck"})
    assert isinstance(message.payload, schema.HeartbeatAckPayload)


def test_retryable_defaults_follow_protocol():
    assert keys.RETRYABLE_BY_DEFAULT["transport_lost"] is True
    assert keys.RETRYABLE_BY_DEFAULT["user_error"] is False
    assert "io_error" not in keys.RETRYABLE_BY_DEFAULT


def test_an_integer_is_a_number_and_a_boolean_is_not_an_integer():
    beat = {"executorId": "e", "heartbeatSeq": 1, "executorCpuUtilization": 1}
    assert validate(HeartbeatPayload, beat).executorCpuUtilization == 1.0
    with pytest.raises(PayloadError) as info:
        validate(HeartbeatPayload, {**beat, "memoryBytes": False})
    assert (info.value.key, info.value.problem) == ("memoryBytes", "Expected `int`, got `bool`")


def test_a_completed_payload_is_validated_with_its_output():
    payload = {"taskId": "t", "attemptSeq": 2, "output": {"sum": [1, 2**70]}, "queueWaitUs": 4}
    message = _roundtrip(build_envelope(keys.MT_CALL_COMPLETED, payload, call_id="c"))
    assert to_wire(message.payload) == {
        "taskId": "t", "attemptSeq": 2, "output": {"sum": [1, 2**70]}, "budgetUsedMs": 0,
        "debugOutput": None, "effectiveExecutionDurationUs": 0, "queueWaitUs": 4,
        "localReadHits": None,
    }  # fmt: skip


def test_a_payload_that_is_not_json_is_a_payload_error():
    with pytest.raises(PayloadError) as info:
        validate(HeartbeatPayload, {"executorId": "e", "heartbeatSeq": 1, "x": object()})
    assert info.value.key == "payload" and info.value.problem.startswith("is not JSON")

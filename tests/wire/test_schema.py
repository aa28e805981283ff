"""The wire schema (blockx.wire.schema): one Struct per message of docs/protocol.md, defined
nowhere else, its keys those of blockx.wire.keys and the protocol, its bytes what the generic
path reads, its defaults and required members what the receivers apply."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

import blockx.wire
from blockx.executor.context import ExecContext
from blockx.wire import (
    FrameDecoder,
    PayloadError,
    decode_frame,
    encode_frame,
    keys,
    loads_wire,
    parse_message,
    schema,
    validate,
    validate_payload,
)
from blockx.wire.frames import typed_hook
from blockx.wire.messages import to_wire
from blockx.worker.link.handlers import call_frame_error

PROTOCOL = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()

#: Every key string blockx.wire.keys spells, for envelopes and for payloads.
ENVELOPE_KEYS = {v for k, v in vars(keys).items() if k.startswith("F_")}
PAYLOAD_KEYS = {v for k, v in vars(keys).items() if k.startswith("FP_")}
DIGEST = "sha256:" + "ab" * 32


def members(struct: type[Any]) -> tuple[str, ...]:
    return tuple(f.encode_name for f in msgspec.structs.fields(struct))


def test_every_message_type_of_the_protocol_has_an_envelope_and_a_payload() -> None:
    documented = set(re.findall(r"^### `(\w+)`", PROTOCOL, re.M))
    assert documented == set(schema.ENVELOPES) == set(schema.PAYLOADS) == keys.MESSAGE_TYPES
    for message_type, envelope in schema.ENVELOPES.items():
        config = envelope.__struct_config__
        assert (config.tag_field, config.tag) == (keys.F_MESSAGE_TYPE, message_type)


def test_every_member_is_a_key_of_blockx_wire_keys_and_of_the_protocol() -> None:
    for envelope in schema.ENVELOPES.values():
        assert set(members(envelope)) <= ENVELOPE_KEYS, envelope
        assert keys.F_PAYLOAD in members(envelope)
    for payload in schema.PAYLOADS.values():
        for key in members(payload):
            assert key in PAYLOAD_KEYS, (payload, key)
            assert f"`{key}`" in PROTOCOL or f'"{key}"' in PROTOCOL, (payload, key)


def test_call_messages_require_a_call_id_and_resume_call_a_request_id() -> None:
    # docs/protocol.md, "Required envelope keys".
    for message_type, envelope in schema.ENVELOPES.items():
        required = {f.encode_name for f in msgspec.structs.fields(envelope) if f.required}
        expected = {keys.F_PAYLOAD}
        if message_type not in (keys.MT_HEARTBEAT, keys.MT_HEARTBEAT_ACK):
            expected.add(keys.F_CALL_ID)
        if message_type in (keys.MT_RESUME_CALL, keys.MT_CALL_WAITING):
            expected.add(keys.F_REQUEST_ID)
        assert required == expected, message_type


def test_each_message_is_defined_once_in_blockx_wire() -> None:
    # Issue #17: the schema is the one definition; no other module of blockx.wire
    # declares a class for a message or its payload, nor a Struct of its own.
    names = {name for t in keys.MESSAGE_TYPES for name in (t, t + "Payload")}
    for info in pkgutil.iter_modules(blockx.wire.__path__):
        module = importlib.import_module(f"blockx.wire.{info.name}")
        for name, value in vars(module).items():
            if not isinstance(value, type) or value.__module__ != module.__name__:
                continue
            if module is schema:
                continue
            assert name not in names, f"{module.__name__}.{name} defines a message again"
            assert not issubclass(value, msgspec.Struct), f"{module.__name__}.{name}"


#: docs/protocol.md, "Required payload keys": the members a payload may not leave out
#: (a CallCompleted's output is checked by the worker; the schema marks it missing).
REQUIRED = {
    keys.MT_EXECUTE_CALL: {"taskId", "functionId", "functionCodeDigest"},
    keys.MT_RESUME_CALL: {"resumeKind"},
    keys.MT_CANCEL_CALL: set(),
    keys.MT_HEARTBEAT_ACK: set(),
    keys.MT_CALL_WAITING: {"taskId", "waitKind"},
    keys.MT_CALL_COMPLETED: {"attemptSeq"},
    keys.MT_CALL_FAILED: {"attemptSeq", "errorKind"},
    keys.MT_HEARTBEAT: {"executorId", "heartbeatSeq"},
}


def test_required_members_are_the_protocols() -> None:
    rules = PROTOCOL.split("**Required payload keys**", 1)[1].split("\n- **", 1)[0]
    for message_type, payload in schema.PAYLOADS.items():
        required = {f.encode_name for f in msgspec.structs.fields(payload) if f.required}
        assert required == REQUIRED[message_type], message_type
        for key in required:
            assert f"`{key}`" in rules, (message_type, key)


def test_the_slow_path_validates_into_the_schema_and_shares_its_required_members() -> None:
    # The worker refuses a terminal frame without attemptSeq (docs/protocol.md lists it
    # in both payloads); the schema requires it there too.
    completed = {keys.FP_TASK_ID: "t", keys.FP_OUTPUT: 1}
    failed = {keys.FP_TASK_ID: "t", keys.FP_ERROR_KIND: "user_error"}
    for message_type, payload in (
        (keys.MT_CALL_COMPLETED, completed),
        (keys.MT_CALL_FAILED, failed),
    ):
        assert "attemptSeq" in (call_frame_error(message_type, "c1", payload) or "")
        with pytest.raises(PayloadError) as info:
            validate_payload(message_type, payload)
        assert info.value.key == keys.FP_ATTEMPT_SEQ
        ok = validate_payload(message_type, {**payload, keys.FP_ATTEMPT_SEQ: 2})
        assert type(ok) is schema.PAYLOADS[message_type] and ok.attemptSeq == 2
        assert call_frame_error(message_type, "c1", {**payload, keys.FP_ATTEMPT_SEQ: 2}) is None


def test_the_executor_fills_a_left_out_execute_call_key_with_the_schemas_default() -> None:
    # The executor's generic path (ExecContext.from_execute_call) and the schema agree on
    # what every optional ExecuteCall member means when the worker leaves it out.
    required = {
        keys.FP_TASK_ID: "t",
        keys.FP_FUNCTION_ID: "f",
        keys.FP_FUNCTION_CODE_DIGEST: DIGEST,
    }
    ctx = ExecContext.from_execute_call("c1", dict(required), clock=lambda: 0.0)
    defaults = schema.ExecuteCallPayload(**required)
    assert (ctx.entry_selector, ctx.args, ctx.call_key, ctx.parent_call_id) == (
        defaults.entrySelector,
        defaults.args,
        defaults.callKey,
        defaults.parentCallId,
    )
    assert list(ctx.ancestry) == defaults.ancestry
    assert (ctx.budget_ms, ctx.attempt_seq, ctx.audit) == (
        defaults.callBudgetMs,
        defaults.attemptSeq,
        defaults.audit,
    )
    assert (ctx.debug_capture is not None) == defaults.debug
    assert validate(schema.ExecuteCallPayload, required) == defaults


def samples() -> list[Any]:
    """One envelope of every message type, with values in every member that has one."""
    return [
        schema.ExecuteCall(
            callId="t#1/c1",
            payload=schema.ExecuteCallPayload(
                taskId="t#1",
                functionId="adder",
                functionCodeDigest=DIGEST,
                entrySelector="_",
                audit={"policy": "default", "verdictDigest": DIGEST},
                args=[1, 2**70, "é"],
                callKey="cd" * 32,
                parentCallId="t#1/c0",
                ancestry=["k0"],
                callBudgetMs=5000,
                attemptSeq=2,
            ),
        ),
        schema.ResumeCall(
            callId="t#1/c1",
            requestId="req-p-1",
            payload=schema.ResumeCallPayload(resumeKind="io", result={"v": 7}, budgetUsedMs=3),
        ),
        schema.ResumeCall(
            callId="t#1/c1",
            requestId="req-p-2",
            payload=schema.ResumeCallPayload(
                resumeKind="io", error={"kind": "io_error", "message": "down", "retryable": True}
            ),
        ),
        schema.CancelCall(callId="t#1/c1", payload=schema.CancelCallPayload(attemptSeq=2)),
        schema.HeartbeatAck(payload=schema.HeartbeatAckPayload()),
        schema.CallWaiting(
            callId="t#1/c1",
            requestId="req-p-3",
            payload=msgspec.to_builtins(
                schema.CallWaitingPayload(
                    taskId="t#1",
                    waitKind="io",
                    attemptSeq=2,
                    ioKind="read",
                    backend="blockdb",
                    operation="get_row",
                    params={"k": 1},
                    cacheKey="ck",
                )
            ),
        ),
        schema.CallCompleted(
            callId="t#1/c1",
            payload=schema.TimedCallCompletedPayload(
                taskId="t#1",
                attemptSeq=2,
                output=msgspec.Raw(b'{"sum":3}'),
                budgetUsedMs=4,
                effectiveExecutionDurationUs=2870,
                queueWaitUs=41,
            ),
        ),
        schema.CallFailed(
            callId="t#1/c1",
            payload=schema.CallFailedPayload(
                taskId="t#1",
                attemptSeq=2,
                errorKind="user_error",
                errorMessage="ValueError: bad",
                errorStack="Traceback ...",
                localVars={"x": "1"},
            ),
        ),
        schema.Heartbeat(
            payload=schema.HeartbeatPayload(
                executorId="exec-0",
                heartbeatSeq=1,
                availableContexts=8,
                executorCpuUtilization=0.25,
                runningCallId="t#1/c1",
                runningForMs=12,
                callStateCounts={"RUNNING": 1},
                sentAtMs=1764450000000,
            ),
        ),
    ]


@pytest.mark.parametrize("envelope", samples(), ids=lambda e: type(e).__name__)
def test_a_schema_envelope_is_what_the_generic_path_reads(envelope: Any) -> None:
    body = msgspec.json.encode(envelope)
    assert body.startswith(b'{"messageType":"' + type(envelope).__name__.encode() + b'",')
    message = parse_message(decode_frame(encode_frame(body)))  # validated, keys by keys.py
    assert message.message_type == type(envelope).__name__
    assert message.call_id == getattr(envelope, "callId", None)
    written = loads_wire(body)[keys.F_PAYLOAD]
    validated = to_wire(message.payload)
    assert {key: validated[key] for key in written} == written  # every member, as written
    # And the schema decodes the bytes back: every member it declares, as written (a
    # CallCompleted's timings are not read).
    decoded = msgspec.json.decode(body, type=schema.Envelope)
    assert type(decoded) is type(envelope)
    again, original = loads_wire(msgspec.json.encode(decoded)), loads_wire(body)
    assert again.pop(keys.F_PAYLOAD).items() <= original.pop(keys.F_PAYLOAD).items()
    assert again == original


def test_every_payload_member_is_written() -> None:
    body = msgspec.json.encode(
        schema.ExecuteCall(
            callId="c",
            payload=schema.ExecuteCallPayload(
                taskId="t", functionId="f", functionCodeDigest=DIGEST
            ),
        )
    )
    assert body == (
        b'{"messageType":"ExecuteCall","callId":"c","payload":{"taskId":"t","functionId":"f",'
        b'"functionCodeDigest":"' + DIGEST.encode() + b'","entrySelector":"","audit":null,'
        b'"debug":false,"args":null,"callKey":"","parentCallId":null,"ancestry":[],'
        b'"callBudgetMs":0,"attemptSeq":1}}'
    )


def test_a_completed_payload_is_encoded_with_its_timings_and_decoded_without() -> None:
    timed = schema.TimedCallCompletedPayload(
        taskId="t", attemptSeq=1, output=msgspec.Raw(b"[1]"), effectiveExecutionDurationUs=9
    )
    body = msgspec.json.encode(schema.CallCompleted(callId="c", payload=timed))
    assert b'"effectiveExecutionDurationUs":9,"queueWaitUs":0' in body
    decoded = msgspec.json.decode(body, type=schema.CallCompleted)
    assert type(decoded.payload) is schema.CallCompletedPayload  # the worker's reading
    assert bytes(decoded.payload.output) == b"[1]"


def test_optional_envelope_members_are_skipped_on_decode() -> None:
    # docs/protocol.md: unknown keys (and the optional ones no receiver reads) are ignored.
    body = (
        b'{"messageType":"CancelCall","callId":"c","executorId":"e","sentAtMs":1,'
        b'"trace":{"traceparent":"00-x"},"requestId":null,"payload":{"attemptSeq":3},"new":1}'
    )
    decoded = msgspec.json.decode(body, type=schema.Envelope)
    assert decoded == schema.CancelCall(callId="c", payload=schema.CancelCallPayload(attemptSeq=3))


def test_a_typed_frame_names_its_type_and_call() -> None:
    hook = typed_hook(keys.MT_CANCEL_CALL, schema.CancelCall, lambda frame: True)
    envelope = schema.CancelCall(callId="t#1/c9", payload=schema.CancelCallPayload())
    stream = encode_frame(msgspec.json.encode(envelope)) + encode_frame(
        {keys.F_CALL_ID: "t#1/c8", keys.F_MESSAGE_TYPE: keys.MT_CANCEL_CALL, keys.F_PAYLOAD: {}}
    )  # another member order: decoded the generic way
    typed, generic = FrameDecoder(typed=hook).feed(stream)
    assert typed.envelope == envelope and type(generic.envelope) is dict
    assert typed.message_type == generic.message_type == keys.MT_CANCEL_CALL
    assert repr(typed) == "Frame(CancelCall, callId='t#1/c9')"
    assert repr(generic) == "Frame(CancelCall, callId='t#1/c8')"

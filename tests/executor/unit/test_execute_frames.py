"""The typed ExecuteCall path: the reader decodes an ExecuteCall, as the wire schema encodes
it (and so as the worker writes it), straight into the schema's struct, and the runtime
builds the same context it builds from the dict envelope; anything the typed path does not
accept goes the generic way, with the generic path's answers."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
import pytest
from executor_harness import Harness

from blockx.executor.context import ExecContext, InvalidExecuteCall, ResumePayload
from blockx.executor.execute_frames import ExecuteCallFrame, ResumeCallFrame, decode_inbound
from blockx.wire import FrameDecoder, dumps_wire, encode_frame, keys, loads_wire, schema

DIGEST = "sha256:" + "ab" * 32
FIELDS = (
    "task_id",
    "function_id",
    "function_code_digest",
    "entry_selector",
    "args",
    "parent_call_id",
    "call_key",
    "ancestry",
    "budget_ms",
    "attempt_seq",
    "audit",
)


def schema_body(
    *,
    args: bytes = b'{"x":1}',
    parent: str | None = None,
    ancestry: tuple[str, ...] = (),
    audit: dict[str, str] | None = None,
) -> bytes:
    """An ExecuteCall as the wire schema encodes it: the worker's pre-encoded frames are
    byte for byte this (tests/worker/runtime/test_orchestrator_execute.py)."""
    return msgspec.json.encode(
        schema.ExecuteCall(
            callId="task-1#1/c7",
            payload=schema.ExecuteCallPayload(
                taskId="task-1#1",
                functionId="adder",
                functionCodeDigest=DIGEST,
                entrySelector="_",
                audit=audit,
                debug=False,
                args=msgspec.Raw(args),
                callKey="cd" * 32,
                parentCallId=parent,
                ancestry=list(ancestry),
                callBudgetMs=5000,
                attemptSeq=2,
            ),
        )
    )


def admitted(h: Harness, envelope: Any, body: bytes) -> ExecContext:
    """The context ``h``'s runtime admits for one ExecuteCall (``envelope``: the typed
    frame or the dict; ``body``: its bytes): resident, not yet run. A sub-call's parent
    is made resident first (asleep), as admission requires."""
    decoded = loads_wire(body)
    parent = decoded[keys.F_PAYLOAD].get(keys.FP_PARENT_CALL_ID)
    if parent is not None:
        h.execute(parent, "import time\ndef _(p):\n    time.sleep(60)\n", task_id="task-1#1")
        h.run()
        assert h.state(parent) == "WAITING_SLEEP"
    h.rt.handle_inbound_message(envelope)
    ctx = h.rt.get_context(decoded[keys.F_CALL_ID])
    assert ctx is not None
    return ctx


def via_dict(h: Harness, body: bytes) -> ExecContext:
    """The context the runtime builds from the generic path's dict envelope."""
    return admitted(h, loads_wire(body), body)  # the generic decoder (big ints exact)


def via_struct(h: Harness, frame: ExecuteCallFrame, body: bytes) -> ExecContext:
    """The context the runtime builds from the reader's typed frame."""
    return admitted(h, frame, body)


def same_context(a: ExecContext, b: ExecContext) -> None:
    assert a.call_id == b.call_id
    for name in FIELDS:
        left, right = getattr(a, name), getattr(b, name)
        assert (left == right and type(left) is type(right)) or (
            name == "ancestry" and list(left) == list(right)
        ), name
    assert (a.debug_capture is None) == (b.debug_capture is None)


@pytest.mark.parametrize(
    "body",
    [
        schema_body(),
        schema_body(args=b'{"big":123456789012345678901234567890,"s":"\\u00e9"}'),
        schema_body(parent="task-1#1/c1", ancestry=("k1", "k2")),
        schema_body(audit={"verdict": "accepted", "policy": "v1"}),
    ],
)
def test_the_schemas_execute_call_decodes_typed_to_the_same_context(
    body: bytes,
    make_harness,  # type: ignore[no-untyped-def]
) -> None:
    frame = decode_inbound(memoryview(body))
    assert isinstance(frame, ExecuteCallFrame)
    same_context(via_struct(make_harness(), frame, body), via_dict(make_harness(), body))


def _variant(**payload: Any) -> bytes:
    envelope = orjson.loads(schema_body())
    envelope[keys.F_PAYLOAD].update(payload)
    return orjson.dumps(envelope)


@pytest.mark.parametrize(
    "body",
    [
        _variant(callBudgetMs=-1),
        _variant(callBudgetMs=True),
        _variant(callBudgetMs=1.5),
        _variant(attemptSeq=0),
        _variant(ancestry=["a", 1]),
        _variant(functionId=None),
        _variant(audit=[]),
        _variant(debug="yes"),
    ],
)
def test_what_the_typed_path_refuses_is_refused_by_the_generic_one(body: bytes) -> None:
    assert decode_inbound(memoryview(body)) is None
    envelope = loads_wire(body)
    with pytest.raises(InvalidExecuteCall):  # the generic path's validator refuses it too
        ExecContext.from_execute_call(
            envelope[keys.F_CALL_ID], envelope[keys.F_PAYLOAD], clock=lambda: 0.0
        )


def test_other_frames_and_other_key_orders_go_the_generic_way() -> None:
    reordered = orjson.loads(schema_body())
    reordered = {keys.F_CALL_ID: reordered[keys.F_CALL_ID], **reordered}
    assert decode_inbound(memoryview(orjson.dumps(reordered))) is None
    resume = {keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL, keys.F_CALL_ID: "c", "payload": {}}
    assert decode_inbound(memoryview(orjson.dumps(resume))) is None
    missing = orjson.loads(schema_body())
    del missing[keys.F_PAYLOAD][keys.FP_TASK_ID]
    assert decode_inbound(memoryview(orjson.dumps(missing))) is None
    assert decode_inbound(memoryview(b'{"messageType":"ExecuteCall", oops')) is None


def test_a_frame_decoder_with_the_hook_yields_structs_and_dicts_in_order() -> None:
    execute = schema_body()
    resume = {keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL, keys.F_CALL_ID: "c", "payload": {}}
    stream = len(execute).to_bytes(4, "big") + execute + encode_frame(resume) + encode_frame(resume)
    whole = FrameDecoder(typed=decode_inbound).feed(stream)
    decoder = FrameDecoder(typed=decode_inbound)
    by_byte = [f for i in range(len(stream)) for f in decoder.feed(stream[i : i + 1])]
    for frames in (whole, by_byte):
        assert [type(f.envelope) for f in frames] == [ExecuteCallFrame, dict, dict]
        assert frames[1].envelope == resume


# --- ResumeCall -----------------------------------------------------------------------------


def resume_body(payload: dict[str, Any]) -> bytes:
    """A ResumeCall as the worker's adapter encodes it (outbound.send_resume_call; big ints
    take the exact encoder)."""
    return dumps_wire(
        {
            keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
            keys.F_CALL_ID: "task-1#1/c7",
            keys.F_REQUEST_ID: "req-abc-12",
            keys.F_PAYLOAD: payload,
        }
    )


def generic_resume(body: bytes) -> ResumePayload:
    return ResumePayload.from_wire(loads_wire(body)[keys.F_PAYLOAD])


@pytest.mark.parametrize(
    "payload",
    [
        {"resumeKind": "io", "result": {"v": 7, "big": 2**70}, "budgetUsedMs": 12},
        {"resumeKind": "io", "result": None, "budgetUsedMs": 0},
        {"resumeKind": "subcall", "result": [1, "x", {"y": None}], "budgetUsedMs": 3},
        {"resumeKind": "io", "result": "text"},  # budgetUsedMs defaults to 0
    ],
)
def test_a_result_resume_decodes_typed_to_the_same_resume_payload(payload: dict[str, Any]) -> None:
    body = resume_body(payload)
    frame = decode_inbound(memoryview(body))
    assert isinstance(frame, ResumeCallFrame)
    assert (frame.callId, frame.requestId) == ("task-1#1/c7", "req-abc-12")
    typed = frame.payload
    generic = generic_resume(body)
    assert (typed.resumeKind, typed.result, None, typed.budgetUsedMs) == (
        generic.resume_kind,
        generic.result,
        generic.error,
        generic.budget_used_ms,
    )


@pytest.mark.parametrize(
    "payload",
    [
        # An error answer: the generic path validates and maps it.
        {
            "resumeKind": "io",
            "error": {"kind": "io_error", "message": "down", "retryable": True},
            "budgetUsedMs": 1,
        },
        {"resumeKind": "io", "result": 1, "budgetUsedMs": -1},
        {"resumeKind": "io", "result": 1, "budgetUsedMs": 1.5},
        {"resumeKind": "io", "result": 1, "budgetUsedMs": True},
        {"result": 1, "budgetUsedMs": 1},
        {"resumeKind": 3, "result": 1},
    ],
)
def test_error_and_malformed_resumes_take_the_generic_path(payload: dict[str, Any]) -> None:
    body = resume_body(payload)
    assert decode_inbound(memoryview(body)) is None
    generic = generic_resume(body)
    assert generic.error is not None  # the error itself, or "malformed ResumeCall: ..."


def test_frames_sharing_the_prefix_but_of_another_type_go_the_generic_way() -> None:
    for envelope in (
        {keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT_ACK, keys.F_PAYLOAD: {}},
        {keys.F_MESSAGE_TYPE: keys.MT_CANCEL_CALL, keys.F_CALL_ID: "c", keys.F_PAYLOAD: {}},
    ):
        assert decode_inbound(memoryview(orjson.dumps(envelope))) is None

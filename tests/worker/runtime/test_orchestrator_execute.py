"""Pre-encoded ExecuteCall envelopes are byte for byte the wire schema's encoding, and decode
to exactly the dict form, for any values."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.wire import keys, schema, validate
from blockx.worker.actor.execute import execute_body, execute_prefix
from blockx.worker.core import DispatchCallCmd, PreparedCall
from blockx.worker.json_values import encode_args

text = st.text(min_size=1, max_size=20)  # any unicode: quotes, backslashes, controls
json_args = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


def dict_form(cmd: DispatchCallCmd, entry: str, audit: Any, debug: bool) -> dict[str, Any]:
    """The envelope the orchestrator used to build as dicts (and the adapter wrapped)."""
    call = cmd.call
    return {
        keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
        keys.F_CALL_ID: cmd.call_id,
        keys.F_PAYLOAD: {
            "taskId": cmd.task_id,
            "functionId": call.function_id,
            "functionCodeDigest": call.function_code_digest,
            "entrySelector": entry,
            "args": orjson.Fragment(call.args_json),
            "parentCallId": cmd.parent_call_id,
            "callKey": call.call_key,
            "ancestry": cmd.ancestry,
            "callBudgetMs": cmd.budget_ms,
            "attemptSeq": cmd.attempt_seq,
            "audit": audit,
            "debug": debug,
        },
    }


def schema_form(cmd: DispatchCallCmd, entry: str, audit: Any, debug: bool) -> bytes:
    """The same call encoded from the wire schema's definition."""
    call = cmd.call
    return msgspec.json.encode(
        schema.ExecuteCall(
            callId=cmd.call_id,
            payload=schema.ExecuteCallPayload(
                taskId=cmd.task_id,
                functionId=call.function_id,
                functionCodeDigest=call.function_code_digest,
                entrySelector=entry,
                audit=audit,
                debug=debug,
                args=msgspec.Raw(call.args_json),
                callKey=call.call_key,
                parentCallId=cmd.parent_call_id,
                ancestry=list(cmd.ancestry),
                callBudgetMs=cmd.budget_ms,
                attemptSeq=cmd.attempt_seq,
            ),
        )
    )


def encode(
    task_id: str,
    function_id: str,
    digest: str,
    entry: str,
    args: Any,
    parent: str | None,
    ancestry: tuple[str, ...],
    budget: int,
    attempt: int,
    audit: dict[str, str] | None,
    debug: bool,
) -> tuple[DispatchCallCmd, bytes]:
    call = PreparedCall(function_id, digest, encode_args(args), "ab" * 16)
    cmd = DispatchCallCmd(
        f"{task_id}/c7", task_id, "exec-0", call, parent, ancestry, budget, attempt, 0
    )
    prefix = execute_prefix(task_id, function_id, digest, entry, audit, debug)
    return cmd, execute_body(prefix, cmd)


@pytest.mark.parametrize(
    ("task_id", "parent", "ancestry", "budget", "attempt", "audit", "debug"),
    [
        ("task-1#1", None, (), 0, 1, None, False),
        ("task-1#1", "task-1#1/c1", ("k1", "k2"), 5000, 2, None, True),
        ('q"uote\\back\nline\x00\x1f\x7f', None, ("é", "☃"), 2**40, 1000, None, False),
        (
            "t\u2028s",
            "p\ud7ff",
            (),
            1,
            3,
            {"policy": "default", "verdictDigest": "sha256:ab"},
            True,
        ),
    ],
)
def test_the_pre_encoded_frame_is_the_schemas_encoding(
    task_id: str,
    parent: str | None,
    ancestry: tuple[str, ...],
    budget: int,
    attempt: int,
    audit: dict[str, str] | None,
    debug: bool,
) -> None:
    for args in (None, [1, 2**63 - 1, "x"], {"k": {"nested": [True, None]}}, "é\n"):
        cmd, body = encode(
            task_id, "pricing/adder", "sha256:" + "cd" * 32, "_", args, parent, ancestry,
            budget, attempt, audit, debug,
        )  # fmt: skip
        assert body == schema_form(cmd, "_", audit, debug)


@settings(max_examples=300, deadline=None)
@given(
    task_id=text,
    function_id=text,
    digest=text,
    entry=st.text(max_size=10),
    args=json_args,
    parent=st.none() | text,
    ancestry=st.lists(st.text(max_size=12), max_size=3).map(tuple),
    budget=st.integers(0, 2**40),
    attempt=st.integers(1, 1000),
    audit=st.none() | st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
    debug=st.booleans(),
)
def test_the_encoded_envelope_is_the_schemas_and_the_dict_form(
    task_id: str,
    function_id: str,
    digest: str,
    entry: str,
    args: Any,
    parent: str | None,
    ancestry: tuple[str, ...],
    budget: int,
    attempt: int,
    audit: dict[str, str] | None,
    debug: bool,
) -> None:
    cmd, body = encode(
        task_id, function_id, digest, entry, args, parent, ancestry, budget, attempt, audit, debug
    )
    assert body == schema_form(cmd, entry, audit, debug)  # byte for byte
    assert orjson.loads(body) == orjson.loads(orjson.dumps(dict_form(cmd, entry, audit, debug)))
    # The schema decodes it typed, every member read.
    decoded = msgspec.json.decode(body, type=schema.ExecuteCall)
    assert (decoded.callId, decoded.payload.taskId, decoded.payload.attemptSeq) == (
        cmd.call_id,
        task_id,
        attempt,
    )
    assert decoded.payload.args == args and decoded.payload.ancestry == list(ancestry)
    # And the slow path's validation of the decoded dict reads it too.
    payload = validate(schema.ExecuteCallPayload, orjson.loads(body)[keys.F_PAYLOAD])
    assert (payload.callBudgetMs, payload.parentCallId, payload.debug) == (
        budget,
        parent,
        debug,
    )

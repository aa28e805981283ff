"""Pre-encoded ExecuteCall envelopes decode to exactly the dict form, for any values."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.wire import ExecuteCall, keys
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
def test_the_encoded_envelope_is_the_dict_form(
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
    call = PreparedCall(function_id, digest, encode_args(args), "ab" * 16)
    cmd = DispatchCallCmd(
        f"{task_id}/c7", task_id, "exec-0", call, parent, ancestry, budget, attempt, 0
    )
    prefix = execute_prefix(task_id, function_id, digest, entry, audit, debug)
    body = execute_body(prefix, cmd)
    assert orjson.loads(body) == orjson.loads(orjson.dumps(dict_form(cmd, entry, audit, debug)))
    # And the executor's typed view of it reads every member.
    payload = ExecuteCall.from_wire(orjson.loads(body)[keys.F_PAYLOAD])
    assert (payload.task_id, payload.attempt_seq, payload.call_budget_ms) == (
        task_id,
        attempt,
        budget,
    )
    assert payload.args == args and list(payload.ancestry) == list(ancestry)

"""ExecuteCall envelopes, pre-encoded: the constant members once per task and function.

Theory of operation
-------------------
An ``ExecuteCall`` payload has twelve members (docs/protocol.md), in the wire
schema's order (:class:`blockx.wire.schema.ExecuteCallPayload`). The first six
are the same for every call of one function of one task -- ``taskId``,
``functionId``, ``functionCodeDigest``, ``entrySelector``, ``audit``,
``debug`` -- and :func:`execute_prefix` encodes them once (the orchestrator
keeps the bytes on the task's :class:`~blockx.worker.actor.task_run.TaskRun`).
Per call, :func:`execute_body` joins the envelope from that prefix and the
members that vary: ``callId``, ``args`` (already canonical JSON bytes, spliced
in as they are), ``callKey``, ``parentCallId``, ``ancestry``,
``callBudgetMs``, ``attemptSeq``.

Every literal byte of the join (the envelope's opening, each ``,"key":``, the
closing braces) is cut once, at import, out of ``msgspec.json.encode`` of the
schema's :class:`~blockx.wire.schema.ExecuteCall` with a marker for every value,
and the import fails if the schema's member order is not the order the join
writes. So a frame is byte for byte ``msgspec.json.encode(ExecuteCall(...))``
of the same values (tests/worker/runtime/test_orchestrator_execute.py): a key
renamed or moved in the schema moves here with it.

Why: building the payload dict and encoding the whole envelope (then framing
it) costs 1.14 µs per call on the worker's box; the join costs 0.71 µs
(``timeit``, best of 5), on a worker that spends 8–15 µs of CPU per trivial
call compiled (docs/operations.md, "Compiled modules").

Strings that come from outside (task and call ids, the function id, the audit
verdict) are encoded by orjson, whose quoting and escaping are msgspec's; numbers
are ASCII digits; the call key is a hex digest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec
import orjson

from blockx.wire import keys
from blockx.wire.schema import ExecuteCall, ExecuteCallPayload

if TYPE_CHECKING:
    from blockx.worker.core import DispatchCallCmd

__all__ = ["execute_body", "execute_prefix"]

_dumps: Final = orjson.dumps

#: The payload members in the order the join below writes them: the six constant per
#: function (:func:`execute_prefix`), then the six per call (:func:`execute_body`).
_MEMBER_ORDER: Final = (
    keys.FP_TASK_ID,
    keys.FP_FUNCTION_ID,
    keys.FP_FUNCTION_CODE_DIGEST,
    keys.FP_ENTRY_SELECTOR,
    keys.FP_AUDIT,
    keys.FP_DEBUG,
    keys.FP_ARGS,
    keys.FP_CALL_KEY,
    keys.FP_PARENT_CALL_ID,
    keys.FP_ANCESTRY,
    keys.FP_CALL_BUDGET_MS,
    keys.FP_ATTEMPT_SEQ,
)


def _schema_pieces() -> list[bytes]:
    """The literal bytes of an encoded schema ExecuteCall, between its 13 values."""
    names = tuple(f.encode_name for f in msgspec.structs.fields(ExecuteCallPayload))
    if names != _MEMBER_ORDER:
        raise ImportError(
            f"blockx.wire.schema.ExecuteCallPayload writes {names}; "
            f"blockx.worker.actor.execute joins {_MEMBER_ORDER}"
        )
    marker = b"\x00"  # never inside JSON text: a control character is always escaped
    value: Any = msgspec.Raw(marker)
    template = ExecuteCall(
        callId=value, payload=ExecuteCallPayload(**dict.fromkeys(_MEMBER_ORDER, value))
    )
    pieces = msgspec.json.encode(template).split(marker)
    if len(pieces) != len(_MEMBER_ORDER) + 2:  # 13 values: callId and the twelve members
        raise ImportError(f"an encoded ExecuteCall template has {len(pieces) - 1} values")
    return pieces


_PIECES: Final = _schema_pieces()
_OPEN: Final = _PIECES[0]  # {"messageType":"ExecuteCall","callId":
_TASK_ID: Final = _PIECES[1]  # ,"payload":{"taskId":
_FUNCTION_ID: Final = _PIECES[2]
_DIGEST: Final = _PIECES[3]
_ENTRY_SELECTOR: Final = _PIECES[4]
_AUDIT: Final = _PIECES[5]
_DEBUG: Final = _PIECES[6]
_ARGS: Final = _PIECES[7]
_CALL_KEY: Final = _PIECES[8]
_PARENT: Final = _PIECES[9]
_ANCESTRY: Final = _PIECES[10]
_BUDGET: Final = _PIECES[11]
_ATTEMPT: Final = _PIECES[12]
_CLOSE: Final = _PIECES[13]  # }}


def execute_prefix(
    task_id: str,
    function_id: str,
    digest: str,
    entry_selector: str,
    audit: dict[str, str] | None,
    debug: bool,
) -> bytes:
    """The payload's opening and the members shared by every call of one function of
    one task: what :func:`execute_body` puts between ``callId`` and ``args``."""
    return b"".join(
        (
            _TASK_ID,
            _dumps(task_id),
            _FUNCTION_ID,
            _dumps(function_id),
            _DIGEST,
            _dumps(digest),
            _ENTRY_SELECTOR,
            _dumps(entry_selector),
            _AUDIT,
            _dumps(audit),
            _DEBUG,
            b"true" if debug else b"false",
        )
    )


def execute_body(prefix: bytes, cmd: DispatchCallCmd) -> bytes:
    """The ``ExecuteCall`` envelope (frame body) for ``cmd``, given its function's prefix."""
    call = cmd.call
    parent = cmd.parent_call_id
    ancestry = cmd.ancestry
    return b"".join(
        (
            _OPEN,
            _dumps(cmd.call_id),
            prefix,
            _ARGS,
            call.args_json,
            _CALL_KEY,
            _dumps(call.call_key),
            _PARENT,
            b"null" if parent is None else _dumps(parent),
            _ANCESTRY,
            _dumps(ancestry) if ancestry else b"[]",
            _BUDGET,
            str(cmd.budget_ms).encode(),  # compiled: native int -> str, not bytes % formatting
            _ATTEMPT,
            str(cmd.attempt_seq).encode(),
            _CLOSE,
        )
    )

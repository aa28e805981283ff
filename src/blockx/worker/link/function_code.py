"""Answers to ``CallWaiting(waitKind=function_code)``, built from the worker's resolver.

The executor receives only a digest in ``ExecuteCall`` and fetches the source
on first use. The adapter answers these waits itself — they never reach the
dispatcher — from the resolver the orchestrator installs (the task's pinned
code view). :func:`function_code_resume_payload` turns whatever the resolver
did into the ``ResumeCall`` payload: ``{"source", "functionCodeDigest"}`` on
success, a ``function_code_fetch_failed`` error otherwise. Code fetches are
not charged to the call's budget (``budgetUsedMs`` 0).
"""

from __future__ import annotations

import logging
from typing import Any

from blockx.wire import RemoteError, keys
from blockx.worker.link.callbacks import FunctionCodeResolver, FunctionCodeUnavailable

__all__ = ["function_code_resume_payload"]

_log = logging.getLogger("blockx.worker.adapter")


def function_code_resume_payload(
    resolver: FunctionCodeResolver | None, task_id: str, function_id: str, digest: str
) -> dict[str, Any]:
    """Ask ``resolver`` and build the ResumeCall payload; never raises."""
    payload: dict[str, Any] = {
        keys.FP_RESUME_KIND: keys.WAIT_FUNCTION_CODE,
        keys.FP_BUDGET_USED_MS: 0,
    }
    error: RemoteError
    try:
        if resolver is None:
            raise FunctionCodeUnavailable("the worker has no function code resolver")
        source = resolver(task_id, function_id, digest)
    except FunctionCodeUnavailable as exc:
        error = RemoteError(
            kind=keys.ERR_FUNCTION_CODE_FETCH_FAILED, message=str(exc), retryable=exc.retryable
        )
    except Exception as resolver_bug:  # own name: mypyc types a name once
        _log.exception("function code resolver failed for %s (%s)", function_id, digest)
        error = RemoteError(
            kind=keys.ERR_FUNCTION_CODE_FETCH_FAILED,
            message=f"function code resolver failed: {resolver_bug!r}",
            retryable=True,
        )
    else:
        if isinstance(source, str):
            payload[keys.FP_RESULT] = {
                keys.FP_SOURCE: source,
                keys.FP_FUNCTION_CODE_DIGEST: digest,
            }
            return payload
        if isinstance(source, RemoteError):
            error = source
        else:
            error = RemoteError(
                kind=keys.ERR_FUNCTION_CODE_FETCH_FAILED,
                message=f"function code resolver returned {type(source).__name__}, not a source",
                retryable=False,
            )
    payload[keys.FP_ERROR] = error.to_wire()
    return payload

"""Sub-calls: admitting a running call's request for a child call, and parking.

Theory of operation
-------------------
A call running on an executor asks for a sub-call (``CallWaiting`` with
``waitKind=subcall``); the runtime resolves the child function's code digest
and hands the request to ``DispatcherCore.handle_subcall_request``, which calls
:func:`admit_subcall`:

1. **Stale check.** The parent must be live (RUNNING or WAITING), on the
   attempt that asked (``parent_attempt_seq``) and bound to the executor the
   request came from. Anything else is a late request of a replaced attempt:
   dropped and counted, nobody is waiting for its answer.
2. **Refusals**, answered at once with a ``ResumeParentCall`` carrying an
   error and no child: the child's ancestry (the parent's ancestry plus the
   parent's call key) already holds ``max_subcall_depth`` keys
   (``subcall_depth_exceeded``), or it holds the child's own key
   (``subcall_cycle_detected``). Neither is retryable.
3. **The child** gets its own context: id ``{parent}/sub-{n}`` (``n`` from the
   process-wide counter), one attempt, the parent's batch index, the granted
   budget, and the ancestry of step 2. It is not counted in the task's totals
   or outputs. Then :func:`~.lifecycle.start_subcall` runs it: a call-cache hit
   or a singleflight leader's result resumes the parent directly; otherwise it
   is bound to the parent's executor or, if the parent is not bound or that
   executor cannot take it now (unhealthy, absent, lost), parked in the task's
   ``pending_bind_subcalls``.

Parked sub-calls are retried by :func:`bind_parked_children` when their parent
is bound and by :func:`rebind_parked` after every snapshot update or executor
loss. A sub-call's end answers its parent (``ResumeParentCall``); a parent's
end or retry cancels its whole subtree (:mod:`.lifecycle`).
"""

from __future__ import annotations

from .commands import DispatchCommand, ResumeParentCall
from .keys import call_key, subcall_id
from .lifecycle import CoreState, start_subcall, try_bind_subcall
from .state import DispatchCallContext
from .types import (
    ERR_SUBCALL_CYCLE_DETECTED,
    ERR_SUBCALL_DEPTH_EXCEEDED,
    CallError,
    CallState,
    PreparedCall,
    SubcallRequest,
)

__all__ = ["admit_subcall", "bind_parked_children", "rebind_parked"]


def admit_subcall(core: CoreState, request: SubcallRequest, out: list[DispatchCommand]) -> None:
    """Validate ``request`` and create and start the child (see module docstring)."""
    parent = core.calls.get(request.parent_call_id)
    if (
        parent is None
        or (parent.state is not CallState.RUNNING and parent.state is not CallState.WAITING)
        or parent.attempt_seq != request.parent_attempt_seq
        or parent.executor is None
        or parent.executor.executor_id != request.executor_id
    ):
        core.stats.stale_events += 1
        return
    task = parent.task
    ancestry = (*parent.ancestry, parent.call.call_key)
    key = call_key(request.function_id, request.function_code_digest, request.args_json)
    refusal: CallError | None = None
    if len(ancestry) >= core.config.max_subcall_depth:
        refusal = CallError(
            kind=ERR_SUBCALL_DEPTH_EXCEEDED,
            message=(
                f"sub-call of {request.function_id!r} from {parent.call_id} would be"
                f" {len(ancestry)} calls deep; the limit is {core.config.max_subcall_depth}"
            ),
            retryable=False,
        )
    elif key in ancestry:
        refusal = CallError(
            kind=ERR_SUBCALL_CYCLE_DETECTED,
            message=(
                f"sub-call of {request.function_id!r} from {parent.call_id} repeats a call"
                " already on its call chain"
            ),
            retryable=False,
        )
    if refusal is not None:
        core.stats.subcalls_rejected += 1
        out.append(
            ResumeParentCall(
                task_id=task.task_id,
                parent_call_id=parent.call_id,
                executor_id=request.executor_id,
                request_id=request.request_id,
                call_id=None,
                output_json=None,
                error=refusal,
                budget_used_ms=0,
            )
        )
        return
    prepared = PreparedCall(
        function_id=request.function_id,
        function_code_digest=request.function_code_digest,
        args_json=request.args_json,
        call_key=key,
    )
    child = DispatchCallContext(
        call_id=subcall_id(parent.call_id, core.subcall_ids.next()),
        task=task,
        call=prepared,
        index=-1,
        batch=None,
        batch_idx=parent.batch_idx,
        max_attempts=1,
        budget_ms=request.granted_budget_ms,
        parent=parent,
        ancestry=ancestry,
        request_id=request.request_id,
    )
    core.calls[child.call_id] = child
    children = parent.children
    if children is None:
        parent.children = {child.call_id: child}
    else:
        children[child.call_id] = child
    task.live_subcalls += 1
    core.stats.subcalls_created += 1
    start_subcall(core, child, out)


def bind_parked_children(
    core: CoreState, parent: DispatchCallContext, out: list[DispatchCommand]
) -> None:
    """``parent`` was just bound: bind its parked sub-calls next to it."""
    children = parent.children
    if not children:
        return
    for child in list(children.values()):
        if child.parked:
            try_bind_subcall(core, child, out)


def rebind_parked(core: CoreState, out: list[DispatchCommand]) -> None:
    """Retry every parked sub-call (after a snapshot update or an executor loss)."""
    for task in list(core.tasks.values()):
        parked = task.pending_bind_subcalls
        if not parked:
            continue
        for child in list(parked.values()):
            if child.parked:
                try_bind_subcall(core, child, out)

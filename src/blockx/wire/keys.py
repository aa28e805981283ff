"""Every name that travels on the worker⇄executor wire, spelled once.

docs/protocol.md is the contract; this module is its vocabulary. Both the worker and
the executor import these constants instead of writing string literals, so a
renamed key is a one-line change that a test (``tests/wire/test_messages.py``)
compares against docs/protocol.md's headings and tables.
"""

from __future__ import annotations

from typing import Final, Literal

# --- message types -----------------------------------------------------------

MT_EXECUTE_CALL: Final = "ExecuteCall"
MT_RESUME_CALL: Final = "ResumeCall"
MT_CANCEL_CALL: Final = "CancelCall"
MT_HEARTBEAT_ACK: Final = "HeartbeatAck"
MT_CALL_WAITING: Final = "CallWaiting"
MT_CALL_COMPLETED: Final = "CallCompleted"
MT_CALL_FAILED: Final = "CallFailed"
MT_HEARTBEAT: Final = "Heartbeat"

MessageType = Literal[
    "ExecuteCall",
    "ResumeCall",
    "CancelCall",
    "HeartbeatAck",
    "CallWaiting",
    "CallCompleted",
    "CallFailed",
    "Heartbeat",
]

WORKER_TO_EXECUTOR: Final[frozenset[str]] = frozenset(
    {MT_EXECUTE_CALL, MT_RESUME_CALL, MT_CANCEL_CALL, MT_HEARTBEAT_ACK}
)
EXECUTOR_TO_WORKER: Final[frozenset[str]] = frozenset(
    {MT_CALL_WAITING, MT_CALL_COMPLETED, MT_CALL_FAILED, MT_HEARTBEAT}
)
MESSAGE_TYPES: Final[frozenset[str]] = WORKER_TO_EXECUTOR | EXECUTOR_TO_WORKER

# --- envelope keys -----------------------------------------------------------

F_MESSAGE_TYPE: Final = "messageType"
F_CALL_ID: Final = "callId"
F_REQUEST_ID: Final = "requestId"
F_EXECUTOR_ID: Final = "executorId"
F_SENT_AT_MS: Final = "sentAtMs"
F_TRACE: Final = "trace"
F_PAYLOAD: Final = "payload"

# --- payload keys --------------------------------------------------------------
# Shared by several payloads.
FP_TASK_ID: Final = "taskId"
FP_ATTEMPT_SEQ: Final = "attemptSeq"
FP_BUDGET_USED_MS: Final = "budgetUsedMs"
FP_FUNCTION_ID: Final = "functionId"
FP_FUNCTION_CODE_DIGEST: Final = "functionCodeDigest"
FP_ARGS: Final = "args"
FP_ANCESTRY: Final = "ancestry"

# ExecuteCall
FP_ENTRY_SELECTOR: Final = "entrySelector"
FP_PARENT_CALL_ID: Final = "parentCallId"
FP_CALL_KEY: Final = "callKey"
FP_CALL_BUDGET_MS: Final = "callBudgetMs"
FP_AUDIT: Final = "audit"
FP_DEBUG: Final = "debug"
FP_AUDIT_POLICY: Final = "policy"
FP_AUDIT_VERDICT_DIGEST: Final = "verdictDigest"

# ResumeCall
FP_RESUME_KIND: Final = "resumeKind"
FP_RESULT: Final = "result"
FP_ERROR: Final = "error"
FP_ERROR_KIND_FIELD: Final = "kind"
FP_ERROR_MESSAGE_FIELD: Final = "message"
FP_ERROR_RETRYABLE_FIELD: Final = "retryable"
FP_RESULT_DATA: Final = "data"
FP_SOURCE: Final = "source"
#: (addition) true on an IO answer that never changes (a chain read at a block number
#: or hash): the executor may answer an identical read of the task from its own cache.
FP_IMMUTABLE: Final = "immutable"

# CancelCall
FP_REASON: Final = "reason"

# CallWaiting
FP_WAIT_KIND: Final = "waitKind"
FP_IO_KIND: Final = "ioKind"
FP_BACKEND: Final = "backend"
FP_OPERATION: Final = "operation"
FP_PARAMS: Final = "params"
FP_CACHE_KEY: Final = "cacheKey"
FP_GRANTED_BUDGET_MS: Final = "grantedBudgetMs"

# CallCompleted
FP_OUTPUT: Final = "output"
FP_EFFECTIVE_EXECUTION_DURATION_US: Final = "effectiveExecutionDurationUs"
FP_QUEUE_WAIT_US: Final = "queueWaitUs"
FP_DEBUG_OUTPUT: Final = "debugOutput"
#: (addition, CallCompleted and CallFailed) reads the executor answered from its own
#: cache during the attempt: ``{backend: {operation: count}}``; absent when none.
FP_LOCAL_READ_HITS: Final = "localReadHits"
#: (addition, CallCompleted and CallFailed) the executor's finished ``execute`` span of a
#: traced attempt (one whose ExecuteCall carried ``trace``); absent otherwise.
FP_EXECUTE_SPAN: Final = "executeSpan"

# CallFailed
FP_ERROR_KIND: Final = "errorKind"
FP_RETRYABLE: Final = "retryable"
FP_ERROR_MESSAGE: Final = "errorMessage"
FP_ERROR_STACK: Final = "errorStack"
FP_LOCAL_VARS: Final = "localVars"

# Heartbeat
FP_EXECUTOR_ID: Final = "executorId"
FP_HEARTBEAT_SEQ: Final = "heartbeatSeq"
FP_RUNNABLE_COUNT: Final = "runnableCount"
FP_INFLIGHT_COUNT: Final = "inflightCount"
FP_AVAILABLE_CONTEXTS: Final = "availableContexts"
FP_MEMORY_BYTES: Final = "memoryBytes"
FP_EXECUTOR_CPU_UTILIZATION: Final = "executorCpuUtilization"
FP_EXECUTOR_CPU_SECONDS_TOTAL: Final = "executorCpuSecondsTotal"
FP_EXECUTOR_PROCESS_INSTANCE_ID: Final = "executorProcessInstanceId"
FP_LAST_SCHEDULER_ACTIVE_AT_MS: Final = "lastSchedulerActiveAtMs"
FP_RUNNING_CALL_ID: Final = "runningCallId"
#: (additions) ms the running call has run since it was last switched into
#: (0 when none runs), and that call's budget left when it was switched into
#: (0 = unlimited): the worker's wedge backstop judges a call by its own budget.
FP_RUNNING_FOR_MS: Final = "runningForMs"
FP_RUNNING_CALL_BUDGET_MS: Final = "runningCallBudgetMs"
FP_CALL_STATE_COUNTS: Final = "callStateCounts"
FP_SENT_AT_MS: Final = "sentAtMs"
#: (v1.1 addition) Optional features the sender understands, in Heartbeat and
#: HeartbeatAck payloads; ``"batch"`` is the only one (docs/protocol.md "Batched frames").
FP_FEATURES: Final = "features"

# --- closed value sets ---------------------------------------------------------

WaitKind = Literal["io", "subcall", "function_code"]
WAIT_IO: Final = "io"
WAIT_SUBCALL: Final = "subcall"
WAIT_FUNCTION_CODE: Final = "function_code"
WAIT_KINDS: Final[frozenset[str]] = frozenset({WAIT_IO, WAIT_SUBCALL, WAIT_FUNCTION_CODE})

IoKind = Literal["read", "write", "capability"]
IO_READ: Final = "read"
IO_WRITE: Final = "write"
IO_CAPABILITY: Final = "capability"
IO_KINDS: Final[frozenset[str]] = frozenset({IO_READ, IO_WRITE, IO_CAPABILITY})

#: Executor-local call states, as reported in ``Heartbeat.callStateCounts``.
EXEC_STATES: Final[tuple[str, ...]] = (
    "RUNNABLE",
    "RUNNING",
    "WAITING_IO",
    "WAITING_SUBCALL",
    "WAITING_FUNCTION_CODE",
    "WAITING_SLEEP",
)

# --- error kinds ---------------------------------------------------------------

ERR_USER_ERROR: Final = "user_error"
ERR_DEADLINE_EXCEEDED: Final = "deadline_exceeded"
ERR_CANCELLED: Final = "cancelled"
ERR_EXECUTOR_CAPACITY_EXHAUSTED: Final = "executor_capacity_exhausted"
ERR_SUBCALL_PARENT_NOT_RESIDENT: Final = "subcall_parent_not_resident"
ERR_FUNCTION_CODE_FETCH_FAILED: Final = "function_code_fetch_failed"
ERR_AUDIT_REJECTED: Final = "audit_rejected"
ERR_OUTPUT_NOT_SERIALIZABLE: Final = "output_not_serializable"
ERR_PAYLOAD_TOO_LARGE: Final = "payload_too_large"
ERR_TRANSPORT_LOST: Final = "transport_lost"
ERR_IO_ERROR: Final = "io_error"
ERR_INTERNAL_ERROR: Final = "internal_error"
ERR_RESUME_SEND_FAILED: Final = "resume_send_failed"
ERR_SUBCALL_FAILED: Final = "subcall_failed"
ERR_SUBCALL_DEPTH_EXCEEDED: Final = "subcall_depth_exceeded"
ERR_SUBCALL_CYCLE_DETECTED: Final = "subcall_cycle_detected"
#: A malformed frame (docs/protocol.md, "More kinds"): sending it again cannot help.
ERR_PROTOCOL_ERROR: Final = "protocol_error"
#: Decided by the worker for the call it found guilty of an executor's death.
ERR_EXECUTOR_WEDGED: Final = "executor_wedged"
ERR_EXECUTOR_CRASHED: Final = "executor_crashed"
ERR_MEMORY_EXCEEDED: Final = "memory_exceeded"

#: Whether a failure of each kind may be retried, when nothing more specific is
#: known (docs/protocol.md, "Retryable by default"). ``io_error`` is absent on
#: purpose: the IO backend decides.
RETRYABLE_BY_DEFAULT: Final[dict[str, bool]] = {
    ERR_EXECUTOR_CAPACITY_EXHAUSTED: True,
    ERR_TRANSPORT_LOST: True,
    ERR_RESUME_SEND_FAILED: True,
    ERR_FUNCTION_CODE_FETCH_FAILED: True,
    ERR_INTERNAL_ERROR: True,
    ERR_USER_ERROR: False,
    ERR_DEADLINE_EXCEEDED: False,
    ERR_CANCELLED: False,
    ERR_AUDIT_REJECTED: False,
    ERR_OUTPUT_NOT_SERIALIZABLE: False,
    ERR_PAYLOAD_TOO_LARGE: False,
    ERR_SUBCALL_PARENT_NOT_RESIDENT: False,
    ERR_PROTOCOL_ERROR: False,
    ERR_EXECUTOR_WEDGED: False,
    ERR_EXECUTOR_CRASHED: False,
    ERR_MEMORY_EXCEEDED: False,
}

#: ``CancelCall.reason`` when the worker gives none.
DEFAULT_CANCEL_REASON: Final = "worker_shutdown"

#: ``Heartbeat.availableContexts`` when the executor has no inflight limit.
UNLIMITED_CONTEXTS: Final = 1 << 30

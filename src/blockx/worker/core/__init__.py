"""The worker's pure dispatcher core (seed 000, ``internal/worker/core``).

A sans-IO, single-writer, in-memory state machine: the worker runtime feeds it
events (``handle_*``, ``prepare_*``/``commit_*``, ``try_dispatch_next``,
``flush_dirty_tasks``) and executes the commands it returns. Start with
:mod:`blockx.worker.core.dispatcher`, whose docstring is the theory of operation.

This package imports no IO, clock, randomness or concurrency module; a test
(``tests/core/test_dispatcher_purity.py``) holds it to that.
"""

from .attempts import CompletedCall, ResumedCall, WaitingCall
from .commands import (
    ArmCallRetry,
    BatchSettled,
    BindCall,
    CancelCallCmd,
    CancelReason,
    CompleteCallFromCache,
    ConvergeTaskCalls,
    DispatchCallCmd,
    DispatchCommand,
    ReleaseWait,
    ResumeParentCall,
    StopCallProduction,
    UnbindCall,
)
from .config import CallRetryPolicy, DispatcherConfig
from .dispatcher import DispatcherCore
from .errors import (
    ConfigError,
    CreditWindowExceededError,
    DispatcherError,
    DispatcherInvariantError,
    DispatcherUsageError,
    DuplicateTaskError,
    InvalidCallSpecError,
    InvalidTransitionError,
    MissingFunctionDigestError,
    PhaseStateError,
    ReentrantCallError,
    StreamStateError,
    UnknownTaskError,
)
from .keys import PROCESS_SUBCALL_IDS, SubcallIdSequence, call_key
from .registration import PreparedCallBatch, PreparedCallPhase
from .selection import ExecutorState
from .state import DispatchCallContext, DispatcherStats, StreamBatch, TaskDispatchState
from .types import (
    ERR_CANCELLED,
    ERR_RESUME_SEND_FAILED,
    ERR_SUBCALL_CYCLE_DETECTED,
    ERR_SUBCALL_DEPTH_EXCEEDED,
    ERR_TRANSPORT_LOST,
    CallError,
    CallOutcome,
    CallSpec,
    CallState,
    CompletionSource,
    ExecutorSnapshot,
    FailedCall,
    FailurePolicy,
    JitterSource,
    PreparedCall,
    SubcallRequest,
    TaskFailure,
    TaskFailureKind,
    TaskMode,
)

__all__ = [
    "ERR_CANCELLED",
    "ERR_RESUME_SEND_FAILED",
    "ERR_SUBCALL_CYCLE_DETECTED",
    "ERR_SUBCALL_DEPTH_EXCEEDED",
    "ERR_TRANSPORT_LOST",
    "PROCESS_SUBCALL_IDS",
    "ArmCallRetry",
    "BatchSettled",
    "BindCall",
    "CallError",
    "CallOutcome",
    "CallRetryPolicy",
    "CallSpec",
    "CallState",
    "CancelCallCmd",
    "CancelReason",
    "CompleteCallFromCache",
    "CompletedCall",
    "CompletionSource",
    "ConfigError",
    "ConvergeTaskCalls",
    "CreditWindowExceededError",
    "DispatchCallCmd",
    "DispatchCallContext",
    "DispatchCommand",
    "DispatcherConfig",
    "DispatcherCore",
    "DispatcherError",
    "DispatcherInvariantError",
    "DispatcherStats",
    "DispatcherUsageError",
    "DuplicateTaskError",
    "ExecutorSnapshot",
    "ExecutorState",
    "FailedCall",
    "FailurePolicy",
    "InvalidCallSpecError",
    "InvalidTransitionError",
    "JitterSource",
    "MissingFunctionDigestError",
    "PhaseStateError",
    "PreparedCall",
    "PreparedCallBatch",
    "PreparedCallPhase",
    "ReentrantCallError",
    "ReleaseWait",
    "ResumeParentCall",
    "ResumedCall",
    "StopCallProduction",
    "StreamBatch",
    "StreamStateError",
    "SubcallIdSequence",
    "SubcallRequest",
    "TaskDispatchState",
    "TaskFailure",
    "TaskFailureKind",
    "TaskMode",
    "UnbindCall",
    "UnknownTaskError",
    "WaitingCall",
    "call_key",
]

"""Registering a task's calls: one-shot phases and streams, prepare then commit.

Theory of operation
-------------------
Registration is split in two so that the expensive part runs off the actor:

* **prepare** (:func:`prepare_calls`, wrapped by
  ``DispatcherCore.prepare_call_phase_with_digests`` and
  ``prepare_call_batch_with_digests``) validates each call, looks up its
  function's code digest (resolved by the runtime at the task's code epoch)
  and computes its call key. It reads only its arguments: no core state, no
  side effects, so it may run on any task or thread, and its result may be
  dropped.
* **commit** (:func:`commit_call_phase`, :func:`commit_call_chunk`,
  :func:`commit_call_stream`, :func:`commit_call_batch`,
  :func:`finish_call_stream`) runs on the actor and is O(calls) of cheap work:
  one context per call, appended to the task's ready queue in call order.

Root call ids are ``{task_id}/c{index}``, ``index`` counting from 0 across the
whole phase (streams continue it from batch to batch). A task id must not be
committed again while its previous phase is live (``DuplicateTaskError``);
after convergence it may be, but the runtime should prefer a fresh id per phase
so that late frames of the old phase cannot reach same-named calls.

One-shot phases in chunks: a long call list need not be committed in one
step (the runtime's event loop would serve nothing else meanwhile). A phase
prepared with ``total_count`` larger than its calls registers those calls and
stays open (``production_open``, ``unregistered_roots``); the rest follow in
order with ``commit_call_chunk``, and the last one closes registration. An open
phase never converges, so "complete" still means every call of the list
ended; dispatch starts with the first chunk. A phase that stops while still
open (fast-fail, output limit, cancellation) gets ``StopCallProduction``, its
unregistered calls are counted cancelled at once, without contexts
(``dropped_roots``: the drain would have cancelled them all the same) and
later chunks are dropped. Everything else -- call ids, call order, outputs
in call order at convergence, limits, the drain -- is the one-step phase's.

Streams: ``commit_call_stream`` opens production; every ``commit_call_batch``
takes one credit of ``max_outstanding_batches`` (committing with none left is
a ``CreditWindowExceededError``), and each ``BatchSettled`` gives one back.
``finish_call_stream`` ends production; the task can converge only after it
(or after the core stopped production itself with ``StopCallProduction``, in
which case later batches are dropped and finishing is a no-op).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b

from .config import CallRetryPolicy
from .errors import (
    CreditWindowExceededError,
    DuplicateTaskError,
    InvalidCallSpecError,
    MissingFunctionDigestError,
    PhaseStateError,
    StreamStateError,
    UnknownTaskError,
)
from .keys import function_hasher
from .lifecycle import CoreState, mark_dirty
from .state import DispatchCallContext, StreamBatch, TaskDispatchState
from .types import CallSpec, PreparedCall, TaskMode

__all__ = [
    "PreparedCallBatch",
    "PreparedCallPhase",
    "commit_call_batch",
    "commit_call_chunk",
    "commit_call_phase",
    "commit_call_stream",
    "drop_unregistered",
    "finish_call_stream",
    "prepare_calls",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedCallPhase:
    """A one-shot call list (or its first chunk) ready to commit (``commit_call_phase``)."""

    task_id: str
    #: Fairness key (tenant); ``None``: the task is its own instance.
    instance: str | None
    policy: CallRetryPolicy | None
    calls: tuple[PreparedCall, ...]
    #: The whole phase's call count, ``len(calls)`` or more: the calls past
    #: ``calls`` follow in chunks (``commit_call_chunk``).
    total_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedCallBatch:
    """One stream batch (``commit_call_batch``) or one-shot chunk (``commit_call_chunk``)
    ready to commit."""

    task_id: str
    calls: tuple[PreparedCall, ...]


def prepare_calls(
    task_id: str, calls: Sequence[CallSpec], digests: Mapping[str, str]
) -> tuple[PreparedCall, ...]:
    """Resolve digests and compute call keys; pure, raises on a malformed call."""
    if not isinstance(task_id, str) or not task_id:
        raise InvalidCallSpecError(str(task_id), -1, "task id must be a non-empty str")
    prepared: list[PreparedCall] = []
    append = prepared.append
    # One primed hasher per function: each call only hashes its arguments.
    hashers: dict[str, tuple[str, blake2b]] = {}
    for index, spec in enumerate(calls):
        function_id = spec.function_id
        primed = hashers.get(function_id)
        if primed is None:
            digest = digests.get(function_id)
            if digest is None:
                raise MissingFunctionDigestError(task_id, function_id)
            primed = hashers[function_id] = (digest, function_hasher(function_id, digest))
        args = spec.args_json
        if type(args) is not bytes:
            raise InvalidCallSpecError(
                task_id, index, f"args_json must be bytes, got {type(args).__name__}"
            )
        h = primed[1].copy()
        h.update(args)
        append(PreparedCall(function_id, primed[0], args, h.hexdigest()))
    return tuple(prepared)


def _new_task(
    core: CoreState,
    task_id: str,
    mode: TaskMode,
    instance: str | None,
    policy: CallRetryPolicy | None,
) -> TaskDispatchState:
    if task_id in core.tasks:
        raise DuplicateTaskError(task_id)
    config = core.config
    policy = policy or CallRetryPolicy()
    task = TaskDispatchState(
        task_id=task_id,
        mode=mode,
        instance=core.scheduler.acquire_instance(instance or task_id),
        max_attempts=policy.max_attempts or config.default_max_attempts,
        base_backoff_ms=(
            policy.base_backoff_ms if policy.base_backoff_ms is not None else config.base_backoff_ms
        ),
        call_budget_ms=(
            policy.call_budget_ms if policy.call_budget_ms is not None else config.call_deadline_ms
        ),
        failure_policy=policy.failure,
    )
    core.tasks[task_id] = task
    return task


def _add_roots(
    core: CoreState,
    task: TaskDispatchState,
    calls: tuple[PreparedCall, ...],
    batch: StreamBatch | None,
) -> None:
    index = task.next_index
    prefix = f"{task.task_id}/c"
    registry = core.calls
    queue = task.ready_queue
    # One-shot roots by index (forgotten as they end), a stream batch's in a list.
    live = task.roots
    batch_roots = None if batch is None else batch.roots
    batch_idx = 0 if batch is None else batch.batch_idx
    max_attempts = task.max_attempts
    budget_ms = task.call_budget_ms
    append_queued = queue.append
    for call in calls:
        call_id = f"{prefix}{index}"
        # Positional (call id, task, call, index, batch, batch idx, max attempts, budget):
        # one per call.
        ctx = DispatchCallContext(
            call_id, task, call, index, batch, batch_idx, max_attempts, budget_ms
        )
        ctx.queued = True
        registry[call_id] = ctx
        if batch_roots is None:
            live[index] = ctx
        else:
            batch_roots.append(ctx)
        append_queued(ctx)
        index += 1
    count = len(calls)
    task.next_index = index
    task.total_count += count
    if batch is not None:
        batch.remaining += count
    if count:
        core.scheduler.wake(task)


def commit_call_phase(core: CoreState, prepared: PreparedCallPhase) -> None:
    """Register a one-shot call list, or its first chunk (an empty list converges at the
    next flush); registration stays open while ``prepared.total_count`` is not reached."""
    task = _new_task(core, prepared.task_id, TaskMode.ONE_SHOT, prepared.instance, prepared.policy)
    _add_roots(core, task, prepared.calls, None)
    unregistered = prepared.total_count - len(prepared.calls)
    if unregistered > 0:
        task.unregistered_roots = unregistered
        task.production_open = True
    mark_dirty(core, task)


def commit_call_chunk(core: CoreState, prepared: PreparedCallBatch) -> bool:
    """Register the next chunk of an open one-shot phase; False if the task stopped
    meanwhile (the chunk is dropped: its calls were counted cancelled)."""
    task = core.tasks.get(prepared.task_id)
    if task is None:
        raise UnknownTaskError(prepared.task_id)
    if task.mode is not TaskMode.ONE_SHOT:
        raise PhaseStateError(task.task_id, "is a stream, not a one-shot call phase")
    if not task.production_open:
        if task.stop_dispatching:
            return False
        raise PhaseStateError(task.task_id, "chunk committed after the whole phase")
    count = len(prepared.calls)
    if count > task.unregistered_roots:
        raise PhaseStateError(
            task.task_id,
            f"chunk of {count} calls, but only {task.unregistered_roots} are left to register",
        )
    _add_roots(core, task, prepared.calls, None)
    task.unregistered_roots -= count
    if not task.unregistered_roots:
        task.production_open = False
    mark_dirty(core, task)
    return True


def drop_unregistered(core: CoreState, task: TaskDispatchState) -> None:
    """A one-shot phase stopped while still open: count its unregistered calls as
    cancelled, without contexts (the settle pass calls this as it closes production)."""
    count = task.unregistered_roots
    task.unregistered_roots = 0
    task.dropped_roots += count
    task.total_count += count
    task.terminal_roots += count
    task.cancelled += count
    core.stats.calls_cancelled += count


def commit_call_stream(
    core: CoreState, task_id: str, instance: str | None, policy: CallRetryPolicy | None
) -> None:
    """Open a stream: batches follow with ``commit_call_batch``."""
    _new_task(core, task_id, TaskMode.STREAM, instance, policy)


def _stream(core: CoreState, task_id: str) -> TaskDispatchState:
    task = core.tasks.get(task_id)
    if task is None:
        raise UnknownTaskError(task_id)
    if task.mode is not TaskMode.STREAM:
        raise StreamStateError(task_id, "is a one-shot call phase, not a stream")
    return task


def commit_call_batch(core: CoreState, prepared: PreparedCallBatch) -> bool:
    """Register one batch; False if the stream was stopped (the batch is dropped)."""
    task = _stream(core, prepared.task_id)
    if not task.production_open:
        if task.stop_dispatching:
            return False
        raise StreamStateError(task.task_id, "batch committed after finish_call_stream")
    limit = core.config.max_outstanding_batches
    if len(task.batches) >= limit:
        raise CreditWindowExceededError(task.task_id, len(task.batches), limit)
    batch = StreamBatch(task.next_batch_idx)
    task.next_batch_idx += 1
    task.batches.append(batch)
    _add_roots(core, task, prepared.calls, batch)
    mark_dirty(core, task)
    return True


def finish_call_stream(core: CoreState, task_id: str) -> None:
    """The producer committed its last batch (idempotent)."""
    task = _stream(core, task_id)
    if task.production_open:
        task.production_open = False
        mark_dirty(core, task)

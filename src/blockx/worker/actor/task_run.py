"""TaskRun: one task's life on the worker, between its caller and the dispatch actor.

Theory of operation
-------------------
A :class:`TaskRun` is created by ``Worker.submit`` and handed to the
orchestrator with the task's first event. From then on two parties touch it,
both on the event loop thread:

* the **dispatch actor** reports what the core decided: counters as waits
  start (:attr:`subcalls`, :attr:`io_calls`), ``BatchSettled``
  (:meth:`batch_settled`), ``StopCallProduction`` (:meth:`production_stopped`)
  and, exactly once, ``ConvergeTaskCalls`` (:meth:`converged`);
* the **caller's side** (the task's producer and its handle) waits on
  :attr:`changed` for credits, rows and the end.

Streams: the producer may have ``window`` batches committed and not yet
*released*; a batch is released once it settled and — when the caller
consumes rows through ``TaskHandle.rows()`` — once its rows were taken. So a
slow consumer slows the producer down instead of piling rows up in memory.

Ids: the core and the executors see :attr:`task_id` (the caller's id plus a
per-worker sequence number: a fresh id per run keeps late frames of an
earlier run with the same id from reaching this one); IO handlers and the
result see :attr:`user_task_id`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from blockx.worker.api import Call, CallFailure
from blockx.worker.code import TaskCodeView
from blockx.worker.core import (
    BatchSettled,
    CallRetryPolicy,
    ConvergeTaskCalls,
    FailedCall,
    TaskFailure,
    TaskMode,
)
from blockx.worker.io import IOHandler
from blockx.worker.json_values import rows_from_outputs

__all__ = ["DECODE_SLICE", "SettledRows", "TaskRun"]

#: Outputs of a one-shot task decoded per loop turn (~7 ms of small rows).
DECODE_SLICE: Final = 16_384


class SettledRows:
    """The rows of settled calls, with the range of calls they came from.

    A stream's batch: calls ``[first_call, first_call + call_count)``, its rows in call
    order, the calls that finally failed among them and its counts. A one-shot task's
    rows come as one of these covering every call. A consumer that persists outcomes
    (``blockx serve``) records a whole one of these at a time.

    :attr:`outputs` are the raw JSON outputs of the *succeeded* calls, in call order
    (``BatchSettled.outputs``; empty when the task dropped its outputs); :attr:`rows`
    are them decoded, on first access only (a consumer that forwards the raw outputs,
    the cluster's node worker, never pays for decoding).
    """

    __slots__ = (
        "_rows",
        "call_count",
        "cancelled",
        "failures",
        "first_call",
        "outputs",
        "succeeded",
    )

    def __init__(
        self,
        *,
        first_call: int,
        call_count: int,
        failures: list[CallFailure],
        succeeded: int,
        cancelled: int,
        rows: list[Any] | None = None,
        outputs: Sequence[bytes] = (),
    ) -> None:
        self.first_call = first_call
        self.call_count = call_count
        self._rows = rows
        self.outputs = outputs
        self.failures = failures
        self.succeeded = succeeded
        self.cancelled = cancelled

    @property
    def decoded(self) -> bool:
        """Whether :attr:`rows` are at hand already (given, or decoded by an access): a
        consumer that can write the raw :attr:`outputs` takes these instead, never
        decoding twice (a one-shot task's are decoded off the actor, a slice per turn)."""
        return self._rows is not None

    @property
    def rows(self) -> list[Any]:
        """The outputs decoded (once, on first access), or the rows given."""
        rows = self._rows
        if rows is None:
            rows = self._rows = rows_from_outputs(self.outputs)
        return rows

    def __repr__(self) -> str:
        rows = len(self._rows) if self._rows is not None else len(self.outputs)
        return (
            f"SettledRows(calls {self.first_call}..{self.first_call + self.call_count}, "
            f"rows={rows}, failed={len(self.failures)}, cancelled={self.cancelled})"
        )


class TaskRun:
    """The runtime state of one task (see the module docstring)."""

    __slots__ = (
        "_consumer_rows",
        "_raw_outputs",
        "batch_starts",
        "calls",
        "changed",
        "code",
        "collect",
        "committed_batches",
        "converged_with",
        "deadline_ms",
        "debug",
        "debug_output",
        "done",
        "execute_prefixes",
        "failures",
        "instance",
        "io_calls",
        "io_handler",
        "max_output_bytes",
        "mode",
        "output_bytes",
        "output_limit_hit",
        "policy",
        "released_batches",
        "rows",
        "started_at",
        "stopped",
        "stream_calls",
        "stream_counts",
        "subcalls",
        "task_id",
        "user_task_id",
        "window",
    )

    def __init__(
        self,
        *,
        task_id: str,
        user_task_id: str,
        code: TaskCodeView,
        io_handler: IOHandler,
        policy: CallRetryPolicy,
        instance: str | None,
        mode: TaskMode,
        calls: Sequence[Call] | None,
        debug: bool,
        max_output_bytes: int | None,
        collect: bool,
        window: int,
        started_at: float,
        deadline_ms: int | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.task_id = task_id
        self.user_task_id = user_task_id
        self.code = code
        self.io_handler = io_handler
        self.policy = policy
        self.instance = instance
        self.mode = mode
        #: One-shot: the calls, by index (for failure reports).
        self.calls = calls
        self.debug = debug
        self.max_output_bytes = max_output_bytes
        #: Keep the rows for the result (``run_task``), else hand them to ``rows()``.
        self.collect = collect
        self.window = window
        self.started_at = started_at
        #: Wall-clock limit from admission (``TaskPolicy.deadline_ms``), None: none.
        self.deadline_ms = deadline_ms
        #: Set once, by ``converged``.
        self.done: asyncio.Future[ConvergeTaskCalls] = loop.create_future()
        self.converged_with: ConvergeTaskCalls | None = None
        #: Set on every change a producer or consumer may wait for.
        self.changed = asyncio.Event()
        # Counters kept by the actor.
        self.subcalls = 0
        self.io_calls = 0
        self.output_bytes = 0
        self.output_limit_hit = False
        self.debug_output: dict[str, str] = {}
        #: The actor's pre-encoded ExecuteCall members, by (function id, digest):
        #: see actor/execute.py.
        self.execute_prefixes: dict[tuple[str, str], bytes] = {}
        # Streams.
        self.stopped: TaskFailure | None = None
        self.committed_batches = 0
        self.released_batches = 0
        #: batch_idx -> (index of its first call, its calls), until the batch settles.
        #: batch -> (its first call's index, its calls: Calls or a CallBatch's pairs).
        self.batch_starts: dict[int, tuple[int, list[Call | tuple[str, Any]]]] = {}
        self.stream_calls = 0
        #: [succeeded, cancelled] summed over settled batches.
        self.stream_counts = [0, 0]
        #: Rows of settled batches: kept for the result, or queued for ``rows()``.
        self.rows: list[Any] = []
        self._consumer_rows: deque[SettledRows] = deque()
        #: A one-shot task's outputs, converged and not yet decoded into rows
        #: (:meth:`decode_outputs`, off the actor).
        self._raw_outputs: Sequence[bytes] | None = None
        self.failures: list[CallFailure] = []

    def __repr__(self) -> str:
        status = "done" if self.done.done() else ("stopping" if self.stopped else "running")
        return (
            f"TaskRun({self.task_id!r}, {self.mode.value}, {status}, "
            f"batches={self.released_batches}/{self.committed_batches})"
        )

    # --- the actor's side -------------------------------------------------------------------

    def production_stopped(self, failure: TaskFailure) -> None:
        """``StopCallProduction``: the producer must commit nothing more."""
        self.stopped = failure
        self.changed.set()

    def batch_settled(self, settled: BatchSettled) -> None:
        """``BatchSettled``: record its failures, release its credit; its rows are decoded
        now when collected, else by the consumer (:attr:`SettledRows.rows`)."""
        first, calls = self.batch_starts.pop(settled.batch_idx, (0, []))
        self.stream_counts[0] += settled.succeeded_count
        self.stream_counts[1] += settled.cancelled_count
        failures = [self._failure(failed, calls, first) for failed in settled.failed_calls]
        self.failures.extend(failures)
        if self.collect:
            self.rows.extend(rows_from_outputs(settled.outputs))
            self.released_batches += 1
        else:
            # Decoded by the consumer, on first access to its rows (not in the actor's turn).
            self._consumer_rows.append(
                SettledRows(
                    first_call=first,
                    call_count=settled.call_count,
                    outputs=settled.outputs,
                    failures=failures,
                    succeeded=settled.succeeded_count,
                    cancelled=settled.cancelled_count,
                )
            )
        self.changed.set()

    def converged(self, converge: ConvergeTaskCalls) -> None:
        """``ConvergeTaskCalls``: the task's call phase is over (called exactly once)."""
        self.converged_with = converge
        if converge.mode is TaskMode.ONE_SHOT:
            calls = self.calls or ()
            self.failures.extend(self._failure(f, calls, 0) for f in converge.failed_calls)
            # Decoded by whoever takes the rows (decode_outputs), not here: this runs in
            # the actor's turn, and a big list's rows take ~0.4 µs each to decode.
            if converge.outputs:
                self._raw_outputs = converge.outputs
        if not self.done.done():
            self.done.set_result(converge)
        self.changed.set()

    def note_debug_output(self, call_id: str, text: str) -> None:
        self.debug_output[call_id] = text

    @staticmethod
    def _failure(
        failed: FailedCall, calls: Sequence[Call | tuple[str, Any]], first: int
    ) -> CallFailure:
        position = failed.index - first
        call = calls[position] if 0 <= position < len(calls) else None
        if isinstance(call, tuple):  # a CallBatch's (function_id, args)
            function_id, args = call
        elif call is not None:
            function_id, args = call.function_id, call.args
        else:
            function_id, args = "?", None
        error = failed.error
        return CallFailure(
            index=failed.index,
            call_id=failed.call_id,
            function_id=function_id,
            args=args,
            kind=error.kind,
            message=error.message,
            stack=error.stack,
            attempts=failed.attempts,
            retryable=error.retryable,
        )

    # --- the producer's and consumer's side ---------------------------------------------------

    @property
    def outputs_pending(self) -> bool:
        """A one-shot task's outputs are not decoded yet (:meth:`decode_outputs`)."""
        return self._raw_outputs is not None

    async def decode_outputs(self) -> None:
        """Decode a converged one-shot task's outputs into rows, :data:`DECODE_SLICE`
        outputs per loop turn (so that a task of 300,000 calls does not hold the loop
        for ~130 ms at its end): into ``rows`` (collect) or one list for ``rows()``."""
        outputs = self._raw_outputs
        if outputs is None:
            return
        rows: list[Any] = []
        for start in range(0, len(outputs), DECODE_SLICE):
            if start:
                await asyncio.sleep(0)
                if self._raw_outputs is not outputs:  # another caller finished it meanwhile
                    return
            rows.extend(rows_from_outputs(outputs[start : start + DECODE_SLICE]))
        if self._raw_outputs is not outputs:
            return
        self._raw_outputs = None
        if self.collect:
            self.rows = rows
        else:
            converged = self.converged_with
            self._consumer_rows.append(
                SettledRows(
                    first_call=0,
                    call_count=converged.total_count if converged is not None else len(rows),
                    rows=rows,
                    outputs=outputs,
                    failures=list(self.failures),
                    succeeded=converged.succeeded_count if converged is not None else len(rows),
                    cancelled=converged.cancelled_count if converged is not None else 0,
                )
            )
        self.changed.set()

    @property
    def credits(self) -> int:
        """Batches the producer may commit now."""
        return self.window - (self.committed_batches - self.released_batches)

    def take_rows(self) -> list[Any] | None:
        """The next settled batch's rows for ``rows()`` (releasing its credit), or None."""
        settled = self.take_settled()
        return None if settled is None else settled.rows

    def take_settled(self) -> SettledRows | None:
        """The next settled batch for ``rows()`` (releasing its credit), or None."""
        if not self._consumer_rows:
            return None
        settled = self._consumer_rows.popleft()
        if self.mode is TaskMode.STREAM:
            self.released_batches += 1
            self.changed.set()
        return settled

    @property
    def finished(self) -> bool:
        """Converged and every row taken."""
        return self.done.done() and not self._consumer_rows and self._raw_outputs is None

    async def wait_changed(self) -> None:
        """Wait for the next change (call after checking your condition)."""
        self.changed.clear()
        await self.changed.wait()

"""One-shot call lists: checked, encoded, prepared and registered in bounded chunks.

Theory of operation
-------------------
A one-shot task (``Task(calls=[...])``) is one call phase: the task is
complete when every call of the list has ended, its outputs come in call
order, fast-fail and the output limit stop the whole list. Getting a list to
the core costs ~6 µs per call on the event loop (the arguments encoded, the
call key computed, the context registered), so doing it in one step held the
loop for a second per 150,000 calls -- no executor frame, heartbeat, IO
answer or other task was served meanwhile. Here a list goes in chunks of
``chunk_calls`` calls (:data:`ONE_SHOT_CHUNK_CALLS`, ~10 ms of work each), one
chunk per loop turn, in three steps:

1. **in ``Worker.submit``** -- the list is copied (in C; later changes to the
   caller's list do not matter) and its first chunk checked, encoded and
   prepared: a list of at most one chunk is handled as before, and a
   bad call in the first chunk raises :class:`~blockx.worker.api.TaskSpecError`
   from ``submit``;
2. **before admission** (:meth:`OneShotCalls.prepare_rest`, on the task's
   driver) -- the other chunks, one per loop turn. A bad call fails the task's
   handle with the same ``TaskSpecError`` (naming the call's index), raised by
   ``TaskHandle.result()`` and ``run_task``; nothing was registered, so nothing
   ran and nothing is left to clean up. Checking every call before the first
   is registered is what keeps "a malformed task runs nothing" true;
3. **once admitted** -- the first chunk is committed with the phase's total
   (``TaskSubmitted`` -> ``commit_call_phase``), and :meth:`OneShotCalls.feed`
   posts the other chunks in order, one per loop turn (``CallChunkPrepared``
   -> ``commit_call_chunk``). Calls are dispatched from the first chunk on.
   The core does not converge the phase before its last chunk, so its
   semantics are the one-step phase's (``core/registration.py``). If the task
   stops while chunks are still to come (fast-fail, output limit,
   cancellation), the core counts the unregistered calls as cancelled and
   sends ``StopCallProduction``; the feeder stops posting.

Arguments are encoded in step 1 or 2, not all in ``submit``: a caller must
not change a call's ``args`` after ``submit`` (failure reports show the
``Call`` objects, so this was never safe). A chunk is bounded by its number of
calls, not bytes: calls with large arguments make longer chunks.

Why not cheaper ways: checking a call *is* encoding it (orjson in C is the
cheap check), so checking the whole list up front would keep most of the
stall; and a list run as a stream would not be a one-shot phase (a stream's
calls in flight are bounded by its credit window, its rows settle batch by
batch, a fast-failed stream counts only the calls it committed).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from blockx.worker.actor.call_specs import as_call, call_specs, encode_call_args, pair_specs
from blockx.worker.actor.events import CallChunkPrepared
from blockx.worker.api import Call, TaskSpecError
from blockx.worker.core import (
    CallRetryPolicy,
    CallSpec,
    DispatcherCore,
    PreparedCallBatch,
    PreparedCallPhase,
)

if TYPE_CHECKING:
    from blockx.worker.actor.task_run import TaskRun

__all__ = [
    "ONE_SHOT_CHUNK_CALLS",
    "OneShotCalls",
    "as_call",
    "call_specs",
    "encode_call_args",
    "pair_specs",
]

#: Calls per registration chunk: ~10 ms of checking, encoding and preparing on
#: the caller's side and ~5 ms of registering on the actor for trivial calls
#: (bench/worker_oneshot_stall.py).
ONE_SHOT_CHUNK_CALLS: Final = 2048


class OneShotCalls:
    """A one-shot task's call list on its way to the core (see the module docstring).

    Built by ``Worker.submit``: prepares the first chunk at once and raises
    ``TaskSpecError`` for a bad call in it. :attr:`calls` grows, chunk by chunk,
    into the whole list as ``Call`` objects (the run's failure reports index it).
    """

    __slots__ = (
        "_chunk_calls",
        "_chunks",
        "_core",
        "_digests",
        "_items",
        "_known",
        "calls",
        "first",
        "task_id",
    )

    def __init__(
        self,
        task_id: str,
        items: Sequence[Any],
        digests: Mapping[str, str],
        core: DispatcherCore,
        *,
        instance: str | None,
        policy: CallRetryPolicy | None,
        chunk_calls: int = ONE_SHOT_CHUNK_CALLS,
    ) -> None:
        self.task_id = task_id
        #: A copy of the caller's list, until every chunk is prepared.
        self._items: list[Any] | None = list(items)
        total = len(self._items)
        self._digests = digests
        self._known = frozenset(digests)
        self._core = core
        self._chunk_calls = chunk_calls
        #: The whole list as Calls, once every chunk is prepared.
        self.calls: list[Call] = []
        #: Chunks prepared and not yet posted, in call order.
        self._chunks: deque[PreparedCallBatch] = deque()
        self.first: PreparedCallPhase = core.prepare_call_phase_with_digests(
            task_id,
            self._chunk_specs(),
            digests,
            instance=instance,
            policy=policy,
            total_count=total,
        )

    def __repr__(self) -> str:
        total = self.first.total_count
        return (
            f"OneShotCalls({self.task_id!r}, {len(self.calls)}/{total} prepared,"
            f" {len(self._chunks)} chunk(s) to post)"
        )

    @property
    def chunked(self) -> bool:
        """More calls than the first chunk: the rest need :meth:`prepare_rest` and :meth:`feed`."""
        return self.first.total_count > len(self.first.calls)

    def _chunk_specs(self) -> list[CallSpec]:
        """Check and encode the next chunk of the list (``TaskSpecError`` for a bad call)."""
        items = self._items
        assert items is not None
        start = len(self.calls)
        part = items[start : start + self._chunk_calls]
        calls = [
            item if type(item) is Call else as_call(item, i) for i, item in enumerate(part, start)
        ]
        unknown = {c.function_id for c in calls} - self._known
        if unknown:
            first = next(i for i, c in enumerate(calls, start) if c.function_id in unknown)
            raise TaskSpecError(
                f"calls name functions the task does not define: {sorted(unknown)}"
                f" (first: call #{first}); defined: {sorted(self._known)}"
            )
        specs = call_specs(calls, start)
        self.calls.extend(calls)
        if len(self.calls) == len(items):
            self._items = None  # self.calls holds the whole list now
        return specs

    async def prepare_rest(self) -> None:
        """Check, encode and prepare every chunk after the first, one per loop turn.

        Call before the phase is committed: a ``TaskSpecError`` here leaves
        nothing registered. Cancellation stops it between chunks.
        """
        core = self._core
        try:
            while self._items is not None:
                await asyncio.sleep(0)  # one chunk per loop turn
                specs = self._chunk_specs()
                self._chunks.append(
                    core.prepare_call_batch_with_digests(self.task_id, specs, self._digests)
                )
        except TaskSpecError:
            # The task will not run: let go of what was prepared (the error's traceback
            # keeps this object alive as long as the caller keeps the error or the handle).
            self._chunks.clear()
            self._items = None
            self.calls.clear()  # the run's ``calls`` too (the same list)
            raise

    async def feed(self, run: TaskRun, post: Callable[[CallChunkPrepared], None]) -> None:
        """Post the prepared chunks in order, one per loop turn, after the phase was
        committed; stops when the task stopped or ended (the core drops any later
        chunk anyway)."""
        chunks = self._chunks
        while chunks:
            await asyncio.sleep(0)  # the actor commits the previous chunk meanwhile
            if run.stopped is not None or run.done.done():
                chunks.clear()
                return
            post(CallChunkPrepared(run=run, prepared=chunks.popleft()))

"""Hypothesis: the dispatcher core's invariants under any interleaving of events.

The machine registers one-shot tasks (whole, or chunk by chunk) and streams,
releases calls, and then interleaves completions, failures (retryable or not),
sub-call requests, IO waits (a handle in the call's ``wait_handle``, answered
or not), executor loss, snapshot changes (health, capacity, stalls), bind
failures, retries coming due, stream batches, one-shot chunks, task
cancellation and stale re-deliveries. Every IO wait's handle ends exactly one
way: answered (cleared by the resume), or handed back once in a ``ReleaseWait``.
After every step the core's full recount (``check_invariants``) must hold and
every command must name a known call and executor (the harness checks); at
teardown everything is driven to the end and every task must have converged
exactly once with consistent counts. Any exception from the core fails the test.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from dispatcher_harness import Runtime, make_core, output_for, snapshot, spec
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tests.helpers.compiled import CORE_COMPILED

from blockx.worker.core import (
    BatchSettled,
    CallError,
    CallRetryPolicy,
    CallSpec,
    CallState,
    ConvergeTaskCalls,
    DispatcherConfig,
    DispatcherCore,
    ExecutorLossReport,
    FailurePolicy,
)

EXECUTORS = ("exec-0", "exec-1", "exec-2")
MAX_TASKS = 5


@dataclass(frozen=True)
class WaitToken:
    """An IO wait's handle (the runtime's future): equal by value, so a deep-copied
    twin core hands back an equal one."""

    serial: int
    call_id: str


@dataclass
class TaskModel:
    task_id: str
    stream: bool
    calls: list[CallSpec] = field(default_factory=list)
    finished: bool = False
    #: A one-shot phase registered in chunks: the chunks not committed yet.
    chunks: list[list[CallSpec]] = field(default_factory=list)


class DispatcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rt: Runtime | None = None
        self.tasks: dict[str, TaskModel] = {}
        self.next_task = 0
        self.heartbeat = 1
        self.ended_attempts: list[tuple[str, int]] = []
        self.fail_binds = False
        self.cancels = 0
        #: Every IO wait's handle attached, and those whose answer was delivered.
        self.io_waits: list[WaitToken] = []
        self.answered: set[WaitToken] = set()
        self.chunks_committed = 0
        self.registering_cancels = 0
        self.chunks_dropped = 0

    # --- set-up -----------------------------------------------------------------------

    @initialize(
        fairness=st.booleans(),
        quantum=st.integers(0, 3),
        sample=st.integers(0, 2),
        heap=st.booleans(),
        cache=st.sampled_from([0, 2, 64]),
        window=st.integers(1, 4),
        executor_cap=st.integers(0, 4),
        output_limit=st.sampled_from([0, 0, 60]),
        seed=st.integers(0, 2**16),
        first_args=st.lists(st.integers(0, 3), min_size=1, max_size=6),
        first_failure=st.sampled_from([None, FailurePolicy.FAST_FAIL, FailurePolicy.CONTINUE]),
    )
    def setup(
        self,
        fairness: bool,
        quantum: int,
        sample: int,
        heap: bool,
        cache: int,
        window: int,
        executor_cap: int,
        output_limit: int,
        seed: int,
        first_args: list[int],
        first_failure: FailurePolicy | None,
    ) -> None:
        config = DispatcherConfig(
            instance_fairness=fairness,
            instance_fairness_quantum=quantum,
            executor_selection_sample_size=sample,
            call_cache_max_entries=cache,
            task_max_inflight_calls=window,
            executor_max_inflight=executor_cap,
            max_collected_output_bytes=output_limit,
            max_subcall_depth=3,
            base_backoff_ms=3,
        )
        self.rt = Runtime(make_core(config, seed=seed), bind_fails=lambda cmd: self.fail_binds)
        if heap:
            # Exact selection keeps a heap only past SCAN_MAX_EXECUTORS; force it.
            self.rt.core._core.executors.scan_max_executors = 0
        self._apply_snapshots({eid: {} for eid in EXECUTORS})
        # Every run starts with work: a one-shot phase and an open stream.
        self.register_phase(first_args, first_failure, "tenant-a")
        self.open_stream(first_failure, "tenant-b")
        self.runtime.pump()

    def _apply_snapshots(self, overrides: dict[str, dict[str, object]]) -> None:
        assert self.rt is not None
        self.heartbeat += 1
        snaps = [
            snapshot(eid, **{"usable_contexts": 8, "heartbeat_seq": self.heartbeat, **kw})
            for eid, kw in overrides.items()
        ]
        self.rt.set_executors(*snaps)

    @property
    def runtime(self) -> Runtime:
        assert self.rt is not None
        return self.rt

    # --- registration -------------------------------------------------------------------

    args_lists = st.lists(st.integers(0, 3), max_size=6)
    policies = st.sampled_from([None, FailurePolicy.FAST_FAIL, FailurePolicy.CONTINUE])
    instances = st.sampled_from([None, "tenant-a", "tenant-b"])

    def _policy(self, failure: FailurePolicy | None) -> CallRetryPolicy | None:
        return None if failure is None else CallRetryPolicy(failure=failure, max_attempts=2)

    @precondition(lambda self: self.next_task < MAX_TASKS)
    @rule(args=args_lists, failure=policies, instance=instances)
    def register_phase(
        self, args: list[int], failure: FailurePolicy | None, instance: str | None
    ) -> None:
        task_id = f"t{self.next_task}"
        self.next_task += 1
        calls = [spec("f", str(a)) for a in args]
        self.tasks[task_id] = TaskModel(task_id, stream=False, calls=calls, finished=True)
        self.runtime.register(task_id, calls, instance=instance, policy=self._policy(failure))

    @precondition(lambda self: self.next_task < MAX_TASKS)
    @rule(
        first=st.lists(st.integers(0, 3), max_size=3),
        rest=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=3),
        failure=policies,
        instance=instances,
    )
    def register_chunked_phase(
        self,
        first: list[int],
        rest: list[list[int]],
        failure: FailurePolicy | None,
        instance: str | None,
    ) -> None:
        """A one-shot phase whose first chunk is committed now, the others by ``commit_chunk``."""
        task_id = f"t{self.next_task}"
        self.next_task += 1
        first_calls = [spec("f", str(a)) for a in first]
        chunks = [[spec("f", str(a)) for a in chunk] for chunk in rest]
        every = first_calls + [call for chunk in chunks for call in chunk]
        model = TaskModel(task_id, stream=False, calls=every)
        model.chunks = chunks
        model.finished = True
        self.tasks[task_id] = model
        self.runtime.register_first_chunk(
            task_id,
            first_calls,
            len(model.calls),
            instance=instance,
            policy=self._policy(failure),
        )

    def _chunked(self) -> list[TaskModel]:
        return [m for m in self.tasks.values() if m.chunks]

    @precondition(lambda self: bool(self._chunked()))
    @rule(data=st.data())
    def commit_chunk(self, data: st.DataObject) -> None:
        self._commit_chunk(data.draw(st.sampled_from(self._chunked())))

    def _commit_chunk(self, model: TaskModel) -> None:
        """The next chunk, in order; one for a task that stopped (or converged, which
        the actor checks first) is dropped."""
        rt = self.runtime
        chunk = model.chunks.pop(0)
        stopped = model.task_id in rt.stopped
        if stopped:
            self.chunks_dropped += 1
        else:
            self.chunks_committed += 1
        if rt.core.task_state(model.task_id) is None:
            assert stopped and model.task_id in rt.converged
            return
        assert rt.add_chunk(model.task_id, chunk) == []
        state = rt.core.task_state(model.task_id)
        if stopped:  # dropped: every call is registered or counted cancelled already
            assert state is not None
            assert state.next_index + state.dropped_roots == len(model.calls)

    @precondition(lambda self: bool(self._chunked()) and self.registering_cancels < 1)
    @rule(data=st.data())
    def cancel_while_registering(self, data: st.DataObject) -> None:
        """A one-shot phase is cancelled while chunks of it are still to come."""
        self.registering_cancels += 1
        rt = self.runtime
        model = data.draw(st.sampled_from(self._chunked()))
        for call_id, cmd in rt.running.items():
            if cmd.task_id == model.task_id:
                self.ended_attempts.append((call_id, cmd.attempt_seq))
        rt.run(rt.core.handle_task_cancelled(model.task_id, "cancelled while registering"))

    @precondition(lambda self: self.next_task < MAX_TASKS)
    @rule(failure=policies, instance=instances)
    def open_stream(self, failure: FailurePolicy | None, instance: str | None) -> None:
        task_id = f"t{self.next_task}"
        self.next_task += 1
        self.tasks[task_id] = TaskModel(task_id, stream=True)
        self.runtime.open_stream(task_id, instance=instance, policy=self._policy(failure))

    def _open_streams(self) -> list[TaskModel]:
        return [
            m
            for m in self.tasks.values()
            if m.stream and not m.finished and self.runtime.core.credits_available(m.task_id) > 0
        ]

    @precondition(lambda self: bool(self._open_streams()))
    @rule(data=st.data(), args=st.lists(st.integers(0, 3), max_size=4))
    def commit_batch(self, data: st.DataObject, args: list[int]) -> None:
        model = data.draw(st.sampled_from(self._open_streams()))
        calls = [spec("f", str(a)) for a in args]
        model.calls += calls
        self.runtime.add_batch(model.task_id, calls)

    @precondition(lambda self: any(m.stream and not m.finished for m in self.tasks.values()))
    @rule(data=st.data())
    def finish_stream(self, data: st.DataObject) -> None:
        model = data.draw(
            st.sampled_from([m for m in self.tasks.values() if m.stream and not m.finished])
        )
        model.finished = True
        if self.runtime.core.task_state(model.task_id) is not None:
            self.runtime.run(self.runtime.core.finish_call_stream(model.task_id))

    # --- the actor epilogue -----------------------------------------------------------------

    @rule()
    def pump(self) -> None:
        self.runtime.pump()

    @rule(max_decisions=st.integers(1, 3))
    def dispatch_some(self, max_decisions: int) -> None:
        rt = self.runtime
        rt.run(rt.core.dispatch_ready(rt.now, max_decisions))

    @rule()
    def flush(self) -> None:
        self.runtime.settle()

    # --- executor events -------------------------------------------------------------------

    def _running(self) -> list[str]:
        return sorted(self.runtime.running)

    # Weighted: most attempts complete; some fail, some ask for sub-calls.
    actions = st.sampled_from(
        ["complete", "complete", "complete", "retryable", "final", "subcall", "subcall"]
    )

    @precondition(lambda self: bool(self._running()))
    @rule(
        data=st.data(),
        steps=st.lists(
            st.tuples(actions, st.sampled_from(["f", "g"]), st.integers(0, 3)),
            min_size=1,
            max_size=4,
        ),
    )
    def work(self, data: st.DataObject, steps: list[tuple[str, str, int]]) -> None:
        rt = self.runtime
        for action, function, arg in steps:
            if not rt.running:
                return
            call_id = data.draw(st.sampled_from(self._running()))
            if action == "subcall":
                if self._wait_handle(call_id) is None:  # one suspended on IO sends nothing
                    rt.request_subcall(call_id, function_id=function, args=str(arg))
                continue
            self.ended_attempts.append((call_id, rt.running[call_id].attempt_seq))
            if action == "complete":
                rt.complete(call_id)
            else:
                rt.fail(call_id, kind="io_error", retryable=action == "retryable")

    # --- batch entry points: each batch must equal its events applied one by one --------

    def _twin(self) -> DispatcherCore | None:
        """A deep copy of the core, to replay a batch's events one at a time.

        None on the compiled core (mypyc's classes cannot be deep-copied): the batch
        runs and the machine's invariants hold it; the batch-equals-one-by-one
        comparison is made by the pure-Python pass of ``make test``.
        """
        return None if CORE_COMPILED else copy.deepcopy(self.runtime.core)

    def _assert_same(self, core: DispatcherCore, twin: DispatcherCore, call_ids: list[str]) -> None:
        assert core.stats.as_dict() == twin.stats.as_dict()
        for call_id in call_ids:
            a, b = core.call_context(call_id), twin.call_context(call_id)
            assert (a is None) == (b is None), call_id
            if a is not None and b is not None:
                assert repr(a) == repr(b)

    @precondition(lambda self: bool(self._running()))
    @rule(data=st.data(), stale=st.booleans())
    def complete_many(self, data: st.DataObject, stale: bool) -> None:
        rt = self.runtime
        ids = data.draw(
            st.lists(st.sampled_from(self._running()), min_size=1, max_size=5, unique=True)
        )
        items: list[tuple[str, int, bytes, int]] = []
        for call_id in ids:
            cmd = rt.running[call_id]
            output = output_for(cmd.function_id, cmd.args_json)
            items.append((call_id, cmd.attempt_seq, output, len(items)))
        if stale:  # a redelivered frame for an attempt that is not the live one
            items.insert(data.draw(st.integers(0, len(items))), (ids[0], items[0][1] + 1, b"{}", 0))
        twin = self._twin()
        expected: list[object] = []
        for call_id, seq, output, budget in items if twin is not None else ():
            expected += twin.handle_call_completed(call_id, seq, output, budget_used_ms=budget)
        out = rt.core.handle_calls_completed(items)
        if twin is not None:
            assert out == expected
            self._assert_same(rt.core, twin, ids)
        for call_id in ids:
            self.ended_attempts.append((call_id, rt.running.pop(call_id).attempt_seq))
        rt.run(out)

    @precondition(lambda self: bool(self._running()))
    @rule(data=st.data(), stale=st.booleans())
    def suspend_and_resume_many(self, data: st.DataObject, stale: bool) -> None:
        """Calls suspend (IO) and are resumed, each step a batch."""
        rt = self.runtime
        ids = data.draw(
            st.lists(st.sampled_from(self._running()), min_size=1, max_size=5, unique=True)
        )
        items = [(call_id, rt.running[call_id].attempt_seq) for call_id in ids]
        if stale:
            items.append((ids[-1], items[-1][1] - 1))
        for call_id in ids:  # an IO wait among them is answered now
            handle = self._wait_handle(call_id)
            if handle is not None:
                self.answered.add(handle)
        twin = self._twin()
        for call_id, seq in items if twin is not None else ():
            assert twin.handle_call_waiting(call_id, seq) == []
        assert rt.core.handle_calls_waiting(items) == []
        if twin is not None:
            self._assert_same(rt.core, twin, ids)
        for call_id, seq in items if twin is not None else ():
            assert twin.handle_call_resumed(call_id, seq) == []
        assert rt.core.handle_calls_resumed(items) == []
        if twin is not None:
            self._assert_same(rt.core, twin, ids)

    def _wait_handle(self, call_id: str) -> WaitToken | None:
        ctx = self.runtime.core.call_context(call_id)
        return None if ctx is None else ctx.wait_handle  # type: ignore[return-value]

    @precondition(lambda self: bool(self._running()))
    @rule(data=st.data())
    def wait_on_io(self, data: st.DataObject) -> None:
        """A running call suspends on IO; the runtime attaches the request's handle."""
        rt = self.runtime
        call_id = data.draw(st.sampled_from(self._running()))
        ctx = rt.core.call_context(call_id)
        assert ctx is not None
        if ctx.state is not CallState.RUNNING:
            return  # already waiting (on IO or a sub-call)
        if ctx.children:
            # A sub-call asked for before the bind was confirmed is still pending (the
            # call stayed RUNNING): at most one pending request per call (docs/protocol.md
            # invariant 2), so it sends no IO wait until that one is answered.
            return
        rt.run(rt.core.handle_call_waiting(call_id, rt.running[call_id].attempt_seq))
        assert ctx.state is CallState.WAITING
        token = WaitToken(len(self.io_waits), call_id)
        ctx.wait_handle = token
        self.io_waits.append(token)

    def _open_io_waits(self) -> list[WaitToken]:
        return [t for t in self.io_waits if self._wait_handle(t.call_id) is t]

    @precondition(lambda self: bool(self._open_io_waits()))
    @rule(data=st.data())
    def answer_io(self, data: st.DataObject) -> None:
        """An IO wait's answer is delivered: the call runs again."""
        rt = self.runtime
        token = data.draw(st.sampled_from(self._open_io_waits()))
        self.answered.add(token)
        rt.run(rt.core.handle_call_resumed(token.call_id, rt.running[token.call_id].attempt_seq))

    @precondition(lambda self: bool(self.runtime.pending_binds))
    @rule(data=st.data())
    def answer_binds_together(self, data: st.DataObject) -> None:
        """Several deferred binds succeed and are confirmed in one call."""
        rt = self.runtime
        count = data.draw(st.integers(1, len(rt.pending_binds)))
        binds, rt.pending_binds = rt.pending_binds[:count], rt.pending_binds[count:]
        twin = self._twin()
        expected: list[object] = []
        for bind in binds if twin is not None else ():
            expected += twin.handle_executor_bound(bind.call_id, bind.executor_id, bind.attempt_seq)
        out = rt.core.handle_executors_bound(binds)
        if twin is not None:
            assert out == expected
            self._assert_same(rt.core, twin, [bind.call_id for bind in binds])
        rt.run(out)

    @precondition(lambda self: bool(self._running()))
    @rule(data=st.data())
    def stale_subcall_request(self, data: st.DataObject) -> None:
        rt = self.runtime
        call_id = data.draw(st.sampled_from(self._running()))
        seq = rt.running[call_id].attempt_seq
        before = rt.core.stats.stale_events
        out = rt.request_subcall(call_id, attempt_seq=seq + 1)
        assert out == [] and rt.core.stats.stale_events == before + 1

    @precondition(lambda self: bool(self.ended_attempts))
    @rule(data=st.data(), completed=st.booleans())
    def redeliver_stale(self, data: st.DataObject, completed: bool) -> None:
        rt = self.runtime
        call_id, seq = data.draw(st.sampled_from(self.ended_attempts))
        before = rt.core.stats.stale_events
        if completed:
            out = rt.core.handle_call_completed(call_id, seq, b"{}")
        else:
            error = CallError(kind="transport_lost", message="late", retryable=True)
            out = rt.core.handle_attempt_failure(call_id, seq, error, rt.now)
        assert out == []
        assert rt.core.stats.stale_events == before + 1

    def _busy_executors(self) -> list[str]:
        return sorted({cmd.executor_id for cmd in self.runtime.running.values()})

    @precondition(lambda self: bool(self._busy_executors()))
    @rule(data=st.data())
    def lose_executor(self, data: st.DataObject) -> None:
        rt = self.runtime
        executor = data.draw(st.sampled_from(self._busy_executors()))
        on = sorted(c for c, cmd in rt.running.items() if cmd.executor_id == executor)
        for call_id in on:
            self.ended_attempts.append((call_id, rt.running[call_id].attempt_seq))
        report = data.draw(
            st.none()
            | st.builds(
                ExecutorLossReport,
                cause=st.sampled_from(
                    [
                        "transport_lost",
                        "executor_crashed",
                        "memory_exceeded",
                        "executor_wedged",
                        "protocol_error",
                        "shutdown",
                    ]
                ),
                running_call_id=st.none() | st.sampled_from(on),
                running_call_known=st.booleans(),
                started_call_ids=st.none() | st.frozensets(st.sampled_from(on)),
            )
        )
        rt.lose_executor(executor, report)

    @rule(
        executor=st.sampled_from(EXECUTORS),
        healthy=st.sampled_from([True, True, True, False]),
        usable=st.integers(0, 8),
        runnable=st.sampled_from([0, 1, 5, 200]),
        stalled=st.sampled_from([False, False, False, True]),
        memory=st.integers(0, 10),
    )
    def change_snapshot(
        self, executor: str, healthy: bool, usable: int, runnable: int, stalled: bool, memory: int
    ) -> None:
        rt = self.runtime
        overrides: dict[str, dict[str, object]] = {
            eid: {"usable_contexts": snap.usable_contexts, "healthy": snap.healthy}
            for eid, snap in rt.snapshots.items()
        }
        overrides[executor] = {
            "healthy": healthy,
            "usable_contexts": usable,
            "runnable_count": runnable,
            "memory_bytes": memory,
            "running_call_id": "x" if stalled else None,
            "running_for_ms": 60_000 if stalled else 0,
            "running_call_budget_ms": 1_000,
        }
        self._apply_snapshots(overrides)

    @rule(fail_binds=st.booleans())
    def toggle_bind_failures(self, fail_binds: bool) -> None:
        self.fail_binds = fail_binds

    @rule(defer=st.booleans())
    def toggle_deferred_binds(self, defer: bool) -> None:
        """Deferred: BindCalls wait for ``answer_bind`` (events may overtake them)."""
        self.runtime.defer_binds = defer

    @precondition(lambda self: bool(self.runtime.pending_binds))
    @rule(data=st.data(), fail=st.booleans())
    def answer_bind(self, data: st.DataObject, fail: bool) -> None:
        rt = self.runtime
        bind = rt.pending_binds.pop(data.draw(st.integers(0, len(rt.pending_binds) - 1)))
        rt.answer_bind(bind, fail=fail)

    @precondition(lambda self: bool(self._unconfirmed_roots()))
    @rule(data=st.data(), arg=st.integers(0, 3))
    def subcall_before_bind_confirmed(self, data: st.DataObject, arg: int) -> None:
        parent = data.draw(st.sampled_from(self._unconfirmed_roots()))
        self.runtime.request_subcall(parent, function_id="g", args=str(arg))

    def _unconfirmed_roots(self) -> list[str]:
        core = self.runtime.core
        found = []
        for bind in self.runtime.pending_binds:
            ctx = core.call_context(bind.call_id)
            if (
                ctx is not None
                and not ctx.bound
                and ctx.attempt_seq == bind.attempt_seq
                and ctx.executor_id == bind.executor_id
                and ctx.state.value == "RUNNING"
            ):
                found.append(bind.call_id)
        return sorted(found)

    @precondition(lambda self: bool(self.runtime.armed))
    @rule(data=st.data())
    def retry_due(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from(sorted(self.runtime.armed)))
        self.runtime.fire_retry(call_id)

    @precondition(lambda self: bool(self.tasks) and self.cancels < 1)
    @rule(data=st.data())
    def cancel_task(self, data: st.DataObject) -> None:
        self.cancels += 1
        rt = self.runtime
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        for call_id, cmd in rt.running.items():
            if cmd.task_id == task_id:
                self.ended_attempts.append((call_id, cmd.attempt_seq))
        rt.run(rt.core.handle_task_cancelled(task_id, "deadline"))

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def core_is_consistent(self) -> None:
        if self.rt is not None:
            self.rt.core.check_invariants()

    @invariant()
    def io_waits_end_one_way(self) -> None:
        """Each handle is held by its waiting call, or was answered, or released once."""
        if self.rt is None:
            return
        released = [cmd.handle for cmd in self.rt.released]
        for token in self.io_waits:
            held = self._wait_handle(token.call_id) is token
            ends = held + (token in self.answered) + released.count(token)
            assert ends == 1, (token, held, token in self.answered, released.count(token))

    @invariant()
    def converged_tasks_add_up(self) -> None:
        if self.rt is None:
            return
        for task_id, conv in self.rt.converged.items():
            self._check_convergence(self.tasks[task_id], conv, self.rt.settled.get(task_id, []))

    def _check_convergence(
        self, model: TaskModel, conv: ConvergeTaskCalls, settled: list[BatchSettled]
    ) -> None:
        assert conv.total_count == len(model.calls)
        assert conv.succeeded_count + conv.failed_count + conv.cancelled_count == conv.total_count
        assert conv.success == (conv.failure is None)
        dropped = conv.failure is not None and conv.failure.kind == "OUTPUT_BYTES_EXCEEDED"
        expected = [output_for(s.function_id, s.args_json) for s in model.calls]
        if model.stream:
            assert conv.outputs == () and conv.failed_calls == ()
            assert [b.batch_idx for b in settled] == list(range(len(settled)))
            assert sum(b.call_count for b in settled) == conv.total_count
            assert sum(b.succeeded_count for b in settled) == conv.succeeded_count
            assert sum(len(b.failed_calls) for b in settled) == conv.failed_count
            outputs = [o for b in settled for o in b.outputs]
        else:
            assert len(conv.failed_calls) == conv.failed_count
            outputs = list(conv.outputs)
        if conv.success:
            # Every successful root call's output, in call order.
            assert len(outputs) == conv.succeeded_count
        else:
            # A failed task may have dropped its outputs (the output limit can
            # be crossed after another failure stopped it).
            assert len(outputs) <= conv.succeeded_count
            if dropped and not model.stream:
                assert outputs == []
        it = iter(expected)
        assert all(any(o == e for e in it) for o in outputs), "outputs out of call order"

    def teardown(self) -> None:
        rt = self.rt
        if rt is None:
            return
        self.fail_binds = False
        rt.defer_binds = False
        self._apply_snapshots({eid: {} for eid in EXECUTORS})
        for _ in range(200):
            while rt.pending_binds:
                rt.answer_bind(rt.pending_binds.pop(0))
            for model in self.tasks.values():
                while model.chunks:
                    self._commit_chunk(model)
                if model.stream and not model.finished:
                    model.finished = True
                    if rt.core.task_state(model.task_id) is not None:
                        rt.run(rt.core.finish_call_stream(model.task_id))
            rt.pump()
            # Deepest calls first, so that parents are resumed before they end.
            for call_id in sorted(rt.running, key=lambda c: -c.count("/")):
                if call_id in rt.running:
                    rt.complete(call_id)
            rt.fire_all_retries()
            rt.pump()
            rt.core.check_invariants()
            if not rt.running and not rt.armed and not rt.pending_binds and not rt.core.task_ids():
                break
        stats = rt.core.stats
        for name in (
            "subcalls_created",
            "subcalls_rejected",
            "retries",
            "cache_hits",
            "singleflight_hits",
            "executor_losses",
            "bind_failures",
            "stale_events",
            "calls_failed",
            "calls_cancelled",
        ):
            event(f"{name} > 0: {getattr(stats, name) > 0}")
        event(f"tasks: {len(self.tasks)}")
        event(f"one-shot chunks committed: {self.chunks_committed > 0}")
        event(f"one-shot chunks dropped (task stopped first): {self.chunks_dropped > 0}")
        event(f"batches settled: {sum(len(b) for b in rt.settled.values()) > 0}")
        event(f"a task failed: {any(not c.success for c in rt.converged.values())}")
        assert set(rt.converged) == set(self.tasks), "not every task converged"
        assert rt.core.task_ids() == []
        assert rt.core.call_context("t0/c0") is None
        self.converged_tasks_add_up()
        self.io_waits_end_one_way()
        event(f"IO waits released: {len(rt.released) > 0}")


DispatcherMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestDispatcherInvariants = DispatcherMachine.TestCase

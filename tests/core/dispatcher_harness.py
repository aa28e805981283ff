"""A fake worker runtime for dispatcher-core tests: executes commands, checks each.

It plays the dispatch actor of the seed's Orchestrator with the adapter and the
executors folded in: ``BindCall`` is answered at once (``handle_executor_bound``
or, when ``bind_fails`` says so, ``handle_bind_failed``) unless ``defer_binds``
holds it for the test to answer later (``answer_bind``); a ``DispatchCallCmd``
makes the attempt "running" on its executor until the test completes or fails
it; ``ResumeParentCall`` is delivered and answered with ``handle_call_resumed``;
``ArmCallRetry`` timers are kept until the test fires them; ``ReleaseWait`` is
recorded (``released``) and must hand back a handle the call held. Every command is
checked against what the runtime knows: no unknown call or executor, nothing
sent to a lost executor, no ``CancelCallCmd`` for an attempt that was never
sent, one ``StopCallProduction`` and one ``ConvergeTaskCalls`` per phase. Time
is fake and starts at an odd value.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from blockx.worker.core import (
    ArmCallRetry,
    BatchSettled,
    BindCall,
    CallError,
    CallSpec,
    CancelCallCmd,
    CompleteCallFromCache,
    ConvergeTaskCalls,
    DispatchCallCmd,
    DispatchCommand,
    DispatcherConfig,
    DispatcherCore,
    ExecutorLossReport,
    ExecutorSnapshot,
    ReleaseWait,
    ResumeParentCall,
    StopCallProduction,
    SubcallIdSequence,
    SubcallRequest,
    UnbindCall,
)

T = TypeVar("T")

START_MS = 1_000_001  # odd on purpose: nothing may assume round times
DIGEST = "sha256:" + "ab" * 32


def digests_for(calls: Iterable[CallSpec]) -> dict[str, str]:
    return {spec.function_id: DIGEST for spec in calls}


def spec(function_id: str = "f", args: str | bytes = "1") -> CallSpec:
    return CallSpec(
        function_id=function_id, args_json=args if isinstance(args, bytes) else args.encode()
    )


def specs(n: int, function_id: str = "f", start: int = 0) -> list[CallSpec]:
    return [spec(function_id, str(i)) for i in range(start, start + n)]


def output_for(function_id: str, args_json: bytes) -> bytes:
    """What the fake executor returns: a pure function of the call."""
    return b'{"f":"' + function_id.encode() + b'","a":' + args_json + b"}"


def snapshot(executor_id: str, **kw: object) -> ExecutorSnapshot:
    values: dict[str, object] = {"usable_contexts": 128, "heartbeat_seq": 1}
    values.update(kw)
    return ExecutorSnapshot(executor_id=executor_id, **values)  # type: ignore[arg-type]


class HarnessError(AssertionError):
    pass


@dataclass
class Runtime:
    core: DispatcherCore
    now: int = START_MS
    #: Decides whether executing a BindCall fails (default: never).
    bind_fails: Callable[[BindCall], bool] = lambda cmd: False
    log: list[DispatchCommand] = field(default_factory=list)
    #: Attempts sent to executors and not yet ended: call id -> its DispatchCallCmd.
    running: dict[str, DispatchCallCmd] = field(default_factory=dict)
    armed: dict[str, ArmCallRetry] = field(default_factory=dict)
    converged: dict[str, ConvergeTaskCalls] = field(default_factory=dict)
    settled: dict[str, list[BatchSettled]] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    resumes: list[ResumeParentCall] = field(default_factory=list)
    from_cache: list[CompleteCallFromCache] = field(default_factory=list)
    cancelled: list[CancelCallCmd] = field(default_factory=list)
    #: Every ReleaseWait executed, in order.
    released: list[ReleaseWait] = field(default_factory=list)
    #: Every root call id registered, and every sub-call id the core created.
    known_calls: set[str] = field(default_factory=set)
    known_executors: set[str] = field(default_factory=set)
    #: Snapshots last applied, by executor id.
    snapshots: dict[str, ExecutorSnapshot] = field(default_factory=dict)
    #: Executors declared lost and not shown in a snapshot since.
    lost: set[str] = field(default_factory=set)
    #: Sub-call requests pending per parent: parent id -> request ids.
    pending_requests: dict[str, set[str]] = field(default_factory=dict)
    request_seq: int = 0
    #: (call id, executor id, attempt seq) of every DispatchCallCmd executed.
    dispatched: set[tuple[str, str, int]] = field(default_factory=set)
    #: Hold BindCalls until the test answers them (``answer_bind``).
    defer_binds: bool = False
    pending_binds: list[BindCall] = field(default_factory=list)

    # --- executing commands ---------------------------------------------------------

    def run(self, commands: Sequence[DispatchCommand]) -> list[DispatchCommand]:
        """Execute commands (and everything they lead to); returns them all."""
        executed: list[DispatchCommand] = []
        for cmd in commands:
            executed.append(cmd)
            self.log.append(cmd)
            self._check(cmd)
            if isinstance(cmd, BindCall):
                if self.defer_binds:
                    self.pending_binds.append(cmd)
                else:
                    executed += self.answer_bind(cmd)
            elif isinstance(cmd, DispatchCallCmd):
                if cmd.call_id in self.running:
                    raise HarnessError(f"second live attempt for {cmd.call_id}")
                self.running[cmd.call_id] = cmd
                self.dispatched.add((cmd.call_id, cmd.executor_id, cmd.attempt_seq))
            elif isinstance(cmd, UnbindCall | CancelCallCmd):
                live = self.running.get(cmd.call_id)
                if live is not None and live.executor_id == cmd.executor_id:
                    del self.running[cmd.call_id]
                if isinstance(cmd, CancelCallCmd):
                    # Only an attempt that was sent can be cancelled; a reservation
                    # that never got its ExecuteCall must be unbound instead.
                    if (cmd.call_id, cmd.executor_id, cmd.attempt_seq) not in self.dispatched:
                        raise HarnessError(f"{cmd!r} cancels an attempt that was never sent")
                    self.cancelled.append(cmd)
            elif isinstance(cmd, ArmCallRetry):
                self.armed[cmd.call_id] = cmd
            elif isinstance(cmd, ResumeParentCall):
                self.resumes.append(cmd)
                self.pending_requests.get(cmd.parent_call_id, set()).discard(cmd.request_id)
                parent = self.running.get(cmd.parent_call_id)
                if parent is not None:
                    executed += self.run(
                        self.core.handle_call_resumed(cmd.parent_call_id, parent.attempt_seq)
                    )
            elif isinstance(cmd, CompleteCallFromCache):
                self.from_cache.append(cmd)
            elif isinstance(cmd, ReleaseWait):
                if cmd.handle is None:
                    raise HarnessError(f"{cmd!r} releases nothing")
                if any(r.handle is cmd.handle for r in self.released):
                    raise HarnessError(f"{cmd!r}: that handle was released before")
                self.released.append(cmd)
            elif isinstance(cmd, StopCallProduction):
                if cmd.task_id in self.stopped:
                    raise HarnessError(f"StopCallProduction twice for {cmd.task_id}")
                self.stopped.add(cmd.task_id)
            elif isinstance(cmd, BatchSettled):
                self.settled.setdefault(cmd.task_id, []).append(cmd)
            elif isinstance(cmd, ConvergeTaskCalls):
                if cmd.task_id in self.converged:
                    raise HarnessError(f"task {cmd.task_id} converged twice")
                self.converged[cmd.task_id] = cmd
        return executed

    def answer_bind(self, cmd: BindCall, fail: bool | None = None) -> list[DispatchCommand]:
        """Report the outcome of executing ``cmd`` (``Adapter.Bind``)."""
        if fail is None:
            fail = self.bind_fails(cmd)
        if fail:
            return self.run(
                self.core.handle_bind_failed(
                    cmd.call_id, cmd.executor_id, cmd.attempt_seq, self.now
                )
            )
        return self.run(
            self.core.handle_executor_bound(cmd.call_id, cmd.executor_id, cmd.attempt_seq)
        )

    def _check(self, cmd: DispatchCommand) -> None:
        call_id = getattr(cmd, "call_id", None)
        if call_id is not None:
            self._check_call_id(call_id)
        if isinstance(cmd, ResumeParentCall):
            self._check_call_id(cmd.parent_call_id)
        executor_id = getattr(cmd, "executor_id", None)
        if executor_id is not None:
            if executor_id not in self.known_executors:
                raise HarnessError(f"{cmd!r} names unknown executor {executor_id}")
            if executor_id in self.lost and isinstance(
                cmd, UnbindCall | CancelCallCmd | ResumeParentCall
            ):
                raise HarnessError(f"{cmd!r} names lost executor {executor_id}")
            if executor_id in self.lost and isinstance(cmd, BindCall | DispatchCallCmd):
                raise HarnessError(f"{cmd!r} binds on lost executor {executor_id}")

    def _check_call_id(self, call_id: str) -> None:
        if call_id in self.known_calls:
            return
        parent, sep, tail = call_id.rpartition("/sub-")
        if sep and tail.isdigit() and parent in self.known_calls:
            self.known_calls.add(call_id)
            return
        raise HarnessError(f"command names unknown call {call_id}")

    # --- driving the core --------------------------------------------------------------

    def settle(self) -> list[DispatchCommand]:
        out: list[DispatchCommand] = []
        while True:
            batch = self.run(self.core.flush_dirty_tasks())
            out += batch
            if not self.core.has_dirty_tasks:
                return out

    def pump(self) -> list[DispatchCommand]:
        """The actor epilogue: flush, release every call possible, flush."""
        out = self.settle()
        out += self.run(self.core.dispatch_ready(self.now))
        out += self.settle()
        return out

    def set_executors(self, *snaps: ExecutorSnapshot) -> list[DispatchCommand]:
        for snap in snaps:
            self.known_executors.add(snap.executor_id)
            self.lost.discard(snap.executor_id)
        self.snapshots = {snap.executor_id: snap for snap in snaps}
        return self.run(self.core.handle_executor_snapshot_updated(list(snaps)))

    def lose_executor(
        self, executor_id: str, report: ExecutorLossReport | None = None
    ) -> list[DispatchCommand]:
        """The era ended: refresh the snapshot without it, then report the loss."""
        remaining = [s for s in self.snapshots.values() if s.executor_id != executor_id]
        out = self.set_executors(*remaining)
        self.lost.add(executor_id)
        for call_id, cmd in list(self.running.items()):
            if cmd.executor_id == executor_id:
                del self.running[call_id]
        out += self.run(self.core.handle_executor_lost(executor_id, self.now, report))
        return out

    def restore_executor(self, executor_id: str, **kw: object) -> list[DispatchCommand]:
        """The pool restarted it: a snapshot shows it again (a new era)."""
        snaps = dict(self.snapshots)
        snaps[executor_id] = snapshot(executor_id, **kw)
        return self.set_executors(*snaps.values())

    def calls_on(self, executor_id: str) -> list[str]:
        """Call ids whose live attempt runs on ``executor_id`` (sent, not ended)."""
        return sorted(c for c, cmd in self.running.items() if cmd.executor_id == executor_id)

    def register(self, task_id: str, calls: Sequence[CallSpec], **kw: object) -> list[str]:
        prepared = self.core.prepare_call_phase_with_digests(
            task_id,
            calls,
            digests_for(calls),
            **kw,  # type: ignore[arg-type]
        )
        ids = [f"{task_id}/c{i}" for i in range(len(calls))]
        self.known_calls.update(ids)
        self.run(self.core.commit_call_phase(prepared))
        return ids

    def register_first_chunk(
        self, task_id: str, calls: Sequence[CallSpec], total_count: int, **kw: object
    ) -> list[str]:
        """Commit the first chunk of a one-shot phase of ``total_count`` calls."""
        prepared = self.core.prepare_call_phase_with_digests(
            task_id,
            calls,
            digests_for(calls),
            total_count=total_count,
            **kw,  # type: ignore[arg-type]
        )
        ids = [f"{task_id}/c{i}" for i in range(total_count)]
        self.known_calls.update(ids)
        self.run(self.core.commit_call_phase(prepared))
        return ids[: len(calls)]

    def add_chunk(self, task_id: str, calls: Sequence[CallSpec]) -> list[DispatchCommand]:
        """Commit the next chunk of a one-shot phase (``register_first_chunk``)."""
        prepared = self.core.prepare_call_batch_with_digests(task_id, calls, digests_for(calls))
        return self.run(self.core.commit_call_chunk(prepared))

    def open_stream(self, task_id: str, **kw: object) -> None:
        self.run(self.core.commit_call_stream(task_id, **kw))  # type: ignore[arg-type]

    def add_batch(self, task_id: str, calls: Sequence[CallSpec]) -> list[str]:
        task = self.core.task_state(task_id)
        start = task.next_index if task is not None else 0
        prepared = self.core.prepare_call_batch_with_digests(task_id, calls, digests_for(calls))
        ids = [f"{task_id}/c{i}" for i in range(start, start + len(calls))]
        self.known_calls.update(ids)
        self.run(self.core.commit_call_batch(prepared))
        return ids

    def complete(
        self, call_id: str, output: bytes | None = None, budget_used_ms: int = 0
    ) -> list[DispatchCommand]:
        cmd = self.running.pop(call_id)
        if output is None:
            output = output_for(cmd.function_id, cmd.args_json)
        return self.run(
            self.core.handle_call_completed(
                call_id, cmd.attempt_seq, output, budget_used_ms=budget_used_ms
            )
        )

    def fail(
        self,
        call_id: str,
        kind: str = "internal_error",
        retryable: bool = True,
        message: str = "boom",
    ) -> list[DispatchCommand]:
        cmd = self.running.pop(call_id)
        error = CallError(kind=kind, message=message, retryable=retryable, stack="Traceback ...")
        return self.run(self.core.handle_attempt_failure(call_id, cmd.attempt_seq, error, self.now))

    def fire_retry(self, call_id: str) -> list[DispatchCommand]:
        arm = self.armed.pop(call_id)
        self.now = max(self.now, arm.due_at_ms)
        return self.run(self.core.handle_retry_ready(call_id))

    def fire_all_retries(self) -> list[DispatchCommand]:
        out: list[DispatchCommand] = []
        for call_id in list(self.armed):
            out += self.fire_retry(call_id)
        return out

    def request_subcall(
        self,
        parent_id: str,
        function_id: str = "child",
        args: str | bytes = "1",
        granted_budget_ms: int = 1000,
        executor_id: str | None = None,
        attempt_seq: int | None = None,
    ) -> list[DispatchCommand]:
        """The parent's executor asks for a sub-call (the parent must be running,
        or have a pending bind when binds are deferred)."""
        parent = self.running.get(parent_id)
        if parent is not None:
            parent_executor, parent_seq = parent.executor_id, parent.attempt_seq
            self.run(self.core.handle_call_waiting(parent_id, parent_seq))
        else:
            bind = next(b for b in self.pending_binds if b.call_id == parent_id)
            parent_executor, parent_seq = bind.executor_id, bind.attempt_seq
        self.request_seq += 1
        request_id = f"req-test-{self.request_seq}"
        self.pending_requests.setdefault(parent_id, set()).add(request_id)
        request = SubcallRequest(
            parent_call_id=parent_id,
            parent_attempt_seq=parent_seq if attempt_seq is None else attempt_seq,
            executor_id=parent_executor if executor_id is None else executor_id,
            request_id=request_id,
            function_id=function_id,
            function_code_digest=DIGEST,
            args_json=args if isinstance(args, bytes) else args.encode(),
            granted_budget_ms=granted_budget_ms,
        )
        return self.run(self.core.handle_subcall_request(request))

    def binds(self, commands: Iterable[DispatchCommand]) -> list[BindCall]:
        return [c for c in commands if isinstance(c, BindCall)]

    def of_type(self, commands: Iterable[DispatchCommand], kind: type[T]) -> list[T]:
        return [c for c in commands if isinstance(c, kind)]


def make_core(
    config: DispatcherConfig | None = None,
    seed: int = 7,
    subcall_ids: SubcallIdSequence | None = None,
) -> DispatcherCore:
    return DispatcherCore(
        config or DispatcherConfig(),
        rng=random.Random(seed),
        subcall_ids=subcall_ids or SubcallIdSequence(),
    )


def make_runtime(
    config: DispatcherConfig | None = None,
    executors: int = 2,
    usable_contexts: int = 128,
    **kw: object,
) -> Runtime:
    rt = Runtime(make_core(config), **kw)  # type: ignore[arg-type]
    rt.set_executors(
        *(snapshot(f"exec-{i}", usable_contexts=usable_contexts) for i in range(executors))
    )
    return rt


__all__ = [
    "DIGEST",
    "START_MS",
    "HarnessError",
    "Runtime",
    "digests_for",
    "make_core",
    "make_runtime",
    "output_for",
    "snapshot",
    "spec",
    "specs",
]

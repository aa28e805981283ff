"""Blame only the guilty: what an executor loss does to the calls bound there.

docs/security.md, "Blame": calls that had not started are dispatched again without
spending an attempt; suspects (the running call when the black box knows it; every
started call otherwise, and for memory_exceeded) run again alone on an executor; a
suspect whose executor dies while it runs alone spends its attempt and, once none is
left, fails with the cause (at once for executor_wedged). Isolation never starves.
"""

from __future__ import annotations

from dispatcher_harness import Runtime, make_runtime, spec, specs
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.worker.core import (
    BindCall,
    CallRetryPolicy,
    DispatcherConfig,
    ExecutorLossReport,
    FailurePolicy,
)


def crash(running: str | None, started: list[str], **kw: object) -> ExecutorLossReport:
    values: dict[str, object] = {
        "cause": "executor_crashed",
        "message": "exited with status 1",
        "running_call_id": running,
        "running_call_known": True,
        "started_call_ids": frozenset(started),
    }
    values.update(kw)
    return ExecutorLossReport(**values)  # type: ignore[arg-type]


def only_call_on(rt: Runtime, executor_id: str) -> str:
    (call_id,) = rt.calls_on(executor_id)
    return call_id


def run_to_end(rt: Runtime, *, culprits: dict[str, ExecutorLossReport]) -> None:
    """Complete every running call except culprits, whose executor dies under them
    (with their report) -- until nothing runs and nothing is armed."""
    for _ in range(200):
        rt.pump()
        if rt.armed:
            rt.fire_all_retries()
            continue
        if not rt.running:
            return
        for call_id in list(rt.running):
            cmd = rt.running.get(call_id)
            if cmd is None:
                continue
            if call_id in culprits:
                on = rt.calls_on(cmd.executor_id)
                template = culprits[call_id]
                report = ExecutorLossReport(
                    cause=template.cause,
                    message=template.message,
                    running_call_id=call_id,
                    running_call_known=True,
                    started_call_ids=frozenset(on),
                )
                rt.lose_executor(cmd.executor_id, report)
                rt.restore_executor(cmd.executor_id)
            else:
                rt.complete(call_id)
    raise AssertionError("did not settle")


def test_neighbours_of_a_crash_get_their_attempts_back_and_the_culprit_becomes_a_suspect() -> None:
    rt = make_runtime(executors=2)
    rt.register("t1", specs(6))
    rt.pump()
    on0 = rt.calls_on("exec-0")
    culprit, neighbours = on0[0], on0[1:]
    rt.lose_executor("exec-0", crash(culprit, on0))
    for call_id in neighbours:
        ctx = rt.core.call_context(call_id)
        assert ctx is not None and ctx.attempt_count == 0 and not ctx.suspect
    suspect = rt.core.call_context(culprit)
    assert suspect is not None and suspect.suspect and suspect.attempt_count == 0
    assert rt.core.stats.suspects == 1 and rt.core.stats.calls_blamed == 0
    rt.core.check_invariants()


def test_a_suspect_runs_alone_and_an_innocent_one_succeeds() -> None:
    rt = make_runtime(executors=2)
    rt.register("t1", specs(6))
    rt.pump()
    on0 = rt.calls_on("exec-0")
    rt.lose_executor("exec-0", crash(on0[0], on0))
    rt.restore_executor("exec-0")
    rt.pump()
    # The suspect got an executor of its own; its neighbours went elsewhere.
    (where,) = [cmd.executor_id for c, cmd in rt.running.items() if c == on0[0]]
    assert rt.calls_on(where) == [on0[0]]
    for _ in range(3):  # more work arrives: none of it lands next to the suspect
        rt.register(f"more{_}", specs(4))
        rt.pump()
        assert rt.calls_on(where) == [on0[0]]
        rt.core.check_invariants()
    # Its own sub-calls are allowed next to it.
    child = rt.binds(rt.request_subcall(on0[0]))[0]
    assert child.executor_id == where
    rt.complete(child.call_id)
    ctx = rt.core.call_context(on0[0])
    rt.complete(on0[0])
    assert ctx is not None and ctx.outcome is not None and ctx.outcome.value == "SUCCEEDED"
    assert ctx.attempt_count == 1


def test_the_culprit_fails_alone_with_the_cause_once_its_attempts_run_out() -> None:
    rt = make_runtime(executors=2)
    policy = CallRetryPolicy(max_attempts=3, failure=FailurePolicy.CONTINUE)
    ids = rt.register("t1", [spec("f", str(i)) for i in range(40)], policy=policy)
    culprit = ids[7]
    run_to_end(
        rt,
        culprits={
            culprit: ExecutorLossReport(cause="executor_crashed", message="killed by SIGSEGV")
        },
    )
    rt.settle()
    done = rt.converged["t1"]
    assert done.success and len(done.failed_calls) == 1
    (failed,) = done.failed_calls
    assert failed.call_id == culprit and failed.attempts == 3
    assert failed.error.kind == "executor_crashed" and "SIGSEGV" in failed.error.message
    assert not failed.error.retryable
    assert sum(o is not None for o in done.outputs) == 39
    assert rt.core.stats.calls_blamed == 3


def test_the_first_failure_reported_names_the_culprit_never_a_neighbour() -> None:
    rt = make_runtime(executors=2)
    ids = rt.register("t1", specs(30), policy=CallRetryPolicy(max_attempts=2))
    culprit = ids[3]
    run_to_end(rt, culprits={culprit: ExecutorLossReport(cause="executor_crashed")})
    rt.settle()
    done = rt.converged["t1"]
    assert not done.success
    assert done.failure is not None and done.failure.call_id == culprit


def test_a_suspect_that_wedges_again_alone_fails_at_once() -> None:
    rt = make_runtime(executors=2)
    ids = rt.register(
        "t1", specs(10), policy=CallRetryPolicy(max_attempts=5, failure=FailurePolicy.CONTINUE)
    )
    run_to_end(rt, culprits={ids[2]: ExecutorLossReport(cause="executor_wedged", message="wedged")})
    rt.settle()
    (failed,) = rt.converged["t1"].failed_calls
    assert failed.call_id == ids[2] and failed.error.kind == "executor_wedged"
    assert failed.attempts == 1  # the first loss made it a suspect; the second convicted it


def test_memory_exceeded_suspects_every_started_call_and_spares_the_unstarted() -> None:
    rt = make_runtime(executors=2)
    rt.register("t1", specs(8))
    rt.pump()
    on0 = rt.calls_on("exec-0")
    started = on0[:2]
    report = ExecutorLossReport(
        cause="memory_exceeded",
        message="over its memory limit of 512 MB",
        running_call_id=None,
        running_call_known=True,
        started_call_ids=frozenset(started),
    )
    rt.lose_executor("exec-0", report)
    for call_id in on0:
        ctx = rt.core.call_context(call_id)
        assert ctx is not None and ctx.attempt_count == 0
        assert ctx.suspect == (call_id in started)


def test_an_unknown_running_call_makes_every_started_call_a_suspect() -> None:
    rt = make_runtime(executors=2)
    rt.register("t1", specs(8))
    rt.pump()
    on0 = rt.calls_on("exec-0")
    report = ExecutorLossReport(
        cause="transport_lost",
        running_call_id=on0[0],  # a guess from the last heartbeat: not trusted
        running_call_known=False,
        started_call_ids=frozenset(on0[1:3]),
    )
    rt.lose_executor("exec-0", report)
    suspects = {c for c in on0 if rt.core.call_context(c).suspect}  # type: ignore[union-attr]
    assert suspects == set(on0[1:3])


def test_a_known_idle_executor_blames_nobody_and_shutdown_blames_nobody() -> None:
    for report in (
        crash(None, ["t1/c0", "t1/c2"]),
        ExecutorLossReport(cause="shutdown", started_call_ids=frozenset({"t1/c0"})),
    ):
        rt = make_runtime(executors=2)
        rt.register("t1", specs(4))
        rt.pump()
        on0 = rt.calls_on("exec-0")
        rt.lose_executor("exec-0", report)
        for call_id in on0:
            ctx = rt.core.call_context(call_id)
            assert ctx is not None and ctx.attempt_count == 0 and not ctx.suspect
        assert rt.core.stats.suspects == 0


def test_isolation_does_not_starve_it_drains_one_executor_then_binds_the_suspect() -> None:
    rt = make_runtime(executors=3, usable_contexts=4)
    rt.register("t1", specs(40))
    rt.pump()  # every executor full (4 each)
    on0 = rt.calls_on("exec-0")
    rt.lose_executor("exec-0", crash(on0[0], on0))  # not restarted yet
    rt.pump()
    suspect = on0[0]
    ctx = rt.core.call_context(suspect)
    assert ctx is not None and ctx.awaiting_isolation  # no empty executor yet
    reserved = [ex for ex in rt.core._core.executors if ex.reserved_for is ctx]
    assert len(reserved) == 1
    drained = reserved[0].executor_id
    before = rt.calls_on(drained)
    assert before  # it still has calls: they finish, nothing new comes in
    for call_id in before:
        rt.complete(call_id)
        rt.pump()
        assert set(rt.calls_on(drained)) <= set(before) | {suspect}
        rt.core.check_invariants()
    assert rt.calls_on(drained) == [suspect]
    # The other executor kept working meanwhile.
    other = "exec-1" if drained == "exec-2" else "exec-2"
    assert rt.calls_on(other)


def test_a_stopped_task_releases_the_executor_drained_for_its_suspect() -> None:
    rt = make_runtime(executors=2, usable_contexts=2)
    rt.register("t1", specs(2))
    rt.register("t2", specs(8))
    rt.pump()
    victim = "t1/c0"
    where = rt.running[victim].executor_id
    on = rt.calls_on(where)
    rt.lose_executor(where, crash(victim, on))
    rt.restore_executor(where, usable_contexts=2)
    rt.pump()
    rt.run(rt.core.handle_task_cancelled("t1", "user"))
    rt.pump()
    assert not rt.core._core.executors.reserved
    for ex in rt.core._core.executors:
        assert not ex.closed_to_roots
    rt.core.check_invariants()


# --- the property --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    n_calls=st.integers(1, 25),
    n_executors=st.integers(1, 4),
    culprit_picks=st.lists(st.integers(0, 24), max_size=3),
    causes=st.lists(
        st.sampled_from(
            ["executor_crashed", "memory_exceeded", "executor_wedged", "transport_lost"]
        ),
        min_size=3,
        max_size=3,
    ),
    steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), max_size=80),
    max_attempts=st.integers(1, 4),
)
def test_every_call_ends_once_and_an_innocent_call_never_loses_an_attempt(
    n_calls: int,
    n_executors: int,
    culprit_picks: list[int],
    causes: list[str],
    steps: list[tuple[int, int]],
    max_attempts: int,
) -> None:
    """Culprits kill whatever executor runs them (the report names them); losses with
    no culprit running (a random kill while idle, a shutdown) name nobody."""
    rt = make_runtime(DispatcherConfig(), executors=n_executors, usable_contexts=3)
    policy = CallRetryPolicy(max_attempts=max_attempts, failure=FailurePolicy.CONTINUE)
    ids = rt.register("t1", specs(n_calls), policy=policy)
    culprits = {ids[i % n_calls]: causes[k] for k, i in enumerate(culprit_picks)}
    binds_seen: dict[str, int] = {}

    def note(commands: list[object]) -> None:
        for c in commands:
            if isinstance(c, BindCall):
                binds_seen[c.call_id] = binds_seen.get(c.call_id, 0) + 1

    def kill(executor_id: str, idle: bool) -> None:
        on = rt.calls_on(executor_id)
        guilty = [c for c in on if c in culprits]
        if guilty and not idle:
            cause = culprits[guilty[0]]
            report = ExecutorLossReport(
                cause=cause,
                running_call_id=None if cause == "memory_exceeded" else guilty[0],
                running_call_known=cause != "memory_exceeded",
                started_call_ids=frozenset(guilty if cause == "memory_exceeded" else on),
            )
        else:
            report = ExecutorLossReport(
                cause="shutdown" if len(on) % 2 else "executor_crashed",
                running_call_known=True,  # nothing was running
                started_call_ids=frozenset(on),
            )
        note(rt.lose_executor(executor_id, report))
        note(rt.restore_executor(executor_id, usable_contexts=3))

    for executor_pick, call_pick in steps:
        note(rt.pump())
        note(rt.fire_all_retries())
        note(rt.pump())
        executor_id = f"exec-{executor_pick % n_executors}"
        running = sorted(rt.running)
        if not running:
            break
        call_id = running[call_pick % len(running)]
        if call_id in culprits:
            kill(rt.running[call_id].executor_id, idle=False)
        elif call_pick % 7 == 0:
            kill(executor_id, idle=True)
        else:
            note(rt.complete(call_id))
        rt.core.check_invariants()
        for innocent in ids:
            ctx = rt.core.call_context(innocent)
            if innocent not in culprits and ctx is not None:
                assert ctx.attempt_count <= 1, ctx  # only its live attempt, if any
    # Let everything finish: culprits keep killing their executors.
    run_to_end(
        rt,
        culprits={c: ExecutorLossReport(cause=cause) for c, cause in culprits.items()},
    )
    rt.settle()
    done = rt.converged["t1"]
    failed = {f.call_id: f for f in done.failed_calls}
    assert len(failed) == len(done.failed_calls)
    assert done.succeeded_count + done.failed_count == n_calls == done.total_count
    assert done.failed_count == len(failed) and done.cancelled_count == 0
    for call_id in ids:
        ended_ok = call_id not in failed  # exactly one end: counted once, above
        if call_id not in culprits:
            assert ended_ok, f"innocent {call_id} failed: {failed.get(call_id)}"
        else:
            assert not ended_ok  # a culprit kills every executor it runs on
            assert failed[call_id].error.kind == culprits[call_id]


def test_a_culprit_nobody_can_name_is_caught_by_the_safety_net() -> None:
    """No black box and no frame sent: the losses name nobody. A call bound through two
    such losses becomes a suspect; alone, with nothing to clear it, it is convicted."""
    rt = make_runtime(executors=1)
    ids = rt.register("t1", specs(3), policy=CallRetryPolicy(max_attempts=2))
    culprit = ids[0]
    unknown = ExecutorLossReport(
        cause="executor_crashed", message="exited with status 1", started_call_ids=frozenset()
    )
    for _ in range(30):
        rt.pump()
        rt.fire_all_retries()
        rt.pump()
        if culprit not in rt.running:
            break
        for call_id in rt.calls_on("exec-0"):
            if call_id != culprit:
                rt.complete(call_id)
        if culprit in rt.running:
            rt.lose_executor("exec-0", unknown)
            rt.restore_executor("exec-0")
        rt.core.check_invariants()
    rt.settle()
    done = rt.converged["t1"]
    assert done.failure is not None and done.failure.call_id == culprit
    assert done.failure.error is not None and done.failure.error.kind == "executor_crashed"
    assert done.succeeded_count == 2


def test_the_black_box_clears_a_suspect_that_was_not_running_when_its_executor_died() -> None:
    rt = make_runtime(executors=1)
    rt.register("t1", specs(1))
    rt.pump()
    rt.lose_executor("exec-0", crash("t1/c0", ["t1/c0"]))
    rt.restore_executor("exec-0")
    rt.pump()
    assert rt.calls_on("exec-0") == ["t1/c0"]  # alone now
    rt.lose_executor("exec-0", crash(None, ["t1/c0"]))  # killed from outside while idle
    ctx = rt.core.call_context("t1/c0")
    assert ctx is not None and ctx.attempt_count == 0 and ctx.suspect
    assert rt.core.stats.calls_blamed == 0

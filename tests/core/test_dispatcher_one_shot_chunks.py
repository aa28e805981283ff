"""One-shot phases registered in chunks: the same phase as one commit, only spread out.

A phase committed with ``total_count`` larger than its first chunk stays open
until the last ``commit_call_chunk``: it never converges early, its outputs
come in call order, and a stop while it is open (cancel, fast-fail) counts the
calls it never registered as cancelled and drops later chunks.
"""

from __future__ import annotations

import pytest
from dispatcher_harness import make_runtime, output_for, specs

from blockx.worker.core import (
    CallRetryPolicy,
    ConvergeTaskCalls,
    FailurePolicy,
    InvalidCallSpecError,
    PhaseStateError,
    StopCallProduction,
    TaskMode,
    UnknownTaskError,
)


def test_a_chunked_phase_dispatches_at_once_and_converges_only_after_its_last_chunk() -> None:
    rt = make_runtime()
    assert rt.register_first_chunk("t", specs(2), total_count=5) == ["t/c0", "t/c1"]
    state = rt.core.task_state("t")
    assert state is not None and state.production_open and state.unregistered_roots == 3
    assert rt.core.credits_available("t") == 0  # not a stream
    rt.pump()
    assert sorted(rt.running) == ["t/c0", "t/c1"]  # dispatch starts with the first chunk
    rt.complete("t/c1")
    rt.complete("t/c0")
    assert rt.of_type(rt.pump(), ConvergeTaskCalls) == []  # every registered call ended: open
    assert rt.add_chunk("t", specs(2, start=2)) == []
    rt.pump()
    rt.add_chunk("t", specs(1, start=4))
    assert not state.production_open and state.unregistered_roots == 0
    rt.pump()
    assert sorted(rt.running) == ["t/c2", "t/c3", "t/c4"]
    for call_id in ("t/c4", "t/c2", "t/c3"):
        rt.complete(call_id)
    rt.settle()
    conv = rt.converged["t"]
    assert conv.success and conv.mode is TaskMode.ONE_SHOT and conv.total_count == 5
    assert conv.outputs == tuple(output_for("f", str(i).encode()) for i in range(5))
    assert "t" not in rt.stopped  # no StopCallProduction for a phase that ran to its end
    rt.core.check_invariants()


def test_the_same_phase_in_one_commit_and_in_chunks_converges_alike() -> None:
    def converge(chunked: bool) -> ConvergeTaskCalls:
        rt = make_runtime()
        policy = CallRetryPolicy(failure=FailurePolicy.CONTINUE, max_attempts=1)
        if chunked:
            rt.register_first_chunk("t", specs(1), total_count=4, policy=policy)
            rt.add_chunk("t", specs(3, start=1))
        else:
            rt.register("t", specs(4), policy=policy)
        rt.pump()
        rt.fail("t/c1", kind="user_error", retryable=False)
        for call_id in ("t/c0", "t/c2", "t/c3"):
            rt.complete(call_id)
        rt.settle()
        return rt.converged["t"]

    assert converge(chunked=True) == converge(chunked=False)


def test_cancelling_an_open_phase_counts_its_unregistered_calls_cancelled() -> None:
    rt = make_runtime()
    rt.register_first_chunk("t", specs(2), total_count=10)
    rt.pump()
    cancels = rt.run(rt.core.handle_task_cancelled("t", "the caller cancelled"))
    assert len(cancels) == 2  # the two running calls
    out = rt.pump()
    (stop,) = rt.of_type(out, StopCallProduction)
    assert stop.task_id == "t" and stop.failure.kind == "CANCELLED"
    conv = rt.converged["t"]
    assert conv.failure is not None and conv.failure.kind == "CANCELLED"
    assert (conv.total_count, conv.succeeded_count, conv.cancelled_count) == (10, 0, 10)
    assert rt.core.stats.calls_cancelled == 10
    assert rt.core.task_ids() == [] and rt.core.call_contexts == {}
    with pytest.raises(UnknownTaskError):  # the actor drops chunks of a converged task
        rt.add_chunk("t", specs(2, start=2))


def test_fast_fail_while_open_waits_for_in_flight_calls_and_drops_later_chunks() -> None:
    rt = make_runtime(executors=1, usable_contexts=2)
    rt.register_first_chunk("t", specs(3), total_count=6)
    rt.pump()
    assert sorted(rt.running) == ["t/c0", "t/c1"]
    rt.fail("t/c0", kind="user_error", retryable=False)
    (stop,) = rt.of_type(rt.pump(), StopCallProduction)
    assert stop.failure.kind == "CALL_FAILED" and stop.failure.call_id == "t/c0"
    state = rt.core.task_state("t")
    assert state is not None and not state.production_open and state.dropped_roots == 3
    assert rt.add_chunk("t", specs(3, start=3)) == []  # dropped: the phase stopped
    assert rt.core.call_context("t/c3") is None and state.total_count == 6
    assert "t" not in rt.converged  # t/c1 is still in flight
    rt.core.check_invariants()
    rt.complete("t/c1")
    rt.settle()
    conv = rt.converged["t"]
    assert (conv.succeeded_count, conv.failed_count, conv.cancelled_count) == (1, 1, 4)
    assert conv.outputs == (output_for("f", b"1"),)
    assert [f.call_id for f in conv.failed_calls] == ["t/c0"]


def test_chunk_misuse_raises_typed_errors_and_changes_nothing() -> None:
    rt = make_runtime()
    with pytest.raises(InvalidCallSpecError, match="total_count"):
        rt.core.prepare_call_phase_with_digests("t", specs(3), {"f": "d"}, total_count=2)
    rt.register_first_chunk("t", specs(1), total_count=3)
    with pytest.raises(PhaseStateError, match="only 2 are left"):
        rt.add_chunk("t", specs(3, start=1))
    state = rt.core.task_state("t")
    assert state is not None and state.next_index == 1 and state.unregistered_roots == 2
    rt.add_chunk("t", specs(2, start=1))
    with pytest.raises(PhaseStateError, match="after the whole phase"):
        rt.add_chunk("t", specs(1, start=3))
    rt.register("whole", specs(1))
    with pytest.raises(PhaseStateError, match="after the whole phase"):
        rt.add_chunk("whole", specs(1, start=1))
    rt.open_stream("s")
    with pytest.raises(PhaseStateError, match="is a stream"):
        rt.add_chunk("s", specs(1))
    with pytest.raises(UnknownTaskError):
        rt.add_chunk("missing", specs(1))
    rt.core.check_invariants()

"""Streamed call phases: credit window, batch settle, output limit, bounded memory."""

from __future__ import annotations

import gc

import pytest
from dispatcher_harness import make_runtime, output_for, specs

from blockx.worker.core import (
    BatchSettled,
    CallRetryPolicy,
    ConvergeTaskCalls,
    CreditWindowExceededError,
    DispatchCallCmd,
    DispatcherConfig,
    FailurePolicy,
    StopCallProduction,
    StreamStateError,
    TaskMode,
    UnknownTaskError,
)


def test_stream_batches_settle_in_order_and_return_credits() -> None:
    rt = make_runtime()
    rt.open_stream("s")
    assert rt.core.credits_available("s") == 2
    first = rt.add_batch("s", specs(2))
    second = rt.add_batch("s", specs(2, start=2))
    assert first == ["s/c0", "s/c1"] and second == ["s/c2", "s/c3"]
    assert rt.core.credits_available("s") == 0
    with pytest.raises(CreditWindowExceededError):
        rt.add_batch("s", specs(1))
    out = rt.pump()
    assert [(d.call_id, d.batch_idx) for d in rt.of_type(out, DispatchCallCmd)] == [
        ("s/c0", 0),
        ("s/c1", 0),
        ("s/c2", 1),
        ("s/c3", 1),
    ]
    for call_id in second:  # batch 1 finishes first, but batches settle in order
        rt.complete(call_id)
    assert rt.settle() == []
    rt.complete("s/c0")
    rt.complete("s/c1")
    settled = rt.of_type(rt.settle(), BatchSettled)
    assert [b.batch_idx for b in settled] == [0, 1]
    assert settled[0].outputs == (output_for("f", b"0"), output_for("f", b"1"))
    assert settled[0].call_count == 2 and settled[0].succeeded_count == 2
    assert rt.core.credits_available("s") == 2
    assert rt.core.call_context("s/c0") is None  # settled contexts are forgotten
    assert "s" not in rt.converged  # production is still open
    rt.run(rt.core.finish_call_stream("s"))
    rt.settle()
    conv = rt.converged["s"]
    assert conv.success and conv.mode is TaskMode.STREAM and conv.outputs == ()
    assert conv.total_count == 4 and conv.succeeded_count == 4


def test_empty_batches_and_empty_streams_settle() -> None:
    rt = make_runtime()
    rt.open_stream("s")
    rt.add_batch("s", [])
    assert [b.batch_idx for b in rt.of_type(rt.settle(), BatchSettled)] == [0]
    rt.run(rt.core.finish_call_stream("s"))
    rt.run(rt.core.finish_call_stream("s"))  # idempotent
    rt.settle()
    assert rt.converged["s"].total_count == 0


def test_stream_misuse_raises_typed_errors() -> None:
    rt = make_runtime()
    rt.register("one-shot", specs(1))
    with pytest.raises(StreamStateError, match="one-shot"):
        rt.add_batch("one-shot", specs(1))
    with pytest.raises(UnknownTaskError):
        rt.add_batch("missing", specs(1))
    with pytest.raises(UnknownTaskError):
        rt.core.finish_call_stream("missing")
    rt.open_stream("s")
    rt.run(rt.core.finish_call_stream("s"))
    with pytest.raises(StreamStateError, match="after finish"):
        rt.add_batch("s", specs(1))


def test_failed_calls_are_reported_with_their_batch() -> None:
    rt = make_runtime()
    rt.open_stream("s", policy=CallRetryPolicy(failure=FailurePolicy.CONTINUE))
    rt.add_batch("s", specs(2))
    rt.pump()
    rt.fail("s/c0", kind="user_error", retryable=False, message="KeyError: 'x'")
    rt.complete("s/c1")
    (batch,) = rt.of_type(rt.settle(), BatchSettled)
    assert batch.outputs == (output_for("f", b"1"),)
    (failed,) = batch.failed_calls
    assert failed.call_id == "s/c0" and failed.index == 0 and failed.attempts == 1
    assert failed.error.kind == "user_error" and failed.error.stack == "Traceback ..."


def test_fast_fail_stops_production_waits_for_in_flight_calls_then_cancels_the_rest() -> None:
    rt = make_runtime(executors=1, usable_contexts=2)
    rt.open_stream("s")
    rt.add_batch("s", specs(3))
    rt.add_batch("s", specs(2, start=3))
    rt.pump()
    assert sorted(rt.running) == ["s/c0", "s/c1"]
    rt.fail("s/c0", kind="user_error", retryable=False)
    out = rt.pump()
    (stop,) = rt.of_type(out, StopCallProduction)
    assert stop.failure.kind == "CALL_FAILED" and stop.failure.call_id == "s/c0"
    assert rt.binds(out) == []  # no more dispatching
    assert "s" not in rt.converged  # s/c1 is still in flight
    rt.add_batch("s", specs(1, start=5))  # dropped: production stopped
    assert rt.core.task_state("s").total_count == 5  # type: ignore[union-attr]
    assert rt.core.call_context("s/c5") is None
    assert rt.binds(rt.pump()) == []
    rt.complete("s/c1")
    out = rt.settle()
    conv = rt.of_type(out, ConvergeTaskCalls)[0]
    assert not conv.success and conv.failure is not None and conv.failure.error is not None
    assert (conv.succeeded_count, conv.failed_count, conv.cancelled_count) == (1, 1, 3)
    assert [b.batch_idx for b in rt.of_type(out, BatchSettled)] == [0, 1]
    with pytest.raises(UnknownTaskError):  # the core forgot the task at convergence
        rt.core.finish_call_stream("s")


def test_output_limit_does_not_apply_to_a_stream() -> None:
    """``max_collected_output_bytes`` limits outputs kept for a whole task; a stream's
    leave with each settled batch, so it gets every output whatever their size."""
    rt = make_runtime(DispatcherConfig(max_collected_output_bytes=20))
    rt.open_stream("s")
    rt.add_batch("s", specs(1))
    rt.pump()
    rt.complete("s/c0")  # 15 bytes
    (first,) = rt.of_type(rt.settle(), BatchSettled)
    assert first.outputs == (output_for("f", b"0"),)
    rt.add_batch("s", specs(3, start=1))
    rt.pump()
    for call_id in ("s/c1", "s/c2", "s/c3"):  # 60 bytes in total > 20
        rt.complete(call_id)
    out = rt.settle()
    assert not rt.of_type(out, StopCallProduction)
    (second,) = rt.of_type(out, BatchSettled)
    assert second.outputs == tuple(output_for("f", str(i).encode()) for i in (1, 2, 3))
    rt.run(rt.core.finish_call_stream("s"))
    rt.pump()
    conv = rt.converged["s"]
    assert conv.success and conv.failure is None and conv.succeeded_count == 4


def test_output_limit_drops_a_one_shot_tasks_outputs() -> None:
    rt = make_runtime(DispatcherConfig(max_collected_output_bytes=20, task_max_inflight_calls=1))
    rt.register("t1", specs(3))
    rt.pump()
    rt.complete("t1/c0")
    rt.pump()
    rt.complete("t1/c1")
    rt.pump()
    conv = rt.converged["t1"]
    assert conv.failure is not None and conv.failure.kind == "OUTPUT_BYTES_EXCEEDED"
    assert conv.outputs == () and conv.succeeded_count == 2 and conv.cancelled_count == 1


def test_a_long_stream_keeps_core_memory_bounded() -> None:
    rt = make_runtime(executors=4, usable_contexts=64)
    rt.open_stream("s")
    peak = 0
    total = 0
    while total < 20_000:
        while rt.core.credits_available("s"):
            rt.add_batch("s", specs(500, start=total))
            total += 500
        rt.pump()
        for call_id in list(rt.running):
            rt.complete(call_id)
        peak = max(peak, len(rt.core._core.calls))
        settled = rt.settled.get("s", [])
        for batch in settled:
            assert len(batch.outputs) == batch.call_count
        rt.settled["s"] = []  # the runtime hands outputs on; the test does not keep them
    rt.run(rt.core.finish_call_stream("s"))
    while rt.running or "s" not in rt.converged:
        rt.pump()
        for call_id in list(rt.running):
            rt.complete(call_id)
    assert peak <= 2 * 500  # the credit window bounds live contexts
    assert rt.converged["s"].succeeded_count == 20_000
    assert not rt.core._core.calls


def test_a_settled_batch_is_freed_by_reference_counting() -> None:
    """A settled batch and its calls must not form a cycle: with the worker's tuned GC
    (rare full collections) a long stream would otherwise grow by every settled batch."""
    from blockx.worker.core.state import DispatchCallContext, StreamBatch

    def alive(call_ids: list[str]) -> list[object]:
        return [
            o
            for o in gc.get_objects()
            if (type(o) is DispatchCallContext and o.call_id in call_ids) or type(o) is StreamBatch
        ]

    gc.collect()
    gc.disable()
    try:
        rt = make_runtime()
        rt.open_stream("s")
        ids = rt.add_batch("s", specs(3))
        rt.pump()
        assert len(alive(ids)) == 4  # three calls and their batch
        for call_id in ids:
            rt.complete(call_id)
        assert [b.batch_idx for b in rt.of_type(rt.settle(), BatchSettled)] == [0]
        assert alive(ids) == []
    finally:
        gc.enable()

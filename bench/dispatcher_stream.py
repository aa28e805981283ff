"""A 1,000,000-call stream through the DispatcherCore: throughput and flat memory.

The producer commits batches of 8,192 calls (the seed's ``BatchMaxRows``)
whenever it has a credit (``max_outstanding_batches`` = 2); 8 executors with
128 contexts each run every bound call to completion at once. Each settled
batch's outputs leave with its ``BatchSettled`` and are dropped here, as the
runtime would hand them on. Two passes:

* throughput: calls/s of the core's whole share (prepare, commit, dispatch,
  bound, complete, flush), CPU time of this process;
* memory: the same run under ``tracemalloc``, sampling the memory the core
  holds after every 10% of the calls -- it must stay flat, bounded by the
  credit window (2 x 8,192 contexts) and the call cache (65,536 entries).

    .venv/bin/python bench/dispatcher_stream.py [--calls N] [--batch N]
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from blockx.worker.core import (
    BatchSettled,
    BindCall,
    CallSpec,
    ConvergeTaskCalls,
    DispatchCallCmd,
    DispatcherConfig,
    DispatcherCore,
    ExecutorSnapshot,
    SubcallIdSequence,
)

DIGEST = "sha256:" + "0" * 64


def run(calls: int, batch: int, sample_memory: bool) -> tuple[float, list[tuple[int, int]]]:
    core = DispatcherCore(DispatcherConfig(), rng=random.Random(1), subcall_ids=SubcallIdSequence())
    core.handle_executor_snapshot_updated(
        [
            ExecutorSnapshot(executor_id=f"exec-{i}", usable_contexts=128, heartbeat_seq=1)
            for i in range(8)
        ]
    )
    core.commit_call_stream("stream")
    now = 1_000_001
    produced = settled = 0
    samples: list[tuple[int, int]] = []
    next_sample = calls // 10
    running: list[DispatchCallCmd] = []
    converged: list[ConvergeTaskCalls] = []

    def execute(commands: list) -> None:  # type: ignore[type-arg]
        nonlocal settled
        for cmd in commands:
            if isinstance(cmd, BindCall):
                execute(core.handle_executor_bound(cmd.call_id, cmd.executor_id, cmd.attempt_seq))
            elif isinstance(cmd, DispatchCallCmd):
                running.append(cmd)
            elif isinstance(cmd, BatchSettled):
                settled += cmd.call_count  # outputs handed on, not kept
            elif isinstance(cmd, ConvergeTaskCalls):
                converged.append(cmd)

    started = time.process_time()
    while not converged:
        while produced < calls and core.credits_available("stream"):
            n = min(batch, calls - produced)
            specs = [
                CallSpec(function_id="f", args_json=b'{"i":%d}' % i)
                for i in range(produced, produced + n)
            ]
            prepared = core.prepare_call_batch_with_digests("stream", specs, {"f": DIGEST})
            core.commit_call_batch(prepared)
            produced += n
            if produced == calls:
                core.finish_call_stream("stream")
        execute(core.dispatch_ready(now))
        for cmd in running:
            core.handle_call_completed(cmd.call_id, cmd.attempt_seq, b'{"y":1}')
        running.clear()
        execute(core.flush_dirty_tasks())
        if sample_memory and settled >= next_sample:
            samples.append((settled, tracemalloc.get_traced_memory()[0]))
            next_sample += calls // 10
    elapsed = time.process_time() - started
    assert converged[0].succeeded_count == calls and settled == calls
    return calls / elapsed, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=8192)
    args = parser.parse_args()
    rate, _ = run(args.calls, args.batch, sample_memory=False)
    print(f"DispatcherCore stream: {args.calls:,} calls in batches of {args.batch:,}")
    print(f"throughput: {rate:,.0f} calls per CPU second")
    tracemalloc.start()
    _, samples = run(args.calls, args.batch, sample_memory=True)
    tracemalloc.stop()
    print("memory held (tracemalloc) after N calls settled:")
    for settled, size in samples:
        print(f"  {settled:>10,} calls: {size / 2**20:7.1f} MiB")


if __name__ == "__main__":
    main()

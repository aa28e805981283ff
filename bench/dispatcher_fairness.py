"""The cost of instance fairness: 100 instances, 64 executors.

Like the seed's ``dispatcher_fairness_bench_test.go``. Each of 100 instances
(tenants) has 1,000 calls (100,000 in all), split over 1 to 4 tasks (instance
n has 1 + n % 4), so that task round-robin favours the instances with more
tasks. Rows: fairness off (task round-robin), and max-min instance fairness
with ``instance_fairness_quantum`` 0 (re-pick every call), 16, 128 and 1024.

* ``backlog``  -- ``dispatch_ready`` releasing the whole backlog (capacity is
  unlimited): decisions/s when every decision binds;
* ``steady``   -- a saturated pool (64 executors x 16 contexts = 1,024 slots):
  each step completes the oldest running call and releases one more, i.e. the
  core's whole share of a call (bind, bound, complete, flush, dispatch) with
  one fairness pick per bind;
* ``spread``   -- in the steady state, the largest minus the smallest number of
  in-flight calls per instance (max-min fairness keeps it at 0 or 1; a larger
  quantum lets it grow to about the quantum; task round-robin gives instances
  with four tasks four times the share of those with one).

CPU time of this process (``time.process_time``), best of 3 runs.

    .venv/bin/python bench/dispatcher_fairness.py [--instances N] [--calls-per-instance N]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter, deque

from blockx.worker.core import (
    BindCall,
    CallSpec,
    DispatchCallCmd,
    DispatcherConfig,
    DispatcherCore,
    ExecutorSnapshot,
    SubcallIdSequence,
)

DIGEST = "sha256:" + "0" * 64
EXECUTORS = 64
MODES: tuple[tuple[str, bool, int], ...] = (
    ("off", False, 0),
    ("quantum 0", True, 0),
    ("quantum 16", True, 16),
    ("quantum 128", True, 128),
    ("quantum 1024", True, 1024),
)


def build(
    fair: bool, quantum: int, instances: int, per_instance: int, contexts: int
) -> DispatcherCore:
    config = DispatcherConfig(
        instance_fairness=fair,
        instance_fairness_quantum=quantum,
        executor_max_inflight=0,
        executor_max_runnable=0,
        task_max_inflight_calls=per_instance + 1,
    )
    core = DispatcherCore(config, rng=random.Random(1), subcall_ids=SubcallIdSequence())
    core.handle_executor_snapshot_updated(
        [
            ExecutorSnapshot(executor_id=f"exec-{i:02d}", usable_contexts=contexts, heartbeat_seq=1)
            for i in range(EXECUTORS)
        ]
    )
    for n in range(instances):
        tasks = 1 + n % 4
        for t in range(tasks):
            specs = [
                CallSpec(function_id="f", args_json=b"[%d,%d,%d]" % (n, t, i))
                for i in range(per_instance // tasks)
            ]
            prepared = core.prepare_call_phase_with_digests(
                f"task-{n:03d}-{t}", specs, {"f": DIGEST}, instance=f"tenant-{n:03d}"
            )
            core.commit_call_phase(prepared)
    core.flush_dirty_tasks()
    return core


def bench_backlog(fair: bool, quantum: int, instances: int, per_instance: int) -> float:
    core = build(fair, quantum, instances, per_instance, 1 << 30)
    started = time.process_time()
    commands = core.dispatch_ready(1_000_001)
    elapsed = time.process_time() - started
    return len(commands) / elapsed


def bench_steady(fair: bool, quantum: int, instances: int, per_instance: int) -> tuple[float, int]:
    core = build(fair, quantum, instances, per_instance, 16)
    now = 1_000_001
    running: deque[DispatchCallCmd] = deque()

    def execute(commands: list) -> None:  # type: ignore[type-arg]
        for cmd in commands:
            if isinstance(cmd, BindCall):
                execute(core.handle_executor_bound(cmd.call_id, cmd.executor_id, cmd.attempt_seq))
            elif isinstance(cmd, DispatchCallCmd):
                running.append(cmd)

    execute(core.dispatch_ready(now))
    steps = instances * per_instance // 3
    spread = 0
    started = time.process_time()
    for step in range(steps):
        cmd = running.popleft()
        core.handle_call_completed(cmd.call_id, cmd.attempt_seq, b'{"y":1}')
        core.flush_dirty_tasks()
        execute(core.dispatch_ready(now))
        if step % 5000 == 4999:
            paused = time.process_time()
            per_instance_inflight = Counter(c.task_id[:9] for c in running)  # "task-NNN-"
            spread = max(
                spread, max(per_instance_inflight.values()) - min(per_instance_inflight.values())
            )
            started += time.process_time() - paused
    elapsed = time.process_time() - started
    return steps / elapsed, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--calls-per-instance", type=int, default=1000)
    args = parser.parse_args()
    n, per = args.instances, args.calls_per_instance
    print(
        f"DispatcherCore fairness: {n} instances x {per:,} calls, {EXECUTORS} executors"
        " (per CPU second, best of 3)"
    )
    print(
        f"{'mode':>13} {'backlog/s':>11} {'us/bind':>8} {'steady/s':>10} {'us/call':>8} {'spread':>7}"
    )
    for label, fair, quantum in MODES:
        backlog = max(bench_backlog(fair, quantum, n, per) for _ in range(3))
        runs = [bench_steady(fair, quantum, n, per) for _ in range(3)]
        steady = max(r[0] for r in runs)
        spread = max(r[1] for r in runs)
        print(
            f"{label:>13} {backlog:>11,.0f} {1e6 / backlog:>8.2f} {steady:>10,.0f}"
            f" {1e6 / steady:>8.2f} {spread:>7}"
        )


if __name__ == "__main__":
    main()

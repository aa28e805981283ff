"""The runtime's own cost per trivial call, in process: no socket, no second process.

``ExecutorRuntime`` without a session (frames collect in its outbox, encoded as
a session would encode them). ExecuteCall envelopes are decoded up front, so
what is measured is: ``handle_inbound_message`` → ``run_until_idle`` (admit,
switch into a resident greenlet, load the entry, run, encode the terminal
frame). Two shapes:

* **one at a time** — feed one ExecuteCall, ``run_until_idle``, next one (the
  main loop's shape when calls arrive one per wake-up);
* **batched** — feed 128 ExecuteCalls, then one ``run_until_idle``.

``--profile`` prints a cProfile of the one-at-a-time loop instead.

    .venv/bin/python bench/executor_runtime_loop.py [--calls 20000] [--repeats 5] [--profile]

Times are the loop's own CPU time (``time.thread_time``), so other processes on a
shared machine disturb them less; read the best run as the cost, the median as a check.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blockx.executor.module_registry import ModuleRegistry
from blockx.executor.runtime import ExecutorRuntime
from blockx.wire import keys

TRIVIAL = 'def _(x):\n    return {"y": x + 1}\n'
DIGEST = "sha256:" + hashlib.sha256(TRIVIAL.encode()).hexdigest()
BATCH = 128


def make_runtime() -> ExecutorRuntime:
    registry = ModuleRegistry()
    registry.compile_source("trivial", DIGEST, TRIVIAL)  # no code fetch round trip
    return ExecutorRuntime("bench", registry=registry, max_inflight=0)


def envelopes(count: int, task_id: str) -> list[dict[str, Any]]:
    return [
        {
            keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
            keys.F_CALL_ID: f"{task_id}/c{i}",
            keys.F_PAYLOAD: {
                keys.FP_TASK_ID: task_id,
                keys.FP_FUNCTION_ID: "trivial",
                keys.FP_FUNCTION_CODE_DIGEST: DIGEST,
                keys.FP_ARGS: i,
                keys.FP_CALL_KEY: f"trivial:{i}",
                keys.FP_ATTEMPT_SEQ: 1,
            },
        }
        for i in range(count)
    ]


def one_at_a_time(runtime: ExecutorRuntime, frames: list[dict[str, Any]]) -> float:
    handle = runtime.handle_inbound_message
    run = runtime.run_until_idle
    outbox = runtime._outbox  # the encoded frames; a session would hand them to its writer
    t0 = time.thread_time()
    for envelope in frames:
        handle(envelope)
        run()
        outbox.clear()
    return time.thread_time() - t0


def batched(runtime: ExecutorRuntime, frames: list[dict[str, Any]]) -> float:
    handle = runtime.handle_inbound_message
    run = runtime.run_until_idle
    outbox = runtime._outbox
    t0 = time.thread_time()
    for start in range(0, len(frames), BATCH):
        for envelope in frames[start : start + BATCH]:
            handle(envelope)
        run()
        outbox.clear()
    return time.thread_time() - t0


def measure(shape: str, calls: int) -> float:
    runtime = make_runtime()
    try:
        run = one_at_a_time if shape == "one" else batched
        run(runtime, envelopes(2000, "warm"))
        frames = envelopes(calls, "run")
        seconds = run(runtime, frames)
        stats = runtime.stats()
        assert stats["calls_completed"] == calls + 2000, stats
        return seconds / calls * 1e6
    finally:
        runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    if args.profile:
        runtime = make_runtime()
        one_at_a_time(runtime, envelopes(2000, "warm"))
        frames = envelopes(args.calls, "run")
        profiler = cProfile.Profile()
        profiler.enable()
        one_at_a_time(runtime, frames)
        profiler.disable()
        runtime.shutdown()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(70)
        return

    results: dict[str, list[float]] = {"one": [], "batched": []}
    for _ in range(args.repeats):  # interleaved, so drift hits both shapes alike
        for shape in results:
            results[shape].append(measure(shape, args.calls))
    print(f"runtime loop, in process: {args.calls} trivial calls, {args.repeats} runs each")
    print(f"| {'shape':<32} | {'median µs/call':>14} | {'best µs/call':>12} |")
    print(f"| {'-' * 32} | {'-' * 14}:| {'-' * 12}:|")
    labels = {"one": "one at a time", "batched": f"batched ({BATCH} per run_until_idle)"}
    for shape, values in results.items():
        median, best = statistics.median(values), min(values)
        print(f"| {labels[shape]:<32} | {median:>14.2f} | {best:>12.2f} |")
    for shape, values in results.items():
        print(f"runs ({shape}): " + ", ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()

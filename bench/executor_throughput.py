"""Trivial calls per second through ONE executor process, 128 calls in flight.

The test-side worker (tests/helpers/fake_worker.py, unthreaded) keeps the
pipeline full: every recv is decoded at once and the ExecuteCalls that replace
the calls that ended go out in one write. Function: ``def _(x): return {"y": x + 1}``.

Reports wall-clock calls/s and the CPU each side spent per call (the executor's
from /proc/<pid>/stat, the driver's from process_time). Medians of --repeats runs,
each on a fresh executor.

    .venv/bin/python bench/executor_throughput.py [--calls 20000] [--inflight 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from tests.helpers.fake_worker import FakeWorker, digest_of
from tests.helpers.pipelined_driver import (
    PipelinedDriver,
    process_cpu_seconds,
)

from blockx.wire import encode_frame, keys

TRIVIAL = 'def _(x):\n    return {"y": x + 1}\n'


def call_maker(digest: str, task_id: str = "bench") -> Callable[[int], bytes]:
    def make(i: int) -> bytes:
        return encode_frame(
            orjson.dumps(
                {
                    keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
                    keys.F_CALL_ID: f"{task_id}/c{i}",
                    keys.F_PAYLOAD: {
                        keys.FP_TASK_ID: task_id,
                        keys.FP_FUNCTION_ID: "trivial",
                        keys.FP_FUNCTION_CODE_DIGEST: digest,
                        keys.FP_ARGS: i,
                        keys.FP_CALL_KEY: f"trivial:{i}",
                        keys.FP_ATTEMPT_SEQ: 1,
                        keys.FP_ENTRY_SELECTOR: "_",
                        keys.FP_PARENT_CALL_ID: None,
                        keys.FP_ANCESTRY: [],
                        keys.FP_CALL_BUDGET_MS: 5000,  # the worker's default call_deadline_ms
                        keys.FP_AUDIT: None,
                        keys.FP_DEBUG: False,
                    },
                }
            )
        )

    return make


def run_once(calls: int, inflight: int, max_inflight: int) -> dict[str, float]:
    worker = FakeWorker(threaded=False, max_inflight=max_inflight, heartbeat_interval=1.0)
    digest = worker.add_source(TRIVIAL)
    assert digest == digest_of(TRIVIAL)
    worker.start()
    try:
        make = call_maker(digest)
        # Warm-up: fetch and compile the code, fill the greenlet pool.
        PipelinedDriver(worker, make).run(min(2000, calls), inflight)
        driver = PipelinedDriver(worker, call_maker(digest, "run"))
        exec_cpu0 = process_cpu_seconds(worker.pid)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        driver.run(calls, inflight)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        exec_cpu = process_cpu_seconds(worker.pid) - exec_cpu0
        assert driver.completed == calls, driver.failed[:3]
        return {
            "calls_per_s": calls / wall,
            "exec_cpu_us": exec_cpu / calls * 1e6,
            "driver_cpu_us": cpu / calls * 1e6,
            "wall_us": wall / calls * 1e6,
        }
    finally:
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--inflight", type=int, default=128)
    parser.add_argument("--max-inflight", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    runs = [run_once(args.calls, args.inflight, args.max_inflight) for _ in range(args.repeats)]
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(
        f"executor throughput: {args.calls} trivial calls, {args.inflight} in flight, "
        f"median of {args.repeats}"
    )
    print(f"| {'metric':<38} | {'value':>12} |")
    print(f"| {'-' * 38} | {'-' * 12}:|")
    print(f"| {'calls/s (wall)':<38} | {med['calls_per_s']:>12,.0f} |")
    print(f"| {'wall µs per call':<38} | {med['wall_us']:>12.1f} |")
    print(f"| {'executor CPU µs per call':<38} | {med['exec_cpu_us']:>12.1f} |")
    print(f"| {'driver (test worker) CPU µs per call':<38} | {med['driver_cpu_us']:>12.1f} |")
    print("runs (calls/s): " + ", ".join(f"{r['calls_per_s']:,.0f}" for r in runs))


if __name__ == "__main__":
    main()

"""The cost of one IO round trip inside the executor, in µs.

Calls do N sequential ``read_req`` waits, each answered at once by the test-side
worker; N=0 against N=10 isolates the per-IO cost:

* **one call at a time** (latency): wall µs per IO = (t(N=10) - t(N=0)) / 10 per call —
  CallWaiting out, ResumeCall in, both processes' wake-ups included;
* **128 calls in flight** (throughput): executor CPU µs per IO, same subtraction —
  what an IO costs the executor when frames are batched.

    .venv/bin/python bench/executor_io_roundtrip.py [--calls 2000] [--reads 10] [--budget-ms 5000]

``--budget-ms 0`` measures calls without a budget (no wait timer, no alarm).
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
from tests.helpers.fake_worker import FakeWorker
from tests.helpers.pipelined_driver import (
    PipelinedDriver,
    process_cpu_seconds,
)

from blockx.wire import Frame, encode_frame, keys

sys.path.insert(0, str(Path(__file__).resolve().parent))
from executor_runtime_loop import N_READS, execute_envelope


def call_maker(
    digest: str, task_id: str, reads: int, budget_ms: int = 5000
) -> Callable[[int], bytes]:
    def make(i: int) -> bytes:
        return encode_frame(
            orjson.dumps(execute_envelope(task_id, i, "n_reads", digest, reads, budget_ms))
        )

    return make


def answer(frame: Frame) -> bytes:
    envelope = frame.envelope
    return encode_frame(
        FakeWorker.resume_envelope(
            envelope[keys.F_CALL_ID], envelope[keys.F_REQUEST_ID], keys.WAIT_IO, result={"v": 1}
        )
    )


def measure(
    worker: FakeWorker,
    digest: str,
    reads: int,
    calls: int,
    inflight: int,
    tag: str,
    budget_ms: int = 5000,
) -> tuple[float, float]:
    """(wall s, executor CPU s) for ``calls`` calls of ``reads`` reads each."""
    driver = PipelinedDriver(worker, call_maker(digest, tag, reads, budget_ms), answer_io=answer)
    cpu0 = process_cpu_seconds(worker.pid)
    t0 = time.perf_counter()
    driver.run(calls, inflight)
    wall = time.perf_counter() - t0
    cpu = process_cpu_seconds(worker.pid) - cpu0
    assert driver.completed == calls, driver.failed[:3]
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--budget-ms",
        type=int,
        default=5000,  # the worker's default call_deadline_ms
        help="callBudgetMs of every call (0 = unlimited)",
    )
    args = parser.parse_args()

    worker = FakeWorker(threaded=False, max_inflight=128, heartbeat_interval=1.0)
    digest = worker.add_source(N_READS)
    worker.start()
    rows: dict[str, list[float]] = {
        "latency_us": [],
        "latency_call0_us": [],
        "pipelined_cpu_us": [],
        "pipelined_wall_us": [],
    }
    try:
        measure(worker, digest, args.reads, 500, 128, "warm", args.budget_ms)
        for r in range(args.repeats):
            seq_calls = max(args.calls // 4, 100)
            w0, _ = measure(worker, digest, 0, seq_calls, 1, f"s0-{r}", args.budget_ms)
            w10, _ = measure(worker, digest, args.reads, seq_calls, 1, f"s10-{r}", args.budget_ms)
            rows["latency_us"].append((w10 - w0) / seq_calls / args.reads * 1e6)
            rows["latency_call0_us"].append(w0 / seq_calls * 1e6)
            pw0, pc0 = measure(worker, digest, 0, args.calls, 128, f"p0-{r}", args.budget_ms)
            pw10, pc10 = measure(
                worker, digest, args.reads, args.calls, 128, f"p10-{r}", args.budget_ms
            )
            rows["pipelined_cpu_us"].append((pc10 - pc0) / args.calls / args.reads * 1e6)
            rows["pipelined_wall_us"].append((pw10 - pw0) / args.calls / args.reads * 1e6)
    finally:
        worker.stop()

    med = {key: statistics.median(values) for key, values in rows.items()}
    print(
        f"executor IO round trip: calls of N=0 vs N={args.reads} sequential reads, "
        f"answered at once; callBudgetMs {args.budget_ms}; median of {args.repeats}"
    )
    print(f"| {'measure':<52} | {'µs':>8} |")
    print(f"| {'-' * 52} | {'-' * 8}:|")
    print(
        f"| {'one call at a time: wall per call with N=0':<52} | {med['latency_call0_us']:>8.1f} |"
    )
    print(f"| {'one call at a time: wall per IO round trip':<52} | {med['latency_us']:>8.1f} |")
    print(
        f"| {'128 in flight: executor CPU per IO round trip':<52} | {med['pipelined_cpu_us']:>8.1f} |"
    )
    print(f"| {'128 in flight: wall per IO round trip':<52} | {med['pipelined_wall_us']:>8.1f} |")


if __name__ == "__main__":
    main()

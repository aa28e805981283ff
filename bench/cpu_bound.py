"""CPU-bound calls: BlockX against ``multiprocessing.Pool.imap(chunksize=1)``, one run.

``--calls`` calls (200) each burning ~``--ms`` (20) ms of CPU in pure Python,
through a BlockX ``Worker`` with ``--executors`` executor processes and through
a ``multiprocessing.Pool`` of as many processes (``imap``, ``chunksize=1``: one
call per message, as BlockX sends them). Interleaved, medians of
``--repeats``. The work per call is calibrated once in this process, so both
systems run the same loop.

What it shows: whether BlockX puts CPU-bound calls on every executor (a worker
that piles them onto one process takes ~N times as long). The target
(issue: fault containment and fair placement) is a ratio >= 0.9. Each BlockX
run also prints how many executor processes served calls.

    .venv/bin/python bench/cpu_bound.py [--calls 200] [--ms 20] [--executors 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.app import Worker
from blockx.worker.config import load_config

BURN = """
import os

def _(p):
    total = 0
    for i in range(p["n"]):
        total += i * i
    return {"pid": os.getpid(), "i": p["i"], "total": total}
"""


def burn(args: dict[str, int]) -> int:
    total = 0
    for i in range(args["n"]):
        total += i * i
    return total


def calibrate(ms: float) -> int:
    """Loop iterations that take ~``ms`` of CPU here (best of a few tries)."""
    n = 100_000
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        burn({"n": n})
        best = min(best, time.process_time() - t0)
    return max(1, int(n * (ms / 1000.0) / best))


async def blockx_run(worker: Worker, calls: int, n: int) -> tuple[float, int]:
    task = Task(
        functions={"burn": BURN},
        calls=[Call("burn", {"n": n, "i": i}) for i in range(calls)],
        policy=TaskPolicy(call_budget_ms=60_000),
    )
    t0 = time.perf_counter()
    result = await worker.run_task(task)
    elapsed = time.perf_counter() - t0
    assert not result.errors, result.errors[:3]
    assert sorted(row["i"] for row in result.outputs) == list(range(calls))
    return calls / elapsed, len({row["pid"] for row in result.outputs})


def pool_run(pool: multiprocessing.pool.Pool, calls: int, n: int) -> float:
    t0 = time.perf_counter()
    out = list(pool.imap(burn, ({"n": n, "i": i} for i in range(calls)), chunksize=1))
    elapsed = time.perf_counter() - t0
    assert len(out) == calls
    return calls / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--ms", type=float, default=20.0)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n = calibrate(args.ms)
    print(
        f"{args.calls} calls of ~{args.ms:g} ms CPU ({n:,} iterations), {args.executors} processes"
    )
    config = load_config(overrides={"pool.executor_count": args.executors})
    blockx_rates: list[float] = []
    pool_rates: list[float] = []
    pids: list[int] = []
    with multiprocessing.get_context("forkserver").Pool(args.executors) as pool:
        pool_run(pool, args.executors * 2, n)  # warm the pool's processes
        async with Worker(config) as worker:
            await worker.wait_ready()
            await blockx_run(worker, args.executors * 2, n)  # warm: code compiled everywhere
            for _ in range(args.repeats):
                rate, used = await blockx_run(worker, args.calls, n)
                blockx_rates.append(rate)
                pids.append(used)
                pool_rates.append(pool_run(pool, args.calls, n))
    ideal = args.executors * 1000.0 / args.ms
    b, p = statistics.median(blockx_rates), statistics.median(pool_rates)
    print(f"{'system':<34}{'calls/s':>10}{'of ideal':>10}")
    print(f"{'BlockX Worker':<34}{b:>10,.1f}{b / ideal:>10.0%}")
    print(f"{'multiprocessing.Pool.imap(1)':<34}{p:>10,.1f}{p / ideal:>10.0%}")
    print(f"ratio BlockX / imap: {b / p:.2f} (target >= 0.9)")
    print(f"executor processes that served calls, per run: {pids} of {args.executors}")


if __name__ == "__main__":
    asyncio.run(main())

"""Worker CPU per call, the worker alone: trivial calls and IO waits against echo executors.

The quick loop for worker-side optimisation. The box these benches run on is
shared and wall-clock numbers swing 2x, so the primary figure is the worker
process's CPU time per call (``time.process_time``), median of ``--repeats``.
Executors are ``bench/echo_executor.py`` stand-ins (they answer at once and run
no user code), so every microsecond counted here is the worker's own:

* **trivial** -- ``--calls`` calls, each one ExecuteCall -> CallCompleted;
* **io** -- ``--io-calls`` calls, each ``--reads`` sequential IO waits answered
  by an in-worker handler (``--io-mode immediate``: an ``IOResult`` returned at
  once; ``delayed``: a future resolved 2 ms later, batched as in
  bench/worker_throughput.py). Per-wait cost = (io - trivial) / reads.

``--profile trivial|io`` runs one more task under a CPU-time cProfile and prints
the hottest functions.

    .venv/bin/python bench/worker_cpu.py [--calls 20000] [--io-calls 4000] [--reads 5]
        [--io-mode delayed] [--repeats 5] [--profile trivial]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockx.worker.api import Call, Task
from blockx.worker.app import Worker, run
from blockx.worker.config import load_config
from blockx.worker.io import IOResult
from blockx.worker.pool.spawner import ProcessSpawner
from worker_throughput import READS, DelayedBackend, echo_argv

TRIVIAL = 'def _(p):\n    return {"y": p["x"] + 1}\n'
IO_SOURCE = "def _(p):\n    return None\n"  # never runs: the echo executor fakes the reads


class ImmediateBackend:
    """Answers every read at once (an ``IOResult``, no future)."""

    def handle_io(self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: Any) -> Any:
        return IOResult(result={"v": payload["params"]["key"]}, budget_used_ms=0)


async def _timed(worker: Worker, source: str, n: int, reads: int) -> tuple[float, float, float]:
    task = Task(functions={"f": source}, calls=[Call("f", {"x": i}) for i in range(n)])
    times0 = os.times()
    t0 = time.perf_counter()
    result = await worker.run_task(task)
    wall = time.perf_counter() - t0
    times1 = os.times()
    cpu = (times1.user - times0.user) + (times1.system - times0.system)
    sys_cpu = times1.system - times0.system
    assert result.success, result.errors[:3]
    if reads:
        expected = [{"total": sum(i * reads + k for k in range(reads))} for i in range(n)]
    else:
        expected = [{"y": i + 1} for i in range(n)]
    assert result.outputs == expected, "wrong outputs"
    return cpu / n * 1e6, n / wall, sys_cpu / n * 1e6


async def measure(args: argparse.Namespace, reads: int) -> list[tuple[float, float, float]]:
    config = load_config(env={}).replace(**{"pool.executor_count": args.executors})
    spawner = ProcessSpawner(argv_factory=echo_argv, extra_env={"ECHO_IO_READS": str(reads)})
    backend: Any = DelayedBackend() if args.io_mode == "delayed" else ImmediateBackend()
    source = IO_SOURCE if reads else TRIVIAL
    n = args.io_calls if reads else args.calls
    out = []
    async with Worker(config, spawner=spawner, io_handlers={"blockdb": backend}) as worker:
        await worker.wait_ready()
        await _timed(worker, source, 2000, reads)
        for _ in range(args.repeats):
            out.append(await _timed(worker, source, n, reads))
        if args.profile == ("io" if reads else "trivial"):
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            await _timed(worker, source, n, reads)
            profiler.disable()
            print(f"\n== cProfile (CPU time) of the worker, one {args.profile} task of {n} ==")
            stats = pstats.Stats(profiler).sort_stats(args.sort)
            stats.print_stats(args.lines)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--io-calls", type=int, default=4_000)
    parser.add_argument("--reads", type=int, default=READS)
    parser.add_argument("--io-mode", choices=("delayed", "immediate"), default="delayed")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", choices=("trivial", "io"), default=None)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--only", choices=("trivial", "io"), default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    med = statistics.median
    trivial_cpu = None
    if args.only != "io":
        trivial = run(measure(args, 0))
        trivial_cpu = med(r[0] for r in trivial)
        print(
            f"trivial x{args.calls}: worker CPU {trivial_cpu:.1f} µs/call "
            f"[min {min(r[0] for r in trivial):.1f}] "
            f"(runs {', '.join(f'{r[0]:.1f}' for r in trivial)}); "
            f"{med(r[1] for r in trivial):,.0f} calls/s; system {med(r[2] for r in trivial):.1f} µs"
        )
    if args.only != "trivial":
        io = run(measure(args, args.reads))
        io_cpu = med(r[0] for r in io)
        per_wait = f"; {(io_cpu - trivial_cpu) / args.reads:.1f} µs/wait" if trivial_cpu else ""
        print(
            f"io x{args.io_calls} ({args.reads} reads, {args.io_mode}): worker CPU "
            f"{io_cpu:.1f} µs/call [min {min(r[0] for r in io):.1f}] (runs {', '.join(f'{r[0]:.1f}' for r in io)}){per_wait}; "
            f"{med(r[1] for r in io):,.0f} calls/s; system {med(r[2] for r in io):.1f} µs"
        )


if __name__ == "__main__":
    main()

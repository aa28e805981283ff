"""One-shot registration: the longest the worker's event loop is held while a big list starts.

A real ``Worker`` (``--executors`` executor processes, the product's
configuration otherwise) runs one one-shot task of ``N`` trivial calls
(``Task(calls=[...list...])``) per size in ``--sizes``. Meanwhile a ticker
(``loop.call_later(--tick-ms)``, re-armed each time it fires) records how late
each tick fires: a late tick is a stretch in which the loop served nothing
else (executor frames, heartbeats, IO answers, other tasks).

Printed per size, medians over ``--repeats``:

* ``submit`` — how long ``Worker.submit`` itself ran (the caller's coroutine);
* ``reg. stall`` — the largest tick delay while the task was being registered:
  from ``submit`` until the core holds all ``N`` calls (the tick that first
  sees them all counts too: the stall that ended registration);
* ``run stall`` — the largest tick delay over the whole run, registration,
  dispatch and convergence (the end of a one-shot phase is incremental: each
  call is forgotten and its output kept in call order as it ends, rows are
  decoded 16,384 per turn -- see docs/architecture.md);
* ``longest gc`` — the longest cyclic-GC pass meanwhile (``gc.callbacks``):
  with N calls alive, a full collection walks them all, whatever the
  registration does. ``--gc-off`` disables the collector during each run
  (collected before), to see the code's own stalls alone;
* ``ticks``, ``wall`` — ticks that ran during the task, its wall time.

    .venv/bin/python bench/worker_oneshot_stall.py [--sizes 100000,300000]
        [--executors 2] [--repeats 3] [--tick-ms 2] [--gc-off]

Run it on a quiet machine: the ticker measures the loop, and a busy host
delays ticks too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blockx.worker.api import Call, Task
from blockx.worker.app import Worker, run
from blockx.worker.config import load_config

TRIVIAL = 'def _(p):\n    return {"y": p["x"] + 1}\n'


class StallTicker:
    """Re-arms itself every ``interval`` s; keeps the largest lateness, overall and while
    ``registering()`` was true at the previous tick."""

    def __init__(self, interval: float, registering: Any) -> None:
        self.interval = interval
        self.registering = registering
        self.max_late = 0.0
        self.max_late_registering = 0.0
        self.ticks = 0
        self._was_registering = True
        self._loop = asyncio.get_running_loop()
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._arm()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        # A tick still due now would have been late by this much.
        self.max_late = max(self.max_late, time.perf_counter() - self._due)

    def _arm(self) -> None:
        self._due = time.perf_counter() + self.interval
        self._handle = self._loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        self.ticks += 1
        late = time.perf_counter() - self._due
        self.max_late = max(self.max_late, late)
        if self._was_registering:
            self.max_late_registering = max(self.max_late_registering, late)
            self._was_registering = self.registering()
        self._arm()


class GcTimer:
    """Times the cyclic collector's passes (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._t0 = 0.0

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self._t0)


async def one_run(worker: Worker, n: int, tick_ms: float, gc_off: bool) -> dict[str, float]:
    calls = [Call("t", {"x": i}) for i in range(n)]
    task = Task(functions={"t": TRIVIAL}, calls=calls)
    core = worker._core
    assert core is not None
    handles: list[Any] = []

    def registering() -> bool:
        if not handles:
            return True
        if handles[0].done():
            return False
        state = core.task_state(handles[0].run_state.task_id)
        return state is None or state.total_count < n

    if gc_off:
        gc.collect()
        gc.disable()
    ticker = StallTicker(tick_ms / 1000.0, registering)
    ticker.start()
    await asyncio.sleep(0.05)  # the ticker is running before the task starts
    try:
        with GcTimer() as gc_timer:
            t0 = time.perf_counter()
            handles.append(worker.submit(task))
            t_submit = time.perf_counter() - t0
            result = await handles[0].result()
            wall = time.perf_counter() - t0
            ticker.stop()
    finally:
        if gc_off:
            gc.enable()
    assert result.success, result.errors[:3]
    assert len(result.outputs) == n and result.outputs[-1] == {"y": n}, "wrong outputs"
    return {
        "submit_ms": t_submit * 1000,
        "reg_stall_ms": ticker.max_late_registering * 1000,
        "run_stall_ms": ticker.max_late * 1000,
        "gc_ms": gc_timer.longest * 1000,
        "ticks": ticker.ticks,
        "wall_s": wall,
    }


async def main_async(args: argparse.Namespace) -> None:
    config = load_config(env={}).replace(**{"pool.executor_count": args.executors})
    sizes = [int(s) for s in args.sizes.split(",")]
    async with Worker(config) as worker:
        await worker.wait_ready()
        await worker.run_task(  # warm-up: code fetched and compiled, greenlets pooled
            Task(functions={"t": TRIVIAL}, calls=[Call("t", {"x": i}) for i in range(2000)])
        )
        print(f"GC {'off' if args.gc_off else 'on'} during the runs; medians of {args.repeats}")
        print(
            f"{'calls':>9} {'submit ms':>10} {'reg. stall ms':>14} {'run stall ms':>13}"
            f" {'longest gc ms':>14} {'ticks':>7} {'wall s':>7}"
        )
        for n in sizes:
            runs = [
                await one_run(worker, n, args.tick_ms, args.gc_off) for _ in range(args.repeats)
            ]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            worst = max(r["reg_stall_ms"] for r in runs)
            print(
                f"{n:>9,} {med['submit_ms']:>10.1f} {med['reg_stall_ms']:>14.1f}"
                f" {med['run_stall_ms']:>13.1f} {med['gc_ms']:>14.1f}"
                f" {med['ticks']:>7.0f} {med['wall_s']:>7.2f}"
                f"   (worst reg. stall {worst:.1f} ms)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,300000")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tick-ms", type=float, default=2.0)
    parser.add_argument("--gc-off", action="store_true")
    args = parser.parse_args()
    run(main_async(args))


if __name__ == "__main__":
    main()

"""Worker throughput: BlockX against ProcessPoolExecutor, trivial and IO-bound calls, one run.

Two workloads, each through BlockX (a ``Worker`` with ``--executors`` executor
processes, the product's configuration otherwise) and through
``concurrent.futures.ProcessPoolExecutor`` (``--executors`` processes, one
``submit`` per call), interleaved, medians of ``--repeats``:

* **trivial** — ``--calls`` calls of ``def _(p): return {"y": p["x"] + 1}``;
  the reference peer of docs/operations.md, ``multiprocessing.Pool.imap(chunksize=1)``,
  runs too (the target is 2x the best per-call peer);
* **io** — ``--io-calls`` calls, each doing 5 sequential reads against a backend
  that answers after 2 ms. BlockX: the reads are ``blockx.sdk.db.get`` and the
  backend is an asyncio handler in the worker (one timer per 2 ms batch of
  requests); every executor holds ``ExecutorMaxInflight`` (128) calls, so 256 are
  in flight with 2 executors. ProcessPoolExecutor: the same function doing
  ``time.sleep(0.002)`` five times (``--ppe-io-calls`` calls: with 2 processes
  it does 2 calls at a time). The ideal is ``in flight / (5 x 2 ms)``. The
  peer a user would pick for such work runs it too: a ``ThreadPoolExecutor``
  with as many threads as BlockX has calls in flight, each call sleeping
  through its reads (docs/operations.md: 10,400 calls/s on the reference machines).
  One more BlockX row serves the same reads the way ``blockx run`` does: each
  task's reads go through a ``TaskIOScope`` (read cache, shared flights,
  statistics) to an ``IOBackend`` with the same 2 ms timer.

A third BlockX row runs the trivial task against ``bench/echo_executor.py``
stand-ins (they answer every ExecuteCall at once and run no code): the worker's
own ceiling, with the executors' cost taken out.

``--io-sweep 16,32,64`` runs the IO task once more per value through a fresh
``Worker`` whose executors hold that many calls each (``EXECUTOR_MAX_INFLIGHT``)
and prints each against its own ideal: where the ratio falls off is where the
machine's CPU, not the calls in flight, sets the pace.

Below the table: the worker's and the executors' CPU per call (``/proc``,
over each task) and how many cores the three processes kept busy — what the
IO target needs is printed beside it (``cores / (0.9 x ideal)`` per call).

``--profile`` runs one more trivial task under cProfile and prints the worker's
hottest functions (the executors run in their own processes; see
bench/executor_throughput.py for their side). Worker CPU per call is the worker
process's CPU time over the task.

``--whole-process`` runs a different comparison instead (the first row of issue
#18 used ``--calls 100000``): the trivial task as a user runs it, whole
processes timed from outside, interleaved, medians of ``--repeats``:

* **BlockX** — ``blockx run`` as a child process (``bench/blockx_process.py``:
  ``sys.executable -m blockx run task.yaml -o rows.jsonl --executors N``, this
  environment passed through) on a task whose ``--calls`` calls are a calls
  file (a stream), rows to a file;
* **imap** — a child ``python -c`` process (no BlockX import) that reads the
  same calls file line by line, runs the same function through
  ``multiprocessing.Pool(N).imap(chunksize=1)`` (fork) and writes the same rows
  to a file with ``json``.

Both are timed from spawn to exit; both row files are checked (every
``{"y": x + 1}``, once). Start-up is estimated the same way for both: a run of
one call (before each repeat) is the process's fixed cost (interpreter,
imports, pool or executors, shutdown), and ``calls / (wall - fixed)`` the
steady-state rate; BlockX's summary rate (``task_wall_time_s``, from the
task's submission, executors' start included) is printed beside it.

    .venv/bin/python bench/worker_throughput.py [--calls 20000] [--io-calls 5000]
        [--executors 2] [--repeats 3] [--io-sweep 16,32,64] [--profile]
    .venv/bin/python bench/worker_throughput.py --whole-process [--calls 100000]
        [--executors 2] [--repeats 3]
    .venv/bin/python bench/worker_throughput.py --tracing [--calls 20000] [--io-calls 5000]

``--tracing`` runs only this comparison: the trivial and the IO task on two
workers alive side by side, one with tracing off (the default) and one tracing
1% of the calls (``traceidratio`` 0.01, to a trace file in a temporary
directory: docs/observability.md), their tasks interleaved, medians of
``--repeats``; it prints both rates, the worker's CPU per call and the cost.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import cProfile
import logging
import multiprocessing
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tests.helpers.pipelined_driver import process_cpu_seconds

from blockx.observability.tracing import JsonLinesSink, Tracing
from blockx.worker.api import Call, Task
from blockx.worker.app import Worker, run
from blockx.worker.config import load_config
from blockx.worker.io import IOResult
from blockx.worker.io.backend import PreparedRequest, Reply
from blockx.worker.io.registry import BackendRegistry, IOSubsystem
from blockx.worker.pool.spawner import ExecutorLaunchSpec, ProcessSpawner
from blockx_process import (
    children_cpu_s,
    format_rate,
    read_rows,
    run_blockx,
    steady_cpu_per_call,
    steady_rate,
    write_task,
)

TRIVIAL = 'def _(p):\n    return {"y": p["x"] + 1}\n'
READS = 5
READ_DELAY_S = 0.002
IO_BOUND = f"""
from blockx.sdk import db

def _(p):
    total = 0
    for k in range({READS}):
        total += db.get("t", p["x"] * {READS} + k)["v"]
    return {{"total": total}}
"""


def trivial_py(x: int) -> dict[str, int]:
    return {"y": x + 1}


def io_bound_py(x: int) -> dict[str, int]:
    total = 0
    for k in range(READS):
        time.sleep(READ_DELAY_S)
        total += x * READS + k
    return {"total": total}


class _TimerBatches:
    """Futures answered ``READ_DELAY_S`` after they were asked for: one timer per batch of
    requests that arrived in the same loop turn, one future per request; each is
    resolved with ``answer(value)``."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer
        self._batch: list[tuple[asyncio.Future[Any], Any]] | None = None

    def later(self, value: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        batch = self._batch
        if batch is None:
            batch = self._batch = []
            loop.call_later(READ_DELAY_S, self._fire, batch)
            loop.call_soon(self._close_batch)
        batch.append((future, value))
        return future

    def _close_batch(self) -> None:
        self._batch = None

    def _fire(self, batch: list[tuple[asyncio.Future[Any], Any]]) -> None:
        answer = self._answer
        for future, value in batch:
            if not future.done():
                future.set_result(answer(value))


class DelayedBackend:
    """An IO handler answering every read ``READ_DELAY_S`` after it arrived."""

    def __init__(self) -> None:
        self._timer = _TimerBatches(lambda key: IOResult(result={"v": key}, budget_used_ms=2))

    def handle_io(self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: Any) -> Any:
        return self._timer.later(payload["params"]["key"])


class DelayedIOBackend:
    """The same 2 ms reads as an :class:`~blockx.worker.io.backend.IOBackend` named
    ``blockdb``, served the way ``blockx run`` serves a task's IO: through the task's
    :class:`~blockx.worker.io.scope.TaskIOScope` (read cache, shared flights, stats)."""

    name = "blockdb"

    def __init__(self) -> None:
        self._timer = _TimerBatches(lambda key: Reply({"v": key}, nbytes=16))

    def prepare(self, io_kind: str, operation: str, params: Any, sidecar: Any) -> PreparedRequest:
        return PreparedRequest(operation, params["key"], domain=params["table"])

    def execute(self, request: PreparedRequest) -> asyncio.Future[Any]:
        return self._timer.later(request.body)

    async def close(self) -> None:
        pass


def product_io(backend: DelayedIOBackend) -> IOSubsystem:
    """The worker's IO subsystem with ``backend`` as its only backend (``blockdb``)."""
    registry = BackendRegistry()
    registry.register("blockdb", backend)
    return IOSubsystem(registry=registry)


# --- BlockX --------------------------------------------------------------------------------


async def blockx_runs(
    args: argparse.Namespace, backend: DelayedBackend
) -> dict[str, list[dict[str, float]]]:
    config = load_config(env={}).replace(**{"pool.executor_count": args.executors})
    out: dict[str, list[dict[str, float]]] = {"trivial": [], "io": [], "io_scope": []}
    io = product_io(DelayedIOBackend())
    async with io, Worker(config, io_handlers={"blockdb": backend}) as worker:
        await worker.wait_ready()
        # Warm-up: code fetched and compiled, greenlet pools filled.
        await worker.run_task(
            Task(functions={"t": TRIVIAL}, calls=[Call("t", {"x": i}) for i in range(2000)])
        )
        await worker.run_task(
            Task(functions={"io": IO_BOUND}, calls=[Call("io", {"x": i}) for i in range(300)])
        )
        for _ in range(args.repeats):
            out["trivial"].append(await _timed(worker, TRIVIAL, args.calls, check_trivial))
            out["io"].append(await _timed(worker, IO_BOUND, args.io_calls, check_io))
            out["io_scope"].append(await _timed(worker, IO_BOUND, args.io_calls, check_io, io))
        if args.profile:
            profiler = cProfile.Profile(time.process_time)  # CPU, not wall: the box is shared
            profiler.enable()
            await _timed(worker, TRIVIAL, args.calls, check_trivial)
            profiler.disable()
            print("\n== cProfile of the worker process, one trivial task (cumulative order cut) ==")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return out


async def io_sweep_runs(args: argparse.Namespace, per_executor: int) -> list[dict[str, float]]:
    """The IO task through a Worker whose executors hold ``per_executor`` calls each."""
    config = load_config(env={}).replace(
        **{
            "pool.executor_count": args.executors,
            "dispatcher.executor_max_inflight": per_executor,
        }
    )
    out = []
    async with Worker(config, io_handlers={"blockdb": DelayedBackend()}) as worker:
        await worker.wait_ready()
        await _timed(worker, IO_BOUND, 300, check_io)
        for _ in range(args.repeats):
            out.append(await _timed(worker, IO_BOUND, args.io_calls, check_io))
    return out


async def tracing_runs(args: argparse.Namespace, trace_dir: str) -> dict[str, Any]:
    """The trivial and IO tasks, interleaved, on a worker with tracing off and one with
    tracing at 1% (``--tracing``)."""
    config = load_config(env={}).replace(**{"pool.executor_count": args.executors})
    sink = JsonLinesSink(os.path.join(trace_dir, "trace.jsonl"))
    tracing = Tracing([sink], sample_ratio=0.01)
    out: dict[str, Any] = {"off": {"trivial": [], "io": []}, "1%": {"trivial": [], "io": []}}
    async with (
        Worker(config, io_handlers={"blockdb": DelayedBackend()}) as off,
        Worker(config, io_handlers={"blockdb": DelayedBackend()}, tracing=tracing) as on,
    ):
        workers = {"off": off, "1%": on}
        for worker in workers.values():
            await worker.wait_ready()
            await _timed(worker, TRIVIAL, 2000, check_trivial)
            await _timed(worker, IO_BOUND, 300, check_io)
        for _ in range(args.repeats):
            for name, worker in workers.items():
                out[name]["trivial"].append(
                    await _timed(worker, TRIVIAL, args.calls, check_trivial)
                )
                out[name]["io"].append(await _timed(worker, IO_BOUND, args.io_calls, check_io))
    out["spans"] = sink.written
    return out


def tracing_main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as trace_dir:
        runs = run(tracing_runs(args, trace_dir))
    med = statistics.median
    print(
        f"\ntracing cost, {args.executors} executors, medians of {args.repeats} "
        f"(interleaved; {runs['spans']:,} spans written at 1%)"
    )
    print(
        f"| {'workload':<32} | {'tracing':>7} | {'calls/s':>10} | {'worker CPU us/call':>18} |"
        f" {'cost':>7} |"
    )
    print(f"| {'-' * 32} | {'-' * 7} | {'-' * 9}:| {'-' * 17}:| {'-' * 6}:|")
    for shape, label in (
        ("trivial", f"trivial x{args.calls}"),
        ("io", f"io x{args.io_calls} (5 reads x 2 ms)"),
    ):
        base_rate = med(r["calls_per_s"] for r in runs["off"][shape])
        base_cpu = med(r["worker_cpu_us"] for r in runs["off"][shape])
        for name in ("off", "1%"):
            rate = med(r["calls_per_s"] for r in runs[name][shape])
            cpu = med(r["worker_cpu_us"] for r in runs[name][shape])
            cost = "" if name == "off" else f"{cpu / base_cpu - 1:+.1%}"
            print(f"| {label:<32} | {name:>7} | {rate:>10,.0f} | {cpu:>18.1f} | {cost:>7} |")
        print(f"| {'':<32} | {'':>7} | {'':>10} | {'rate 1% / off':>18} |", end="")
        rate_on = med(r["calls_per_s"] for r in runs["1%"][shape])
        print(f" {rate_on / base_rate:>6.2f}x |")


def check_trivial(outputs: list[Any], n: int) -> None:
    assert outputs == [{"y": i + 1} for i in range(n)], "wrong trivial outputs"


def check_io(outputs: list[Any], n: int) -> None:
    expected = [{"total": sum(i * READS + k for k in range(READS))} for i in range(n)]
    assert outputs == expected, "wrong io outputs"


async def _timed(
    worker: Worker, source: str, n: int, check: Any, io: IOSubsystem | None = None
) -> dict[str, float]:
    """One task of ``n`` calls of ``source``; its reads served by the worker's handler, or
    with ``io`` by a task scope of it (as ``blockx run`` serves a task's IO)."""
    fid = "t" if source is TRIVIAL else "io"
    task = Task(functions={fid: source}, calls=[Call(fid, {"x": i}) for i in range(n)])
    scope = None
    if io is not None:
        scope = task.io_handler = io.task_scope(task.task_id)
    executors = list(worker.pool.pids().values())
    cpu0 = time.process_time()
    executors0 = sum(map(process_cpu_seconds, executors))
    t0 = time.perf_counter()
    result = await worker.run_task(task)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    executors_cpu = sum(map(process_cpu_seconds, executors)) - executors0
    if scope is not None:
        scope.close()
    assert result.success, result.errors[:3]
    check(result.outputs, n)
    return {
        "calls_per_s": n / wall,
        "worker_cpu_us": cpu / n * 1e6,
        # Clock ticks (10 ms): read over a whole task, not per call.
        "executors_cpu_us": executors_cpu / n * 1e6,
        "cores_busy": (cpu + executors_cpu) / wall,
    }


def echo_argv(spec: ExecutorLaunchSpec) -> list[str]:
    script = str(Path(__file__).resolve().parent / "echo_executor.py")
    return [
        sys.executable,
        script,
        "--executor-id",
        spec.executor_id,
        "--socket-path",
        spec.socket_path,
    ]


async def worker_alone_runs(
    args: argparse.Namespace, source: str, calls: int, reads: int
) -> list[dict[str, float]]:
    """A task against echo executors: the worker's own ceiling (no user code runs)."""
    config = load_config(env={}).replace(**{"pool.executor_count": args.executors})
    spawner = ProcessSpawner(argv_factory=echo_argv, extra_env={"ECHO_IO_READS": str(reads)})
    check = check_io if reads else check_trivial
    out = []
    async with Worker(config, spawner=spawner, io_handlers={"blockdb": DelayedBackend()}) as w:
        await w.wait_ready()
        await _timed(w, source, 2000, check)
        for _ in range(args.repeats):
            out.append(await _timed(w, source, calls, check))
    return out


# --- peers -----------------------------------------------------------------------------------


def ppe_run(fn: Any, n: int, workers: int, pool: concurrent.futures.Executor) -> float:
    t0 = time.perf_counter()
    futures = [pool.submit(fn, i) for i in range(n)]
    results = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    assert results[-1] == fn.__wrapped__(n - 1) if hasattr(fn, "__wrapped__") else True
    return n / wall


def imap_run(n: int, pool: Any) -> float:
    t0 = time.perf_counter()
    results = list(pool.imap(trivial_py, range(n), chunksize=1))
    wall = time.perf_counter() - t0
    assert results[-1] == {"y": n}
    return n / wall


# --- whole processes (--whole-process) --------------------------------------------------------

#: The imap peer as its own process: no BlockX import; the calls file in, the rows file out.
IMAP_PROCESS = """
import json, multiprocessing, sys

def t(p):
    return {"y": p["x"] + 1}

def main():
    calls_path, rows_path, processes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(calls_path, encoding="utf-8") as calls, open(rows_path, "w", encoding="utf-8") as rows:
        args = (json.loads(line)["args"] for line in calls if line.strip())
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            for row in pool.imap(t, args, chunksize=1):
                rows.write(json.dumps(row, separators=(",", ":")))
                rows.write("\\n")

if __name__ == "__main__":
    main()
"""


def check_trivial_rows(system: str, rows: list[Any], n: int) -> None:
    """Every call's row, once (a stream's rows may come in batch order, not call order)."""
    ys = sorted(row["y"] for row in rows)
    if ys != list(range(1, n + 1)):
        raise SystemExit(f"{system}: wrong rows: {len(rows)} rows for {n} calls")


def trivial_task(directory: Path, n: int) -> Path:
    task, _ = write_task(
        directory,
        {"t": TRIVIAL},
        ({"function": "t", "args": {"x": i}} for i in range(n)),
    )
    return task


def blockx_process_run(directory: Path, n: int, executors: int) -> dict[str, float]:
    run = run_blockx(trivial_task(directory, n), n, executors)
    check_trivial_rows("BlockX", read_rows(run.rows_path), n)
    return {
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "task_wall_s": run.task_wall_s,
        "outside_s": run.outside_command_clock_s,
    }


def imap_process_run(directory: Path, n: int, executors: int) -> dict[str, float]:
    task = trivial_task(directory, n)  # the same calls file
    rows = task.parent / "imap-rows.jsonl"
    argv = [sys.executable, "-c", IMAP_PROCESS, str(task.parent / "calls.jsonl"), str(rows)]
    cpu0 = children_cpu_s()
    t0 = time.perf_counter()
    done = subprocess.run([*argv, str(executors)], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    cpu = children_cpu_s() - cpu0  # the pool's processes too: it joins them at its close
    if done.returncode != 0:
        raise SystemExit(f"the imap process exited {done.returncode}:\n{done.stderr[-4000:]}")
    check_trivial_rows("imap", read_rows(rows), n)
    return {"wall_s": wall, "cpu_s": cpu}


def whole_process_main(args: argparse.Namespace) -> None:
    n = args.calls
    runs: dict[str, list[dict[str, float]]] = {"blockx": [], "imap": []}
    fixed: dict[str, list[float]] = {"blockx": [], "imap": []}
    fixed_cpu: dict[str, list[float]] = {"blockx": [], "imap": []}
    outside: list[float] = []  # BlockX one-call runs: wall time outside the command's clock
    systems = {"blockx": blockx_process_run, "imap": imap_process_run}
    with tempfile.TemporaryDirectory(prefix="bench-whole-process-") as tmp:
        root = Path(tmp)
        for r in range(args.repeats):
            order = ["blockx", "imap"] if r % 2 == 0 else ["imap", "blockx"]
            for system in order:
                one = systems[system](root / f"{system}-one-{r}", 1, args.executors)
                fixed[system].append(one["wall_s"])
                fixed_cpu[system].append(one["cpu_s"])
                if system == "blockx":
                    outside.append(one["outside_s"])
            for system in order:
                runs[system].append(systems[system](root / f"{system}-{r}", n, args.executors))

    med = statistics.median
    rate = {s: med(n / run["wall_s"] for run in runs[s]) for s in runs}
    start = {s: med(fixed[s]) for s in fixed}
    steady = {s: steady_rate(n, [run["wall_s"] for run in runs[s]], fixed[s]) for s in runs}
    cpu_per_call = {
        s: steady_cpu_per_call(n, [run["cpu_s"] for run in runs[s]], fixed_cpu[s]) for s in runs
    }
    task_rate = med(n / run["task_wall_s"] for run in runs["blockx"])
    print(
        f"\nwhole processes: {n:,} trivial calls from a calls file, rows to a file, "
        f"{args.executors} executors / processes, medians of {args.repeats}"
    )
    print(
        f"| {'system':<52} | {'calls/s':>10} | {'start-up ms':>11} | {'steady calls/s':>14} |"
        f" {'CPU µs/call':>11} | {'BlockX ratio':>13} |"
    )
    print(f"| {'-' * 52} | {'-' * 10}:| {'-' * 11}:| {'-' * 14}:| {'-' * 11}:| {'-' * 13}:|")
    labels = {
        "blockx": "BlockX: blockx run -o FILE",
        "imap": "python: multiprocessing.Pool.imap(chunksize=1)",
    }
    for s in ("blockx", "imap"):
        print(
            f"| {labels[s]:<52} | {rate[s]:>10,.0f} | {start[s] * 1000:>11,.0f} |"
            f" {format_rate(steady[s], 14)} | {_micros(cpu_per_call[s]):>11} |"
            f" {rate['blockx'] / rate[s]:>12.2f}x |"
        )
    bx_steady, imap_steady = steady["blockx"], steady["imap"]
    steady_ratio = (
        f"{bx_steady / imap_steady:.2f}x"
        if bx_steady is not None and imap_steady is not None
        else "n/a (a run no longer than its start-up: use more calls)"
    )
    print(
        f"steady state: BlockX / imap {steady_ratio} "
        f"(start-up: a one-call run's wall; steady: calls / (wall - start-up)); BlockX's "
        f"start-up spends {med(outside) * 1000:,.0f} ms before and after the command's own "
        "clock (interpreter, imports, input checks, exit); "
        f"BlockX's summary rate (task_wall_time_s, from the task's submission, executors' "
        f"start included): {task_rate:,.0f} calls/s; CPU µs/call: every process of the "
        "system (BlockX: the worker, its executors and their fork server; imap: the script "
        "and its pool), getrusage(RUSAGE_CHILDREN) around each, a one-call run's subtracted"
    )
    print(
        "runs (calls/s): "
        + "; ".join(
            f"{s} " + ", ".join(f"{n / run['wall_s']:,.0f}" for run in runs[s]) for s in runs
        )
        + "; start-up (ms): "
        + "; ".join(f"{s} " + ", ".join(f"{f * 1000:,.0f}" for f in fixed[s]) for s in fixed)
    )


def _micros(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--io-calls", type=int, default=5_000)
    parser.add_argument("--ppe-io-calls", type=int, default=400)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--io-sweep",
        default="",
        help="comma-separated calls in flight per executor: one more IO row each",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--whole-process",
        action="store_true",
        help="time blockx run and a multiprocessing.Pool.imap script as whole processes instead",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="only compare tracing off with tracing at 1%% sampling (trivial and IO tasks)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.whole_process:
        whole_process_main(args)
        return
    if args.tracing:
        tracing_main(args)
        return

    backend = DelayedBackend()
    blockx = run(blockx_runs(args, backend))
    alone = run(worker_alone_runs(args, TRIVIAL, args.calls, 0))
    alone_io = run(worker_alone_runs(args, IO_BOUND, args.io_calls, READS))
    sweep = {
        int(v): run(io_sweep_runs(args, int(v))) for v in args.io_sweep.split(",") if v.strip()
    }

    ctx = multiprocessing.get_context("fork")
    ppe_trivial: list[float] = []
    ppe_io: list[float] = []
    imap: list[float] = []
    with concurrent.futures.ProcessPoolExecutor(args.executors, mp_context=ctx) as pool:
        list(pool.map(trivial_py, range(100)))  # warm-up
        for _ in range(args.repeats):
            ppe_trivial.append(ppe_run(trivial_py, args.calls, args.executors, pool))
            ppe_io.append(ppe_run(io_bound_py, args.ppe_io_calls, args.executors, pool))
    # The thread pool a user would pick for IO-bound work: as many threads as BlockX has
    # calls in flight, each call sleeping through its five reads.
    threads_io: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(128 * args.executors) as thread_pool:
        list(thread_pool.map(trivial_py, range(100)))  # warm-up: threads started
        for _ in range(args.repeats):
            threads_io.append(ppe_run(io_bound_py, args.io_calls, 0, thread_pool))
    with ctx.Pool(args.executors) as mp_pool:
        list(mp_pool.imap(trivial_py, range(100), chunksize=1))
        for _ in range(args.repeats):
            imap.append(imap_run(args.calls, mp_pool))

    med = statistics.median
    bx_trivial = med(r["calls_per_s"] for r in blockx["trivial"])
    bx_trivial_cpu = med(r["worker_cpu_us"] for r in blockx["trivial"])
    bx_io = med(r["calls_per_s"] for r in blockx["io"])
    bx_io_cpu = med(r["worker_cpu_us"] for r in blockx["io"])
    in_flight = 128 * args.executors
    ideal = in_flight / (READS * READ_DELAY_S)
    ppe_ideal = args.executors / (READS * READ_DELAY_S)

    print(f"\nworker throughput, {args.executors} executors / processes, medians of {args.repeats}")
    print(f"| {'workload':<44} | {'calls/s':>10} | {'BlockX ratio':>12} |")
    print(f"| {'-' * 44} | {'-' * 10}:| {'-' * 12}:|")
    print(f"| {f'trivial x{args.calls}: BlockX':<44} | {bx_trivial:>10,.0f} | {'1.00x':>12} |")
    bx_alone = med(r["calls_per_s"] for r in alone)
    bx_alone_cpu = med(r["worker_cpu_us"] for r in alone)
    print(
        f"| {'trivial: BlockX worker alone (echo executors)':<44} | {bx_alone:>10,.0f} |"
        f" {bx_trivial / bx_alone:>11.2f}x |"
    )
    print(
        f"| {'trivial: ProcessPoolExecutor, submit per call':<44} | {med(ppe_trivial):>10,.0f} |"
        f" {bx_trivial / med(ppe_trivial):>11.2f}x |"
    )
    print(
        f"| {'trivial: multiprocessing.Pool.imap chunksize=1':<44} | {med(imap):>10,.0f} |"
        f" {bx_trivial / med(imap):>11.2f}x |"
    )
    print(
        f"| {f'io x{args.io_calls} (5 reads x 2 ms): BlockX':<44} | {bx_io:>10,.0f} |"
        f" {f'{bx_io / ideal:.0%} ideal':>12} |"
    )
    bx_io_scope = med(r["calls_per_s"] for r in blockx["io_scope"])
    print(
        f"| {'io: BlockX, reads through a task IO scope':<44} | {bx_io_scope:>10,.0f} |"
        f" {f'{bx_io_scope / ideal:.0%} ideal':>12} |"
    )
    bx_alone_io = med(r["calls_per_s"] for r in alone_io)
    print(
        f"| {'io: BlockX worker alone (echo executors)':<44} | {bx_alone_io:>10,.0f} |"
        f" {f'{bx_alone_io / ideal:.0%} ideal':>12} |"
    )
    print(f"| {f'io: ideal for {in_flight} in flight':<44} | {ideal:>10,.0f} | {'':>12} |")
    for per_executor, runs in sweep.items():
        rate = med(r["calls_per_s"] for r in runs)
        swept = per_executor * args.executors
        swept_ideal = swept / (READS * READ_DELAY_S)
        label = f"io, {swept} in flight: BlockX (ideal {swept_ideal:,.0f})"
        print(f"| {label:<44} | {rate:>10,.0f} | {f'{rate / swept_ideal:.0%} ideal':>12} |")
    label = f"io x{args.io_calls}: ThreadPoolExecutor({in_flight}), sleeps"
    print(
        f"| {label:<44} | {med(threads_io):>10,.0f} |"
        f" {f'{med(threads_io) / ideal:.0%} ideal':>12} |"
    )
    print(
        f"| {f'io x{args.ppe_io_calls}: ProcessPoolExecutor (sleep 5x2 ms)':<44} |"
        f" {med(ppe_io):>10,.0f} | {bx_io / med(ppe_io):>11.1f}x |"
    )
    print(
        f"| {f'io: ProcessPoolExecutor ideal ({args.executors} in flight)':<44} |"
        f" {ppe_ideal:>10,.0f} | {'':>12} |"
    )
    print(
        "BlockX CPU per call, worker + executors (cores busy): trivial "
        f"{bx_trivial_cpu:.1f} + {med(r['executors_cpu_us'] for r in blockx['trivial']):.1f} µs "
        f"({med(r['cores_busy'] for r in blockx['trivial']):.2f}), io {bx_io_cpu:.1f} + "
        f"{med(r['executors_cpu_us'] for r in blockx['io']):.1f} µs "
        f"({med(r['cores_busy'] for r in blockx['io']):.2f} of {os.cpu_count()}); the IO target "
        f"(90% of the ideal) leaves {os.cpu_count() / (0.9 * ideal) * 1e6:.0f} µs per call"
    )
    print(
        f"worker CPU per call: trivial {bx_trivial_cpu:.1f} µs (with echo executors "
        f"{bx_alone_cpu:.1f} µs), io {bx_io_cpu:.1f} µs ({READS} waits each; with echo "
        f"executors {med(r['worker_cpu_us'] for r in alone_io):.1f} µs)"
    )
    print(
        "runs (calls/s): BlockX trivial "
        + ", ".join(f"{r['calls_per_s']:,.0f}" for r in blockx["trivial"])
        + "; BlockX io "
        + ", ".join(f"{r['calls_per_s']:,.0f}" for r in blockx["io"])
        + "; BlockX io through a task scope "
        + ", ".join(f"{r['calls_per_s']:,.0f}" for r in blockx["io_scope"])
    )


if __name__ == "__main__":
    main()

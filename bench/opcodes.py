"""Python bytecodes executed per call, by function: a cost measure the machine cannot disturb.

Wall-clock and CPU-time figures on our shared 2-core VMs swing by 2x between
runs (and CPU time seems to include time the host takes the vCPU away), so a
change worth 10% cannot be seen in them. This bench counts instead: every
bytecode the interpreter executes (``sys.settrace`` with ``f_trace_opcodes``),
per function, divided by the calls run. The count does not depend on the
machine or its load; on CPython 3.11 one bytecode of our code costs ~10-15 ns,
so 1,000 per call is ~10-15 µs. C work (JSON codecs, dict internals, syscalls)
is not counted: check a change that moves work into C with a timing bench.

Two sides, each the way the real process runs it:

* **worker** — a real ``Worker`` in process against bench/worker_inprocess.py's
  fake executors (their code and the bench backends are left out of the count):
  ``--calls`` trivial calls, then ``--io-calls`` calls doing ``--reads`` IO waits
  each, answered at once (``IOResult``) or after 2 ms (``--io-mode delayed``);
  The same reads once more through what ``blockx run`` uses: an IOSubsystem task
  scope (read cache, singleflight, statistics) over blockdb on a SQLite file;
* **executor** — ``ExecutorRuntime`` over bench/executor_runtime_loop.py's
  in-memory session, fed ExecuteCall frames decoded by the reader's own typed
  decoder, 128 per ``run_until_idle``; then calls doing ``--reads`` IO waits,
  each answered with a ResumeCall as soon as its CallWaiting is out. Calls carry
  the worker's default budget (5000 ms; ``--budget-ms 0``: none).

Counted on the pure-Python sources: this bench sets ``BLOCKX_PURE_PYTHON=1``
before importing ``blockx`` (modules compiled by mypyc execute no bytecodes, so
a compiled run would count only what is left interpreted; ``--native`` does
that, to see what remains).

    .venv/bin/python bench/opcodes.py [--side worker|executor|both] [--top 25] [--native]
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
from pathlib import Path
from typing import Any

# Before blockx is imported (blockx.native decides once per process).
if "--native" not in sys.argv:
    os.environ["BLOCKX_PURE_PYTHON"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson

import executor_runtime_loop as erl
import worker_inprocess as wi
from blockx.executor.execute_frames import decode_inbound
from blockx.wire import Frame, FrameDecoder
from blockx.worker.app import Worker, run
from blockx.worker.config import load_config

BENCH_DIR = str(Path(__file__).resolve().parent)


class OpcodeCounter:
    """Counts bytecodes per (file, function) while installed (this thread, greenlets too)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def _global(self, frame: Any, _event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame: Any, event: str, _arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            self.counts[(code.co_filename, code.co_name)] += 1
        return self._local

    def __enter__(self) -> OpcodeCounter:
        sys.settrace(self._global)
        return self

    def __exit__(self, *_exc: object) -> None:
        sys.settrace(None)

    def report(self, title: str, calls: int, top: int) -> None:
        ours = {k: v for k, v in self.counts.items() if not k[0].startswith(BENCH_DIR)}
        total = sum(ours.values())
        print(f"\n== {title}: {total / calls:,.0f} bytecodes per call ==")
        for (file, name), count in sorted(ours.items(), key=lambda kv: -kv[1])[:top]:
            where = file.split("/src/blockx/")[-1] if "/src/blockx/" in file else file
            print(f"  {count / calls:8.1f}  {where}:{name}")


# --- worker -----------------------------------------------------------------------------------


async def attach_fakes(worker: Worker, reads: int, clock: list[float]) -> None:
    """Fill the worker's two executor slots with worker_inprocess.py's fake executors."""
    for i in range(2):
        conn = worker.adapter._new_connection()
        fake = wi.FakeExecutor(f"exec-{i}", conn, reads, clock)
        conn.connection_made(fake)  # type: ignore[arg-type]
        fake.heartbeat()
    await worker.wait_ready()


class ScopeSwitch:
    """The worker's IO handler: whichever product scope (TaskIOScope) is current."""

    def __init__(self) -> None:
        self.scope: Any = None

    def handle_io(self, task_id: str, call_id: str, payload: Any, sidecar: Any) -> Any:
        return self.scope.handle_io(task_id, call_id, payload, sidecar)


async def product_io_side(args: argparse.Namespace) -> None:
    """The fake executors' reads through what `blockx run` uses: an IOSubsystem's task
    scope (read cache, singleflight, statistics) over blockdb on a SQLite file. The
    SQLite thread's own Python is not counted (it runs off the loop)."""
    import tempfile

    from blockx.worker.io import IOResult
    from blockx.worker.io.registry import IOSubsystem

    config = load_config(env={}).replace(**{"pool.executor_count": 2})
    reads, n = args.reads, args.io_calls
    with tempfile.TemporaryDirectory() as data_dir:
        io = IOSubsystem({"data_dir": data_dir})
        switch = ScopeSwitch()
        try:
            filler = io.task_scope("fill")
            rows = [{"key": k, "v": k} for k in range((n + 500) * reads)]
            answer = await filler.handle_io(
                "fill",
                "fill/c0",
                {
                    "backend": "blockdb",
                    "operation": "upsert_rows",
                    "ioKind": "write",
                    "params": {"table": "t", "rows": rows},
                },
                None,
            )
            assert type(answer) is IOResult and answer.error is None, answer
            filler.close()
            clock = [0.0]
            async with Worker(config, spawner=wi.IdleSpawner(), io_handlers=switch) as worker:
                await attach_fakes(worker, reads, clock)
                switch.scope = io.task_scope("warm")
                await wi._timed(worker, 500, reads, clock)
                switch.scope = io.task_scope("measured")  # a cold read cache
                with OpcodeCounter() as counter:
                    await wi._timed(worker, n, reads, clock)
        finally:
            await io.close()
    counter.report(
        f"worker, {n} calls of {reads} reads through the product's IO scope + SQLite (misses)",
        n,
        args.top,
    )


async def worker_side(args: argparse.Namespace) -> None:
    config = load_config(env={}).replace(**{"pool.executor_count": 2})
    for reads, n in ((0, args.calls), (args.reads, args.io_calls)):
        clock = [0.0]
        backend: Any = wi.DelayedBackend() if args.io_mode == "delayed" else wi.ImmediateBackend()
        async with Worker(
            config, spawner=wi.IdleSpawner(), io_handlers={"blockdb": backend}
        ) as worker:
            await attach_fakes(worker, reads, clock)
            await wi._timed(worker, 500, reads, clock)  # warm-up
            with OpcodeCounter() as counter:
                await wi._timed(worker, n, reads, clock)
        what = "trivial calls" if not reads else f"calls of {reads} IO waits ({args.io_mode})"
        counter.report(f"worker, {n} {what}", n, args.top)


# --- executor ---------------------------------------------------------------------------------


def typed_frames(frames: list[Frame]) -> list[Frame]:
    """The frames as the executor's reader thread hands them over (typed ExecuteCall)."""
    decoder = FrameDecoder(typed=decode_inbound)
    out: list[Frame] = []
    for frame in frames:
        body = orjson.dumps(frame.envelope)
        out.extend(decoder.feed(len(body).to_bytes(4, "big") + body))
    return out


def typed_resume(call_id: str, request_id: str) -> Frame:
    """A ResumeCall as the reader hands it over: through the typed decoder (its Python
    part, ``decode_matching``, counts; the reader's per-frame loop does not)."""
    body = orjson.dumps(erl.resume_frame(call_id, request_id).envelope)
    envelope = decode_inbound.decode_matching(memoryview(body))
    return Frame(envelope if envelope is not None else orjson.loads(body))


def executor_side(args: argparse.Namespace) -> None:
    runtime = erl.make_runtime()
    try:
        budget = args.budget_ms
        erl.batched(runtime, typed_frames(erl.envelopes(1000, "warm", budget_ms=budget)))
        frames = typed_frames(erl.envelopes(args.calls, "run", budget_ms=budget))
        with OpcodeCounter() as counter:
            erl.batched(runtime, frames)
        counter.report(f"executor, {args.calls} trivial calls", args.calls, args.top)
        frames = typed_frames(erl.envelopes(args.io_calls, "io", args.reads, budget_ms=budget))
        with OpcodeCounter() as counter:
            erl.io_waits(runtime, frames, typed_resume)
        counter.report(
            f"executor, {args.io_calls} calls of {args.reads} IO waits", args.io_calls, args.top
        )
    finally:
        runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("worker", "executor", "both"), default="both")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--io-calls", type=int, default=500)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--io-mode", choices=("immediate", "delayed"), default="immediate")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--budget-ms", type=int, default=5000, help="executor calls' callBudgetMs (0: none)"
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="count with the compiled modules in place: only what is left interpreted",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    from blockx import native

    print(f"blockx modules: {native.status().describe()}")
    if args.side in ("worker", "both"):
        run(worker_side(args))
        run(product_io_side(args))
    if args.side in ("executor", "both"):
        executor_side(args)


if __name__ == "__main__":
    main()

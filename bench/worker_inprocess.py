"""Worker CPU per call, in one process: the real worker against in-process fake executors.

bench/worker_cpu.py measures the worker against echo executor *processes*; on a
shared 2-core box its figures swing with scheduling (how many frames each read
and each actor run happens to batch). This bench takes the scheduler out: a
real :class:`~blockx.worker.app.Worker` (task API, orchestrator, core, adapter,
connections, frame codec) whose executor slots are filled by fake executors
living in the same process, attached through a fake transport:

* the pool's processes are idle placeholders that never connect;
* each fake executor gets a real ``ExecutorConnection`` from the adapter and
  attaches with a Heartbeat (one more every 400 ms);
* ``transport.write`` hands the bytes to the fake executor, which answers the
  whole write in one ``data_received`` on the next loop turn (like an executor
  answering one read with one write): ``CallCompleted`` at once, or with
  ``--reads k`` first k ``CallWaiting(io)``, one at a time, each answered by
  the worker's IO handler with a ``ResumeCall`` (``--io-mode immediate``: an
  ``IOResult`` returned at once; ``delayed``: bench/worker_throughput.py's
  backend, a future resolved 2 ms later, one timer per batch of requests;
  ``scope``: the same 2 ms reads through a task's ``TaskIOScope``, as
  ``blockx run`` serves them; ``sqlite``: real ``get_row`` reads of a table
  in a temporary SQLite file, through the product's IO subsystem -- the
  SQLite engine's thread runs in the worker's process and is counted).

The fake executors' own CPU (decoding ExecuteCall / ResumeCall, building
replies) is measured with ``time.thread_time`` and subtracted: what is left is
the worker's CPU per call. Median and min of ``--repeats`` runs.

    .venv/bin/python bench/worker_inprocess.py [--calls 20000] [--io-calls 4000]
        [--reads 5] [--repeats 7] [--profile trivial|io] [--sort tottime]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import pstats
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockx.observability.tracing import Tracing
from blockx.wire import encode_frame
from blockx.wire.frames import BATCH_MAGIC, FEATURE_BATCH, batch_frames
from blockx.worker.api import Call, Task
from blockx.worker.app import Worker, run
from blockx.worker.config import load_config
from blockx.worker.io import IOResult
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import IOSubsystem
from blockx.worker.pool.spawner import ExecutorLaunchSpec
from worker_throughput import DelayedBackend, DelayedIOBackend, product_io

TRIVIAL = 'def _(p):\n    return {"y": p["x"] + 1}\n'
IO_SOURCE = "def _(p):\n    return None\n"  # never runs: the fake executor fakes the reads
_U32 = struct.Struct(">I")
_dumps = orjson.dumps
_loads = orjson.loads


class IdleSpawner:
    """Pool placeholders: processes that sleep and never connect."""

    mode = "process"

    def spawn(self, spec: ExecutorLaunchSpec) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )


class ImmediateBackend:
    def handle_io(self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: Any) -> Any:
        return IOResult(result={"v": payload["params"]["key"]}, budget_used_ms=0)


class FakeExecutor:
    """A fake transport and the executor behind it (see the module docstring)."""

    def __init__(
        self, executor_id: str, conn: Any, reads: int, clock: list[float], batch: bool = False
    ) -> None:
        #: Announce batched frames (docs/protocol.md "Batched frames") and, once the
        #: worker's ack accepts them, answer each turn's frames as one batch.
        self.batch = batch
        self.batching = False
        self.executor_id = executor_id
        self.conn = conn
        self.reads = reads
        self.clock = clock  # [seconds spent in fake executors]
        self.loop = asyncio.get_running_loop()
        self.pending: list[bytes] = []
        self.scheduled = False
        self.calls: dict[str, list[Any]] = {}
        self.seq = 0
        self.closed = False

    # --- the transport the connection writes to -------------------------------------------

    def write(self, data: bytes) -> None:
        self.pending.append(data)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.answer)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def abort(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    # --- the executor ----------------------------------------------------------------------

    def heartbeat(self) -> None:
        if self.closed:
            return
        self.seq += 1
        frame = encode_frame(
            {
                "messageType": "Heartbeat",
                "executorId": self.executor_id,
                "payload": {
                    "executorId": self.executor_id,
                    "heartbeatSeq": self.seq,
                    "runnableCount": 0,
                    "inflightCount": len(self.calls),
                    "availableContexts": 128,
                    "memoryBytes": 0,
                    "lastSchedulerActiveAtMs": int(time.time() * 1000),
                    "runningCallId": None,
                    "executorProcessInstanceId": f"fake-{self.executor_id}",
                    **({"features": [FEATURE_BATCH]} if self.batch else {}),
                },
            }
        )
        self.conn.data_received(frame)
        self.loop.call_later(0.4, self.heartbeat)

    def answer(self) -> None:
        t0 = time.thread_time()
        self.scheduled = False
        data = b"".join(self.pending)
        self.pending.clear()
        out: list[bytes] = []
        pos = 0
        size = len(data)
        reads = self.reads
        calls = self.calls
        bodies: list[bytes] = []
        while pos < size:
            (length,) = _U32.unpack_from(data, pos)
            body = data[pos + 4 : pos + 4 + length]
            pos += 4 + length
            if body[:4] == BATCH_MAGIC:  # K x (uint32 L | L bytes)
                (count,) = _U32.unpack_from(body, 4)
                inner = 8
                for _ in range(count):
                    (n,) = _U32.unpack_from(body, inner)
                    bodies.append(body[inner + 4 : inner + 4 + n])
                    inner += 4 + n
            else:
                bodies.append(body)
        for body in bodies:
            envelope = _loads(body)
            kind = envelope["messageType"]
            if kind == "HeartbeatAck":
                self.batching = FEATURE_BATCH in envelope.get("payload", {}).get("features", ())
                continue
            if kind == "ExecuteCall":
                payload = envelope["payload"]
                call_id = envelope["callId"]
                x = payload["args"]["x"]
                if reads:
                    state = [payload["taskId"], payload["attemptSeq"], x, 0, 0]
                    calls[call_id] = state
                    out.append(self._waiting(call_id, state))
                else:
                    out.append(
                        self._completed(
                            call_id, payload["taskId"], payload["attemptSeq"], {"y": x + 1}
                        )
                    )
            elif kind == "ResumeCall":
                call_id = envelope["callId"]
                state = calls.get(call_id)
                if state is None:
                    continue
                state[3] += 1
                state[4] += envelope["payload"]["result"]["v"]
                if state[3] < reads:
                    out.append(self._waiting(call_id, state))
                else:
                    del calls[call_id]
                    out.append(self._completed(call_id, state[0], state[1], {"total": state[4]}))
        reply = batch_frames(out) if self.batching else b"".join(out)
        self.clock[0] += time.thread_time() - t0
        if reply and not self.closed:
            self.conn.data_received(reply)

    def _frame(self, envelope: dict[str, Any]) -> bytes:
        body = _dumps(envelope)
        return _U32.pack(len(body)) + body

    def _waiting(self, call_id: str, state: list[Any]) -> bytes:
        self.seq += 1
        return self._frame(
            {
                "messageType": "CallWaiting",
                "callId": call_id,
                "requestId": f"req-{self.seq}",
                "executorId": self.executor_id,
                "payload": {
                    "taskId": state[0],
                    "attemptSeq": state[1],
                    "waitKind": "io",
                    "ioKind": "read",
                    "backend": "blockdb",
                    "operation": "get_row",
                    "params": {"table": "t", "key": state[2] * self.reads + state[3]},
                    "cacheKey": None,
                },
            }
        )

    def _completed(self, call_id: str, task_id: str, attempt: int, output: Any) -> bytes:
        return self._frame(
            {
                "messageType": "CallCompleted",
                "callId": call_id,
                "executorId": self.executor_id,
                "payload": {
                    "taskId": task_id,
                    "attemptSeq": attempt,
                    "output": output,
                    "budgetUsedMs": 0,
                },
            }
        )


#: (label, owner class path, method name): phases timed by ``--phases``. Each method
#: runs once per read, per actor run or per task -- not per call -- so timing it
#: costs little. Nested phases are reported exclusive of the phases inside them.
PHASES = (
    ("submit (encode args, prepare)", "blockx.worker.app:Worker", "submit"),
    # A one-shot list's chunks after the first are checked and prepared by its driver.
    ("submit (encode args, prepare)", "blockx.worker.actor.one_shot:OneShotCalls", "_chunk_specs"),
    (
        "submit (encode args, prepare)",
        "blockx.worker.core.dispatcher:DispatcherCore",
        "prepare_call_batch_with_digests",
    ),
    ("inbound: decode (wire)", "blockx.wire.frames:FrameDecoder", "feed"),
    ("inbound: adapter", "blockx.worker.link.handlers:InboundHandlers", "on_frames"),
    (
        "actor: commit",
        "blockx.worker.actor.tasks:Tasks",
        "apply_task_submitted",
    ),
    ("actor: commit", "blockx.worker.actor.tasks:Tasks", "apply_call_chunk"),
    (
        "actor: completions",
        "blockx.worker.actor.attempts:AttemptEnds",
        "apply_call_frames",
    ),
    (
        "actor: completions",
        "blockx.worker.actor.attempts:AttemptEnds",
        "apply_attempt_completed",
    ),
    ("actor: bind+send", "blockx.worker.actor.orchestrator:Orchestrator", "_execute_bind"),
    ("core: completions", "blockx.worker.core.dispatcher:DispatcherCore", "handle_call_completed"),
    (
        "core: binds confirmed",
        "blockx.worker.core.dispatcher:DispatcherCore",
        "handle_executor_bound",
    ),
    (
        "actor: resumes",
        "blockx.worker.actor.waits:Waits",
        "apply_controls_delivered",
    ),
    (
        "actor: resumes",
        "blockx.worker.actor.waits:Waits",
        "apply_control_delivered",
    ),
    ("actor: waits", "blockx.worker.actor.waits:Waits", "apply_waits"),
    (
        "actor: waits",
        "blockx.worker.actor.waits:Waits",
        "apply_call_suspended",
    ),
    ("flush notes", "blockx.worker.link.connection:ExecutorConnection", "_report_flushed"),
    ("IO futures answered (bench backend)", "worker_throughput:_TimerBatches", "_fire"),
    ("actor: decisions", "blockx.worker.core.dispatcher:DispatcherCore", "dispatch_ready"),
    ("core: completions", "blockx.worker.core.dispatcher:DispatcherCore", "handle_calls_completed"),
    (
        "core: binds confirmed",
        "blockx.worker.core.dispatcher:DispatcherCore",
        "handle_executors_bound",
    ),
    ("core: commit", "blockx.worker.core.dispatcher:DispatcherCore", "commit_call_phase"),
    ("core: commit", "blockx.worker.core.dispatcher:DispatcherCore", "commit_call_chunk"),
    ("actor: run commands", "blockx.worker.actor.orchestrator:Orchestrator", "_run"),
    ("actor: bind+send", "blockx.worker.actor.orchestrator:Orchestrator", "_execute_binds"),
    ("actor: convergence", "blockx.worker.core.dispatcher:DispatcherCore", "flush_dirty_tasks"),
    ("actor: run (total)", "blockx.worker.actor.orchestrator:Orchestrator", "_run_actor"),
    ("flush (write)", "blockx.worker.link.connection:ExecutorConnection", "_flush"),
    ("result", "blockx.worker.app:Worker", "_result"),
)


def install_phase_timers(acc: dict[str, float]) -> None:
    import importlib
    import inspect

    stack: list[float] = []  # time spent in nested phases, per open phase

    for label, owner, name in PHASES:
        module_name, class_name = owner.split(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        original = getattr(cls, name, None)
        if original is None:  # an older tree without this entry point
            continue

        def timed(*args: Any, __original: Any = original, __label: str = label, **kw: Any) -> Any:
            t0 = time.thread_time()
            stack.append(0.0)
            try:
                return __original(*args, **kw)
            finally:
                inner = stack.pop()
                spent = time.thread_time() - t0
                acc[__label] = acc.get(__label, 0.0) + spent - inner
                if stack:
                    stack[-1] += spent

        if isinstance(inspect.getattr_static(cls, name), staticmethod):
            setattr(cls, name, staticmethod(timed))
        else:
            setattr(cls, name, timed)


async def _timed(worker: Worker, n: int, reads: int, clock: list[float]) -> tuple[float, float]:
    source = IO_SOURCE if reads else TRIVIAL
    task = Task(functions={"f": source}, calls=[Call("f", {"x": i}) for i in range(n)])
    fake0 = clock[0]
    cpu0 = time.process_time()
    result = await worker.run_task(task)
    cpu = time.process_time() - cpu0 - (clock[0] - fake0)
    assert result.success, result.errors[:3]
    if reads:
        expected = [{"total": sum(i * reads + k for k in range(reads))} for i in range(n)]
    else:
        expected = [{"y": i + 1} for i in range(n)]
    assert result.outputs == expected, "wrong outputs"
    return cpu / n * 1e6, (clock[0] - fake0) / n * 1e6


async def measure(
    args: argparse.Namespace, reads: int, counts: list[float]
) -> list[tuple[float, float]]:
    config = load_config(env={}).replace(**{"pool.executor_count": args.executors})
    clock = [0.0]
    acc: dict[str, float] = {}
    if args.phases:  # before the Worker exists: the actor keeps bound methods
        install_phase_timers(acc)
    handlers: Any
    io: IOSubsystem | None = None
    if args.io_mode == "scope":
        handlers = io = product_io(DelayedIOBackend())
    elif args.io_mode == "sqlite":
        data = tempfile.mkdtemp(prefix="bx-inprocess-")
        path = os.path.join(data, "blockdb.sqlite3")
        handlers = io = IOSubsystem(
            load_io_config({"blockdb": {"engine": "sqlite", "sqlite_path": path}}, env={})
        )
        await _preload(io, max(args.io_calls, 2000) * reads)
    else:
        backend = DelayedBackend() if args.io_mode == "delayed" else ImmediateBackend()
        handlers = {"blockdb": backend}
    try:
        return await _measure(args, config, handlers, reads, counts, clock, acc)
    finally:
        if io is not None:
            await io.close()
        if args.io_mode == "sqlite":
            shutil.rmtree(data, ignore_errors=True)


async def _preload(io: IOSubsystem, rows: int) -> None:
    """Table ``t`` of the SQLite store: rows ``{"key": k, "v": k}`` for every key read."""
    backend = io.backend("blockdb")
    assert backend is not None
    for start in range(0, rows, 10_000):
        batch = [{"key": k, "v": k} for k in range(start, min(start + 10_000, rows))]
        prepared = backend.prepare("write", "upsert_rows", {"table": "t", "rows": batch}, None)
        reply = await backend.execute(prepared)
        assert reply.error is None, reply.error


async def _measure(
    args: argparse.Namespace,
    config: Any,
    handlers: Any,
    reads: int,
    counts: list[float],
    clock: list[float],
    acc: dict[str, float],
) -> list[tuple[float, float]]:
    out = []
    # Tracing as blockx run sets it (off unless BLOCKX_TRACE_FILE or an OTLP endpoint is
    # set; OTEL_TRACES_SAMPLER(_ARG) sample): bench/instructions.py measures its cost so.
    tracing = Tracing.from_env()
    async with Worker(
        config, spawner=IdleSpawner(), io_handlers=handlers, tracing=tracing
    ) as worker:
        fakes = []
        for i in range(args.executors):
            conn = worker.adapter._new_connection()
            fake = FakeExecutor(f"exec-{i}", conn, reads, clock, getattr(args, "batch", False))
            conn.connection_made(fake)  # type: ignore[arg-type]
            fake.heartbeat()
            fakes.append(fake)
        await worker.wait_ready()
        n = args.io_calls if reads else args.calls
        await _timed(worker, 2000, reads, clock)
        for _ in range(args.repeats):
            out.append(await _timed(worker, n, reads, clock))
        if args.phases:
            acc.clear()
            fake0 = clock[0]
            cpu, _fake = await _timed(worker, n, reads, clock)
            fake_us = (clock[0] - fake0) / n * 1e6
            print(
                f"\n== phases, one {'io' if reads else 'trivial'} task of {n}: µs/call (exclusive) =="
            )
            for label, spent in sorted(acc.items(), key=lambda kv: -kv[1]):
                print(f"  {spent / n * 1e6:7.2f}  {label}")
            print(
                f"  {cpu - sum(acc.values()) / n * 1e6:7.2f}  (rest: event loop, timers, callbacks)"
            )
            print(f"  {cpu:7.2f}  worker total (fake executors' {fake_us:.2f} subtracted)")
        if args.count:
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            await _timed(worker, n, reads, clock)
            profiler.disable()
            stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
            own = sum(
                v[1]
                for (file, _line, _name), v in stats.items()
                if file != "~" and not file.endswith("worker_inprocess.py")
            )
            counts.append(own / n)
        if args.profile == ("io" if reads else "trivial"):
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            await _timed(worker, n, reads, clock)
            profiler.disable()
            print(f"\n== cProfile (CPU time) of one {args.profile} task of {n} (fakes included) ==")
            if args.dump:
                profiler.dump_stats(args.dump)
            pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.lines)
        for fake in fakes:
            fake.closed = True
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--io-calls", type=int, default=4_000)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument(
        "--io-mode", choices=("immediate", "delayed", "scope", "sqlite"), default="immediate"
    )
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument(
        "--batch", action="store_true", help="fake executors announce batched frames"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", choices=("trivial", "io"), default=None)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--dump", default=None, help="write the --profile run's stats here")
    parser.add_argument("--only", choices=("trivial", "io"), default=None)
    parser.add_argument(
        "--phases", action="store_true", help="time the worker's phases (batch-level timers)"
    )
    parser.add_argument(
        "--count",
        action="store_true",
        help="also count Python function calls per call (a deterministic proxy for CPU)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    med = statistics.median
    trivial_cpu = None
    if args.only != "io":
        counts: list[float] = []
        trivial = run(measure(args, 0, counts))
        trivial_cpu = med(r[0] for r in trivial)
        print(
            f"trivial x{args.calls}: worker CPU {trivial_cpu:.2f} µs/call "
            f"[min {min(r[0] for r in trivial):.2f}] "
            f"(runs {', '.join(f'{r[0]:.1f}' for r in trivial)}; "
            f"fake executors {med(r[1] for r in trivial):.1f} µs/call, subtracted)"
            + (f"; {counts[0]:.1f} Python calls/call" if counts else "")
        )
    if args.only != "trivial":
        io_counts: list[float] = []
        io = run(measure(args, args.reads, io_counts))
        io_cpu = med(r[0] for r in io)
        io_min = min(r[0] for r in io)
        per_wait = ""
        if trivial_cpu is not None:
            trivial_min = min(r[0] for r in trivial)
            per_wait = (
                f"; per wait {(io_cpu - trivial_cpu) / args.reads:.2f} µs "
                f"[min {(io_min - trivial_min) / args.reads:.2f}]"
            )
        print(
            f"io x{args.io_calls} ({args.reads} reads, {args.io_mode}): "
            f"worker CPU {io_cpu:.2f} µs/call "
            f"[min {io_min:.2f}] (runs {', '.join(f'{r[0]:.1f}' for r in io)}){per_wait}"
            + (f"; {io_counts[0]:.1f} Python calls/call" if io_counts else "")
        )


if __name__ == "__main__":
    main()

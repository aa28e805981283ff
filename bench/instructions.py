"""CPU instructions per call and per IO wait, counted by valgrind: a cost measure the VM cannot disturb.

Wall-clock and CPU-time figures on our shared 2-core VMs swing by ~2x within an
hour, and ``bench/opcodes.py`` counts bytecodes, which compiled modules no
longer execute. This bench counts machine instructions instead, with
``valgrind --tool=callgrind`` (no hardware counters needed): the same code and
inputs give the same count (within ~0.5%) whatever else the machine is doing,
compiled or not, C work (JSON codecs, dict internals, allocation) included.

Each figure is a difference of two runs in fresh processes that differ only in
how many calls they run (start-up, imports and warm-up cancel out), divided by
the difference in calls:

* **worker** -- a real ``Worker`` against bench/worker_inprocess.py's in-process
  fake executors: trivial calls, and calls doing ``--reads`` IO waits answered
  at once (``immediate``: an ``IOResult``) or after 2 ms (``delayed``: a future,
  bench/worker_throughput.py's backend), or after 2 ms through the product's IO
  path (``scope``: the task's ``TaskIOScope`` -- read cache, shared flights,
  stats -- over an ``IOBackend``, as ``blockx run`` serves reads), or real
  ``get_row`` reads of a SQLite table through the same path (``sqlite``: the
  engine's thread included). The fake executors' own work (encoding
  their frames, decoding the worker's) is included: it does not change when
  the worker does, so differences between two builds are the worker's;
* **executor** -- ``ExecutorRuntime`` over bench/executor_runtime_loop.py's
  in-memory session, its inbound frames fed through the reader's own
  ``FrameDecoder`` (typed hook included) as the reader feeds them (a view of
  one reused receive buffer), 128 per ``run_until_idle``: trivial
  calls, and calls doing ``--reads`` IO waits, each answered with a ResumeCall
  as the worker encodes it; ``io kept``: the same reads of one key answered
  ``immutable`` (a chain read at a block), so all but the task's first are
  answered by the executor's own read cache (executor/local_reads.py). The
  socket and the reader/writer threads are not in it.

Tracing (docs/observability.md) is off, as by default; the worker shapes
run with it as ``blockx run`` would with ``BLOCKX_TRACE_FILE`` (and
``OTEL_TRACES_SAMPLER=traceidratio OTEL_TRACES_SAMPLER_ARG=0.01`` for 1%) in the
environment: its cost when on. (The fake executors send no ``execute`` span back.)

Per wait = (instructions per IO call - per trivial call) / reads. Runs on the
build in place: compiled if ``blockx --version`` says so, pure with
``BLOCKX_PURE_PYTHON=1``. Takes a few minutes (valgrind runs ~50x slower).

    .venv/bin/python bench/instructions.py [--only worker|executor] [--reads 5]

Needs ``valgrind`` on PATH (without it the bench says so and does nothing).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: (calls in the small run, calls in the big run) per shape.
SIZES = {"trivial": (500, 2500), "io": (300, 1300)}


# --- children: what runs under valgrind ------------------------------------------------


def _child_worker(mode: str, calls: int, reads: int, batch: bool = False) -> None:
    import logging

    sys.path.insert(0, str(HERE))
    import worker_inprocess
    from blockx.worker.app import run

    logging.basicConfig(level=logging.ERROR)
    args = argparse.Namespace(
        executors=2,
        io_mode=mode,
        calls=calls,
        io_calls=calls,
        repeats=1,
        batch=batch,
        phases=False,
        count=False,
        profile=None,
    )
    run(worker_inprocess.measure(args, reads, []))


def _child_executor(calls: int, reads: int, kept: bool = False) -> None:
    sys.path.insert(0, str(HERE))
    import executor_runtime_loop as loop
    from blockx.executor.execute_frames import decode_inbound
    from blockx.wire import FrameDecoder, encode_frame

    runtime = loop.make_runtime()
    session = runtime._session
    decoder = FrameDecoder(typed=decode_inbound)
    # As the reader thread feeds it: a view of one reused receive buffer.
    received = bytearray(1 << 20)

    def feed(data: bytes) -> list[Any]:
        received[: len(data)] = data
        with memoryview(received) as view:
            return decoder.feed(view[: len(data)])

    def execute_bytes(tag: str, count: int) -> list[bytes]:
        if kept:
            function, digest = "n_kept", loop.N_KEPT_DIGEST
        elif reads:
            function, digest = "n_reads", loop.N_READS_DIGEST
        else:
            function, digest = "trivial", loop.DIGEST
        return [
            encode_frame(loop.execute_envelope(tag, i, function, digest, reads or i, 5000))
            for i in range(count)
        ]

    def resume_bytes(call_id: str, request_id: str) -> bytes:
        # Charged 2 ms, as bench/worker_throughput.py's backend answers.
        return encode_frame(loop.resume_frame(call_id, request_id, 2, immutable=kept).envelope)

    def run_all(tag: str, count: int) -> None:
        frames = execute_bytes(tag, count)
        for start in range(0, count, loop.BATCH):
            batch = frames[start : start + loop.BATCH]
            session.incoming.extend(feed(b"".join(batch)))
            runtime.run_until_idle()
            session.sent.clear()
            if not reads:
                continue
            waiting = [f"{tag}/c{i}" for i in range(start, start + len(batch))]
            while waiting:
                still = []
                answers = []
                for call_id in waiting:
                    ctx = runtime.get_context(call_id)
                    if ctx is None:
                        continue
                    still.append(call_id)
                    assert ctx.pending_request_id is not None
                    answers.append(resume_bytes(call_id, ctx.pending_request_id))
                if answers:
                    session.incoming.extend(feed(b"".join(answers)))
                runtime.run_until_idle()
                session.sent.clear()
                waiting = still

    try:
        run_all("warm", 1000)
        run_all("run", calls)
        stats = runtime.stats()
        assert stats["calls_completed"] == calls + 1000, stats
        assert stats["calls_failed"] == stats["stale_resume_dropped"] == 0, stats
    finally:
        runtime.shutdown()


# --- the parent: valgrind runs and arithmetic -----------------------------------------------


def _count(argv: list[str], out_dir: str, name: str) -> int:
    out_file = os.path.join(out_dir, f"{name}.callgrind")
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", *argv],
        capture_output=True,
        text=True,
        env=env,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("worker", "executor"), default=None)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--keep", default=None, help="keep the callgrind files in this directory")
    parser.add_argument(
        "--batch",
        action="store_true",
        help="the worker's fake executors announce batched frames (docs/protocol.md)",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, mode, calls, reads, *rest = args.child
        if side == "worker":
            _child_worker(mode, int(calls), int(reads), batch=rest == ["batch"])
        else:
            _child_executor(int(calls), int(reads), kept=mode == "kept")
        return
    if shutil.which("valgrind") is None:
        print("instructions: skipped, valgrind is not on PATH (Debian: apt-get install valgrind)")
        return
    out_dir = args.keep or tempfile.mkdtemp(prefix="bx-instr-")
    os.makedirs(out_dir, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    jobs: dict[str, list[str]] = {}
    shapes: list[tuple[str, str, str, int]] = []  # (side, label, mode, reads)
    if args.only != "executor":
        shapes += [
            ("worker", "trivial", "immediate", 0),
            ("worker", "io immediate", "immediate", args.reads),
            ("worker", "io delayed", "delayed", args.reads),
            ("worker", "io scope", "scope", args.reads),
            ("worker", "io sqlite", "sqlite", args.reads),
        ]
    if args.only != "worker":
        shapes += [
            ("executor", "trivial", "-", 0),
            ("executor", "io", "-", args.reads),
            ("executor", "io kept", "kept", args.reads),
        ]
    for side, label, mode, reads in shapes:
        small, big = SIZES["io" if reads else "trivial"]
        for size in (small, big):
            name = f"{side}-{label.replace(' ', '_')}-{size}"
            jobs[name] = [*me, side, mode, str(size), str(reads)]
            if args.batch and side == "worker":
                jobs[name].append("batch")
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {name: pool.submit(_count, argv, out_dir, name) for name, argv in jobs.items()}
        counts = {name: future.result() for name, future in futures.items()}
    from blockx.native import status

    frames = ", worker: batched frames" if args.batch else ""
    print(
        f"instructions (valgrind), {status().describe()}, reads per IO call: {args.reads}{frames}"
    )
    print(f"| {'side':<8} | {'calls':<14} | {'instr/call':>11} | {'instr/wait':>11} |")
    print(f"| {'-' * 8} | {'-' * 14} | {'-' * 10}:| {'-' * 10}:|")
    per_call: dict[tuple[str, str], float] = {}
    for side, label, _mode, reads in shapes:
        small, big = SIZES["io" if reads else "trivial"]
        key = f"{side}-{label.replace(' ', '_')}"
        value = (counts[f"{key}-{big}"] - counts[f"{key}-{small}"]) / (big - small)
        per_call[(side, label)] = value
        trivial = per_call.get((side, "trivial"))
        per_wait = (
            f"{(value - trivial) / reads:>11,.0f}" if reads and trivial is not None else " " * 11
        )
        print(f"| {side:<8} | {label:<14} | {value:>11,.0f} | {per_wait} |")
    if args.keep:
        print(f"callgrind files in {out_dir} (callgrind_annotate FILE)")
    else:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

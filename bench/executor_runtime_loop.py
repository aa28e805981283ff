"""The runtime's own cost per trivial call, in process: no socket, no second process.

``ExecutorRuntime`` over an in-memory session (``BenchSession``: the main-thread
side of ``UDSSession``). ExecuteCall frames (every payload key, as the worker
writes them, with its default ``callBudgetMs`` of 5000, so the budget and alarm
paths run) are decoded up front, so what is measured is ``run_until_idle``:
drain, admit, switch into a resident greenlet, load the entry, run, encode the
terminal frame. Three shapes:

* **one at a time** — feed one ExecuteCall, ``run_until_idle``, next one (the
  main loop's shape when calls arrive one per wake-up);
* **batched** — feed 128 ExecuteCalls, then one ``run_until_idle``;
* **IO wait** — batches of 128 calls doing 10 sequential reads, each answered
  with a ResumeCall envelope as soon as the CallWaiting is out; the cost of one
  CallWaiting → ResumeCall round trip is (t(10 reads) - t(0 reads)) / 10.

``--profile`` prints a cProfile of the one-at-a-time loop instead (``--profile
--io``: of the IO loop).

    .venv/bin/python bench/executor_runtime_loop.py [--calls 20000] [--repeats 5] [--profile [--io]]

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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blockx.executor.module_registry import ModuleRegistry
from blockx.executor.runtime import ExecutorRuntime
from blockx.wire import Frame, encode_frame, keys
from blockx.wire.blackbox import BlackboxWriter

#: The black box's file (removed when the bench exits).
_BLACKBOX_FILE = tempfile.NamedTemporaryFile(prefix="bx-bench-blackbox-")

TRIVIAL = 'def _(x):\n    return {"y": x + 1}\n'
DIGEST = "sha256:" + hashlib.sha256(TRIVIAL.encode()).hexdigest()
N_READS = """\
from blockx.sdk import get_provider


def _(n):
    provider = get_provider()
    total = 0
    for i in range(n):
        total += provider.read_req("blockdb", "get_row", {"i": i})["v"]
    return {"total": total}
"""
N_READS_DIGEST = "sha256:" + hashlib.sha256(N_READS.encode()).hexdigest()
#: The same reads as the kind the executor keeps: one key, answered ``immutable``
#: (a chain read at a block), so all but the task's first are answered in the executor.
N_KEPT = """\
from blockx.sdk import get_provider


def _(n):
    provider = get_provider()
    total = 0
    for i in range(n):
        total += provider.read_req("rpc", "eth_getBalance", {"i": 0}, cache_key="k")["v"]
    return {"total": total}
"""
N_KEPT_DIGEST = "sha256:" + hashlib.sha256(N_KEPT.encode()).hexdigest()
BATCH = 128
IO_READS = 10


def make_runtime() -> ExecutorRuntime:
    registry = ModuleRegistry()
    # No code fetch round trip.
    registry.compile_source("trivial", DIGEST, TRIVIAL)
    registry.compile_source("n_reads", N_READS_DIGEST, N_READS)
    registry.compile_source("n_kept", N_KEPT_DIGEST, N_KEPT)
    # A black box, as the product's executor always has one (the worker names its file):
    # written at every switch into a call and back.
    blackbox = BlackboxWriter(_BLACKBOX_FILE.name)
    return ExecutorRuntime(
        "bench", session=BenchSession(), registry=registry, max_inflight=0, blackbox=blackbox
    )


def execute_envelope(
    task_id: str, i: int, function_id: str, digest: str, args: Any, budget_ms: int = 5000
) -> dict[str, Any]:
    """Call ``i``'s ExecuteCall with every payload key, as the worker writes it (5000 ms:
    the worker's default ``call_deadline_ms``)."""
    return {
        keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
        keys.F_CALL_ID: f"{task_id}/c{i}",
        keys.F_PAYLOAD: {
            keys.FP_TASK_ID: task_id,
            keys.FP_FUNCTION_ID: function_id,
            keys.FP_FUNCTION_CODE_DIGEST: digest,
            keys.FP_ARGS: args,
            keys.FP_CALL_KEY: f"{function_id}:{i}",
            keys.FP_ATTEMPT_SEQ: 1,
            keys.FP_ENTRY_SELECTOR: "_",
            keys.FP_PARENT_CALL_ID: None,
            keys.FP_ANCESTRY: [],
            keys.FP_CALL_BUDGET_MS: budget_ms,
            keys.FP_AUDIT: None,
            keys.FP_DEBUG: False,
        },
    }


def envelopes(
    count: int, task_id: str, reads: int | None = None, budget_ms: int = 5000
) -> list[Frame]:
    """ExecuteCalls of the trivial function, or (``reads`` set) of one doing ``reads`` reads."""
    if reads is None:
        return [
            Frame(execute_envelope(task_id, i, "trivial", DIGEST, i, budget_ms))
            for i in range(count)
        ]
    return [
        Frame(execute_envelope(task_id, i, "n_reads", N_READS_DIGEST, reads, budget_ms))
        for i in range(count)
    ]


class BenchSession:
    """The main-thread side of ``UDSSession``, in memory: the bench queues decoded
    frames (the reader thread's work is not measured), the runtime's frames are
    encoded as the session would encode them and then dropped."""

    def __init__(self) -> None:
        self.incoming: list[Frame] = []
        self.sent: list[bytes] = []

    def send_message(self, envelope: dict[str, Any], sidecar: bytes | None = None) -> None:
        if keys.F_EXECUTOR_ID not in envelope:
            envelope[keys.F_EXECUTOR_ID] = "bench"
        self.sent.append(encode_frame(envelope, sidecar))

    def send_encoded(self, frame: bytes) -> None:
        self.sent.append(frame)

    def drain_incoming(self) -> list[Frame]:
        frames, self.incoming = self.incoming, []
        return frames

    def has_incoming(self) -> bool:
        return bool(self.incoming)

    def is_connected(self) -> bool:
        return True


def one_at_a_time(runtime: ExecutorRuntime, frames: list[Frame]) -> float:
    session = runtime._session
    assert isinstance(session, BenchSession)
    sent = session.sent
    run = runtime.run_until_idle
    t0 = time.thread_time()
    for frame in frames:
        session.incoming.append(frame)
        run()
        sent.clear()
    return time.thread_time() - t0


def batched(runtime: ExecutorRuntime, frames: list[Frame]) -> float:
    session = runtime._session
    assert isinstance(session, BenchSession)
    sent = session.sent
    run = runtime.run_until_idle
    t0 = time.thread_time()
    for start in range(0, len(frames), BATCH):
        session.incoming.extend(frames[start : start + BATCH])
        run()
        sent.clear()
    return time.thread_time() - t0


def resume_frame(
    call_id: str, request_id: str, budget_used_ms: int = 0, *, immutable: bool = False
) -> Frame:
    """The ResumeCall answering a wait, as a dict envelope (the generic path); the
    worker writes the same envelope (link/outbound.py's send_resume_call)."""
    payload: dict[str, Any] = {
        keys.FP_RESUME_KIND: keys.WAIT_IO,
        keys.FP_RESULT: {"v": 1},
        keys.FP_BUDGET_USED_MS: budget_used_ms,
    }
    if immutable:
        payload[keys.FP_IMMUTABLE] = True
    return Frame(
        {
            keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
            keys.F_CALL_ID: call_id,
            keys.F_REQUEST_ID: request_id,
            keys.F_PAYLOAD: payload,
        }
    )


def io_waits(
    runtime: ExecutorRuntime,
    frames: list[Frame],
    resume: Callable[[str, str], Frame] = resume_frame,
) -> float:
    """Batches of calls; every wait is answered (``resume`` builds the ResumeCall) before
    the next run_until_idle."""
    session = runtime._session
    assert isinstance(session, BenchSession)
    sent = session.sent
    run = runtime.run_until_idle
    get_context = runtime.get_context
    t0 = time.thread_time()
    for start in range(0, len(frames), BATCH):
        batch = frames[start : start + BATCH]
        session.incoming.extend(batch)
        run()
        sent.clear()
        waiting = [_call_id(frame) for frame in batch]
        while waiting:
            still = []
            for call_id in waiting:
                ctx = get_context(call_id)
                if ctx is None:
                    continue
                still.append(call_id)
                assert ctx.pending_request_id is not None
                session.incoming.append(resume(call_id, ctx.pending_request_id))
            run()
            sent.clear()
            waiting = still
    return time.thread_time() - t0


def _call_id(frame: Frame) -> str:
    """The callId of a dict envelope or of a typed one (as the reader decodes them)."""
    envelope: Any = frame.envelope
    return envelope[keys.F_CALL_ID] if type(envelope) is dict else envelope.callId


def measure_io(calls: int) -> float:
    """µs per CallWaiting → ResumeCall round trip: (t(10 reads) - t(0 reads)) / 10."""
    runtime = make_runtime()
    try:
        io_waits(runtime, envelopes(1000, "warm", IO_READS))
        with_reads = io_waits(runtime, envelopes(calls, "io", IO_READS))
        without = io_waits(runtime, envelopes(calls, "none", 0))
        stats = runtime.stats()
        assert stats["calls_completed"] == 2 * calls + 1000, stats
        return (with_reads - without) / calls / IO_READS * 1e6
    finally:
        runtime.shutdown()


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
    parser.add_argument("--io", action="store_true", help="with --profile: the IO loop")
    args = parser.parse_args()

    if args.profile:
        runtime = make_runtime()
        if args.io:
            loop, reads = io_waits, IO_READS
        else:
            loop, reads = one_at_a_time, None
        loop(runtime, envelopes(2000, "warm", reads))
        frames = envelopes(args.calls, "run", reads)
        profiler = cProfile.Profile()
        profiler.enable()
        loop(runtime, frames)
        profiler.disable()
        runtime.shutdown()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(70)
        return

    results: dict[str, list[float]] = {"one": [], "batched": [], "io": []}
    for _ in range(args.repeats):  # interleaved, so drift hits every shape alike
        for shape in results:
            if shape == "io":
                results[shape].append(measure_io(args.calls // 4))
            else:
                results[shape].append(measure(shape, args.calls))
    print(f"runtime loop, in process: {args.calls} trivial calls, {args.repeats} runs each")
    print(f"| {'shape':<32} | {'median µs/call':>14} | {'best µs/call':>12} |")
    print(f"| {'-' * 32} | {'-' * 14}:| {'-' * 12}:|")
    labels = {
        "one": "one at a time",
        "batched": f"batched ({BATCH} per run_until_idle)",
        "io": "IO wait round trip (batched)",
    }
    for shape, values in results.items():
        median, best = statistics.median(values), min(values)
        print(f"| {labels[shape]:<32} | {median:>14.2f} | {best:>12.2f} |")
    for shape, values in results.items():
        print(f"runs ({shape}): " + ", ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()

"""Pipelined ExecuteCall -> CallCompleted pairs/s through the ExecutorAdapter.

Run: .venv/bin/python bench/adapter_frames.py [--seconds 2] [--inflight 256] [--profile]

Both sides are real: the worker side runs on uvloop in this process; a minimal
fast executor peer runs in a child process (the other core) and answers every
ExecuteCall with a CallCompleted, one write per read. Rows, interleaved and
repeated (median of ``--rounds``):

* ``bare floor`` — the floor of docs/operations.md ("The figures the design
  is built on"): a bare uvloop ``Protocol`` that decodes replies with
  ``FrameDecoder`` and writes each new ExecuteCall from a pre-encoded template,
  one write per read.
* ``adapter`` — the real thing: ``bind`` + ``send_execute_call`` (a fresh
  payload dict, encoded with orjson) for every call, the reply through the
  connection's decoder, the reservation released by the terminal frame, and
  ``on_call_completed`` appending to a list that ``on_batch_done`` drains the
  way the dispatch actor will (one batch per read).
* ``adapter, 1 in flight`` — one call at a time (round-trip latency bound).

``--profile`` runs the adapter row under cProfile and prints the top functions
by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple

import orjson
import uvloop

from blockx.wire import FrameDecoder, encode_frame, keys
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.link.callbacks import AdapterCallbacks

_U32 = struct.Struct(">I")


class Result(NamedTuple):
    pairs: int
    wall_s: float
    #: CPU seconds of the worker side (this process) over the same window.
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.pairs / self.wall_s

    @property
    def cpu_us_per_pair(self) -> float:
        return self.cpu_s * 1e6 / max(self.pairs, 1)


EXECUTE_PAYLOAD: dict[str, Any] = {
    "taskId": "task-7f3a",
    "functionId": "pricing/adder",
    "functionCodeDigest": "sha256:" + "ab" * 32,
    "entrySelector": "_",
    "args": {"left": 12345, "right": 67890, "chain": "eth", "block": 19000000},
    "parentCallId": None,
    "callKey": "ck-" + "cd" * 16,
    "ancestry": [],
    "callBudgetMs": 5000,
    "attemptSeq": 1,
    "audit": None,
    "debug": False,
}

# --- the executor peer (child process) ------------------------------------------------------

_REPLY_PREFIX = b'{"messageType":"CallCompleted","callId":'
_REPLY_SUFFIX = (
    b',"executorId":"exec-0","payload":{"taskId":"task-7f3a","attemptSeq":1,'
    b'"output":{"sum":80235},"budgetUsedMs":0,"effectiveExecutionDurationUs":3,"queueWaitUs":1}}'
)


class _Peer(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None]) -> None:
        self.decoder = FrameDecoder()
        self.done = done

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        heartbeat = {
            keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT,
            keys.F_EXECUTOR_ID: "exec-0",
            keys.F_PAYLOAD: {
                keys.FP_EXECUTOR_ID: "exec-0",
                keys.FP_HEARTBEAT_SEQ: 1,
                keys.FP_AVAILABLE_CONTEXTS: keys.UNLIMITED_CONTEXTS,
            },
        }
        transport.write(encode_frame(heartbeat))

    def data_received(self, data: bytes) -> None:
        out = []
        dumps = orjson.dumps
        pack = _U32.pack
        for frame in self.decoder.feed(data):
            envelope = frame[0]
            if envelope["messageType"] != "ExecuteCall":
                continue
            body = _REPLY_PREFIX + dumps(envelope["callId"]) + _REPLY_SUFFIX
            out.append(pack(len(body)))
            out.append(body)
        if out:
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _peer_main(path: str) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    await loop.create_unix_connection(lambda: _Peer(done), path)
    await done


def _start_peer(path: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--peer", path])


def _reap(peer: subprocess.Popen[bytes]) -> None:
    try:
        peer.wait(5)
    except subprocess.TimeoutExpired:
        peer.kill()
        peer.wait()


# --- the worker side -----------------------------------------------------------------------


class _BareDriver(asyncio.Protocol):
    """The floor: decode replies, write the next ExecuteCall from a template."""

    def __init__(self, inflight: int) -> None:
        self.decoder = FrameDecoder()
        self.inflight = inflight
        self.completed = 0
        self.seq = 0
        self.attached: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        envelope = {
            "messageType": "ExecuteCall",
            "callId": "@@CALL@@",
            "payload": EXECUTE_PAYLOAD,
        }
        prefix, _, suffix = orjson.dumps(envelope).partition(b'"@@CALL@@"')
        self.prefix, self.suffix = prefix, suffix

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def _frame(self) -> bytes:
        self.seq += 1
        body = self.prefix + orjson.dumps(f"t/c{self.seq}") + self.suffix
        return _U32.pack(len(body)) + body

    def data_received(self, data: bytes) -> None:
        frames = self.decoder.feed(data)
        if not self.attached.done():
            self.attached.set_result(None)
            self.transport.write(b"".join(self._frame() for _ in range(self.inflight)))
            return
        out = []
        for frame in frames:
            if frame[0]["messageType"] == "CallCompleted":
                self.completed += 1
                out.append(self._frame())
        if out:
            # Coalesced like the adapter: up to 64 frames per write.
            for i in range(0, len(out), 64):
                self.transport.write(b"".join(out[i : i + 64]))


async def bench_bare(seconds: float, inflight: int) -> Result:
    loop = asyncio.get_running_loop()
    directory = tempfile.mkdtemp(prefix="blockx-bench-")
    path = os.path.join(directory, "bare.sock")
    drivers: list[_BareDriver] = []

    def factory() -> _BareDriver:
        drivers.append(_BareDriver(inflight))
        return drivers[-1]

    server = await loop.create_unix_server(factory, path)
    peer = _start_peer(path)
    try:
        while not drivers:
            await asyncio.sleep(0.005)
        driver = drivers[0]
        await driver.attached
        await asyncio.sleep(0.2)  # warm-up
        start_count, start, cpu = driver.completed, time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        pairs = driver.completed - start_count
        return Result(pairs, time.perf_counter() - start, time.process_time() - cpu)
    finally:
        server.close()
        for d in drivers:
            d.transport.abort()
        await asyncio.sleep(0.01)
        _reap(peer)
        os.unlink(path)
        os.rmdir(directory)


class _AdapterDriver:
    """Plays the dispatch actor: completions queued by the callback, handled per batch."""

    def __init__(self, inflight: int) -> None:
        self.inflight = inflight
        self.completed = 0
        self.seq = 0
        self.pending: list[str] = []
        self.adapter: ExecutorAdapter | None = None
        self.attached: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def callbacks(self) -> AdapterCallbacks:
        pending = self.pending

        def on_call_completed(executor_id: str, call_id: str, payload: dict[str, Any]) -> None:
            pending.append(call_id)

        def on_attached(executor_id: str, snapshot: Any) -> None:
            self.attached.set_result(None)

        return AdapterCallbacks(
            on_call_completed=on_call_completed,
            on_batch_done=self.on_batch_done,
            on_executor_attached=on_attached,
        )

    def dispatch_one(self) -> None:
        adapter = self.adapter
        assert adapter is not None
        self.seq += 1
        call_id = f"t/c{self.seq}"
        adapter.bind(call_id, "exec-0")
        adapter.send_execute_call("exec-0", call_id, {**EXECUTE_PAYLOAD, "attemptSeq": 1})

    def on_batch_done(self, executor_id: str) -> None:
        pending = self.pending
        if not pending:
            return
        adapter = self.adapter
        assert adapter is not None
        self.completed += len(pending)
        for call_id in pending:
            adapter.unbind(call_id, executor_id)  # already released by the terminal frame
            self.dispatch_one()
        pending.clear()


async def bench_adapter(seconds: float, inflight: int, profile: cProfile.Profile | None) -> Result:
    driver = _AdapterDriver(inflight)
    adapter = ExecutorAdapter(callbacks=driver.callbacks(), outbox_depth=max(256, inflight))
    driver.adapter = adapter
    path = await adapter.start()
    peer = _start_peer(path)
    try:
        await driver.attached
        for _ in range(inflight):
            driver.dispatch_one()
        await asyncio.sleep(0.2)  # warm-up
        if profile is not None:
            profile.enable()
        start_count, start, cpu = driver.completed, time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        result = Result(
            driver.completed - start_count, time.perf_counter() - start, time.process_time() - cpu
        )
        if profile is not None:
            profile.disable()
        return result
    finally:
        await adapter.close()
        _reap(peer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        uvloop.run(_peer_main(args.peer))
        return

    if args.profile:
        profile = cProfile.Profile()
        result = uvloop.run(bench_adapter(args.seconds, args.inflight, profile))
        print(
            f"adapter under cProfile: {result.rate:,.0f} pairs/s, "
            f"{result.cpu_us_per_pair:.2f} us CPU/pair (profiling overhead included)"
        )
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
        return

    rows: dict[str, list[Result]] = {"bare floor": [], "adapter": [], "adapter, 1 in flight": []}
    for _ in range(args.rounds):
        rows["bare floor"].append(uvloop.run(bench_bare(args.seconds, args.inflight)))
        rows["adapter"].append(uvloop.run(bench_adapter(args.seconds, args.inflight, None)))
        rows["adapter, 1 in flight"].append(uvloop.run(bench_adapter(args.seconds, 1, None)))
    floor = statistics.median(r.rate for r in rows["bare floor"])
    floor_cpu = statistics.median(r.cpu_us_per_pair for r in rows["bare floor"])
    print(
        f"ExecuteCall->CallCompleted pairs/s, {args.inflight} in flight unless noted, "
        f"median of {args.rounds} x {args.seconds:g}s (docs/operations.md floor: 449,000 pairs/s).\n"
        "CPU = worker-side process time per pair: robust when another process shares the cores."
    )
    for name, results in rows.items():
        rate = statistics.median(r.rate for r in results)
        cpu = statistics.median(r.cpu_us_per_pair for r in results)
        print(
            f"  {name:<22} {rate:>10,.0f} pairs/s ({rate / floor:4.2f}x floor)   "
            f"{cpu:6.2f} us CPU/pair ({cpu / floor_cpu:4.2f}x floor)   "
            f"runs: {', '.join(f'{r.rate:,.0f}' for r in results)}"
        )


if __name__ == "__main__":
    main()

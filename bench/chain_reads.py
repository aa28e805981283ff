"""Chain reads: ``blockx run`` against a thread pool and asyncio, over a local JSON-RPC node.

The workload users run most: calls that each read a few account balances at a
block. ``--calls`` calls, each making ``--reads`` sequential
``ChainState("eth", block).get_address_balance(address)`` reads, in two
workloads:

* **distinct** — every read a different address at one block number: nothing
  repeats, so nothing can be answered from a cache; batching is all a system
  can win;
* **repeated** — the addresses drawn (seeded) from 100 at one block number:
  a system that remembers immutable reads makes ~100 of them.

The node (:class:`Node`) is an Ethereum JSON-RPC server on 127.0.0.1 in a child
process of its own (``bench/chain_reads.py --serve-node``), so its CPU is not
the driver's — but it shares the machine's cores with everything measured.
It is a bare ``asyncio.Protocol`` speaking HTTP/1.1 keep-alive (a request with a
``Content-Length`` body, one response per request, in order), because
``aiohttp.web`` costs ~1.5x the CPU per request (200 µs against 130 µs of the
node's CPU per keep-alive request, measured on the 2-core machine, syscalls
included) and would tax the peers, which send one HTTP request per read, far
more than BlockX. Each HTTP request — one JSON-RPC object or a batch array — is
answered ``--delay-ms`` after it arrived (one timer per request). It counts HTTP requests and JSON-RPC requests
(``GET /stats``, reset by ``POST /reset`` before every run).
``eth_getBalance(address, block)`` answers
``int(sha256(f"{address.lower()}:{block}"), 16) % 10**24`` (beyond 64 bits,
as real wei balances are), in hex; any other method or a block tag is a
JSON-RPC error. Every system's answers are checked against that formula (and
the call order): a wrong or missing answer stops the bench with an error.

Systems, interleaved within each repeat, medians of ``--repeats``:

* **BlockX** — the whole ``blockx run`` process (``bench/blockx_process.py``):
  a task file in a temporary directory with the function's source inline,
  the calls as a calls file (a stream), ``io.rpc.endpoints`` pointing at the
  node, rows to a file, ``--executors`` executors; the product's defaults
  otherwise (``io.rpc.max_batch`` 100, the task's read cache). Its rate is over
  the process's wall time. Start-up is measured apart: a one-call run of the
  same task (before every repeat) is the fixed cost of the process (interpreter,
  imports, executors, shutdown), and ``calls / (wall - fixed)`` the
  steady-state rate; the summary's ``task_wall_time_s`` rate is printed too
  (it counts from the task's submission, executors' start included).
* **ThreadPoolExecutor(256) + http.client** — one keep-alive
  ``http.client.HTTPConnection`` per thread, one JSON-RPC request (one HTTP
  request) per read, ``json`` to encode and decode; the pool is created inside
  the timed run.
* **asyncio + aiohttp** — one ``ClientSession`` (``TCPConnector(limit=256)``),
  256 coroutines taking calls from a shared counter, one request per read; the
  session is created inside the timed run.

Printed per workload: calls/s, HTTP and JSON-RPC requests the node saw, and
BlockX's ratio to the best peer; then BlockX's start-up and steady-state rate.

``--inflight 256,512`` adds BlockX runs (interleaved with the rest) with that many
calls in flight per executor (``--set dispatcher.executor_max_inflight=N``; the
default, the seed's, is 128: 256 in flight with 2 executors, as many as the peers
have). Whether the calls in flight or the CPU bound a run shows here. 2026-12-03,
medians of 3 interleaved repeats, distinct: 6,187 calls/s at 128 per executor,
6,199 at 256, 6,680 at 512, 6,902 at 1,024 (runs ranged 4,595-7,906); repeated:
23,038, 27,996, 25,167, 26,437. So ~10% more at most: the CPU (the worker's and
the executors' per read) bounds it, not the calls in flight. The peers are
CPU-bound at 256 already: the same day, 6,000 distinct calls, ThreadPool
1,480-1,546 calls/s with 256 threads and 1,471-1,553 with 1,024; aiohttp
1,608-2,028 with 256 coroutines and 1,277-1,416 with 1,024. So they keep 256.
Figures are only worth anything on a quiet machine: the node, the driver and
BlockX's processes all share its cores.

    .venv/bin/python bench/chain_reads.py [--calls 10000] [--reads 5] [--executors 2]
        [--repeats 3] [--delay-ms 2] [--workloads distinct,repeated] [--inflight 256,512]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import hashlib
import http.client
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockx_process import (
    SRC,
    ProcessRun,
    format_rate,
    read_rows,
    run_blockx,
    steady_cpu_per_call,
    steady_rate,
    write_task,
)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BLOCK = 19_000_000
CHAIN = "eth"
REPEATED_ADDRESSES = 100
PEER_CONCURRENCY = 256
WORKLOADS = ("distinct", "repeated")

READS_FUNCTION = """
def _(p):
    state = ChainState("eth", p["block"])
    return {"i": p["i"], "b": [state.get_address_balance(a) for a in p["addresses"]]}
"""


def balance(address: str, block: int) -> int:
    """The node's balance of ``address`` at ``block``: what every system must read."""
    digest = hashlib.sha256(f"{address.lower()}:{block}".encode()).hexdigest()
    return int(digest, 16) % 10**24


def address_of(n: int) -> str:
    return "0x" + format(n, "040x")


def workload_addresses(workload: str, calls: int, reads: int) -> list[list[str]]:
    """Each call's addresses, in read order."""
    if workload == "distinct":
        return [[address_of(i * reads + k + 1) for k in range(reads)] for i in range(calls)]
    if workload == "repeated":
        rng = random.Random(18)
        pool = [address_of(0xA000 + n) for n in range(REPEATED_ADDRESSES)]
        return [[rng.choice(pool) for _ in range(reads)] for _ in range(calls)]
    raise SystemExit(f"unknown workload {workload!r} (workloads: {', '.join(WORKLOADS)})")


def expected_balances(addresses: list[list[str]]) -> list[list[int]]:
    return [[balance(a, BLOCK) for a in call] for call in addresses]


def check(system: str, got: list[list[int]], expected: list[list[int]]) -> None:
    """Fail the bench loudly on any wrong or missing answer."""
    if got != expected:
        wrong = next(
            (i for i, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e),
            min(len(got), len(expected)),
        )
        raise SystemExit(
            f"{system}: wrong answers: {len(got)} calls answered of {len(expected)}; "
            f"first difference at call {wrong}: "
            f"{got[wrong] if wrong < len(got) else None} != "
            f"{expected[wrong] if wrong < len(expected) else None}"
        )


# --- the node ------------------------------------------------------------------------------


class _Counts:
    def __init__(self) -> None:
        self.http = 0
        self.rpc = 0


class NodeProtocol(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection of the node. Requests are parsed from the
    buffer (headers, then ``Content-Length`` bytes); each JSON-RPC body is answered
    ``delay_s`` later, in arrival order (equal delays keep the order)."""

    def __init__(self, counts: _Counts, delay_s: float, skew: int = 0) -> None:
        self.counts = counts
        self.delay_s = delay_s
        self.skew = skew  # added to every balance: only to prove that the checks fail
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
                elif name.strip().lower() == "transfer-encoding":
                    self._respond(411, b'"chunked bodies are not supported"', 0)
                    return
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            method, path = head[0].split(" ")[:2]
            self._request(method, path, body)

    def _request(self, method: str, path: str, body: bytes) -> None:
        counts = self.counts
        if method == "GET" and path == "/stats":
            self._respond(200, json.dumps({"http": counts.http, "rpc": counts.rpc}).encode(), 0)
            return
        if method == "POST" and path == "/reset":
            counts.http = counts.rpc = 0
            self._respond(200, b"{}", 0)
            return
        counts.http += 1
        try:
            request = json.loads(body)
        except ValueError:
            self._respond(400, b'"not JSON"', self.delay_s)
            return
        if isinstance(request, list):
            counts.rpc += len(request)
            answer: Any = [self._answer(item) for item in request]
        else:
            counts.rpc += 1
            answer = self._answer(request)
        self._respond(200, json.dumps(answer, separators=(",", ":")).encode(), self.delay_s)

    def _answer(self, item: Any) -> dict[str, Any]:
        rid = item.get("id") if isinstance(item, dict) else None
        try:
            assert isinstance(item, dict) and item.get("method") == "eth_getBalance"
            address, block = item["params"]
            assert isinstance(block, str) and block.startswith("0x")
            result = hex(balance(address, int(block, 16)) + self.skew)
        except (AssertionError, KeyError, TypeError, ValueError):
            error = {
                "code": -32601,
                "message": f"this node answers eth_getBalance at a block number only, not {item!r}",
            }
            return {"jsonrpc": "2.0", "id": rid, "error": error}
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def _respond(self, status: int, body: bytes, delay_s: float) -> None:
        reason = {200: "OK", 400: "Bad Request", 411: "Length Required"}[status]
        message = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        if delay_s > 0:
            asyncio.get_running_loop().call_later(delay_s, self._write, message)
        else:
            self._write(message)

    def _write(self, message: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(message)


def serve_node(delay_ms: float, skew: int) -> None:
    """The node's process: print the port, serve until stdin closes (the driver went away)."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        counts = _Counts()
        server = await loop.create_server(
            lambda: NodeProtocol(counts, delay_ms / 1000, skew), "127.0.0.1", 0, backlog=1024
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        await loop.run_in_executor(None, sys.stdin.read)
        server.close()

    asyncio.run(serve())


class Node:
    """The node's child process, seen from the driver: ``url``, ``reset()``, ``stats()``."""

    def __init__(self, delay_ms: float, skew: int = 0) -> None:
        argv = [sys.executable, __file__, "--serve-node", "--delay-ms", str(delay_ms)]
        self.process = subprocess.Popen(
            [*argv, "--node-skew", str(skew)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            raise SystemExit(f"the JSON-RPC node did not start (it printed {line!r})")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}/"

    def _get(self, method: str, path: str) -> dict[str, int]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body=b"" if method == "POST" else None)
            return json.loads(connection.getresponse().read())  # type: ignore[no-any-return]
        finally:
            connection.close()

    def reset(self) -> None:
        self._get("POST", "/reset")

    def stats(self) -> dict[str, int]:
        return self._get("GET", "/stats")

    def cpu_s(self) -> float:
        """The node process's CPU seconds so far (``/proc``: Linux)."""
        with open(f"/proc/{self.process.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- the systems -----------------------------------------------------------------------------


def write_reads_task(
    directory: Path, node_url: str, addresses: list[list[str]]
) -> tuple[Path, int]:
    """The workload as a task (``task.yaml``, its calls file) reading from ``node_url``."""
    return write_task(
        directory,
        {"reads": READS_FUNCTION},
        (
            {"function": "reads", "args": {"i": i, "block": BLOCK, "addresses": call}}
            for i, call in enumerate(addresses)
        ),
        io={"rpc": {"endpoints": {CHAIN: [node_url]}}},
    )


def blockx_run(
    node: Node,
    addresses: list[list[str]],
    executors: int,
    directory: Path,
    knobs: tuple[str, ...] = (),
) -> ProcessRun:
    """``blockx run`` over the node (``knobs``: ``--set`` settings); the rows are read
    back by :func:`blockx_answers`."""
    task, n = write_reads_task(directory, node.url, addresses)
    return run_blockx(task, n, executors, knobs=knobs)


def blockx_answers(run: ProcessRun, calls: int) -> list[list[int]]:
    got: list[list[int] | None] = [None] * calls
    for row in read_rows(run.rows_path):
        got[row["i"]] = row["b"]
    return [g if g is not None else [] for g in got]


def threads_run(port: int, addresses: list[list[str]]) -> list[list[int]]:
    """ThreadPoolExecutor(256), one keep-alive HTTPConnection per thread, one request per read."""
    local = threading.local()
    block = hex(BLOCK)

    def call(addrs: list[str]) -> list[int]:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection("127.0.0.1", port)
        out = []
        for k, address in enumerate(addrs):
            body = json.dumps(
                {"jsonrpc": "2.0", "id": k, "method": "eth_getBalance", "params": [address, block]}
            )
            connection.request("POST", "/", body, {"Content-Type": "application/json"})
            out.append(int(json.loads(connection.getresponse().read())["result"], 16))
        return out

    with concurrent.futures.ThreadPoolExecutor(PEER_CONCURRENCY) as pool:
        return list(pool.map(call, addresses))


def aiohttp_run(url: str, addresses: list[list[str]]) -> list[list[int]]:
    """asyncio + aiohttp: 256 coroutines over one ClientSession, one request per read."""
    import aiohttp

    block = hex(BLOCK)
    out: list[list[int]] = [[] for _ in addresses]

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=PEER_CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector) as session:
            next_call = itertools.count()

            async def worker() -> None:
                while (i := next(next_call)) < len(addresses):
                    balances = []
                    for k, address in enumerate(addresses[i]):
                        body = {
                            "jsonrpc": "2.0",
                            "id": k,
                            "method": "eth_getBalance",
                            "params": [address, block],
                        }
                        async with session.post(url, json=body) as response:
                            answer = await response.json()
                        balances.append(int(answer["result"], 16))
                    out[i] = balances

            await asyncio.gather(*(worker() for _ in range(PEER_CONCURRENCY)))

    asyncio.run(main())
    return out


# --- the run ---------------------------------------------------------------------------------


def timed_peer(
    name: str, node: Node, addresses: list[list[str]], expected: list[list[int]]
) -> dict[str, float]:
    node.reset()
    node_cpu0 = node.cpu_s()
    cpu0 = time.process_time()  # the peers run in this process (its threads included)
    t0 = time.perf_counter()
    if name == "threads":
        got = threads_run(node.port, addresses)
    else:
        got = aiohttp_run(node.url, addresses)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    node_cpu = node.cpu_s() - node_cpu0
    check(PEERS[name], got, expected)
    calls = len(addresses)
    return {
        "calls_per_s": calls / wall,
        "cpu_per_call_s": cpu / calls,
        "node_cpu_per_call_s": node_cpu / calls,
        **node.stats(),
    }


def timed_blockx(
    node: Node,
    addresses: list[list[str]],
    expected: list[list[int]],
    executors: int,
    directory: Path,
    knobs: tuple[str, ...] = (),
) -> dict[str, float]:
    node.reset()
    node_cpu0 = node.cpu_s()
    run = blockx_run(node, addresses, executors, directory, knobs)
    node_cpu = node.cpu_s() - node_cpu0
    check("BlockX", blockx_answers(run, len(addresses)), expected)
    return {
        "calls_per_s": run.calls_per_s,
        "cpu_s": run.cpu_s,
        "node_cpu_per_call_s": node_cpu / len(addresses),
        "task_calls_per_s": run.calls / run.task_wall_s,
        "wall_s": run.wall_s,
        "outside_s": run.outside_command_clock_s,
        **node.stats(),
    }


def _steady(calls: int, results: dict[str, list[dict[str, float]]], startup: list[float]) -> str:
    rate = steady_rate(calls, [r["wall_s"] for r in results["blockx"]], startup)
    if rate is None:
        return "n/a (a run no longer than start-up: use more calls)"
    best = max(statistics.median(r["calls_per_s"] for r in results[s]) for s in PEERS)
    return f"{format_rate(rate)} calls/s ({rate / best:.2f}x)"


PEERS = {
    "threads": f"ThreadPool({PEER_CONCURRENCY}) + http.client",
    "aiohttp": f"asyncio + aiohttp, {PEER_CONCURRENCY} coroutines",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--inflight",
        default="",
        help="extra BlockX runs with these calls in flight per executor "
        "(dispatcher.executor_max_inflight), e.g. 256,512",
    )
    parser.add_argument("--serve-node", action="store_true", help=argparse.SUPPRESS)
    # A node whose balances are off by this much: the checks must stop the bench (a test).
    parser.add_argument("--node-skew", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_node:
        serve_node(args.delay_ms, args.node_skew)
        return
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    try:
        inflight = [int(n) for n in args.inflight.split(",") if n.strip()]
    except ValueError:
        inflight = [0]
    if any(n < 1 for n in inflight):
        parser.error(
            f"--inflight takes positive numbers of calls per executor, e.g. 256,512; "
            f"got {args.inflight!r}"
        )
    swept = {f"blockx@{n}": n for n in inflight}
    plans = {w: workload_addresses(w, args.calls, args.reads) for w in workloads}
    expected = {w: expected_balances(a) for w, a in plans.items()}

    node = Node(args.delay_ms, args.node_skew)
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        w: {"blockx": [], "threads": [], "aiohttp": [], **{k: [] for k in swept}} for w in workloads
    }
    startup: list[float] = []
    startup_cpu: list[float] = []
    outside: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-chain-reads-") as tmp:
            root = Path(tmp)
            one = workload_addresses("distinct", 1, args.reads)
            for r in range(args.repeats):
                # The fixed cost of a blockx run process: the same task with one call.
                node.reset()
                first = blockx_run(node, one, args.executors, root / f"one-{r}")
                check("BlockX (one call)", blockx_answers(first, 1), expected_balances(one))
                startup.append(first.wall_s)
                startup_cpu.append(first.cpu_s)
                outside.append(first.outside_command_clock_s)
                for w in workloads:
                    order = ["blockx", "threads", "aiohttp", *swept]
                    turn = r % len(order)
                    order = order[turn:] + order[:turn]  # each system goes first in turn
                    for system in order:
                        if system.startswith("blockx"):
                            knobs = ()
                            if system in swept:
                                knobs = (f"dispatcher.executor_max_inflight={swept[system]}",)
                            result = timed_blockx(
                                node,
                                plans[w],
                                expected[w],
                                args.executors,
                                root / f"{w}-{r}-{system}",
                                knobs,
                            )
                        else:
                            result = timed_peer(system, node, plans[w], expected[w])
                        results[w][system].append(result)
    finally:
        node.close()

    med = statistics.median
    print(
        f"\nchain reads: {args.calls:,} calls x {args.reads} balance reads, node answers each "
        f"HTTP request after {args.delay_ms:g} ms, BlockX with {args.executors} executors "
        f"(whole blockx run process); medians of {args.repeats}, every answer checked"
    )
    print(
        f"| {'workload: system':<48} | {'calls/s':>9} | {'HTTP reqs':>9} | {'JSON-RPC reqs':>13} | {'BlockX ratio':>12} |"
    )
    print(f"| {'-' * 48} | {'-' * 9}:| {'-' * 9}:| {'-' * 13}:| {'-' * 12}:|")
    for w in workloads:
        bx = med(r["calls_per_s"] for r in results[w]["blockx"])
        peers = {s: med(r["calls_per_s"] for r in results[w][s]) for s in PEERS}
        best = max(peers, key=lambda s: peers[s])
        for system, label, rate in [
            ("blockx", "BlockX, blockx run", bx),
            *((s, PEERS[s], peers[s]) for s in PEERS),
        ]:
            runs = results[w][system]
            ratio = "1.00x" if system == "blockx" else f"{bx / rate:.2f}x"
            print(
                f"| {f'{w}: {label}':<48} | {rate:>9,.0f} | {med(r['http'] for r in runs):>9,.0f} |"
                f" {med(r['rpc'] for r in runs):>13,.0f} | {ratio:>12} |"
            )
        print(
            f"| {f'{w}: BlockX / best peer ({best})':<48} | {'':>9} | {'':>9} | {'':>13} | {bx / peers[best]:>11.2f}x |"
        )
    print(
        f"BlockX start-up (a one-call blockx run process, wall): {med(startup) * 1000:,.0f} ms, "
        f"of which {med(outside) * 1000:,.0f} ms before and after the command's own clock "
        "(interpreter, imports, input checks, exit); "
        "steady state, calls / (wall - start-up), and its ratio to the best peer: "
        + "; ".join(f"{w} {_steady(args.calls, results[w], startup)}" for w in workloads)
        + "; the summary's task rate (from submission, executors' start included): "
        + "; ".join(
            f"{w} {med(r['task_calls_per_s'] for r in results[w]['blockx']):,.0f}"
            for w in workloads
        )
    )
    _print_cpu(args, workloads, results, swept, startup_cpu)
    if swept:
        _print_inflight(args, workloads, results, swept)
    print(
        "runs (calls/s): "
        + "; ".join(
            f"{w} {s} " + ", ".join(f"{r['calls_per_s']:,.0f}" for r in results[w][s])
            for w in workloads
            for s in ("blockx", *PEERS, *swept)
        )
    )


def default_inflight() -> int:
    """``dispatcher.executor_max_inflight``'s default in this checkout (the seed's
    ``ExecutorMaxInflight``): what the ``blockx run`` children get without ``--set``."""
    sys.path.insert(0, str(SRC))
    from blockx.worker.core.config import DispatcherConfig

    return DispatcherConfig().executor_max_inflight


def _print_cpu(
    args: argparse.Namespace,
    workloads: list[str],
    results: dict[str, dict[str, list[dict[str, float]]]],
    swept: dict[str, int],
    startup_cpu: list[float],
) -> None:
    """CPU per call: each system's own processes, and the node's."""
    med = statistics.median
    print(
        "\nCPU per call, µs (medians): the system's own processes -- BlockX: the worker, its "
        "executors and their fork server (getrusage(RUSAGE_CHILDREN) around the process, a "
        "one-call run's subtracted); a peer: this process, its threads included "
        "(time.process_time) -- and the node's (/proc), both sharing the machine's cores"
    )
    print(f"| {'workload: system':<48} | {'own CPU':>9} | {'node CPU':>9} |")
    print(f"| {'-' * 48} | {'-' * 9}:| {'-' * 9}:|")
    for w in workloads:
        for system in ("blockx", *PEERS, *swept):
            runs = results[w][system]
            if system.startswith("blockx"):
                own = steady_cpu_per_call(args.calls, [r["cpu_s"] for r in runs], startup_cpu)
                label = "BlockX, blockx run"
                if system in swept:
                    label += f", {swept[system]} in flight per executor"
            else:
                own = med(r["cpu_per_call_s"] for r in runs)
                label = PEERS[system]
            node = med(r["node_cpu_per_call_s"] for r in runs)
            own_text = "n/a" if own is None else f"{own * 1e6:,.1f}"
            print(f"| {f'{w}: {label}':<48} | {own_text:>9} | {node * 1e6:>9,.1f} |")


def _print_inflight(
    args: argparse.Namespace,
    workloads: list[str],
    results: dict[str, dict[str, list[dict[str, float]]]],
    swept: dict[str, int],
) -> None:
    """The ``--inflight`` rows: BlockX with more calls in flight, against the same peers."""
    med = statistics.median
    default = default_inflight()
    print(
        f"\nBlockX with more calls in flight (dispatcher.executor_max_inflight per executor, "
        f"x {args.executors} executors; the default is {default}); the peers keep "
        f"{PEER_CONCURRENCY}, which more does not help (see the module docstring)"
    )
    print(
        f"| {'workload: calls in flight':<48} | {'calls/s':>9} | {'HTTP reqs':>9} | {'vs best peer':>12} |"
    )
    print(f"| {'-' * 48} | {'-' * 9}:| {'-' * 9}:| {'-' * 12}:|")
    for w in workloads:
        best = max(med(r["calls_per_s"] for r in results[w][s]) for s in PEERS)
        rows = [("blockx", default), *swept.items()]
        for system, per_executor in rows:
            runs = results[w][system]
            rate = med(r["calls_per_s"] for r in runs)
            label = f"{w}: {per_executor} x {args.executors} = {per_executor * args.executors}"
            print(
                f"| {label:<48} | {rate:>9,.0f} | {med(r['http'] for r in runs):>9,.0f} |"
                f" {rate / best:>11.2f}x |"
            )


if __name__ == "__main__":
    main()

"""``blockx run --ray`` against plain ``blockx run``, and 1 -> 2 -> 3 simulated Ray nodes.

Part 1: the same ``--calls`` (100,000) trivial calls (a calls file) through
``blockx run TASK --ray auto`` (a one-node local Ray instance) and through plain
``blockx run TASK``, both as real CLI subprocesses with the same executors,
interleaved, ``--repeats`` times; the figure compared is the task's own
``calls_per_s`` from ``--summary-json`` (Ray's start-up is not the task's). The
target (issue #21) is a ratio ``--ray / local`` >= 0.8: the batching must hide Ray's
per-call cost. Each run also prints the CPU seconds (user + system) of its processes
by kind -- the driver (the CLI), the node actor, the executors, Ray's own processes --
sampled from ``/proc`` every 50 ms (a process's last sample counts: the figures include
start-up, and may miss a process's last 50 ms). On a small machine the processes
compete for cores: the CPU figures say where the difference goes when wall-clock
ratios cannot.

Part 2: an IO-bound task (``--io-calls`` calls of 5 waits of 2 ms each:
``time.sleep`` suspends the call's greenlet, the executor runs others meanwhile) on a
simulated cluster (``ray.cluster_utils.Cluster``, ``num_cpus=1`` per node) of 1, then
2, then 3 nodes: calls/s per node count and the calls per actor method call.

    .venv/bin/python bench/cluster.py [--calls 100000] [--io-calls 20000] [--repeats 3]
    .venv/bin/python bench/cluster.py --quick      # a smoke check with small sizes

Figures only mean something on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

TRIVIAL = """\
functions:
  f:
    source: |
      def f(x):
          return {"x": x}
calls_file: calls.jsonl
policy: {failure: continue}
"""

IO_BOUND = """
import time
def io(p):
    for _ in range(5):
        time.sleep(0.002)
    return {"i": p["i"]}
"""


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc(pid: int) -> tuple[int, float, str] | None:
    """(parent pid, CPU seconds, kind) of a process, from /proc (None: gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    end = stat.rfind(")")
    comm = stat[stat.find("(") + 1 : end]
    fields = stat[end + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK
    return int(fields[1]), cpu, _kind(comm, cmd) if cmd else ""


def _kind(comm: str, cmd: str) -> str:
    """What a process is, from its name and command line (Ray's workers rename
    themselves once they know: a process's last name counts)."""
    if "blockx.executor" in cmd:
        return "executors"
    if "-m blockx run" in cmd:
        return "driver (blockx run)"
    if "NodeWorker" in comm or "NodeWorker" in cmd:
        return "node actor"
    if comm.startswith("ray::"):
        return f"ray: {comm.removeprefix('ray::')[:24]}"
    if "/ray/" in cmd:
        scripts = [word for word in cmd.split() if word.endswith(".py")]
        return f"ray: {Path(scripts[0]).name if scripts else comm}"
    return comm


class CpuSampler:
    """The CPU seconds of a process and its descendants by kind (:func:`_kind`), sampled
    from /proc on a thread of its own (Linux; elsewhere the figures stay empty)."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self.pid = pid
        self.every_s = every_s
        #: pid -> (its last kind seen, its last CPU seconds seen).
        self.seen: dict[int, tuple[str, float]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.every_s)

    def sample(self) -> None:
        if not Path("/proc").is_dir():
            return
        children: dict[int, list[int]] = {}
        infos: dict[int, tuple[float, str]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                info = _proc(int(entry))
                if info is not None:
                    children.setdefault(info[0], []).append(int(entry))
                    infos[int(entry)] = (info[1], info[2])
        stack = [self.pid]
        while stack:
            pid = stack.pop()
            if pid in infos:
                cpu, kind = infos[pid]
                known = self.seen.get(pid)
                # An exited process (no command line any more) keeps its last kind.
                self.seen[pid] = (kind or (known[0] if known else "?"), cpu)
            stack.extend(children.get(pid, ()))

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.thread.join()
        by_kind: dict[str, float] = {}
        for kind, cpu in self.seen.values():
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu
        return by_kind


def _cli(args: list[str], cwd: str) -> tuple[dict[str, Any], dict[str, float]]:
    """``blockx run`` with ``args``: its summary and its processes' CPU seconds by kind."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "blockx", "run", "task.yaml", "-o", "out.jsonl", "-q"),
            *("--summary-json", "summary.json", *args),
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = CpuSampler(proc.pid)
    _, stderr = proc.communicate()
    cpu = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"blockx run {' '.join(args)} failed:\n{stderr}")
    return dict(json.loads(Path(cwd, "summary.json").read_text())), cpu


def _cpu_line(cpu: dict[str, float], calls: int) -> str:
    ranked = sorted(cpu.items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{kind} {seconds:.2f}" for kind, seconds in ranked)
    return f"CPU s for {calls:,} calls (start-up included): {parts}; total {sum(cpu.values()):.2f}"


def part1(calls: int, executors: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "task.yaml").write_text(TRIVIAL)
        with open(Path(tmp, "calls.jsonl"), "w") as f:
            for i in range(calls):
                f.write(f'{{"function": "f", "args": {i}}}\n')
        local: list[float] = []
        ray: list[float] = []
        for r in range(repeats):
            a, a_cpu = _cli(["--executors", str(executors)], tmp)
            b, b_cpu = _cli(["--ray", "auto", "--executors-per-node", str(executors)], tmp)
            local.append(a["calls_per_s"])
            ray.append(b["calls_per_s"])
            (node,) = b["nodes"].values()
            print(
                f"  run {r + 1}: local {a['calls_per_s']:,.0f} calls/s, --ray "
                f"{b['calls_per_s']:,.0f} calls/s ({node['batches']} method calls, "
                f"{calls / max(1, node['batches']):,.0f} calls each)"
            )
            print(f"    local  {_cpu_line(a_cpu, calls)}")
            print(f"    --ray  {_cpu_line(b_cpu, calls)}")
        ratio = statistics.median(ray) / statistics.median(local)
        print(f"part 1: {calls:,} trivial calls, {executors} executors: --ray/local = {ratio:.2f}")


def part2(calls: int, nodes: int) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from blockx.cluster.driver import ClusterOptions, ClusterRun, run_on_cluster
    from blockx.worker.api import Call, Task, TaskPolicy
    from blockx.worker.io.config import IOConfig

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    try:
        for count in range(1, nodes + 1):
            if count > 1:
                cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            task = Task(
                functions={"io": IO_BOUND},
                calls=[Call("io", {"i": i}) for i in range(calls)],
                policy=TaskPolicy(failure="continue"),
            )
            out = ClusterRun()

            async def sink(rows: list[Any]) -> None:
                return None

            t0 = time.monotonic()
            result = asyncio.run(
                run_on_cluster(
                    task, None, IOConfig(), ClusterOptions(address=cluster.address), sink, out
                )
            )
            wall = time.monotonic() - t0
            assert result.stats.succeeded == calls, result
            print(
                f"part 2: {count} node(s): {result.stats.calls_per_s:,.0f} calls/s "
                f"(task), {calls / wall:,.0f} calls/s (with start-up); "
                f"{calls / max(1, out.batches):,.0f} calls per actor method call"
            )
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--io-calls", type=int, default=20_000)
    parser.add_argument("--executors", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.io_calls, args.repeats, args.nodes = 5_000, 1_000, 1, 2
    part1(args.calls, args.executors, args.repeats)
    part2(args.io_calls, args.nodes)


if __name__ == "__main__":
    main()

"""``blockx run --ray`` against plain ``blockx run``, and 1 -> 2 -> 3 simulated Ray nodes.

Part 1: the same ``--calls`` (100,000) trivial calls (a calls file) through
``blockx run TASK --ray auto`` (a one-node local Ray instance) and through plain
``blockx run TASK``, both as real CLI subprocesses with the same executors,
interleaved, ``--repeats`` times; the figure compared is the task's own
``calls_per_s`` from ``--summary-json`` (Ray's start-up is not the task's). The
target (issue #21) is a ratio ``--ray / local`` >= 0.8: the batching must hide Ray's
per-call cost.

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


def _cli(args: list[str], cwd: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "blockx", "run", "task.yaml", "-o", "out.jsonl", "-q"),
            *("--summary-json", "summary.json", *args),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"blockx run {' '.join(args)} failed:\n{done.stderr}")
    return dict(json.loads(Path(cwd, "summary.json").read_text()))


def part1(calls: int, executors: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "task.yaml").write_text(TRIVIAL)
        with open(Path(tmp, "calls.jsonl"), "w") as f:
            for i in range(calls):
                f.write(f'{{"function": "f", "args": {i}}}\n')
        local: list[float] = []
        ray: list[float] = []
        for r in range(repeats):
            a = _cli(["--executors", str(executors)], tmp)
            b = _cli(["--ray", "auto", "--executors-per-node", str(executors)], tmp)
            local.append(a["calls_per_s"])
            ray.append(b["calls_per_s"])
            (node,) = b["nodes"].values()
            print(
                f"  run {r + 1}: local {a['calls_per_s']:,.0f} calls/s, --ray "
                f"{b['calls_per_s']:,.0f} calls/s ({node['batches']} method calls, "
                f"{calls / max(1, node['batches']):,.0f} calls each)"
            )
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

"""The worker's instructions per call of a chain-read workload, counted by valgrind.

``bench/chain_reads.py`` times whole ``blockx run`` processes over a local JSON-RPC
node; on a shared VM its rates swing by 2x. This bench counts what the worker
process itself executes instead (``valgrind --tool=callgrind`` on the ``blockx run``
process only: its executors and the node run natively, so their work is not in the
count), for two call counts, and divides the difference by the difference in calls:
start-up, imports and shutdown cancel out. The same build gives the same figure within
about 1% whatever else the machine does, so it A/B-tests a change to the worker's IO
path (the task scope, the ``rpc`` backend, frame decoding) that a wall-clock bench
cannot resolve.

Under valgrind the worker runs ~50x slower than its executors and the node, so the
node's batches are as full as ``io.rpc.max_batch`` allows in both runs.

    .venv/bin/python bench/chain_instructions.py [--workload distinct|repeated|trivial]
        [--calls 500,2500]
        [--keep DIR]   (DIR/<workload>-<calls>/callgrind.out: callgrind_annotate them)

2026-12-02, compiled build, distinct workload (5 reads per call): 663,523 instructions
per call with the ``rpc`` backend interpreted, 582,474 with it compiled; 572,239 later
that day (63 modules, the calls file as ``CallBatch`` items); the repeated workload
113,049 (the reads answered by the executors' own caches). ``--workload trivial`` (no
node: ``bench/worker_throughput.py --whole-process``'s calls, ``--calls 2000,10000``):
64,662 at the day's last build; the same runs by hand gave 73,900 before the calls file
came as ``CallBatch`` items and 65,500 after.
Needs ``valgrind`` on PATH.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockx_process import blockx_argv, blockx_env, write_task
from chain_reads import Node, workload_addresses, write_reads_task

#: ``--workload trivial``: what ``bench/worker_throughput.py --whole-process`` runs.
TRIVIAL_FUNCTION = "def _(p):\n    return {'y': p['x'] + 1}\n"


def worker_instructions(node: Node, workload: str, calls: int, reads: int, root: Path) -> int:
    """Instructions of one ``blockx run`` process (callgrind's total) for ``calls`` calls."""
    directory = root / f"{workload}-{calls}"
    if workload == "trivial":
        task, _ = write_task(
            directory,
            {"t": TRIVIAL_FUNCTION},
            ({"function": "t", "args": {"x": i}} for i in range(calls)),
        )
    else:
        addresses = workload_addresses(workload, calls, reads)
        task, _ = write_reads_task(directory, node.url, addresses)
    out = directory / "callgrind.out"
    env = blockx_env()
    node.reset()
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *blockx_argv(task, 2)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"blockx run under valgrind failed:\n{done.stderr[-3000:]}")
    rows = (directory / "rows.jsonl").read_text(encoding="utf-8").count("\n")
    if rows != calls:
        raise SystemExit(f"{rows} rows for {calls} calls")
    for line in out.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no total in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload", choices=("distinct", "repeated", "trivial"), default="distinct"
    )
    parser.add_argument("--calls", default="500,2500", help="two call counts, comma-separated")
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument(
        "--keep", default=None, help="keep the runs (and callgrind.out files) in this directory"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print(
            "chain_instructions: skipped, valgrind is not on PATH (Debian: apt-get install valgrind)"
        )
        return
    small, large = sorted(int(n) for n in args.calls.split(","))
    node = Node(args.delay_ms)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-chain-instr-") as tmp:
            root = Path(args.keep) if args.keep else Path(tmp)
            counts = {
                n: worker_instructions(node, args.workload, n, args.reads, root)
                for n in (small, large)
            }
    finally:
        node.close()
    per_call = (counts[large] - counts[small]) / (large - small)
    runs = f"(runs of {small:,} and {large:,} calls: {counts[small]:,} and {counts[large]:,})"
    if args.workload == "trivial":
        print(
            f"trivial calls, the blockx run process: {per_call:,.0f} instructions per call {runs}"
        )
        return
    print(
        f"{args.workload} chain reads ({args.reads} per call), the blockx run process: "
        f"{per_call:,.0f} instructions per call, {per_call / args.reads:,.0f} per read {runs}"
    )


if __name__ == "__main__":
    main()

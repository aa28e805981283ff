"""The SDK's own cost per chain read, counted by valgrind: ``ChainState`` in user code.

On the repeated chain-read workload (``bench/chain_reads.py``) the executors answer
most reads from their own cache (``executor/local_reads.py``), and what is left of a
read's cost is the interpreted SDK in user code: ``ChainState`` checking the address,
building the request and its cache key, parsing the answer. This bench counts the
instructions of exactly that — ``ChainState("eth", block)`` and ``--reads``
``get_address_balance`` reads per call — against a provider that answers at once:

* **repeated** — the addresses drawn from 100, each answered with the same string
  object every time (as the executor's read cache returns it);
* **distinct** — every read a new address and a new answer string.

Each figure is the difference of two runs in fresh processes (``--calls``, two counts)
divided by the difference in calls, so start-up and imports cancel out; it repeats
within ~0.5% whatever else the machine does. 2026-12-02, per call of 5 reads:

=====================================================  ========  ========
``blockx/chain.py``                                    repeated  distinct
=====================================================  ========  ========
before the day's work                                   103,197   123,956
the account reads written out (no ``rpc.call``)          81,688   102,996
their pure results kept per process (two memos)          43,362   125,123
=====================================================  ========  ========

The memos cost a read never seen before ~4.4k instructions (a lookup that misses, an
insert, the clears), against the ~160k the worker and the round trip cost such a read;
a read seen before saves ~7.8k, about a seventh of what the whole process spent on it.

    .venv/bin/python bench/sdk_instructions.py [--reads 5] [--calls 500,2500]

Needs ``valgrind`` on PATH (without it the bench says so and does nothing).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instructions import _count

SRC = Path(__file__).resolve().parents[1] / "src"
BLOCK = 19_000_000
WORKLOADS = ("repeated", "distinct")


def child(workload: str, calls: int, reads: int) -> None:
    """The measured process: ``calls`` calls of ``reads`` balance reads each."""
    sys.path.insert(0, str(SRC))
    from blockx.chain import ChainState
    from blockx.sdk.runtime import set_provider

    pool = ["0x" + format(0xA000 + n, "040x") for n in range(100)]
    answers = {address: hex(n * 10**18 + 7) for n, address in enumerate(pool)}

    class Provider:
        def read_req(self, backend: str, operation: str, params: dict, cache_key: str | None):  # type: ignore[no-untyped-def,type-arg]
            address = params["params"][0]
            if workload == "repeated":
                return answers[address]
            return hex(int(address, 16) * 3)  # a new string for a new address

    set_provider(Provider())  # type: ignore[arg-type]
    n = 0
    for i in range(calls):
        state = ChainState("eth", BLOCK)
        for k in range(reads):
            if workload == "repeated":
                address = pool[(i * 7 + k * 13) % 100]
            else:
                n += 1
                address = "0x" + format(n, "040x")
            state.get_address_balance(address)


def count(workload: str, calls: int, reads: int) -> int:
    """Instructions of one child process (callgrind's total; ``bench/instructions.py``'s
    runner, which pins ``PYTHONHASHSEED``: the memos hash strings)."""
    with tempfile.TemporaryDirectory(prefix="bench-sdk-instr-") as out:
        argv = [sys.executable, __file__, "--child", workload, str(calls), str(reads)]
        return _count(argv, out, f"{workload}-{calls}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--calls", default="500,2500", help="two call counts, comma-separated")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        workload, calls, reads = args.child
        child(workload, int(calls), int(reads))
        return
    if shutil.which("valgrind") is None:
        print(
            "sdk_instructions: skipped, valgrind is not on PATH (Debian: apt-get install valgrind)"
        )
        return
    small, large = sorted(int(n) for n in args.calls.split(","))
    print(
        f"ChainState and {args.reads} get_address_balance reads per call, provider answering at once"
    )
    for workload in WORKLOADS:
        low, high = count(workload, small, args.reads), count(workload, large, args.reads)
        per_call = (high - low) / (large - small)
        print(
            f"{workload:9s} {per_call:9,.0f} instructions per call, "
            f"{per_call / args.reads:7,.0f} per read"
        )


if __name__ == "__main__":
    main()

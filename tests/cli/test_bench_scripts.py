"""The whole-process benches run end to end at a tiny size (issue #18).

``bench/chain_reads.py`` and ``bench/worker_throughput.py --whole-process`` each
run as a user runs them — their own process, real ``blockx run`` processes, a
real JSON-RPC node on loopback — with a handful of calls and one repeat: they
must exit 0 and print their table. Nothing here looks at a figure (the
machine is shared; figures come from full-size runs on a quiet one). A node
that answers wrong balances must stop the chain-read bench with an error:
its checks are what make its figures mean anything.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def run_bench(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_chain_reads_runs_both_workloads_through_every_system() -> None:
    done = run_bench(str(BENCH / "chain_reads.py"), "--calls", "20", "--repeats", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "chain reads: 20 calls x 5 balance reads" in out
    assert "| workload: system" in out and "| JSON-RPC reqs |" in out
    for workload in ("distinct", "repeated"):
        assert f"| {workload}: BlockX, blockx run" in out
        assert f"| {workload}: ThreadPool(256) + http.client" in out
        assert f"| {workload}: asyncio + aiohttp, 256 coroutines" in out
        assert f"| {workload}: BlockX / best peer" in out
    # The node saw every peer's 100 reads as 100 HTTP requests.
    assert "|       100 |           100 |" in out
    assert "BlockX start-up (a one-call blockx run process, wall):" in out
    assert "CPU per call, µs (medians)" in out
    cpu_rows = [line for line in out.splitlines() if line.endswith(" |") and "CPU" not in line]
    for workload in ("distinct", "repeated"):
        for system in ("BlockX, blockx run", "ThreadPool(256) + http.client"):
            row = next(
                r
                for r in cpu_rows
                if r.startswith(f"| {workload}: {system} ") and r.count("|") == 4
            )
            own, node = (cell.strip() for cell in row.split("|")[2:4])
            assert own == "n/a" or float(own.replace(",", "")) > 0, row
            assert float(node.replace(",", "")) >= 0, row


@pytest.mark.slow
def test_chain_reads_inflight_rows_run_blockx_with_that_many_calls_in_flight() -> None:
    done = run_bench(
        str(BENCH / "chain_reads.py"),
        *("--calls", "20", "--repeats", "1", "--workloads", "distinct", "--inflight", "1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "BlockX with more calls in flight" in out
    assert "| distinct: 128 x 2 = 256" in out
    row = next(line for line in out.splitlines() if line.startswith("| distinct: 1 x 2 = 2 "))
    # Two calls in flight: the node sees at most two reads per HTTP request (100 reads),
    # where the default's 20 calls in flight share a handful of requests.
    http_requests = int(row.split("|")[3].replace(",", ""))
    assert http_requests >= 50, row
    assert "distinct blockx@1 " in out


@pytest.mark.parametrize("value", ["0", "256,x"])
def test_chain_reads_refuses_a_bad_inflight(value: str) -> None:
    done = run_bench(str(BENCH / "chain_reads.py"), "--inflight", value)
    assert done.returncode == 2
    assert "--inflight takes positive numbers" in done.stderr
    assert repr(value) in done.stderr


@pytest.mark.slow
def test_chain_reads_fails_loudly_on_a_wrong_answer() -> None:
    done = run_bench(
        str(BENCH / "chain_reads.py"),
        "--calls",
        "5",
        "--repeats",
        "1",
        "--workloads",
        "distinct",
        "--node-skew",
        "1",
    )
    assert done.returncode != 0
    assert "wrong answers" in done.stderr
    assert "chain reads:" not in done.stdout


@pytest.mark.slow
def test_worker_throughput_whole_process_runs_blockx_and_imap() -> None:
    done = run_bench(
        str(BENCH / "worker_throughput.py"), "--whole-process", "--calls", "20", "--repeats", "1"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "whole processes: 20 trivial calls from a calls file, rows to a file" in out
    assert "| system" in out and "| start-up ms |" in out and "| steady calls/s |" in out
    assert "| CPU µs/call |" in out
    assert "| BlockX: blockx run -o FILE" in out
    assert "| python: multiprocessing.Pool.imap(chunksize=1)" in out
    assert "BlockX's summary rate" in out


def load_bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_children_cpu_counts_a_child_and_the_children_it_reaped() -> None:
    bench = load_bench("blockx_process")
    # A child that spends ~0.2 s of CPU in a grandchild it waits for.
    burn = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.2: pass')"
    waiter = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}], check=True)"
    before = bench.children_cpu_s()
    subprocess.run([sys.executable, "-c", waiter], check=True, timeout=60)
    assert bench.children_cpu_s() - before >= 0.2
    assert bench.steady_cpu_per_call(10, [1.2, 1.4, 1.0], [0.2, 0.4, 0.2]) == pytest.approx(0.1)
    assert bench.steady_cpu_per_call(10, [1.0], [1.0]) is None


def test_whole_process_rows_check_refuses_a_missing_or_wrong_row() -> None:
    check = load_bench("worker_throughput").check_trivial_rows
    check("x", [{"y": 2}, {"y": 1}, {"y": 3}], 3)  # any order
    for rows in ([{"y": 1}, {"y": 2}], [{"y": 1}, {"y": 2}, {"y": 4}], [{"y": 1}] * 3):
        with pytest.raises(SystemExit, match="wrong rows"):
            check("x", rows, 3)


@pytest.mark.slow
def test_serve_bench_runs_submit_and_run_side_by_side() -> None:
    done = run_bench(
        str(BENCH / "serve.py"), "--calls", "200", "--repeats", "1", "--latency-samples", "2"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "| blockx run (whole process) |" in out
    assert "| blockx submit --follow (whole client process; server running) |" in out
    assert "| submit / run |" in out
    assert "submit to first row, a one-call task over HTTP: median" in out


@pytest.mark.parametrize("workload", ["repeated", "distinct"])
def test_sdk_instructions_measured_process_reads_through_chain_state(workload: str) -> None:
    """The process ``bench/sdk_instructions.py`` counts under valgrind runs its reads."""
    done = run_bench(str(BENCH / "sdk_instructions.py"), "--child", workload, "3", "5")
    assert done.returncode == 0, done.stderr[-3000:]


def test_executor_start_times_both_starts() -> None:
    done = run_bench(str(BENCH / "executor_start.py"), "--runs", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| cold", "| forked"))]
    assert len(rows) == 4, done.stdout  # executor starts, then one-call blockx runs
    for row in rows[:2]:
        connected, first = (float(cell) for cell in row.split("|")[2:4])
        assert 0 < connected <= first, row
    for row in rows[2:]:
        wall, cpu = (float(cell) for cell in row.split("|")[2:4])
        assert wall > 0 and cpu > 0, row
    assert "first frame: cold / forked" in done.stdout
    assert "wall: cold / forked" in done.stdout

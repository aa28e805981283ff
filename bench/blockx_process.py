"""Time ``blockx run`` as a whole process, the way a user runs it: shared by the benches.

A task is written into a directory (``task.yaml``, its calls as ``calls.jsonl``,
a stream), then ``sys.executable -m blockx run task.yaml -o rows.jsonl
--summary-json summary.json --quiet --executors N`` runs with this process's
environment (``BLOCKX_PURE_PYTHON`` and the rest pass through, but
``PYTHONDONTWRITEBYTECODE``: a user's install has its bytecode cached), this checkout's
``src`` put first on ``PYTHONPATH`` — the sources the in-process benches put first
on ``sys.path``, so both kinds of bench measure the same BlockX. The wall time is taken
around the child, from just before it is spawned to its exit: interpreter
start-up, imports, executors, the task, the last row written and shutdown.

What the process spends outside the calls is estimated honestly from outside:
:func:`run_blockx` on a one-call task of the same functions and IO is the
fixed cost (start-up and shutdown, one call's work is noise next to it); the
steady-state rate of an N-call run is ``N / (wall - fixed)``. The summary's
own ``task_wall_time_s`` (from the task's submission to its end: it includes
the executors' start, which runs concurrently with it) is kept too, and so is
the part of the wall time the command's own clock (``wall_time_s``) does not
see: interpreter start-up, imports, the input checks, the exit.

CPU is counted the same way from outside: :func:`children_cpu_s` before and after the
child, the ``RUSAGE_CHILDREN`` of this process -- the child's own CPU and that of every
descendant it waited for (the executors and their fork server: the worker reaps them
before it exits). :func:`steady_cpu_per_call` subtracts a one-call run's, as the
steady-state rate does with wall time.

Nothing here checks the rows: each bench reads ``rows_path`` and checks them
against what its calls must return, failing loudly on a wrong answer.
"""

from __future__ import annotations

import compileall
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True, slots=True)
class ProcessRun:
    """One ``blockx run`` process: its wall time, its ``--summary-json`` and its rows file."""

    calls: int
    wall_s: float
    summary: dict[str, Any]
    rows_path: Path
    #: CPU seconds of the process and the descendants it reaped (:func:`children_cpu_s`).
    cpu_s: float = 0.0

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s

    @property
    def task_wall_s(self) -> float:
        return float(self.summary["task_wall_time_s"])

    @property
    def outside_command_clock_s(self) -> float:
        """The process's wall time the command's own clock (the summary's ``wall_time_s``,
        from the run's start to its last row) does not see: interpreter start-up, imports,
        the task file's and the calls file's checks, and the exit."""
        return self.wall_s - float(self.summary["wall_time_s"])

    def __repr__(self) -> str:
        return f"ProcessRun(calls={self.calls}, wall_s={self.wall_s:.3f}, task_wall_s={self.task_wall_s:.3f})"


def write_task(
    directory: Path,
    functions: dict[str, str],
    calls: Iterable[dict[str, Any]],
    io: dict[str, Any] | None = None,
    call_budget_ms: int = 60_000,
) -> tuple[Path, int]:
    """Write ``task.yaml`` (JSON is YAML) and ``calls.jsonl`` into ``directory``; return the
    task file and the number of calls."""
    directory.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(directory / "calls.jsonl", "w", encoding="utf-8") as f:
        for call in calls:
            f.write(json.dumps(call, separators=(",", ":")))
            f.write("\n")
            n += 1
    spec: dict[str, Any] = {
        "task_id": directory.name,
        "functions": {fid: {"source": source} for fid, source in functions.items()},
        "calls_file": "calls.jsonl",
        # fast_fail: one failed call stops the run, and the bench then fails loudly.
        "policy": {"failure": "fast_fail", "call_budget_ms": call_budget_ms},
        "io": {"data_dir": str(directory / "data"), **(io or {})},
    }
    task = directory / "task.yaml"
    task.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return task, n


def blockx_env() -> dict[str, str]:
    """The environment a ``blockx run`` child gets: this checkout's sources first, their
    bytecode compiled (:func:`compile_bytecode`)."""
    compile_bytecode()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    # As a user's install runs: with its modules' bytecode cached. Inherited, this would
    # make every run compile BlockX's interpreted modules from source (~80 ms of start-up).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


@functools.cache
def compile_bytecode() -> None:
    """Write the bytecode of this checkout's modules now (once per bench), so that no run
    pays for it: the first ``blockx run`` of a fresh checkout otherwise compiles every
    interpreted module -- ~80 ms of its wall time, and under callgrind ~400 million
    instructions that made ``chain_instructions.py``'s difference of two runs negative."""
    compileall.compile_dir(SRC / "blockx", quiet=1)


def blockx_argv(task: Path, executors: int, *extra: str) -> list[str]:
    """``python -m blockx run TASK -o ROWS --quiet --executors N [extra]``; the rows go to
    ``rows.jsonl`` beside the task."""
    rows = task.parent / "rows.jsonl"
    return [
        *(sys.executable, "-m", "blockx", "run", str(task), "-o", str(rows), "--quiet"),
        *("--executors", str(executors), *extra),
    ]


def run_blockx(
    task: Path, calls: int, executors: int, timeout_s: float = 600, *, knobs: tuple[str, ...] = ()
) -> ProcessRun:
    """Run ``blockx run`` on ``task`` as a child process; raise if it does not succeed.

    ``knobs``: ``KNOB=VALUE`` settings passed as ``--set`` (the product's defaults
    otherwise)."""
    rows = task.parent / "rows.jsonl"
    summary_path = task.parent / "summary.json"
    sets = [arg for knob in knobs for arg in ("--set", knob)]
    argv = blockx_argv(task, executors, "--summary-json", str(summary_path), *sets)
    env = blockx_env()
    cpu0 = children_cpu_s()
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    cpu = children_cpu_s() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"blockx run {task} exited {done.returncode}:\n{done.stderr[-4000:]}")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    if summary.get("succeeded") != calls or summary.get("failed"):
        raise SystemExit(f"blockx run {task}: not every call succeeded: {summary}")
    return ProcessRun(calls=calls, wall_s=wall, summary=summary, rows_path=rows, cpu_s=cpu)


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's children that ended and were waited
    for, and of the descendants they waited for (``getrusage(RUSAGE_CHILDREN)``)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def steady_cpu_per_call(calls: int, cpus: list[float], fixed: list[float]) -> float | None:
    """The median of ``(cpu - fixed) / calls`` over paired runs (``fixed``: a one-call
    run's CPU), in seconds; None when a run took no more CPU than its one-call run."""
    spans = [cpu - f for cpu, f in zip(cpus, fixed, strict=True)]
    if min(spans) <= 0:
        return None
    return statistics.median(span / calls for span in spans)


def read_rows(path: Path) -> list[Any]:
    """The rows of a run, one JSON value per line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def steady_rate(calls: int, walls: list[float], fixed: list[float]) -> float | None:
    """The median of ``calls / (wall - fixed)`` over paired runs; None when a run took no
    longer than its start-up estimate (too few calls to tell the two apart)."""
    spans = [wall - f for wall, f in zip(walls, fixed, strict=True)]
    if min(spans) <= 0:
        return None
    return statistics.median(calls / span for span in spans)


def format_rate(rate: float | None, width: int = 0) -> str:
    """``12,345``, or ``n/a`` for a rate :func:`steady_rate` could not tell."""
    return f"{'n/a' if rate is None else f'{rate:,.0f}':>{width}}"

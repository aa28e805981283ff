"""An executor's start: a cold ``python -m blockx.executor`` against one forked from a warm parent.

Every ``blockx run`` starts its executors cold: a new interpreter imports the
executor (msgspec, typing, logging, the compiled group, ~600 classes) before it
connects to the worker's socket, ~60-90 ms of CPU each on our VMs, and two of
them boot while the worker imports itself on the same two cores. This bench
measures what a fork server would save, side by side in one run, interleaved:

* **cold** -- ``sys.executable -m blockx.executor`` with the pool's flags, as
  :class:`~blockx.worker.pool.spawner.ProcessSpawner` starts it (without the
  ``setpriv`` wrapper, which adds nothing measurable);
* **forked** -- ``os.fork()`` of this process after it imported the executor's
  modules (what a fork server would have done once), the child calling the
  executor's ``main`` with the same flags.

Each is timed from the spawn to the worker side's ``accept`` (the executor
connected) and to its first frame (its first ``Heartbeat``: the worker attaches
it then); the listening socket is this process's. Medians of ``--runs``; the
children's CPU per start comes from ``RUSAGE_CHILDREN``.

The product has no fork server (yet): the forked row is a measurement of one,
not of a mode. What one would have to keep (docs/architecture.md's pool): exit
statuses and the group kill before a reap (the pool is the executors' parent
today), per-executor stdout/stderr pipes, the sandbox mode's own spawns.

    .venv/bin/python bench/executor_start.py [--runs 15]
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def flags(socket_path: str) -> list[str]:
    return [
        *("--executor-id", "exec-0", "--socket-path", socket_path),
        *("--heartbeat-interval", "1.0", "--executor-max-inflight", "128"),
        *("--executor-max-runnable", "128", "--memory-limit-mb", "4096"),
        *("--max-open-files", "1024"),
    ]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_connected(listener: socket.socket, t0: float) -> tuple[float, float]:
    """Seconds from ``t0`` to the connection and to its first bytes."""
    connection, _ = listener.accept()
    connected = time.perf_counter() - t0
    with connection:
        if not connection.recv(4096):
            raise SystemExit("the executor closed its connection before its first frame")
        first = time.perf_counter() - t0
    return connected, first


def cold(listener: socket.socket, socket_path: str, env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "blockx.executor", *flags(socket_path)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return wait_connected(listener, t0)
    finally:
        child.wait(timeout=30)  # it exits once its connection is closed


def forked(listener: socket.socket, socket_path: str, main: object) -> tuple[float, float]:
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: the executor, as a fork server's child would run it
        code = 70
        try:
            listener.close()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.setsid()
            code = main(flags(socket_path))  # type: ignore[operator]
        finally:
            os._exit(code if isinstance(code, int) else 70)
    try:
        return wait_connected(listener, t0)
    finally:
        os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's install runs: bytecode cached
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(SRC / "blockx")], check=True)

    # The warm parent: what a fork server would import once, before any spawn.
    sys.path.insert(0, str(SRC))
    t0 = time.perf_counter()
    from blockx.msgspec_import import import_msgspec

    import_msgspec()
    import blockx.executor.__main__ as executor_main

    for late in ("blockx.executor.runtime", "blockx.executor.uds_session"):  # main's late ones
        importlib.import_module(late)

    warm_import_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="bx-start-") as directory:
        socket_path = os.path.join(directory, "worker.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path)
        listener.listen(4)
        runs: dict[str, list[tuple[float, float]]] = {"cold": [], "forked": []}
        cpu: dict[str, float] = {"cold": 0.0, "forked": 0.0}
        for _ in range(args.runs):
            before = children_cpu_s()
            runs["cold"].append(cold(listener, socket_path, env))
            middle = children_cpu_s()
            runs["forked"].append(forked(listener, socket_path, executor_main.main))
            cpu["cold"] += middle - before
            cpu["forked"] += children_cpu_s() - middle
        listener.close()

    def median_ms(name: str, index: int) -> float:
        return statistics.median(r[index] for r in runs[name]) * 1e3

    print(f"executor start, medians of {args.runs} (interleaved)")
    print("| start  | connected ms | first frame ms | CPU ms per start |")
    print("| ------ | ------------:| --------------:| ----------------:|")
    for name in ("cold", "forked"):
        print(
            f"| {name:<6} | {median_ms(name, 0):12.1f} | {median_ms(name, 1):14.1f} "
            f"| {cpu[name] / args.runs * 1e3:16.1f} |"
        )
    ratio = median_ms("cold", 1) / max(median_ms("forked", 1), 1e-9)
    print(
        f"first frame: cold / forked = {ratio:.1f}x; the warm parent's own imports took "
        f"{warm_import_s * 1e3:.1f} ms (a fork server pays them once, not per executor)"
    )


if __name__ == "__main__":
    main()

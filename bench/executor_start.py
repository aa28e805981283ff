"""An executor's start: cold ``python -m blockx.executor`` against forked by the fork server.

An executor started cold imports itself (msgspec, typing, logging, the compiled
group, ~600 classes) before it connects to the worker's socket: ~60-110 ms of CPU
each on our VMs, and a ``blockx run``'s executors boot while the worker imports
itself on the same two cores. The fork server (``pool.fork_server``, on by default:
``blockx/executor/fork_server.py``) imports that once and forks each executor.
Side by side in one run, interleaved:

* **cold** -- ``sys.executable -m blockx.executor`` with the pool's flags, as
  :class:`~blockx.worker.pool.spawner.ProcessSpawner` starts it without the server
  (and without the ``setpriv`` wrapper, which adds nothing measurable);
* **forked** -- the same executor from the product's
  :class:`~blockx.worker.pool.fork_server.ForkServer` (started once, before the
  first run: its own imports are printed apart).

Each is timed from the spawn to the worker side's ``accept`` (the executor
connected) and to its first frame (its first ``Heartbeat``: the worker attaches it
then); the listening socket is this process's. A forked executor is this process's
child too (the server forks with ``CLONE_PARENT``), so the children's CPU per start
comes from ``RUSAGE_CHILDREN`` for both.

Then whole ``blockx run`` processes of a one-call task, the fork server on and off
(``EXECUTOR_FORK_SERVER``), two executors each, interleaved: wall time from the
command's start to its exit, and its CPU with its executors' and server's.

    .venv/bin/python bench/executor_start.py [--runs 15]
"""

from __future__ import annotations

import argparse
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


def forked(listener: socket.socket, server: object, spec: object) -> tuple[float, float]:
    t0 = time.perf_counter()
    child = server.spawn(spec)  # type: ignore[attr-defined]
    try:
        return wait_connected(listener, t0)
    finally:
        child.wait(timeout=30)  # it exits once its connection is closed
        for pipe in (child.stdout, child.stderr):
            pipe.close()


TASK = """\
functions:
  f: {source: "def f(x):\\n    return x + 1\\n"}
calls:
  - {function: f, args: [1]}
"""


def one_call_run(task: Path, env: dict[str, str], fork_server: bool) -> float:
    """Seconds of one ``blockx run`` of ``task``, executors forked or cold."""
    run_env = {**env, "EXECUTOR_FORK_SERVER": "1" if fork_server else "0", "EXECUTOR_COUNT": "2"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "blockx", "run", str(task)],
        env=run_env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - t0
    if done.returncode != 0 or done.stdout.split() != ["2"]:
        raise SystemExit(f"blockx run failed ({done.returncode}): {done.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's install runs: bytecode cached
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(SRC / "blockx")], check=True)

    sys.path.insert(0, str(SRC))
    from blockx.wire.launch import ExecutorArgs
    from blockx.worker.pool.fork_server import ForkServer
    from blockx.worker.pool.launch import ExecutorLaunchSpec

    with tempfile.TemporaryDirectory(prefix="bx-start-") as directory:
        socket_path = os.path.join(directory, "worker.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path)
        listener.listen(4)
        spec = ExecutorLaunchSpec(args=ExecutorArgs.parse(flags(socket_path)))
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the server's, as the cold ones'
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        server = ForkServer()
        t0 = time.perf_counter()
        forked(listener, server, spec)  # the server's imports, then a first executor
        warm_s = time.perf_counter() - t0
        runs: dict[str, list[tuple[float, float]]] = {"cold": [], "forked": []}
        cpu: dict[str, float] = {"cold": 0.0, "forked": 0.0}
        for _ in range(args.runs):
            before = children_cpu_s()
            runs["cold"].append(cold(listener, socket_path, env))
            middle = children_cpu_s()
            runs["forked"].append(forked(listener, server, spec))
            cpu["cold"] += middle - before
            cpu["forked"] += children_cpu_s() - middle
        server.close()
        listener.close()

        task = Path(directory) / "one.yaml"
        task.write_text(TASK)
        whole: dict[bool, list[float]] = {True: [], False: []}
        whole_cpu: dict[bool, float] = {True: 0.0, False: 0.0}
        for _ in range(args.runs):
            for on in (False, True):
                before = children_cpu_s()
                whole[on].append(one_call_run(task, env, on))
                whole_cpu[on] += children_cpu_s() - before

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
        f"first frame: cold / forked = {ratio:.1f}x; the server's start and first executor "
        f"took {warm_s * 1e3:.1f} ms (paid once per worker, not per executor)"
    )
    print()
    print(f"one-call `blockx run`, 2 executors, medians of {args.runs} (interleaved)")
    print("| executors | wall ms | CPU ms per run |")
    print("| --------- | -------:| --------------:|")
    for on, name in ((False, "cold"), (True, "forked")):
        print(
            f"| {name:<9} | {statistics.median(whole[on]) * 1e3:7.1f} "
            f"| {whole_cpu[on] / args.runs * 1e3:14.1f} |"
        )
    print(
        f"wall: cold / forked = {statistics.median(whole[False]) / statistics.median(whole[True]):.2f}x; "
        f"CPU: cold / forked = {whole_cpu[False] / max(whole_cpu[True], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()

"""``blockx serve`` against ``blockx run``: the same task, side by side in one run.

Usage::

    .venv/bin/python bench/serve.py [--calls 100000] [--repeats 3] [--executors 2]

One server (``python -m blockx serve --port 0``, its own data dir) is started
first and left running: a service's start-up is paid once, not per task. Then,
interleaved, ``--repeats`` times each:

* ``blockx run task.yaml -o rows.jsonl`` -- a whole process, start-up included;
* ``blockx submit task.yaml --follow > rows.jsonl`` -- a whole client process: the
  task file read and checked locally, uploaded (its calls file streamed in
  chunks), its rows followed to stdout as the server stores them, until it ends.

The task is the trivial one of ``bench/worker_throughput.py --whole-process``
(``{"x": x}`` for x in 0..N-1 from a calls file); every run's rows are checked
(N of them, each once). Printed: rows/s of each (median), the ratio submit / run
(the issue's target: >= 0.8), and the latency from submit to first row -- a
one-call task POSTed over a kept-alive connection and its rows read until the
first line arrives (median of 20; target <= 50 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
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

_LISTENING = re.compile(r"listening on http://([^\s:]+):(\d+)")
SOURCE = "def _(x):\n    return {'x': x}\n"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's install has its bytecode cached
    return env


def write_task(directory: Path, n: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "calls.jsonl", "w", encoding="utf-8") as f:
        for x in range(n):
            f.write(f'{{"function":"trivial","args":{x}}}\n')
    task = directory / "task.yaml"
    spec = {
        "functions": {"trivial": {"source": SOURCE}},
        "calls_file": "calls.jsonl",
        "policy": {"failure": "fast_fail", "call_budget_ms": 60_000},
    }
    task.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return task


def check_rows(path: Path, n: int, who: str) -> None:
    seen = sorted(json.loads(line)["x"] for line in path.read_bytes().splitlines() if line)
    if seen != list(range(n)):
        raise SystemExit(f"{who}: wrong rows ({len(seen)} of {n}, or not each once)")


class ServeProcess:
    """The server under test, started once."""

    def __init__(self, data_dir: Path, executors: int) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "blockx",
                "serve",
                "--port",
                "0",
                "--data-dir",
                str(data_dir),
                "--executors",
                str(executors),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_env(),
        )
        self.host, self.port = "", 0
        found = threading.Event()
        lines: list[str] = []

        def read() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                lines.append(line)
                m = _LISTENING.search(line)
                if m and not found.is_set():
                    self.host, self.port = m.group(1), int(m.group(2))
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(120):
            self.proc.kill()
            raise SystemExit("blockx serve did not start:\n" + "".join(lines))
        deadline = time.monotonic() + 120
        while self.get("/readyz")[0] != 200:
            if time.monotonic() > deadline:
                raise SystemExit("blockx serve never became ready")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def time_run(task: Path, n: int, executors: int) -> float:
    rows = task.parent / "run-rows.jsonl"
    argv = [sys.executable, "-m", "blockx", "run", str(task), "-o", str(rows), "--quiet"]
    argv += ["--executors", str(executors)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"blockx run exited {done.returncode}:\n{done.stderr[-3000:]}")
    check_rows(rows, n, "blockx run")
    return wall


def time_submit(task: Path, n: int, url: str) -> float:
    rows = task.parent / "submit-rows.jsonl"
    argv = [sys.executable, "-m", "blockx", "submit", str(task), "--server", url, "--follow"]
    t0 = time.perf_counter()
    with open(rows, "wb") as out:
        done = subprocess.run(
            argv, env=_env(), stdout=out, stderr=subprocess.PIPE, text=True, timeout=600
        )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"blockx submit exited {done.returncode}:\n{done.stderr[-3000:]}")
    check_rows(rows, n, "blockx submit --follow")
    return wall


def first_row_latency(server: ServeProcess, samples: int) -> list[float]:
    """Seconds from the POST of a one-call task to its first row read, over one kept-alive
    connection for the POST and one for the rows."""
    body = json.dumps(
        {
            "functions": {"trivial": {"source": SOURCE}},
            "calls": [{"function": "trivial", "args": 7}],
        }
    ).encode()
    post = http.client.HTTPConnection(server.host, server.port, timeout=60)
    out: list[float] = []
    for _ in range(samples):
        t0 = time.perf_counter()
        post.request("POST", "/v1/tasks", body=body, headers={"Content-Type": "application/json"})
        r = post.getresponse()
        created: Any = json.loads(r.read())
        if r.status != 201:
            raise SystemExit(f"POST /v1/tasks answered {r.status}: {created}")
        rows = http.client.HTTPConnection(server.host, server.port, timeout=60)
        rows.request("GET", f"/v1/tasks/{created['id']}/rows")
        line = rows.getresponse().readline()
        out.append(time.perf_counter() - t0)
        rows.close()
        if json.loads(line) != {"x": 7}:
            raise SystemExit(f"first row: {line!r}")
    post.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--executors", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--latency-samples", type=int, default=20)
    args = parser.parse_args()
    n = args.calls
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        task = write_task(Path(tmp) / "task", n)
        server = ServeProcess(Path(tmp) / "serve-data", args.executors)
        try:
            runs: list[float] = []
            submits: list[float] = []
            for _ in range(args.repeats):
                runs.append(time_run(task, n, args.executors))
                submits.append(time_submit(task, n, server.url))
            latency = first_row_latency(server, args.latency_samples)
        finally:
            server.stop()
    run_rate = n / statistics.median(runs)
    submit_rate = n / statistics.median(submits)
    print(
        f"\nblockx serve vs blockx run: {n:,} trivial calls from a calls file, "
        f"{args.executors} executors, medians of {args.repeats} (interleaved)\n"
    )
    print("| system | wall (s) | rows/s |")
    print("| --- | ---: | ---: |")
    print(f"| blockx run (whole process) | {statistics.median(runs):.3f} | {run_rate:,.0f} |")
    print(
        f"| blockx submit --follow (whole client process; server running) | "
        f"{statistics.median(submits):.3f} | {submit_rate:,.0f} |"
    )
    print(f"| submit / run | | {submit_rate / run_rate:.2f}x (target >= 0.8) |")
    print(
        f"\nsubmit to first row, a one-call task over HTTP: median "
        f"{statistics.median(latency) * 1000:.1f} ms, best {min(latency) * 1000:.1f} ms "
        f"(target <= 50 ms; {len(latency)} samples)"
    )


if __name__ == "__main__":
    main()

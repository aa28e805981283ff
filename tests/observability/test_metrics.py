"""Prometheus metrics (issue #20, "Metrics"): every series of the issue's table, present
from the start with its label sets, and moving by exactly what a run did.

Real workers with real executor processes; the metrics are scraped over HTTP as
Prometheus would, and parsed with ``prometheus_client``'s own parser:

* a ``Worker(metrics_port=0)``: scraped before any call (every series, every label
  set known in advance, all zero), then after a task that wrote a table, then after
  a task with sub-calls (one answered from the call cache), table reads, a failing
  call under ``failure: continue`` and a call retried once (a transient IO error),
  the counters compared by their exact deltas; and while gated calls sleep (the
  in-flight and suspended gauges up, then down);
* ``blockx run --metrics-port 0`` end to end: scraped while a gated task runs, and
  the port closed once the run ended;
* ``GET /metrics`` of ``blockx serve`` (behind the token), ``blockx_tasks{state}``
  from its store.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.cli.cli_support import clean_env, write
from tests.serve.server import Server, wait_for

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "worker", "e2e"))
from e2e_support import WorkerSession, e2e_config

from blockx.observability.metrics import IO_RESULTS, WorkerCollector
from blockx.observability.snapshot import (
    CONTEXT_STATES,
    ERROR_KINDS,
    EXECUTOR_STATES,
    TASK_STATES,
    WAIT_KINDS,
    io_snapshot,
    worker_snapshot,
)
from blockx.wire import RemoteError
from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.io.backend import PreparedRequest, Reply
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import IOSubsystem, default_registry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

#: The issue's table: every sample name and the label names it carries.
SERIES: dict[str, set[str]] = {
    "blockx_calls_total": {"outcome", "kind"},
    "blockx_call_failures_total": {"error_kind"},
    "blockx_call_retries_total": {"reason"},
    "blockx_call_duration_seconds_bucket": {"le"},
    "blockx_call_duration_seconds_count": set(),
    "blockx_call_duration_seconds_sum": set(),
    "blockx_calls_inflight": set(),
    "blockx_calls_suspended": {"wait"},
    "blockx_cache_hits_total": {"cache"},
    "blockx_singleflight_joins_total": {"cache"},
    "blockx_io_requests_total": {"backend", "operation", "result"},
    "blockx_io_backend_seconds_bucket": {"backend", "operation", "le"},
    "blockx_io_backend_seconds_count": {"backend", "operation"},
    "blockx_io_backend_seconds_sum": {"backend", "operation"},
    "blockx_executors": {"state"},
    "blockx_executor_rss_bytes": {"executor"},
    "blockx_executor_cpu_seconds_total": {"executor"},
    "blockx_executor_contexts": {"executor", "state"},
    "blockx_executor_restarts_total": {"executor"},
    "blockx_executor_wedge_kills_total": set(),
    "blockx_executor_heartbeat_age_seconds": {"executor"},
    "blockx_tasks": {"state"},
    "blockx_rows_total": set(),
}
#: Series whose label values appear with use (a backend's operations): declared from
#: the start, with samples once the operation was first used.
PER_OPERATION = {name for name in SERIES if name.startswith("blockx_io_")}
#: Families as declared (``# TYPE``), for the per-operation ones.
FAMILIES = {
    "blockx_io_requests": "counter",
    "blockx_io_backend_seconds": "histogram",
}


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: Samples) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for name, labels in samples:
        out.setdefault(name, []).append(dict(labels))
    return out


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read().decode()


async def scrape(port: int) -> tuple[str, Samples]:
    """GET /metrics from a thread, while the worker's loop runs on."""
    status, content_type, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
    assert status == 200, body
    assert content_type.startswith("text/plain"), content_type
    return body, parse(body)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


# --- the functions of the tasks ---------------------------------------------------------------

WRITER = """
def _(p):
    return {"written": Table("prices").upsert_rows(p["rows"])}
"""

PARENT = """
def _(p):
    usd = Table("prices").get_row(p["token"])["usd"]
    first = function.call("double", {"x": usd})
    again = function.call("double", {"x": usd})  # the call cache answers
    return {"token": p["token"], "y": first["y"], "same": first == again}
"""

DOUBLE = "def _(p):\n    return {'y': p['x'] * 2}\n"

FAILS = "def _(p):\n    raise ValueError('no such wallet: ' + p['wallet'])\n"

FLAKY = """
from blockx.sdk import get_provider

def _(p):
    return get_provider().read_req("flaky", "get", {"key": p["key"]})
"""

GATED = """
import os, time

def _(p):
    while not os.path.exists(p["gate"]):
        time.sleep(0.02)
    return {"i": p["i"]}
"""


class Flaky:
    """A backend whose first answer to each key is a transient error (retryable
    ``io_error``); later ones answer. Not cacheable: every read reaches it."""

    name = "flaky"

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def prepare(
        self, io_kind: str, operation: str, params: Any, sidecar: bytes | None
    ) -> PreparedRequest:
        return PreparedRequest(operation, params, domain=None, cacheable=False)

    def execute(self, request: PreparedRequest) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        key = str(request.body["key"])
        if key in self.seen:
            future.set_result(Reply({"key": key, "ok": True}))
        else:
            self.seen.add(key)
            error = RemoteError(kind="io_error", message="node busy, try again", retryable=True)
            future.set_result(Reply(error=error))
        return future

    async def close(self) -> None:
        return None


# --- a Worker(metrics_port=0) ------------------------------------------------------------------


def _check_present_at_start(body: str, samples: Samples, executors: int) -> None:
    found = names(samples)
    for name, labels in SERIES.items():
        if name in PER_OPERATION:
            continue
        assert name in found, f"{name} missing before any call:\n{body}"
        for label_set in found[name]:
            assert set(label_set) == labels, (name, label_set)
    for family, kind in FAMILIES.items():  # (the counter's TYPE line: with _total or not)
        assert re.search(rf"^# TYPE {family}(_total)? {kind}$", body, re.M), family
    # Every label set known in advance is there, at 0.
    for kind in ("root", "subcall"):
        for outcome in ("succeeded", "failed", "cancelled"):
            key = ("blockx_calls_total", frozenset({("kind", kind), ("outcome", outcome)}))
            assert samples[key] == 0
    for error_kind in ERROR_KINDS:
        assert samples[("blockx_call_failures_total", frozenset({("error_kind", error_kind)}))] == 0
        assert samples[("blockx_call_retries_total", frozenset({("reason", error_kind)}))] == 0
    for wait in WAIT_KINDS:
        assert samples[("blockx_calls_suspended", frozenset({("wait", wait)}))] == 0
    for cache in ("call", "io"):
        assert samples[("blockx_cache_hits_total", frozenset({("cache", cache)}))] == 0
        assert samples[("blockx_singleflight_joins_total", frozenset({("cache", cache)}))] == 0
    for state in EXECUTOR_STATES:
        assert ("blockx_executors", frozenset({("state", state)})) in samples
    assert value(samples, "blockx_executors", state="running") == executors
    for state in TASK_STATES:
        assert samples[("blockx_tasks", frozenset({("state", state)}))] == 0
    executor_ids = {labels["executor"] for labels in found["blockx_executor_rss_bytes"]}
    assert executor_ids == {f"exec-{i}" for i in range(executors)}
    for executor in executor_ids:
        for state in CONTEXT_STATES:
            key = (
                "blockx_executor_contexts",
                frozenset({("executor", executor), ("state", state.lower())}),
            )
            assert key in samples, key
        assert value(samples, "blockx_executor_rss_bytes", executor=executor) > 0
        assert value(samples, "blockx_executor_restarts_total", executor=executor) == 0
    assert value(samples, "blockx_call_duration_seconds_count") == 0
    assert value(samples, "blockx_call_duration_seconds_bucket", le="+Inf") == 0
    assert value(samples, "blockx_calls_inflight") == 0
    assert value(samples, "blockx_rows_total") == 0
    assert value(samples, "blockx_executor_wedge_kills_total") == 0


@pytest.fixture
def flaky_io(tmp_path: Path) -> Iterator[tuple[IOSubsystem, Flaky]]:
    flaky = Flaky()
    registry = default_registry()
    registry.register("flaky", flaky)
    config = load_io_config({"blockdb": {"sqlite_path": str(tmp_path / "m.sqlite3")}}, env={})
    yield IOSubsystem(config, registry), flaky


def test_every_series_from_the_start_then_moved_by_exactly_what_the_run_did(
    flaky_io: tuple[IOSubsystem, Flaky],
) -> None:
    io, _flaky = flaky_io
    executors = 2
    with WorkerSession(e2e_config(), metrics_port=0) as session:
        worker = session.worker
        port = worker.metrics_port
        assert isinstance(port, int) and port > 0

        async def scenario() -> tuple[Any, ...]:
            try:
                body0, s0 = await scrape(port)
                _check_present_at_start(body0, s0, executors)
                rows = [{"key": "ETH", "usd": 3000}, {"key": "BTC", "usd": 60000}]
                wrote = await worker.run_task(
                    Task(
                        functions={"writer": WRITER},
                        calls=[Call("writer", {"rows": rows})],
                        io_handler=io,
                    )
                )
                assert wrote.success, wrote
                _, s1 = await scrape(port)
                result = await worker.run_task(
                    Task(
                        functions={
                            "parent": PARENT,
                            "double": DOUBLE,
                            "fails": FAILS,
                            "flaky": FLAKY,
                        },
                        calls=[
                            Call("parent", {"token": "ETH"}),
                            Call("parent", {"token": "BTC"}),
                            Call("fails", {"wallet": "mallory"}),
                            Call("flaky", {"key": "k1"}),
                        ],
                        policy=TaskPolicy(failure="continue", max_attempts=3, base_backoff_ms=5),
                        io_handler=io,
                    )
                )
                body2, s2 = await scrape(port)
                return s1, result, body2, s2, worker_snapshot(worker)
            finally:
                await io.close()

        s1, result, body2, s2, snap = session.run(scenario(), timeout=120)

    assert result.success and result.stats.failed == 1 and result.stats.retries == 1, result
    assert [e.kind for e in result.errors] == ["user_error"]
    # Calls: 3 roots succeeded (two parents, the flaky one on its 2nd attempt), 1 failed;
    # 4 sub-calls succeeded (each parent's two: one ran, one from the call cache).
    expected_calls = {
        ("root", "succeeded"): 3,
        ("root", "failed"): 1,
        ("root", "cancelled"): 0,
        ("subcall", "succeeded"): 4,
        ("subcall", "failed"): 0,
        ("subcall", "cancelled"): 0,
    }
    for (kind, outcome), moved in expected_calls.items():
        got = delta(s2, s1, "blockx_calls_total", kind=kind, outcome=outcome)
        assert got == moved, (kind, outcome, got, body2)
    for error_kind in ERROR_KINDS:
        failed = delta(s2, s1, "blockx_call_failures_total", error_kind=error_kind)
        assert failed == (1 if error_kind == "user_error" else 0), error_kind
        retried = delta(s2, s1, "blockx_call_retries_total", reason=error_kind)
        assert retried == (1 if error_kind == "io_error" else 0), error_kind
    # Attempts: 2 parents + 2 sub-calls that ran + the failing call + 2 of the flaky one.
    assert delta(s2, s1, "blockx_call_duration_seconds_count") == 7
    assert delta(s2, s1, "blockx_call_duration_seconds_bucket", le="+Inf") == 7
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in s2.items()
        if name == "blockx_call_duration_seconds_bucket"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert value(s2, "blockx_call_duration_seconds_sum") >= 0
    assert delta(s2, s1, "blockx_cache_hits_total", cache="call") == 2
    assert delta(s2, s1, "blockx_singleflight_joins_total", cache="call") == 0
    assert delta(s2, s1, "blockx_rows_total") == 3
    assert value(s1, "blockx_rows_total") == 1  # the writer's row
    # IO: two table reads and two flaky reads (one refused as transient), nothing cached.
    blockdb_get = {"backend": "blockdb", "operation": "get_row"}
    flaky_get = {"backend": "flaky", "operation": "get"}
    assert delta(s2, s1, "blockx_io_requests_total", **blockdb_get, result="ok") == 2
    assert delta(s2, s1, "blockx_io_requests_total", **flaky_get, result="ok") == 1
    assert delta(s2, s1, "blockx_io_requests_total", **flaky_get, result="error") == 1
    for result_kind in ("cached", "joined", "abandoned", "local"):
        assert value(s2, "blockx_io_requests_total", **flaky_get, result=result_kind) == 0
    for labels in (blockdb_get, flaky_get):
        for result_kind in IO_RESULTS:  # the whole label set, once the operation is seen
            key = (
                "blockx_io_requests_total",
                frozenset({**labels, "result": result_kind}.items()),
            )
            assert key in s2, key
    assert delta(s2, s1, "blockx_io_backend_seconds_count", **blockdb_get) == 2
    assert value(s2, "blockx_io_backend_seconds_count", **flaky_get) == 2
    assert value(s2, "blockx_io_backend_seconds_bucket", **flaky_get, le="+Inf") == 2
    assert delta(s2, s1, "blockx_cache_hits_total", cache="io") == 0
    # The writer's upsert is there too, from the first task.
    assert value(s1, "blockx_io_requests_total", backend="blockdb", operation="upsert_rows",
                 result="ok") == 1  # fmt: skip
    # Tasks: two ended, both succeeded (failure: continue); none live.
    assert value(s2, "blockx_tasks", state="succeeded") == 2
    assert value(s2, "blockx_tasks", state="running") == 0
    assert value(s2, "blockx_tasks", state="failed") == 0
    # Executors: alive and reporting; nothing restarted or killed.
    assert value(s2, "blockx_executors", state="running") == executors
    for i in range(executors):
        executor = f"exec-{i}"
        assert value(s2, "blockx_executor_cpu_seconds_total", executor=executor) > 0
        assert value(s2, "blockx_executor_heartbeat_age_seconds", executor=executor) < 30
        assert value(s2, "blockx_executor_restarts_total", executor=executor) == 0
    assert value(s2, "blockx_executor_wedge_kills_total") == 0
    # The snapshot the dashboard reads says the same.
    assert snap["calls"]["by_kind"]["subcall"]["succeeded"] == 4
    assert snap["calls"]["failures"] == {"user_error": 1}
    assert snap["calls"]["retries"] == {"io_error": 1}
    assert snap["rows"] == 4 and snap["pool"] == {"restarts": 0, "wedge_kills": 0}
    assert {e["executor"] for e in snap["executors"]} == {"exec-0", "exec-1"}
    ops = {(op["backend"], op["operation"]) for op in snap["io"]}
    assert {("blockdb", "get_row"), ("flaky", "get"), ("blockdb", "upsert_rows")} <= ops


def test_gauges_rise_while_calls_sleep_and_fall_when_they_end(tmp_path: Path) -> None:
    """Four calls sleep until a file exists: in flight 4 and suspended{sleep} 4 (from the
    executors' heartbeats) while they wait; both 0 once they ended."""
    gate = tmp_path / "gate"
    with WorkerSession(e2e_config(), metrics_port=0) as session:
        worker = session.worker
        port = worker.metrics_port
        assert port is not None

        async def scenario() -> tuple[Samples, Samples]:
            task = Task(
                functions={"gated": GATED},
                calls=[Call("gated", {"gate": str(gate), "i": i}) for i in range(4)],
                policy=TaskPolicy(call_budget_ms=0),
            )
            handle = worker.submit(task)
            deadline = time.monotonic() + 60
            while True:
                _, during = await scrape(port)
                if (
                    value(during, "blockx_calls_suspended", wait="sleep") == 4
                    and value(during, "blockx_calls_inflight") == 4
                    and value(during, "blockx_tasks", state="running") == 1
                ):
                    break
                assert time.monotonic() < deadline, during
                await asyncio.sleep(0.05)
            gate.touch()
            result = await handle.result()
            assert result.success, result
            deadline = time.monotonic() + 60
            while True:  # the suspended count is the heartbeats': the next one says 0
                _, after = await scrape(port)
                if value(after, "blockx_calls_suspended", wait="sleep") == 0:
                    break
                assert time.monotonic() < deadline, after
                await asyncio.sleep(0.05)
            return during, after

        during, after = session.run(scenario(), timeout=120)

    contexts = sum(
        v
        for (name, labels), v in during.items()
        if name == "blockx_executor_contexts" and dict(labels)["state"] == "waiting_sleep"
    )
    assert contexts == 4
    assert value(during, "blockx_calls_total", kind="root", outcome="succeeded") == 0
    assert value(after, "blockx_calls_inflight") == 0
    assert value(after, "blockx_calls_total", kind="root", outcome="succeeded") == 4
    assert value(after, "blockx_tasks", state="succeeded") == 1
    assert value(after, "blockx_tasks", state="running") == 0
    assert value(after, "blockx_call_duration_seconds_count") == 4
    # Each call slept until the gate opened: its attempt took at least ~that long.
    assert value(after, "blockx_call_duration_seconds_bucket", le="0.001") == 0


def test_an_executor_killed_from_outside_is_counted_restarted() -> None:
    """SIGKILL of exec-0's process: its restart counter moves by one (the other's not),
    and it reports again (a new process, a fresh heartbeat)."""
    import signal

    with WorkerSession(e2e_config(), metrics_port=0) as session:
        worker = session.worker
        port = worker.metrics_port
        assert port is not None

        async def scenario() -> tuple[Samples, Samples]:
            _, before = await scrape(port)
            old_pid = worker.pool.pid("exec-0")
            assert old_pid is not None
            os.kill(old_pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while True:
                _, after = await scrape(port)
                new_pid = worker.pool.pid("exec-0")
                if (
                    value(after, "blockx_executor_restarts_total", executor="exec-0") == 1
                    and new_pid not in (None, old_pid)
                    and worker.adapter.is_attached("exec-0")
                    and value(after, "blockx_executors", state="running") == 2
                ):
                    return before, after
                assert time.monotonic() < deadline, after
                await asyncio.sleep(0.05)

        before, after = session.run(scenario(), timeout=90)
    assert value(before, "blockx_executor_restarts_total", executor="exec-0") == 0
    assert value(after, "blockx_executor_restarts_total", executor="exec-1") == 0
    assert value(after, "blockx_executor_wedge_kills_total") == 0  # not the backstop's kill


def test_the_collector_reads_zeros_off_a_worker_that_is_not_running() -> None:
    """Before start a snapshot is zeros, and the collector still yields every series --
    a scrape never raises."""
    from blockx.worker.app import Worker

    worker = Worker(e2e_config())
    snap = worker_snapshot(worker)
    assert snap["calls"]["succeeded"] == 0 and snap["executors"] == [] and snap["rows"] == 0
    families = {family.name for family in WorkerCollector(worker).collect()}
    assert {"blockx_calls", "blockx_tasks", "blockx_rows", "blockx_io_requests"} <= families
    assert io_snapshot(object()) == []


# --- blockx run --metrics-port ---------------------------------------------------------------


def test_blockx_run_metrics_port_is_scraped_while_a_gated_task_runs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    task = write(
        tmp_path / "task.yaml",
        "functions:\n"
        "  gated:\n"
        "    source: |\n"
        + "".join(f"      {line}\n" for line in GATED.strip().splitlines())
        + (
            "calls:\n"
            + "".join(
                f"  - {{function: gated, args: {{gate: '{gate}', i: {i}}}}}\n" for i in range(3)
            )
            + "policy: {call_budget_ms: 0}\n"
        ),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "blockx",
            "run",
            str(task),
            "--executors",
            "2",
            "--metrics-port",
            "0",
            "-o",
            str(tmp_path / "out.jsonl"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    lines: list[str] = []
    found: list[int] = []

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            match = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", line)
            if match:
                found.append(int(match.group(1)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        port = wait_for(lambda: found and found[0], 90, "the metrics line on stderr")
        url = f"http://127.0.0.1:{port}/metrics"

        def sleeping() -> Samples | None:
            samples = parse(get(url)[2])
            ok = value(samples, "blockx_calls_suspended", wait="sleep") == 3
            return samples if ok and value(samples, "blockx_calls_inflight") == 3 else None

        first = wait_for(sleeping, 90, "three calls sleeping")
        for name in SERIES:
            if name not in PER_OPERATION:
                assert name in names(first), name
        assert value(first, "blockx_tasks", state="running") == 1
        assert value(first, "blockx_calls_total", kind="root", outcome="succeeded") == 0
        gate.touch()
        assert proc.wait(timeout=90) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    # The server stopped with the worker.
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3


def test_blockx_run_help_says_where_metrics_listen() -> None:
    from blockx.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    text = run.format_help()
    assert "--metrics-port PORT" in text and "127.0.0.1" in text


# --- blockx serve: GET /metrics ------------------------------------------------------------------


def test_blockx_serve_get_metrics(tmp_path: Path) -> None:
    token_file = write(tmp_path / "token", "s3cret-token\n")
    token_file.chmod(0o600)
    gate = tmp_path / "gate"
    source = "import os, time\ndef _(i):\n" + (
        f"    while not os.path.exists({str(gate)!r}):\n        time.sleep(0.02)\n"
        "    return {'i': i}\n"
    )
    with Server(tmp_path / "data", "--token-file", str(token_file), token="s3cret-token") as s:
        assert s.request("GET", "/metrics", token=None).status == 401
        reply = s.request("GET", "/metrics")
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
        start = parse(reply.body.decode())
        for name in SERIES:
            if name not in PER_OPERATION:
                assert name in names(start), name
        for state in TASK_STATES:
            assert value(start, "blockx_tasks", state=state) == 0
        task_id = s.submit(
            {
                "functions": {"gated": {"source": source}},
                "calls": [{"function": "gated", "args": i} for i in range(3)],
                "policy": {"call_budget_ms": 0},
            }
        )

        def running() -> Samples | None:
            samples = parse(s.request("GET", "/metrics").body.decode())
            ok = value(samples, "blockx_tasks", state="running") == 1
            return samples if ok and value(samples, "blockx_calls_inflight") == 3 else None

        during = wait_for(running, 90, "the task running, three calls in flight")
        assert value(during, "blockx_rows_total") == 0
        gate.touch()
        assert s.wait_finished(task_id)["state"] == "succeeded"
        after = parse(s.request("GET", "/metrics").body.decode())
    assert value(after, "blockx_tasks", state="succeeded") == 1
    assert value(after, "blockx_tasks", state="running") == 0
    assert value(after, "blockx_calls_total", kind="root", outcome="succeeded") == 3
    assert value(after, "blockx_rows_total") == 3


def test_the_attempt_histogram_folds_its_per_millisecond_slots_into_the_buckets() -> None:
    """Attempts under 1024 ms are counted one slot per ms, slower ones by bucket: read,
    both fold into the power-of-two buckets (``le`` inclusive) with the exact sum."""
    from blockx.worker.core.state import ATTEMPT_BUCKETS_MS, DispatcherStats

    stats = DispatcherStats()
    durations = [0, 1, 2, 3, 4, 5, 1023, 1024, 1025, 300_000, 10**9]
    for ms in durations:
        if 0 <= ms < 1024:
            stats.attempt_ms_counts[ms] += 1
        else:
            stats.record_slow_attempt(ms)
    stats.record_slow_attempt(-5)  # the wall clock stepped back: counted as 0 ms
    counts, total = stats.attempt_histogram()
    assert total == sum(durations)
    expected = [0] * (len(ATTEMPT_BUCKETS_MS) + 1)
    for ms in [*durations, 0]:
        index = next((i for i, b in enumerate(ATTEMPT_BUCKETS_MS) if ms <= b), None)
        expected[len(ATTEMPT_BUCKETS_MS) if index is None else index] += 1
    assert counts == expected
    assert counts[0] == 3 and counts[1] == 1 and counts[2] == 2 and counts[-1] == 2

"""Traces (issue #20): the five spans, the W3C context across the socket, the trace file.

The end-to-end tests run a real worker with real executor processes and read
back the trace file: every line parses, names come from the five, the ``task``
span is the root of its trace, every ``execute`` span's parent is a ``call``
span of the same trace, every ``io`` span's parent is its call, ``subcall``
spans hang under their caller's ``call`` and the sub-call's own ``call`` under
its ``subcall``. ``blockx run --trace-file`` is run as a user runs it, on the
quickstart (sub-calls and blockdb Table reads on SQLite). Sampling at 0 writes
nothing; an executor that sends no ``executeSpan`` back (an older protocol)
still runs every call, the trace just has no ``execute`` span.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from tests.cli.cli_support import blockx, clean_env, copy_example
from tests.worker.e2e.e2e_support import RecordingSpawner, WorkerSession, e2e_config

from blockx.executor.execute_frames import decode_inbound
from blockx.executor.tracing import execute_span_from, traced_envelope
from blockx.observability.tracing import (
    CallTracer,
    JsonLinesSink,
    OtlpSink,
    Tracing,
    sample_ratio_from_env,
)
from blockx.wire import keys
from blockx.worker.api import Call, Task
from blockx.worker.io import IOResult
from blockx.worker.link.completed_frames import decode_call_frames
from blockx.worker.pool.spawner import ExecutorLaunchSpec, executor_command

NAMES = {"task", "call", "io", "subcall", "execute"}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

PARENT = """
def _(p):
    child = function.call("child", {"key": p["key"]})
    return {"parent": child["usd"] + 1}
"""
CHILD = """
from blockx.sdk import db

def _(p):
    first = db.get("prices", p["key"])
    second = db.get("prices", p["key"] + 100)
    return {"usd": first["usd"] + second["usd"]}
"""


class PriceBackend:
    """A real asyncio IO backend: answers each read after a short sleep."""

    def __init__(self) -> None:
        self.requests = 0

    async def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOResult:
        self.requests += 1
        await asyncio.sleep(0.002)
        return IOResult(result={"usd": payload["params"]["key"] * 2}, budget_used_ms=1)


def read_spans(path: Path) -> list[dict[str, Any]]:
    """Every line of a trace file, parsed (a line that does not parse fails the test)."""
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    for span in spans:
        assert set(span) == {
            "trace_id",
            "span_id",
            "parent_span_id",
            "name",
            "start_ns",
            "end_ns",
            "attributes",
        }, span
        assert span["name"] in NAMES, span
        assert len(span["trace_id"]) == 32 and len(span["span_id"]) == 16
        assert 0 < span["start_ns"] <= span["end_ns"], span
    return spans


def check_tree(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The shape the issue asks for; returns the spans by id."""
    by_id = {span["span_id"]: span for span in spans}
    assert len(by_id) == len(spans), "span ids are unique"
    for span in spans:
        parent = by_id.get(span["parent_span_id"]) if span["parent_span_id"] else None
        if span["name"] == "task":
            assert span["parent_span_id"] is None, span
            continue
        assert parent is not None, f"{span['name']} span without its parent: {span}"
        assert parent["trace_id"] == span["trace_id"], span
        expected = {
            "execute": {"call"},
            "io": {"call"},
            "subcall": {"call"},
            "call": {"task", "subcall"},
        }[span["name"]]
        assert parent["name"] in expected, (span, parent)
        if span["name"] in ("execute", "io", "subcall"):
            assert parent["start_ns"] <= span["start_ns"], (span, parent)
        if span["name"] == "execute":  # the executor's side of the same attempt
            assert span["attributes"]["blockx.call_id"] == parent["attributes"]["blockx.call_id"]
            assert span["attributes"]["blockx.attempt"] == parent["attributes"]["blockx.attempt"]
        if span["name"] == "call" and parent["name"] == "subcall":
            caller = by_id[parent["parent_span_id"]]
            assert span["attributes"]["blockx.call_id"].startswith(
                caller["attributes"]["blockx.call_id"] + "/"
            ), (span, caller)
    return by_id


# --- the wire: the executor's side, without processes ---------------------------------------


def test_execute_span_from_takes_a_sampled_traceparent_only() -> None:
    span = execute_span_from({"traceparent": TRACEPARENT})
    assert span is not None
    assert span.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent_span_id == "b7ad6b7169203331"
    assert len(span.span_id) == 16 and span.span_id != span.parent_span_id
    assert span.traceparent() == f"00-{span.trace_id}-{span.span_id}-01"
    for bad in (
        None,
        "x",
        {},
        {"traceparent": TRACEPARENT[:-2] + "00"},  # not sampled
        {"traceparent": TRACEPARENT.upper()},
        {"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"},
        {"traceparent": TRACEPARENT + "-"},
        {"traceparent": 42},
    ):
        assert execute_span_from(bad) is None, bad


def test_a_traced_terminal_frame_keeps_every_key_and_takes_the_generic_path() -> None:
    span = execute_span_from({"traceparent": TRACEPARENT})
    assert span is not None
    envelope = {
        keys.F_MESSAGE_TYPE: keys.MT_CALL_COMPLETED,
        keys.F_CALL_ID: "t/c1",
        keys.F_EXECUTOR_ID: "exec-0",
        keys.F_PAYLOAD: {keys.FP_TASK_ID: "t", keys.FP_ATTEMPT_SEQ: 1, keys.FP_OUTPUT: {"y": 1}},
    }
    plain = msgspec.json.encode(envelope)
    assert decode_call_frames(plain) is not None  # the typed fast path takes an untraced one
    traced = traced_envelope(envelope, span, {"blockx.call_id": "t/c1"})
    body = msgspec.json.encode(traced)
    assert decode_call_frames(body) is None  # ... and leaves a traced one to the generic path
    decoded = json.loads(body)
    assert next(iter(decoded)) == keys.F_TRACE
    assert decoded[keys.F_TRACE] == {"traceparent": span.traceparent()}
    executed = decoded[keys.F_PAYLOAD].pop(keys.FP_EXECUTE_SPAN)
    assert executed["parentSpanId"] == "b7ad6b7169203331"
    assert executed["traceId"] == span.trace_id and executed["spanId"] == span.span_id
    assert 0 < executed["startNs"] <= executed["endNs"]
    del decoded[keys.F_TRACE]
    assert decoded == json.loads(plain)  # every other key as it was


def test_a_traced_execute_call_is_the_untraced_one_with_trace_first() -> None:
    from blockx.worker.actor.execute import execute_body, execute_prefix
    from blockx.worker.core import DispatchCallCmd, PreparedCall

    prefix = execute_prefix("t", "f", "d" * 64, "", None, False)
    call = PreparedCall("f", "d" * 64, b'{"x":1}', "ab" * 16)
    cmd = DispatchCallCmd("t/c1", "t", "exec-0", call, None, (), 0, 1, 0)
    body = execute_body(prefix, cmd)
    tracer = CallTracer(Tracing([], sample_ratio=1.0))
    tracer.task_started("t", "t")
    traced = tracer.traced_body(cmd, body)
    assert decode_inbound(body) is not None
    assert decode_inbound(traced) is None  # the executor reads it on its generic path
    decoded = json.loads(traced)
    assert next(iter(decoded)) == keys.F_TRACE
    assert decoded.pop(keys.F_TRACE) == {"traceparent": tracer.calls["t/c1"].traceparent()}
    assert decoded == json.loads(body)


# --- configuration ---------------------------------------------------------------------------


def test_tracing_is_off_by_default_and_configured_by_the_standard_variables(
    tmp_path: Path,
) -> None:
    assert Tracing.from_env(environ={}) is None
    assert Tracing.from_env(environ={"OTEL_TRACES_SAMPLER": "always_on"}) is None
    tracing = Tracing.from_env(environ={"BLOCKX_TRACE_FILE": str(tmp_path / "t.jsonl")})
    assert tracing is not None and tracing.sample_ratio == 1.0
    assert isinstance(tracing.sinks[0], JsonLinesSink)
    tracing.sinks[0].close()
    assert sample_ratio_from_env({}) == 1.0
    assert sample_ratio_from_env({"OTEL_TRACES_SAMPLER": "always_off"}) == 0.0
    assert sample_ratio_from_env({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}) == 0.0
    ratio = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}
    assert sample_ratio_from_env(ratio) == 0.01
    ratio["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
    assert sample_ratio_from_env(ratio) == 0.01
    assert sample_ratio_from_env({"OTEL_TRACES_SAMPLER": "traceidratio"}) == 1.0


def test_the_sampler_decides_once_per_call() -> None:
    tracer = CallTracer(Tracing([], sample_ratio=0.25))
    ids = [f"task#1/c{i}" for i in range(4000)]
    first = [tracer.sampled(call_id) for call_id in ids]
    assert first == [tracer.sampled(call_id) for call_id in ids]  # every attempt agrees
    assert 700 < sum(first) < 1300
    assert not any(CallTracer(Tracing([], sample_ratio=0.0)).sampled(i) for i in ids)
    assert all(CallTracer(Tracing([], sample_ratio=1.0)).sampled(i) for i in ids)


# --- a real worker, real executors ------------------------------------------------------------


def parent_child_task(n: int) -> Task:
    return Task(
        functions={"parent": PARENT, "child": CHILD},
        calls=[Call("parent", {"key": i}) for i in range(n)],
    )


@pytest.mark.slow
def test_trace_file_of_a_task_with_subcalls_and_io(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    path = tmp_path / "trace.jsonl"
    exporter = InMemorySpanExporter()
    tracing = Tracing([JsonLinesSink(path), OtlpSink(exporter, batch=False)])
    backend = PriceBackend()
    with WorkerSession(e2e_config(), io_handlers={"blockdb": backend}, tracing=tracing) as s:
        result = s.run(s.worker.run_task(parent_child_task(6)))
        assert result.success, result.errors
        assert result.outputs == [{"parent": 2 * i + 2 * (i + 100) + 1} for i in range(6)]
    spans = read_spans(path)
    by_id = check_tree(spans)
    names = Counter(span["name"] for span in spans)
    assert names == {"task": 1, "call": 12, "subcall": 6, "io": 12, "execute": 12}, names
    assert len({span["trace_id"] for span in spans}) == 1  # one trace per task
    for span in spans:
        attributes = span["attributes"]
        if span["name"] == "call":
            assert attributes["blockx.outcome"] == "succeeded"
            assert attributes["blockx.attempt"] == 1
            assert attributes["blockx.function"] in ("parent", "child")
            assert attributes["blockx.kind"] == (
                "root" if attributes["blockx.function"] == "parent" else "subcall"
            )
        elif span["name"] == "io":
            assert attributes["blockx.io.backend"] == "blockdb"
            assert attributes["blockx.io.operation"] == "get_row"
            assert attributes["blockx.io.answer"] == "sent"
            assert by_id[span["parent_span_id"]]["attributes"]["blockx.function"] == "child"
        elif span["name"] == "subcall":
            assert by_id[span["parent_span_id"]]["attributes"]["blockx.function"] == "parent"
        elif span["name"] == "execute":
            assert attributes["blockx.executor"].startswith("exec-")
    # The same spans reached the exporter, the executors' too, with the same ids.
    exported = {
        (f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}", span.name)
        for span in exporter.get_finished_spans()
    }
    assert exported == {(span["trace_id"], span["span_id"], span["name"]) for span in spans}


@pytest.mark.slow
def test_sampling_at_zero_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    tracing = Tracing([JsonLinesSink(path)], sample_ratio=0.0)
    with WorkerSession(e2e_config(), io_handlers={"blockdb": PriceBackend()}, tracing=tracing) as s:
        result = s.run(s.worker.run_task(parent_child_task(4)))
        assert result.success, result.errors
    assert path.read_text() == ""


def _executor_without_spans(spec: ExecutorLaunchSpec) -> list[str]:
    """A real executor that never starts an execute span: one from before tracing."""
    argv = executor_command(spec)
    module_at = argv.index("-m")
    patch = (
        "import runpy, sys\n"
        "import blockx.executor.inbound_frames as inbound\n"
        "inbound.execute_span_from = lambda trace: None\n"
        f"sys.argv = ['blockx.executor', *{argv[module_at + 2 :]!r}]\n"
        "runpy.run_module('blockx.executor', run_name='__main__', alter_sys=True)\n"
    )
    return [*argv[:module_at], "-c", patch]


@pytest.mark.slow
def test_an_executor_that_sends_no_execute_span_still_runs_every_call(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    tracing = Tracing([JsonLinesSink(path)])
    spawner = RecordingSpawner(argv_factory=_executor_without_spans)
    with WorkerSession(
        e2e_config(), io_handlers={"blockdb": PriceBackend()}, tracing=tracing, spawner=spawner
    ) as s:
        result = s.run(s.worker.run_task(parent_child_task(3)))
        assert result.success, result.errors
        tracer = s.worker.orchestrator.tracer
        assert tracer is not None and tracer.refused_execute_spans == 0
    spans = read_spans(path)
    check_tree(spans)
    names = Counter(span["name"] for span in spans)
    assert names == {"task": 1, "call": 6, "subcall": 3, "io": 6}, names


# --- blockx run --trace-file ----------------------------------------------------------------


@pytest.mark.slow
def test_blockx_run_trace_file_end_to_end(tmp_path: Path) -> None:
    task = copy_example("quickstart", tmp_path)
    trace = tmp_path / "trace.jsonl"
    done = blockx("run", task, "-o", tmp_path / "rows.jsonl", "--trace-file", trace, "-q")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    spans = read_spans(trace)
    by_id = check_tree(spans)
    names = Counter(span["name"] for span in spans)
    roots = [span for span in spans if span["name"] == "task"]
    assert len(roots) == 1 and roots[0]["attributes"]["blockx.task_id"] == "quickstart"
    root_calls = [
        s for s in spans if s["name"] == "call" and s["attributes"]["blockx.kind"] == "root"
    ]
    assert len(root_calls) == len(rows) == 5
    assert names["subcall"] >= 1 and names["io"] >= 1
    assert names["execute"] == names["call"]  # every attempt, seen from both sides
    reads = [s for s in spans if s["name"] == "io" and s["attributes"]["blockx.io.operation"]]
    assert {s["attributes"]["blockx.io.backend"] for s in reads} == {"blockdb"}
    assert "get_row" in {s["attributes"]["blockx.io.operation"] for s in reads}
    for span in reads:
        assert by_id[span["parent_span_id"]]["name"] == "call"

    # BLOCKX_TRACE_FILE does the same; a sampler at 0 writes no span at all.
    again = tmp_path / "again.jsonl"
    env = clean_env(
        BLOCKX_TRACE_FILE=str(again),
        OTEL_TRACES_SAMPLER="traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0",
    )
    done = blockx("run", task, "-o", tmp_path / "rows2.jsonl", "-q", env=env)
    assert done.returncode == 0, done.stderr
    assert again.exists() and again.read_text() == ""


def test_blockx_run_help_names_the_trace_file_option() -> None:
    done = blockx("run", "--help")
    assert done.returncode == 0
    assert "--trace-file" in done.stdout
    done = blockx("serve", "--help")
    assert done.returncode == 0
    assert "--trace-file" in done.stdout


def test_a_trace_file_that_cannot_be_written_is_bad_usage(tmp_path: Path) -> None:
    """Exit 2 before anything runs, naming the flag (or variable) and the path; not a
    traceback from the worker."""
    task = copy_example("quickstart", tmp_path)
    missing = tmp_path / "no" / "such" / "trace.jsonl"
    done = blockx("run", task, "-o", tmp_path / "rows.jsonl", "--trace-file", missing, "-q")
    assert done.returncode == 2, done.stderr
    assert "--trace-file" in done.stderr and "no such directory" in done.stderr
    assert not (tmp_path / "rows.jsonl").exists()
    env = clean_env(BLOCKX_TRACE_FILE=str(missing))
    done = blockx("run", task, "-o", tmp_path / "rows.jsonl", "-q", env=env)
    assert done.returncode == 2 and "BLOCKX_TRACE_FILE" in done.stderr, done.stderr
    done = blockx("serve", "--data-dir", tmp_path / "data", "--port", "0", "--trace-file", tmp_path)
    assert done.returncode == 2 and "--trace-file" in done.stderr, done.stderr
    assert "is a directory" in done.stderr


@pytest.mark.slow
def test_blockx_serve_trace_file(tmp_path: Path) -> None:
    from tests.serve.server import Server

    trace = tmp_path / "serve-trace.jsonl"
    task = {
        "functions": {"parent": {"source": SERVE_PARENT}, "child": {"source": SERVE_CHILD}},
        "calls": [{"function": "parent", "args": i} for i in range(4)],
    }
    with Server(tmp_path / "data", "--trace-file", str(trace)) as server:
        assert server.wait_finished(server.submit(task))["rows"] == 4
        # The task span is written (and the file flushed) when the task ends.
        spans = read_spans(trace)
    check_tree(spans)
    names = Counter(span["name"] for span in spans)
    assert names == {"task": 1, "call": 8, "subcall": 4, "execute": 8}, names


SERVE_PARENT = "def _(i):\n    return function.call('child', i) + 1\n"
SERVE_CHILD = "def _(i):\n    return i * 2\n"


class SlowTable:
    """A real IO backend named ``blockdb`` behind a task IO scope (read cache, shared
    flights), as ``blockx run`` serves reads: each read answers after 50 ms."""

    name = "blockdb"

    def prepare(self, io_kind: str, operation: str, params: Any, sidecar: Any) -> Any:
        from blockx.worker.io.backend import PreparedRequest

        return PreparedRequest(operation, params["key"], domain=params["table"])

    def execute(self, request: Any) -> asyncio.Future[Any]:
        from blockx.worker.io.backend import Reply

        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        loop.call_later(0.05, future.set_result, Reply({"usd": request.body * 2}, nbytes=16))
        return future

    async def close(self) -> None:
        pass


SAME_KEY_TWICE = """
from blockx.sdk import db

def _(p):
    first = db.get("prices", 7)
    second = db.get("prices", 7)
    return first["usd"] + second["usd"] + p
"""


@pytest.mark.slow
def test_io_spans_say_sent_joined_or_cached(tmp_path: Path) -> None:
    from blockx.worker.io.registry import BackendRegistry, IOSubsystem

    path = tmp_path / "trace.jsonl"
    registry = BackendRegistry()
    registry.register("blockdb", SlowTable())
    io = IOSubsystem(registry=registry)
    with WorkerSession(e2e_config(), tracing=Tracing([JsonLinesSink(path)])) as s:

        async def scenario() -> Any:
            task = Task(
                functions={"reader": SAME_KEY_TWICE},
                calls=[Call("reader", i) for i in range(6)],
            )
            scope = task.io_handler = io.task_scope(task.task_id)
            try:
                return await s.worker.run_task(task)
            finally:
                scope.close()
                await io.close()

        result = s.run(scenario())
        assert result.success, result.errors
    spans = read_spans(path)
    check_tree(spans)
    answers = Counter(s["attributes"]["blockx.io.answer"] for s in spans if s["name"] == "io")
    # Six calls read key 7 twice: one backend request; the reads that came while it
    # was in flight joined it; the rest (every second read at least) hit the cache.
    assert answers["sent"] == 1, answers
    assert answers["cached"] >= 6, answers
    assert sum(answers.values()) == 12 and set(answers) <= {"sent", "joined", "cached"}
    assert answers["joined"] + answers["cached"] == 11, answers


class Collector:
    """A real OTLP/HTTP trace receiver on a loopback port: keeps every span it is sent."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[Any] = []
        self.paths: set[str] = set()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.paths.add(self.path)
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        collector.spans.extend(scope_spans.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_blockx_run_exports_the_same_spans_over_otlp_http(tmp_path: Path) -> None:
    task = copy_example("quickstart", tmp_path)
    trace = tmp_path / "trace.jsonl"
    collector = Collector()
    try:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=collector.url)
        done = blockx(
            "run", task, "-o", tmp_path / "rows.jsonl", "-q", "--trace-file", trace, env=env
        )
        assert done.returncode == 0, done.stderr
    finally:
        collector.close()
    assert collector.paths == {"/v1/traces"}
    spans = read_spans(trace)
    exported = {(s.trace_id.hex(), s.span_id.hex(), s.name) for s in collector.spans}
    assert exported == {(s["trace_id"], s["span_id"], s["name"]) for s in spans}
    assert {"task", "call", "io", "subcall", "execute"} <= {name for _, _, name in exported}
    parents = {s.span_id.hex(): s.parent_span_id.hex() for s in collector.spans}
    assert parents == {s["span_id"]: s["parent_span_id"] or "" for s in spans}


def test_otlp_export_follows_the_standard_variables() -> None:
    on = Tracing.from_env(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert on is not None and isinstance(on.sinks[0], OtlpSink)
    on.sinks[0].close()
    for off in (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"},
    ):
        assert Tracing.from_env(environ=off) is None


class FlakyBackend:
    """Fails the first read of each key with a retryable error, answers the rest."""

    def __init__(self) -> None:
        self.failed: set[int] = set()

    async def handle_io(
        self, task_id: str, call_id: str, payload: dict[str, Any], sidecar: bytes | None
    ) -> IOResult:
        from blockx.wire import RemoteError

        key = payload["params"]["key"]
        if key not in self.failed:
            self.failed.add(key)
            return IOResult(error=RemoteError(kind="io_error", message="flaky", retryable=True))
        return IOResult(result={"usd": key}, budget_used_ms=1)


ONE_READ = """
from blockx.sdk import db

def _(p):
    return db.get("prices", p)["usd"]
"""


@pytest.mark.slow
def test_a_call_span_per_attempt_with_its_outcome_and_error_kind(tmp_path: Path) -> None:
    from blockx.worker.api import TaskPolicy

    path = tmp_path / "trace.jsonl"
    with WorkerSession(
        e2e_config(),
        io_handlers={"blockdb": FlakyBackend()},
        tracing=Tracing([JsonLinesSink(path)]),
    ) as s:
        task = Task(
            functions={"read": ONE_READ},
            calls=[Call("read", i) for i in range(3)],
            policy=TaskPolicy(max_attempts=3),
        )
        result = s.run(s.worker.run_task(task))
        assert result.success, result.errors
        assert result.outputs == [0, 1, 2]
    spans = read_spans(path)
    check_tree(spans)
    calls = [span["attributes"] for span in spans if span["name"] == "call"]
    by_attempt = sorted(
        (a["blockx.call_id"], a["blockx.attempt"], a["blockx.outcome"]) for a in calls
    )
    ids = sorted({a["blockx.call_id"] for a in calls})
    assert by_attempt == sorted(
        [(call_id, 1, "failed") for call_id in ids] + [(call_id, 2, "succeeded") for call_id in ids]
    )
    assert all(a["blockx.error_kind"] == "io_error" for a in calls if a["blockx.attempt"] == 1)
    executes = [span["attributes"] for span in spans if span["name"] == "execute"]
    assert sorted((a["blockx.call_id"], a["blockx.attempt"]) for a in executes) == sorted(
        (call_id, attempt) for call_id, attempt, _ in by_attempt
    )
    assert {a["blockx.outcome"] for a in executes if a["blockx.attempt"] == 1} == {"failed"}

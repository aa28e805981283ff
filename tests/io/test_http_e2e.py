"""End to end: user functions calling ``Http`` (no imports) on real executor processes,
through a Worker whose IO is the real subsystem, against a real local web API.

The headline: 20 calls of ``Http.get_json`` on ONE executor, each answered after 0.2 s,
overlap — the server holds every request until all 20 are in flight at once, so calls
that blocked their executor (one at a time) could never pass it. The elapsed time is
printed, not asserted (a loaded machine only makes it longer).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from web_api_server import WebApiServer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "worker", "e2e"))
from e2e_support import WorkerSession, e2e_config

from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import IOSubsystem

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

GET_ONE = """
def _(p):
    return Http.get_json(p["url"], params={"n": p["n"]})["n"]
"""

STATUS = """
from blockx.http import HttpError


def _(p):
    try:
        Http.get_json(p["url"])
    except HttpError as exc:
        return {"status": exc.status, "retryable": exc.retryable, "kind": exc.kind}
    return "ok"
"""

UNCAUGHT = """
def _(p):
    return Http.get_json(p["url"])
"""

POST = """
def _(p):
    return Http.post_json(p["url"], {"n": p["n"], "tags": ["a", "b"]})
"""

AUDITED = """
from blockx.http import HttpError


def _(p):
    got = Http.get_json(p["url"], params={"n": p["n"]})
    try:
        Http.get_json(p["missing"])
    except HttpError as exc:
        return {"n": got["n"], "status": exc.status, "retryable": exc.retryable}
    return None
"""


@pytest.fixture(scope="module")
def server() -> Iterator[WebApiServer]:
    with WebApiServer() as s:
        yield s


@pytest.fixture(scope="module")
def session() -> Iterator[WorkerSession]:
    with WorkerSession(e2e_config(**{"pool.executor_count": 1})) as s:
        yield s


def _io(server: WebApiServer, *hosts: str, **knobs: Any) -> IOSubsystem:
    allow = list(hosts) or [f"127.0.0.1:{server.port}"]
    return IOSubsystem(load_io_config({"http": {"allow_hosts": allow, **knobs}}, env={}))


def _run(session: WorkerSession, io: IOSubsystem, task: Task) -> Any:
    async def scenario() -> Any:
        try:
            task.io_handler = io.task_scope(task.task_id)
            return await session.worker.run_task(task)
        finally:
            await io.close()

    return session.run(scenario(), timeout=150)


def test_20_get_json_calls_of_0_2_s_overlap_on_one_executor(
    session: WorkerSession, server: WebApiServer
) -> None:
    server.reset()
    server.barrier = 20  # nothing is answered until all 20 are in flight together
    server.hold_s = 0.2
    url = f"{server.base}/hold"
    task = Task(
        functions={"get_one": GET_ONE},
        calls=[Call("get_one", {"url": url, "n": i}) for i in range(20)],
    )
    started = time.perf_counter()
    # 20 slots for the one host (the default is 16: the barrier needs all 20 at once)
    result = _run(session, _io(server, max_concurrency=20), task)
    elapsed = time.perf_counter() - started
    print(f"20 Http.get_json calls of 0.2 s on one executor: {elapsed:.2f} s")
    assert result.success, result.errors
    assert result.outputs == list(range(20))
    assert server.max_in_flight == 20


def test_a_host_off_the_allowlist_fails_the_call_naming_the_host(
    session: WorkerSession, server: WebApiServer
) -> None:
    server.reset()
    task = Task(
        functions={"uncaught": UNCAUGHT},
        calls=[Call("uncaught", {"url": f"{server.base}/echo"})],
        policy=TaskPolicy(failure="continue", max_attempts=2),
    )
    result = _run(session, _io(server, "api.example.com"), task)
    (error,) = result.errors
    assert error.kind == "io_error" and not error.retryable and error.attempts == 1
    assert "HttpError" in error.message
    assert f"host '127.0.0.1:{server.port}' is not in io.http.allow_hosts" in error.message
    assert server.requests == []


def test_http_errors_carry_the_status_and_posts_send_json(
    session: WorkerSession, server: WebApiServer
) -> None:
    server.reset()
    task = Task(
        functions={"status": STATUS, "post": POST},
        calls=[
            Call("status", {"url": f"{server.base}/status/404"}),
            Call("status", {"url": f"{server.base}/status/503"}),
            Call("status", {"url": f"{server.base}/echo"}),
            Call("post", {"url": f"{server.base}/echo", "n": 7}),
        ],
    )
    result = _run(session, _io(server), task)
    assert result.success, result.errors
    assert result.outputs == [
        {"status": 404, "retryable": False, "kind": "io_error"},
        {"status": 503, "retryable": True, "kind": "io_error"},
        "ok",
        {"got": {"n": 7, "tags": ["a", "b"]}},
    ]


def test_audited_functions_use_http_too(session: WorkerSession, server: WebApiServer) -> None:
    server.reset()
    task = Task(
        functions={"audited": AUDITED},
        calls=[
            Call(
                "audited",
                {"url": f"{server.base}/hold", "missing": f"{server.base}/status/404", "n": 5},
            )
        ],
        audit=True,
    )
    result = _run(session, _io(server), task)
    assert result.success, result.errors
    assert result.outputs == [{"n": 5, "status": 404, "retryable": False}]


def test_a_get_outlasting_the_calls_budget_ends_the_call_and_is_cancelled(
    session: WorkerSession, server: WebApiServer
) -> None:
    """The server never answers: the call's 800 ms budget ends the wait (not
    io.http.timeout_s, 600 s here), and the worker drops the request nobody waits for."""
    server.reset()
    io = _io(server, timeout_s=600)
    task = Task(
        functions={"uncaught": UNCAUGHT},
        calls=[Call("uncaught", {"url": f"{server.base}/hang"})],
        policy=TaskPolicy(call_budget_ms=800, max_attempts=1, failure="continue"),
    )
    scope = io.task_scope(task.task_id)

    async def scenario() -> Any:
        try:
            task.io_handler = scope
            return await session.worker.run_task(task)
        finally:
            await io.close()

    result = session.run(scenario(), timeout=150)
    (error,) = result.errors
    assert error.kind == "deadline_exceeded", error
    assert "http.get_json" in error.message
    stats = scope.stats.operation("http", "get_json")
    assert (stats.requests, stats.abandoned) == (1, 1)
    assert server.paths() == ["/hang"]

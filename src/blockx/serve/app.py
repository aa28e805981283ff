"""The HTTP API of ``blockx serve`` (aiohttp): routes, authentication, limits, problems.

Every route is a thin translation between HTTP and the
:class:`~blockx.serve.runner.TaskManager`; what a task is and how it is checked
is :mod:`blockx.serve.documents`'s, how it is kept is the store's. The API is
described in ``docs/serve.md`` and, machine-readably, at ``GET /openapi.json``
(:mod:`blockx.serve.openapi`).

Order of checks on a request: authentication (every path but ``/healthz``,
``/readyz`` and the dashboard's static page needs the bearer token when the server has one;
compared in constant time), then the id (``t-`` and 16 hex digits, else 404 before
any lookup), then the body (capped at ``max_body`` bytes: 413; a content type the
route does not take: 415), then the route. Any exception a route did not expect is
logged and answered 500 as a problem; nothing a client sends stops the server.
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web

from blockx.serve.dashboard import PUBLIC_PATHS as _DASHBOARD_PATHS
from blockx.serve.dashboard import add_dashboard_routes
from blockx.serve.problems import problem
from blockx.serve.runner import (
    FINISHED_STATES,
    QueueFull,
    ServerDraining,
    TaskManager,
    public_fields,
)
from blockx.serve.store import TaskClosed, TaskRecord

__all__ = ["ID_RE", "STATES", "ServeOptions", "make_app", "status_object"]

_log = logging.getLogger("blockx.serve")

ID_RE: Final = re.compile(r"t-[0-9a-f]{16}")
STATES: Final = ("queued", "running", "succeeded", "failed", "cancelled")
#: No token needed: health, and the dashboard's static page and assets (they hold no data;
#: the page reads ``/v1/dashboard`` with the token, ``docs/observability.md``).
_OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"}) | _DASHBOARD_PATHS
_TASK_TYPES: Final = {
    "application/json": "json",
    "application/yaml": "yaml",
    "application/x-yaml": "yaml",
    "text/yaml": "yaml",
}
_CALL_TYPES: Final = frozenset({"application/x-ndjson", "application/jsonl", "text/plain"})
_NDJSON: Final = "application/x-ndjson"
#: Seconds a client is told to wait when the queue is full.
RETRY_AFTER_S: Final = 5

_MANAGER: Final = web.AppKey("manager", TaskManager)
_OPTIONS: Final = web.AppKey("options", object)


class ServeOptions:
    """What the routes need besides the manager."""

    __slots__ = ("functions_root", "max_body", "require_audit", "token", "worker")

    def __init__(
        self,
        *,
        token: str | None,
        max_body: int,
        functions_root: Path | None,
        require_audit: bool,
        worker: Any,
    ) -> None:
        self.token = token
        self.max_body = max_body
        self.functions_root = functions_root
        self.require_audit = require_audit
        self.worker = worker

    def __repr__(self) -> str:
        return (
            f"ServeOptions(token={'set' if self.token else 'none'}, max_body={self.max_body}, "
            f"functions_root={self.functions_root}, require_audit={self.require_audit})"
        )


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


def status_object(r: TaskRecord) -> dict[str, Any]:
    """A task as ``GET /v1/tasks/{id}`` shows it (times as ISO 8601 UTC)."""
    return {
        **public_fields(r),
        "created_at": _iso(r.created_at),
        "started_at": _iso(r.started_at),
        "ended_at": _iso(r.ended_at),
        "failure": r.failure,
        "summary": r.summary,
    }


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(data), content_type="application/json", headers=headers
    )


def _not_found(what: str) -> web.Response:
    return problem(404, "not-found", "Not found", what)


def _media_type(request: web.Request) -> str:
    return request.content_type.split(";")[0].strip().lower()


def make_app(manager: TaskManager, options: ServeOptions) -> web.Application:
    """The aiohttp application (see the module docstring)."""

    @web.middleware
    async def guard(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if options.token is not None and request.path not in _OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            scheme, _, credential = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                credential.strip().encode(), options.token.encode()
            ):
                return problem(
                    401,
                    "unauthorized",
                    "Unauthorized",
                    "this server needs `Authorization: Bearer <token>`"
                    if not given
                    else "the bearer token is not the server's",
                    headers={"WWW-Authenticate": 'Bearer realm="blockx"'},
                )
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return problem(
                413,
                "body-too-large",
                "Request body too large",
                f"the body is larger than the server's limit of {options.max_body:,} bytes "
                "(blockx serve --max-body)",
            )
        except web.HTTPException as exc:
            if exc.status >= 400:
                return problem(exc.status, "http-error", exc.reason, exc.text or exc.reason)
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            _log.exception("%s %s failed", request.method, request.path)
            return problem(
                500,
                "internal",
                "Internal server error",
                f"{type(exc).__name__}: {exc} (the server's log has the traceback)",
            )

    app = web.Application(middlewares=[guard], client_max_size=options.max_body)
    app[_MANAGER] = manager
    app[_OPTIONS] = options

    async def record_or_404(request: web.Request) -> TaskRecord | web.Response:
        task_id = request.match_info["id"]
        if not ID_RE.fullmatch(task_id):
            return _not_found(f"no task {task_id!r} (task ids are t- and 16 hex digits)")
        record = await manager.get(task_id)
        if record is None:
            return _not_found(f"no task {task_id!r}")
        return record

    async def healthz(_request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        if manager.draining:
            return problem(503, "draining", "Draining", "the server is shutting down")
        cluster_executors = getattr(options.worker, "ready_executors", None)  # --ray
        attached = (
            cluster_executors()
            if cluster_executors is not None
            else len(options.worker.adapter.attached_executor_ids())
        )
        if not attached:
            return problem(503, "not-ready", "Not ready", "no executor attached yet")
        return _json({"status": "ready", "executors": attached})

    # GET /metrics (docs/observability.md): the worker's series and blockx_tasks{state}
    # from the store, read at each scrape; behind the token like the API.
    from blockx.observability.metrics import make_registry, metrics_response

    options.worker.observe_io(manager.io)
    task_counts: dict[str, int] = {}
    # --ray: the node workers' series, summed, fetched from the nodes at each scrape
    refresh = getattr(options.worker, "refresh_metrics", None)
    snapshot = getattr(options.worker, "metrics_snapshot", None)
    registry = make_registry(options.worker, tasks=lambda: task_counts, snapshot=snapshot)

    async def metrics(request: web.Request) -> web.Response:
        if refresh is not None:
            await refresh()
        counts = await manager.store.call(manager.store.store.counts_by_state)
        task_counts.clear()
        task_counts.update(counts)
        return metrics_response(registry, request)

    async def openapi(_request: web.Request) -> web.Response:
        from blockx.serve.openapi import OPENAPI

        return _json(OPENAPI)

    async def create_task(request: web.Request) -> web.Response:
        from blockx.serve.documents import DocumentError, check_task_document, parse_task_body

        if manager.draining:
            return problem(503, "draining", "Draining", "the server is shutting down")
        kind = _media_type(request)
        if kind not in _TASK_TYPES:
            return problem(
                415,
                "unsupported-media-type",
                "Unsupported media type",
                f"a task is sent as application/json or application/yaml, not {kind or 'nothing'}",
            )
        body = await request.read()

        def check() -> Any:
            data = parse_task_body(body, kind)
            return check_task_document(
                data,
                functions_root=options.functions_root,
                require_audit=options.require_audit,
            )

        try:
            checked = await asyncio.to_thread(check)
        except DocumentError as exc:
            return _invalid(exc, "the task is not valid")
        spec = orjson.loads(checked.spec_json)
        task_problem = getattr(options.worker, "task_problem", None)  # --ray: Table on SQLite
        refused = task_problem(dict(spec["functions"])) if task_problem is not None else None
        if refused is not None:
            return problem(422, "not-on-this-cluster", "Cannot run on the cluster", refused)
        if not spec.get("task_id"):  # made here, so that a resumed run keeps it
            spec["task_id"] = f"task-{secrets.token_hex(6)}"
        try:
            record = await manager.create(
                task_id=spec["task_id"],
                instance=spec.get("instance"),
                spec_json=orjson.dumps(spec),
                streamed=checked.streamed,
                calls_lines=checked.calls_lines,
                calls_count=checked.calls_count,
            )
        except QueueFull as exc:
            return problem(
                429,
                "queue-full",
                "Too many tasks waiting",
                f"{exc}; retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        except ServerDraining as exc:
            return problem(503, "draining", "Draining", str(exc))
        return _json(
            {"id": record.id, "task_id": record.task_id, "state": record.state},
            status=201,
            headers={"Location": f"/v1/tasks/{record.id}"},
        )

    async def append_calls(request: web.Request) -> web.Response:
        from blockx.serve.documents import DocumentError, check_call_lines

        found = await record_or_404(request)
        if isinstance(found, web.Response):
            return found
        if not found.streamed:
            return problem(409, "not-streamed", "Not a streamed task", _not_streamed(found))
        if found.closed or found.state in FINISHED_STATES:
            return problem(
                409,
                "closed",
                "Calls closed",
                f"task {found.id} takes no more calls (it is {found.state}"
                f"{', its calls closed' if found.closed else ''})",
            )
        kind = _media_type(request)
        if kind not in _CALL_TYPES:
            return problem(
                415,
                "unsupported-media-type",
                "Unsupported media type",
                f"calls are sent as JSON Lines (application/x-ndjson), not {kind or 'nothing'}",
            )
        body = await request.read()
        live = manager.live.get(found.id)
        functions = live.functions if live is not None else frozenset()
        try:
            lines, count = await asyncio.to_thread(check_call_lines, body, functions)
        except DocumentError as exc:
            return _invalid(exc, "no call of this request was accepted")
        try:
            record = await manager.append_calls(found.id, lines, count)
        except TaskClosed as exc:
            return problem(409, "closed", "Calls closed", str(exc))
        except ServerDraining as exc:
            return problem(503, "draining", "Draining", str(exc))
        return _json({"accepted": count, "calls": record.calls})

    async def close_calls(request: web.Request) -> web.Response:
        found = await record_or_404(request)
        if isinstance(found, web.Response):
            return found
        if not found.streamed:
            return problem(409, "not-streamed", "Not a streamed task", _not_streamed(found))
        if found.state in FINISHED_STATES:
            return _json(status_object(found))
        try:
            record = await manager.close_calls(found.id)
        except TaskClosed as exc:
            return problem(409, "closed", "Calls closed", str(exc))
        return _json(status_object(record))

    async def list_tasks(request: web.Request) -> web.Response:
        state = request.query.get("state")
        if state is not None and state not in STATES:
            return problem(
                400,
                "bad-query",
                "Bad query",
                f"state={state!r}: expected one of {', '.join(STATES)}",
            )
        records = await manager.list(state)
        return _json({"tasks": [status_object(r) for r in records]})

    async def get_task(request: web.Request) -> web.Response:
        found = await record_or_404(request)
        if isinstance(found, web.Response):
            return found
        return _json(status_object(found))

    async def rows(request: web.Request) -> web.StreamResponse:
        found = await record_or_404(request)
        if isinstance(found, web.Response):
            return found
        raw = request.query.get("after", "0")
        if not raw.isdigit():
            return problem(
                400, "bad-query", "Bad query", f"after={raw!r}: expected a non-negative integer"
            )
        after = int(raw)
        response = web.StreamResponse(
            headers={"Content-Type": _NDJSON, "X-BlockX-Rows-After": str(after)}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        async for body in manager.rows(found.id, after):
            await response.write(body)
        await response.write_eof()
        return response

    async def failures(request: web.Request) -> web.Response:
        found = await record_or_404(request)
        if isinstance(found, web.Response):
            return found
        records = await manager.store.call(manager.store.store.failures, found.id)
        body = b"".join(r + b"\n" for r in records)
        return web.Response(body=body, content_type=_NDJSON)

    async def delete_task(request: web.Request) -> web.Response:
        found = await record_or_404(request)
        if isinstance(found, web.Response):
            return found
        purge = request.query.get("purge", "false").lower()
        if purge not in ("true", "false", "1", "0"):
            return problem(
                400, "bad-query", "Bad query", f"purge={purge!r}: expected true or false"
            )
        if purge in ("true", "1"):
            if found.state not in FINISHED_STATES:
                return problem(
                    409,
                    "not-finished",
                    "Task not finished",
                    f"task {found.id} is {found.state}: cancel it and wait for its end first",
                )
            await manager.purge(found.id)
            return web.Response(status=204)
        await manager.cancel(found.id)
        record = await manager.get(found.id)
        return _json(status_object(record or found), status=202)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/tasks", create_task)
    app.router.add_get("/v1/tasks", list_tasks)
    app.router.add_get("/v1/tasks/{id}", get_task)
    app.router.add_delete("/v1/tasks/{id}", delete_task)
    app.router.add_post("/v1/tasks/{id}/calls", append_calls)
    app.router.add_post("/v1/tasks/{id}/close", close_calls)
    app.router.add_get("/v1/tasks/{id}/rows", rows)
    app.router.add_get("/v1/tasks/{id}/failures", failures)
    add_dashboard_routes(app, manager, options)
    return app


def _not_streamed(record: TaskRecord) -> str:
    return f"task {record.id} has its calls inline; only a calls_stream task takes calls later"


def _invalid(exc: Any, detail: str) -> web.Response:
    problems = [{"path": path, "message": message} for path, message in exc.problems]
    first = problems[0] if problems else None
    text = detail if first is None else f"{detail}: {first['path']}: {first['message']}"
    if len(problems) > 1:
        text += f" (and {len(problems) - 1} more)"
    return problem(400, "invalid-task", "Invalid task", text, problems=problems)

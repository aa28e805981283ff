"""The OpenAPI 3.1 description of ``blockx serve``'s HTTP API, served at ``GET /openapi.json``.

Theory of operation
-------------------
:data:`OPENAPI` is a plain dict, built once at import: every endpoint of
``blockx serve`` (issue #19's API table) with its parameters, request bodies
(and their content types), responses (status codes, schemas, headers) and the
bearer-token security that applies to all but :data:`PUBLIC_PATHS`. Errors are
RFC 9457 problem documents (``application/problem+json``,
:data:`PROBLEM_SCHEMA`); an invalid task's 400 lists every problem with its
JSON path (:mod:`blockx.serve.documents`).

The task document's schema (``TaskDocument``) is the task-file schema of
docs/taskspec.md as a submitted task may use it (``calls`` or ``calls_stream``;
no ``calls_file``, no ``io``), generated from the task model by
:mod:`blockx.cli.schema` (the generator of ``blockx schema``'s task-file schema), so the
description cannot drift from the checks.
The checks remain the server's (``blockx validate``'s): the schema says what is
accepted, a 400's messages say what is wrong.

tests/serve/test_openapi.py validates the document with
``openapi-spec-validator`` and checks it lists every endpoint and status code.
"""

from __future__ import annotations

from typing import Any, Final

from blockx import __version__
from blockx.cli.schema import task_definitions, task_document
from blockx.serve.documents import CALLS_CONTENT_TYPES, SUBMITTED_FIELDS, TASK_CONTENT_TYPES

__all__ = ["OPENAPI", "PROBLEM_SCHEMA", "PUBLIC_PATHS", "TASK_ID_PATTERN", "TASK_STATES"]

#: Paths answered without a token (the others need ``Authorization: Bearer <token>``
#: when the server has one).
PUBLIC_PATHS: Final = ("/healthz", "/readyz", "/")
#: A task's id as the server makes it (checked before any lookup: anything else is a 404).
TASK_ID_PATTERN: Final = "^t-[0-9a-f]{16}$"
#: A task's states, in the order a task goes through them (the last three: finished).
TASK_STATES: Final = ("queued", "running", "succeeded", "failed", "cancelled")

_REF = "#/components/schemas/"
_NDJSON = "application/x-ndjson"
_PROBLEM_JSON = "application/problem+json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, schema]}


#: The task document and its parts: generated from the task model (blockx.cli.schema, the
#: schema ``blockx schema`` prints for task files), in the variant a submitted task may use.
_TASK_DOCUMENT: Final[dict[str, Any]] = task_document(
    "submitted", ref=_REF, fields=tuple(SUBMITTED_FIELDS)
)
_TASK_PARTS: Final[dict[str, Any]] = task_definitions("submitted")

#: RFC 9457 problem details, with ``problems`` for an invalid task or body of calls.
PROBLEM_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "RFC 9457 problem details.",
    "required": ["type", "title", "status"],
    "properties": {
        "type": {
            "type": "string",
            "format": "uri",
            "description": "https://blockx.dev/problems/<slug>",
        },
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "problems": {
            "type": "array",
            "description": "every problem of an invalid task (JSON paths: $.calls[3].function) "
            "or body of calls (line N)",
            "items": {
                "type": "object",
                "required": ["path", "message"],
                "properties": {"path": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "additionalProperties": True,
}

_COUNT = {"type": "integer", "minimum": 0}
_TIME = {
    "oneOf": [{"type": "null"}, {"type": "string", "format": "date-time"}],
    "description": "ISO 8601, UTC",
}

_SUMMARY: Final[dict[str, Any]] = {
    "type": "object",
    "description": "The figures blockx run --summary-json gives, once the task has ended.",
    "properties": {
        "task_id": {"type": "string"},
        "success": {"type": "boolean"},
        "failure": {"type": ["string", "null"], "description": "the task failure's kind"},
        "calls": _COUNT,
        "succeeded": _COUNT,
        "failed": _COUNT,
        "cancelled": _COUNT,
        "retries": _COUNT,
        "subcalls": _COUNT,
        "cache_hits": _COUNT,
        "singleflight_hits": _COUNT,
        "io_calls": _COUNT,
        "task_wall_time_s": {"type": "number"},
        "calls_per_s": {"type": "number"},
        "failures_by_kind": {"type": "object", "additionalProperties": _COUNT},
        "output_rows": _COUNT,
        "io": {"type": "object"},
        "exit_code": {
            "type": "integer",
            "description": "what blockx run would exit with: 0 every call succeeded, 1 the "
            "task or a call failed",
        },
    },
    "additionalProperties": True,
}

_TASK_STATUS: Final[dict[str, Any]] = {
    "type": "object",
    "required": [
        "id",
        "task_id",
        "instance",
        "state",
        "streamed",
        "closed",
        "calls",
        "done",
        "succeeded",
        "failed",
        "cancelled",
        "rows",
        "created_at",
        "started_at",
        "ended_at",
        "failure",
        "summary",
    ],
    "properties": {
        "id": {"type": "string", "pattern": TASK_ID_PATTERN},
        "task_id": {"type": "string"},
        "instance": {"type": ["string", "null"]},
        "state": {"enum": list(TASK_STATES)},
        "streamed": {"type": "boolean"},
        "closed": {"type": "boolean", "description": "no more calls will come"},
        "calls": {**_COUNT, "description": "calls known so far"},
        "done": {**_COUNT, "description": "calls settled (and persisted)"},
        "succeeded": _COUNT,
        "failed": _COUNT,
        "cancelled": _COUNT,
        "rows": {**_COUNT, "description": "rows persisted (GET .../rows serves them)"},
        "created_at": _TIME,
        "started_at": _TIME,
        "ended_at": _TIME,
        "failure": _nullable(
            {
                "type": "object",
                "required": ["kind", "message"],
                "properties": {
                    "kind": {"type": "string"},
                    "message": {"type": "string"},
                    "call_index": {
                        "type": ["integer", "null"],
                        "description": "the call that stopped a fast_fail task",
                    },
                    "error_kind": {"type": ["string", "null"]},
                },
            }
        ),
        "summary": _nullable(_ref("Summary")),
    },
    "additionalProperties": True,
}

_FAILURE_RECORD: Final[dict[str, Any]] = {
    "type": "object",
    "description": "One line of GET /v1/tasks/{id}/failures: a finally failed call (the "
    "record of blockx run --errors FILE).",
    "required": ["index", "function", "args", "kind", "message", "stack", "attempts", "retryable"],
    "properties": {
        "index": _COUNT,
        "function": {"type": "string"},
        "args": {"description": "the call's arguments (any JSON value)"},
        "kind": {"type": "string", "description": "user_error, deadline_exceeded, ..."},
        "message": {"type": "string"},
        "stack": {"type": ["string", "null"]},
        "attempts": _COUNT,
        "retryable": {"type": "boolean"},
    },
}

_SCHEMAS: Final[dict[str, Any]] = {
    "TaskDocument": _TASK_DOCUMENT,
    **_TASK_PARTS,
    "Created": {
        "type": "object",
        "required": ["id", "task_id", "state"],
        "properties": {
            "id": {"type": "string", "pattern": TASK_ID_PATTERN},
            "task_id": {"type": "string"},
            "state": {"const": "queued"},
        },
    },
    "TaskStatus": _TASK_STATUS,
    "TaskList": {
        "type": "object",
        "required": ["tasks"],
        "properties": {"tasks": {"type": "array", "items": _ref("TaskStatus")}},
    },
    "Summary": _SUMMARY,
    "CallsAccepted": {
        "type": "object",
        "required": ["accepted", "calls"],
        "properties": {
            "accepted": {**_COUNT, "description": "calls taken from this body"},
            "calls": {**_COUNT, "description": "the task's calls so far"},
        },
    },
    "FailureRecord": _FAILURE_RECORD,
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}},
    },
    "Ready": {
        "type": "object",
        "required": ["status", "executors"],
        "properties": {"status": {"const": "ready"}, "executors": _COUNT},
    },
    "Problem": PROBLEM_SCHEMA,
}


def _problem(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {_PROBLEM_JSON: {"schema": _ref("Problem")}},
    }
    if headers:
        response["headers"] = headers
    return response


_RESPONSES: Final[dict[str, Any]] = {
    "Invalid": _problem("The request is invalid; `problems` lists every problem."),
    "Unauthorized": _problem(
        "No token or a wrong one (the server has --token-file).",
        {
            "WWW-Authenticate": {
                "description": "Bearer",
                "schema": {"type": "string"},
            }
        },
    ),
    "NotFound": _problem("No task with this id."),
    "Conflict": _problem("The task is not in a state that allows this."),
    "TooLarge": _problem("The body is larger than the server's --max-body."),
    "UnsupportedMediaType": _problem("The body's Content-Type is not accepted here."),
    "QueueFull": _problem(
        "Too many tasks are waiting.",
        {
            "Retry-After": {
                "description": "seconds to wait before trying again",
                "schema": {"type": "integer", "minimum": 0},
            }
        },
    ),
    "Unavailable": _problem("The server is draining (shutting down) or not ready."),
}


def _response(name: str) -> dict[str, str]:
    return {"$ref": "#/components/responses/" + name}


def _json(description: str, schema: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": _ref(schema)}},
    }
    if headers:
        response["headers"] = headers
    return response


def _ndjson(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {_NDJSON: {"schema": {"type": "string"}}},
    }
    if headers:
        response["headers"] = headers
    return response


_ID_PARAMETER: Final = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "the task's id (t- and 16 hex digits, made by the server)",
    "schema": {"type": "string", "pattern": TASK_ID_PATTERN},
}
_AUTHED: Final = {"401": _response("Unauthorized")}
_TASK: Final = {**_AUTHED, "404": _response("NotFound")}

_TASK_BODY: Final[dict[str, Any]] = {
    "required": True,
    "description": "A task in the task-file schema, as JSON or YAML.",
    "content": {
        kind: (
            {"schema": _ref("TaskDocument")}
            if kind == "application/json"
            else {"schema": {"type": "string", "description": "a TaskDocument written as YAML"}}
        )
        for kind in TASK_CONTENT_TYPES
    },
}
_CALLS_BODY: Final[dict[str, Any]] = {
    "required": True,
    "description": 'JSON Lines, one call per line: {"function": ID, "args": VALUE} (blank '
    "lines skipped).",
    "content": {kind: {"schema": {"type": "string"}} for kind in CALLS_CONTENT_TYPES},
}

_PATHS: Final[dict[str, Any]] = {
    "/v1/tasks": {
        "post": {
            "operationId": "submitTask",
            "summary": "Submit a task",
            "description": "The task is on disk before the 201 is sent. Functions by source "
            "(a path only under the server's --functions-root); calls inline or "
            "calls_stream: true.",
            "requestBody": _TASK_BODY,
            "responses": {
                "201": _json(
                    "Queued.",
                    "Created",
                    {
                        "Location": {
                            "description": "/v1/tasks/{id}",
                            "schema": {"type": "string"},
                        }
                    },
                ),
                "400": _response("Invalid"),
                **_AUTHED,
                "413": _response("TooLarge"),
                "415": _response("UnsupportedMediaType"),
                "429": _response("QueueFull"),
                "503": _response("Unavailable"),
            },
        },
        "get": {
            "operationId": "listTasks",
            "summary": "Every task with its state and counters, oldest first",
            "parameters": [
                {
                    "name": "state",
                    "in": "query",
                    "required": False,
                    "description": "only the tasks in this state",
                    "schema": {"enum": list(TASK_STATES)},
                }
            ],
            "responses": {
                "200": _json("The tasks.", "TaskList"),
                "400": _response("Invalid"),
                **_AUTHED,
            },
        },
    },
    "/v1/tasks/{id}": {
        "parameters": [_ID_PARAMETER],
        "get": {
            "operationId": "getTask",
            "summary": "A task's state, counters, times and (once ended) summary",
            "responses": {"200": _json("The task.", "TaskStatus"), **_TASK},
        },
        "delete": {
            "operationId": "cancelTask",
            "summary": "Cancel a task, or (?purge=true, once finished) delete its data",
            "parameters": [
                {
                    "name": "purge",
                    "in": "query",
                    "required": False,
                    "description": "delete a finished task and all its data",
                    "schema": {"type": "boolean", "default": False},
                }
            ],
            "responses": {
                "202": _json(
                    "Cancelled (a finished task is left as it is).",
                    "TaskStatus",
                ),
                "204": {"description": "Purged: the task and its data are deleted."},
                **_TASK,
                "409": _response("Conflict"),
            },
        },
    },
    "/v1/tasks/{id}/calls": {
        "parameters": [_ID_PARAMETER],
        "post": {
            "operationId": "appendCalls",
            "summary": "Append calls to a streamed task",
            "description": "Held while the task's window is full (back-pressure). A bad line: "
            "400 and none of the body's calls are taken.",
            "requestBody": _CALLS_BODY,
            "responses": {
                "200": _json("Taken.", "CallsAccepted"),
                "400": _response("Invalid"),
                **_TASK,
                "409": _response("Conflict"),
                "413": _response("TooLarge"),
                "415": _response("UnsupportedMediaType"),
            },
        },
    },
    "/v1/tasks/{id}/close": {
        "parameters": [_ID_PARAMETER],
        "post": {
            "operationId": "closeTask",
            "summary": "No more calls for a streamed task",
            "responses": {
                "200": _json("Closed.", "TaskStatus"),
                **_TASK,
                "409": _response("Conflict"),
            },
        },
    },
    "/v1/tasks/{id}/rows": {
        "parameters": [_ID_PARAMETER],
        "get": {
            "operationId": "getRows",
            "summary": "The task's rows as JSON Lines, as blockx run writes them",
            "description": "One stable order; a row is served once it is persisted. While the "
            "task runs the response streams (chunked) until the task ends.",
            "parameters": [
                {
                    "name": "after",
                    "in": "query",
                    "required": False,
                    "description": "skip the first N rows (those already read)",
                    "schema": {"type": "integer", "minimum": 0, "default": 0},
                }
            ],
            "responses": {
                "200": _ndjson(
                    "The rows, one JSON value per line.",
                    {
                        "X-BlockX-Rows-After": {
                            "description": "the rows skipped (the request's after)",
                            "schema": {"type": "integer", "minimum": 0},
                        }
                    },
                ),
                "400": _response("Invalid"),
                **_TASK,
            },
        },
    },
    "/v1/tasks/{id}/failures": {
        "parameters": [_ID_PARAMETER],
        "get": {
            "operationId": "getFailures",
            "summary": "The finally failed calls as JSON Lines (FailureRecord), by index",
            "responses": {"200": _ndjson("One FailureRecord per line."), **_TASK},
        },
    },
    "/healthz": {
        "get": {
            "operationId": "health",
            "summary": "The server is alive",
            "security": [],
            "responses": {"200": _json("Alive.", "Health")},
        }
    },
    "/readyz": {
        "get": {
            "operationId": "ready",
            "summary": "Executors attached and tasks accepted",
            "security": [],
            "responses": {
                "200": _json("Ready.", "Ready"),
                "503": _response("Unavailable"),
            },
        }
    },
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This description",
            "responses": {
                "200": {
                    "description": "The OpenAPI 3.1 document.",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                "401": _response("Unauthorized"),
            },
        }
    },
    "/": {
        "get": {
            "operationId": "dashboard",
            "summary": "The live dashboard (an HTML page; its data comes from GET /v1/dashboard)",
            "security": [],
            "responses": {
                "200": {
                    "description": "The page (static: it holds no data, so it needs no token).",
                    "content": {"text/html": {"schema": {"type": "string"}}},
                }
            },
        }
    },
    "/v1/dashboard": {
        "get": {
            "operationId": "dashboardState",
            "summary": "The dashboard's state: tasks, counts by state, history, IO, executors",
            "responses": {
                "200": {
                    "description": "docs/observability.md, 'GET /v1/dashboard'.",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                "401": _response("Unauthorized"),
            },
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics of the worker and the tasks",
            "responses": {
                "200": {
                    "description": "The series of docs/observability.md, in the Prometheus "
                    "text format (OpenMetrics when the Accept header asks for it).",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": _response("Unauthorized"),
            },
        }
    },
}

#: The OpenAPI 3.1.0 document (``GET /openapi.json``).
OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {
        "title": "BlockX serve",
        "version": __version__,
        "description": "blockx serve: tasks submitted over HTTP, run on one executor pool, "
        "kept in SQLite so that they survive a crash.",
        "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
    },
    "servers": [{"url": "http://127.0.0.1:8470"}],
    "security": [{"bearer": []}],
    "paths": _PATHS,
    "components": {
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "the content of the server's --token-file",
            }
        },
        "schemas": _SCHEMAS,
        "responses": _RESPONSES,
    },
}

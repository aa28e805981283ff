"""``GET /openapi.json``'s document: valid OpenAPI 3.1, every endpoint and status code of
the serve API described, and its task schema agreeing with the server's checks
(src/blockx/serve/openapi.py)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from blockx.serve.documents import CALLS_CONTENT_TYPES, TASK_CONTENT_TYPES, check_task_document
from blockx.serve.openapi import OPENAPI, PUBLIC_PATHS
from blockx.worker.api import POLICY_INTEGERS

#: (path, method) -> the status codes the API answers with (issue #19); 401 on every
#: endpoint but the public ones and 404 on every task's are added below.
ENDPOINTS: dict[tuple[str, str], set[str]] = {
    ("/v1/tasks", "post"): {"201", "400", "413", "415", "429", "503"},
    ("/v1/tasks", "get"): {"200"},
    ("/v1/tasks/{id}", "get"): {"200"},
    ("/v1/tasks/{id}", "delete"): {"202", "204", "409"},
    ("/v1/tasks/{id}/calls", "post"): {"200", "400", "409", "413", "415"},
    ("/v1/tasks/{id}/close", "post"): {"200"},
    ("/v1/tasks/{id}/rows", "get"): {"200"},
    ("/v1/tasks/{id}/failures", "get"): {"200"},
    ("/healthz", "get"): {"200"},
    ("/readyz", "get"): {"200", "503"},
    ("/openapi.json", "get"): {"200", "401"},
    ("/metrics", "get"): {"200", "401"},
    ("/", "get"): {"200"},
    ("/v1/dashboard", "get"): {"200", "401"},
}
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = OPENAPI
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def test_the_document_is_valid_openapi_3_1() -> None:
    assert OPENAPI["openapi"] == "3.1.0"
    validate(OPENAPI)
    # It is served as JSON: it must survive a round trip unchanged.
    assert json.loads(json.dumps(OPENAPI)) == OPENAPI


def test_the_validator_catches_a_broken_document() -> None:
    """The check above can fail: a response without its description is refused."""
    broken = json.loads(json.dumps(OPENAPI))
    del broken["paths"]["/healthz"]["get"]["responses"]["200"]["description"]
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_every_endpoint_is_described_and_nothing_else() -> None:
    described = {
        (path, method)
        for path, item in OPENAPI["paths"].items()
        for method in item
        if method in METHODS
    }
    assert described == set(ENDPOINTS)


@pytest.mark.parametrize(("path", "method"), sorted(ENDPOINTS))
def test_every_status_code_is_described(path: str, method: str) -> None:
    expected = set(ENDPOINTS[(path, method)])
    if path not in PUBLIC_PATHS:
        expected.add("401")
    if "{id}" in path:
        expected.add("404")
    responses = OPENAPI["paths"][path][method]["responses"]
    assert expected <= set(responses), f"{method.upper()} {path}: {expected - set(responses)}"
    for code, response in responses.items():
        response = _resolve(response)
        assert response["description"]
        if code.startswith(("4", "5")):
            assert list(response["content"]) == ["application/problem+json"]
            assert response["content"]["application/problem+json"]["schema"] == {
                "$ref": "#/components/schemas/Problem"
            }


def test_security_is_bearer_everywhere_but_the_public_paths() -> None:
    assert OPENAPI["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "the content of the server's --token-file",
    }
    assert OPENAPI["security"] == [{"bearer": []}]
    for (path, method), _codes in ENDPOINTS.items():
        operation = OPENAPI["paths"][path][method]
        if path in PUBLIC_PATHS:
            assert operation["security"] == []
        else:
            assert "security" not in operation  # the global requirement applies
    unauthorized = _resolve(OPENAPI["paths"]["/v1/tasks"]["get"]["responses"]["401"])
    assert "WWW-Authenticate" in unauthorized["headers"]


def test_parameters() -> None:
    paths = OPENAPI["paths"]
    for path in paths:
        if "{id}" in path:
            [parameter] = paths[path]["parameters"]
            assert parameter["name"] == "id" and parameter["in"] == "path"
            assert parameter["schema"]["pattern"] == "^t-[0-9a-f]{16}$"

    def query(path: str, method: str) -> dict[str, Any]:
        return {p["name"]: p for p in paths[path][method]["parameters"]}

    assert query("/v1/tasks/{id}/rows", "get")["after"]["schema"] == {
        "type": "integer",
        "minimum": 0,
        "default": 0,
    }
    assert query("/v1/tasks", "get")["state"]["schema"]["enum"] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert query("/v1/tasks/{id}", "delete")["purge"]["schema"]["type"] == "boolean"


def test_request_bodies_and_their_content_types() -> None:
    tasks = OPENAPI["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]
    assert tuple(tasks) == TASK_CONTENT_TYPES
    assert tasks["application/json"]["schema"] == {"$ref": "#/components/schemas/TaskDocument"}
    calls = OPENAPI["paths"]["/v1/tasks/{id}/calls"]["post"]["requestBody"]["content"]
    assert tuple(calls) == CALLS_CONTENT_TYPES


def test_json_lines_responses() -> None:
    for path in ("/v1/tasks/{id}/rows", "/v1/tasks/{id}/failures"):
        content = OPENAPI["paths"][path]["get"]["responses"]["200"]["content"]
        assert content == {"application/x-ndjson": {"schema": {"type": "string"}}}
    rows = OPENAPI["paths"]["/v1/tasks/{id}/rows"]["get"]["responses"]["200"]
    assert "X-BlockX-Rows-After" in rows["headers"]
    created = OPENAPI["paths"]["/v1/tasks"]["post"]["responses"]["201"]
    assert "Location" in created["headers"]


def test_the_status_object_lists_every_field() -> None:
    status = OPENAPI["components"]["schemas"]["TaskStatus"]
    assert set(status["required"]) == {
        "id", "task_id", "instance", "state", "streamed", "closed", "calls", "done",
        "succeeded", "failed", "cancelled", "rows", "created_at", "started_at", "ended_at",
        "failure", "summary",
    }  # fmt: skip
    summary = OPENAPI["components"]["schemas"]["Summary"]["properties"]
    assert {"exit_code", "failures_by_kind", "output_rows", "calls_per_s"} <= set(summary)


def test_policy_bounds_come_from_the_worker() -> None:
    policy = OPENAPI["components"]["schemas"]["Policy"]["properties"]
    for name, (least, greatest, _expected) in POLICY_INTEGERS.items():
        assert policy[name]["minimum"] == least
        assert policy[name].get("maximum") == greatest


# --- the task schema agrees with the checks --------------------------------------------------------

ADDER = "def _(p):\n    return p\n"


def _schema_errors(doc: Any) -> list[str]:
    schema = {"$ref": "#/components/schemas/TaskDocument", "components": OPENAPI["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    return [error.message for error in validator.iter_errors(doc)]


def _accepted(doc: Any) -> bool:
    from blockx.serve.documents import DocumentError

    try:
        check_task_document(doc)
    except DocumentError:
        return False
    return True


def _doc(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"functions": {"adder": {"source": ADDER}}, "calls": []}
    doc.update(fields)
    return {key: value for key, value in doc.items() if value is not None}


@pytest.mark.parametrize(
    "doc",
    [
        _doc(),
        _doc(task_id="a.b:c@d-1", instance="tenant", audit=True),
        _doc(calls=None, calls_stream=True),
        _doc(calls_stream=False, calls=[{"function": "adder", "args": {"x": [1, 2]}}]),
        _doc(policy={"max_attempts": 1, "failure": "continue", "deadline_ms": 86_400_000}),
        _doc(policy={"call_budget_ms": None, "debug": True, "base_backoff_ms": 0}),
        _doc(
            functions={"pricing/eth.v2": {"source": ADDER}}, calls=[{"function": "pricing/eth.v2"}]
        ),
    ],
)
def test_documents_the_server_accepts_match_the_schema(doc: dict[str, Any]) -> None:
    assert _accepted(doc)
    assert _schema_errors(doc) == []


@pytest.mark.parametrize(
    "doc",
    [
        _doc(task_id="has space"),
        _doc(task_id="x" * 129),
        _doc(instance=""),
        _doc(functions={}),
        _doc(functions={"adder": "adder.py"}),
        _doc(functions={"adder": {"source": ADDER, "path": "a.py"}}),
        _doc(calls=None),
        _doc(calls_stream=True),
        _doc(calls=None, calls_stream=False),
        _doc(calls=[{"args": 1}]),
        _doc(calls=[{"function": "adder", "x": 1}]),
        _doc(policy={"max_attempts": 0}),
        _doc(policy={"deadline_ms": 86_400_001}),
        _doc(policy={"failure": "stop"}),
        _doc(policy={"retries": 1}),
        _doc(audit="yes"),
        _doc(calls_file="calls.jsonl"),
        _doc(io={}),
        _doc(polcy={}),
    ],
)
def test_documents_the_server_refuses_break_the_schema(doc: dict[str, Any]) -> None:
    assert not _accepted(doc)
    assert _schema_errors(doc) != []

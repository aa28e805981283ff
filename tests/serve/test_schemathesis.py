"""Property-based requests from ``/openapi.json`` (schemathesis): no 5xx, ever.

Schemathesis generates requests for every operation the OpenAPI document
describes -- valid ones and, from the schemas' edges, odd ones -- and sends them
to a real ``blockx serve`` (with a token, which every request carries). Whatever
it sends, the server must answer below 500, with a status the document lists for
that operation (405 for a method the path does not take).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")

from hypothesis import HealthCheck, settings  # noqa: E402
from tests.serve.server import Server  # noqa: E402

from blockx.serve.openapi import OPENAPI  # noqa: E402

pytestmark = pytest.mark.slow

TOKEN = "schemathesis-token"


@schemathesis.serializer("application/x-ndjson", "application/jsonl")
def _ndjson(_ctx: Any, value: Any) -> bytes:
    import json

    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


@schemathesis.serializer("application/yaml", "application/x-yaml", "text/yaml")
def _yaml(_ctx: Any, value: Any) -> bytes:
    import json

    return json.dumps(value).encode()  # JSON is YAML


schema = schemathesis.openapi.from_dict(OPENAPI)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("schemathesis")
    token_file = base / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    with Server(
        Path(base) / "data", "--token-file", str(token_file), "--max-body", "200000", token=TOKEN
    ) as s:
        yield s


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_request_makes_the_server_fail(case: Any, server: Server) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    response = case.call(base_url=server.url, headers=headers, timeout=30)
    assert response.status_code < 500, (case.method, case.path, response.text[:2000])
    listed = {int(code) for code in case.operation.definition.raw["responses"]}
    if case.method.upper() != case.operation.method.upper():
        listed = {405}  # schemathesis tries methods the path does not take
    assert response.status_code in listed, (
        case.method,
        case.path,
        response.status_code,
        response.text[:500],
    )

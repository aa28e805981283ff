"""``blockx schema`` (issue #22, item 7): a JSON Schema of the task file, generated from the
task model the checks use; every example task file validates, a misspelt key does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from blockx.cli.schema import task_file_schema
from blockx.cli.taskfile import CALL_FIELDS, POLICY_FIELDS, TOP_FIELDS
from blockx.cli.yaml12 import load
from blockx.worker.io.config import iter_io_knobs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p for p in (ROOT / "examples").rglob("*") if p.suffix in (".yaml", ".yml", ".json")
)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    """The schema as the command prints it (a real ``blockx schema`` process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "blockx", "schema"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def _errors(schema: dict[str, Any], data: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [
        "/".join(map(str, e.absolute_path)) + ": " + e.message for e in validator.iter_errors(data)
    ]


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 4, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_task_file_validates(schema: dict[str, Any], path: Path) -> None:
    data = load(path.read_text()) if path.suffix != ".json" else json.loads(path.read_text())
    assert _errors(schema, data) == []


def _task(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "task_id": "t1",
        "instance": "NO",
        "functions": {"f": {"path": "f.py"}, "g": {"source": "def g():\n    return 1\n"}},
        "calls": [{"function": "f", "args": {"x": 1}}, {"function": "g"}],
        "policy": {"max_attempts": 3, "failure": "continue", "call_budget_ms": 5000},
        "audit": False,
        "io": {"data_dir": ".data", "rpc": {"endpoints": {"eth": "http://127.0.0.1:8545"}}},
    }
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not ...}


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        (_task(polcy={"max_attempts": 3}), "polcy"),
        (_task(policy={"max_attempt": 3}), "policy"),
        (_task(calls=[{"fuction": "f"}]), "calls/0"),
        (_task(functions={"f": {"paht": "f.py"}}), "functions/f"),
        (_task(io={"data_dri": "x"}), "io"),
        (_task(io={"rpc": {"endpoint": {}}}), "io"),
        (_task(audit="yes"), "audit"),
        (_task(policy={"failure": "contniue"}), "policy/failure"),
        (_task(policy={"max_attempts": 0}), "policy/max_attempts"),
        (_task(task_id="bad id"), "task_id"),
    ],
)
def test_a_misspelt_or_bad_field_is_rejected(
    schema: dict[str, Any], bad: dict[str, Any], where: str
) -> None:
    """Each is the good document of :func:`_task` with one field wrong."""
    assert _errors(schema, _task()) == []
    assert _errors(schema, bad), f"{where}: accepted {bad}"


def test_good_documents_validate(schema: dict[str, Any]) -> None:
    assert _errors(schema, _task()) == []
    assert _errors(schema, _task(calls=..., calls_file="calls.jsonl")) == []
    # Empty optional fields are taken as absent by the checks, so the schema allows null.
    assert _errors(schema, _task(policy=None, audit=None, io=None, instance=None)) == []
    # Exactly one of calls and calls_file.
    assert _errors(schema, _task(calls_file="calls.jsonl"))
    assert _errors(schema, _task(calls=...))


def test_the_schema_is_generated_from_the_task_model(schema: dict[str, Any]) -> None:
    """Its fields are the checks' tuples and the IO configuration's knobs."""
    assert tuple(schema["properties"]) == tuple(TOP_FIELDS)
    assert tuple(schema["$defs"]["Call"]["properties"]) == tuple(CALL_FIELDS)
    assert set(schema["$defs"]["Policy"]["properties"]) == set(POLICY_FIELDS)
    io = schema["properties"]["io"]["anyOf"][1]
    for section, name, _field in iter_io_knobs():
        target = io if not section else io["properties"][section]
        assert name in target["properties"], (section, name)
    assert schema == task_file_schema()


def test_schema_output_file(tmp_path: Path) -> None:
    out = tmp_path / "task.schema.json"
    proc = subprocess.run(
        [sys.executable, "-m", "blockx", "schema", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert json.loads(out.read_text()) == task_file_schema()


def test_docs_show_the_yaml_language_server_comment() -> None:
    text = (ROOT / "docs" / "taskspec.md").read_text()
    assert "# yaml-language-server: $schema=" in text
    assert "blockx schema" in text

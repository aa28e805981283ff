"""``blockx schema``: the JSON Schema of a task file, generated from the task model.

Theory of operation
-------------------
Nothing here is a second description of a task file written by hand. The
fields come from the tuples the checks use (:data:`blockx.cli.taskfile.TOP_FIELDS`,
``FUNCTION_FIELDS``, ``CALL_FIELDS``, ``POLICY_FIELDS``; a submitted task's
:data:`blockx.serve.documents.SUBMITTED_FIELDS`, passed in by the server), the id patterns from
:mod:`blockx.cli.taskfile`, the policy's bounds from
:data:`blockx.worker.api.POLICY_INTEGERS` and ``FAILURE_POLICIES``, and the
``io`` section's knobs (and their docs) from the IO configuration model
(:data:`blockx.worker.io.config.IO_SECTIONS`). A field added to a tuple without a
schema here fails the generation (:class:`KeyError` naming it), so the schema
cannot silently fall behind the checks.

Two variants share the builders:

* ``"file"`` -- a task file as ``blockx run``/``blockx validate`` read it
  (``calls`` or ``calls_file``, ``io``; optional fields may be null, as the
  checks allow). :func:`task_file_schema` is the standalone document
  ``blockx schema`` prints (draft 2020-12, definitions under ``$defs``).
* ``"submitted"`` -- a task sent to ``blockx serve`` (``calls`` or
  ``calls_stream: true``; no ``calls_file``, no ``io``):
  :mod:`blockx.serve.openapi` takes its ``TaskDocument``, ``FunctionSource``,
  ``Call`` and ``Policy`` from :func:`task_document` and :func:`task_definitions`.

The schema says what is accepted; the checks remain the judge (a function id
named by a call must be one of the task's, a path must exist, ...), and their
messages say what is wrong. An editor uses the schema through the
``yaml-language-server`` comment docs/taskspec.md shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final, Literal

from blockx.cli.taskfile import (
    CALL_FIELDS,
    FUNCTION_FIELDS,
    FUNCTION_ID_RE,
    POLICY_FIELDS,
    TASK_ID_RE,
    TOP_FIELDS,
)

__all__ = ["SCHEMA_DIALECT", "main", "task_definitions", "task_document", "task_file_schema"]

Variant = Literal["file", "submitted"]

SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
_DEFS: Final = "#/$defs/"

#: What a task file's top-level fields hold (docs/taskspec.md), by variant.
_FIELD_DOCS: Final[dict[str, str]] = {
    "task_id": "names the task in logs and the summary (default: task-<12 hex>)",
    "instance": "fairness key (tenant): instances share capacity max-min fairly",
    "calls": "inline calls",
    "calls_file": "a JSON Lines file of calls (relative to the task file), streamed",
    "calls_stream": "true: the calls are sent later (POST /v1/tasks/{id}/calls) "
    "until POST /v1/tasks/{id}/close",
    "audit": "audit every function before it runs (docs/security.md)",
    "io": "IO knobs merged over the environment's IO configuration (docs/configuration.md)",
}


def _ref(prefix: str, name: str) -> dict[str, str]:
    return {"$ref": prefix + name}


def _optional(schema: dict[str, Any], variant: Variant) -> dict[str, Any]:
    """A task file's optional field may be written empty (null): the checks take it as
    absent. A submitted task's schema stays strict (the API's published form)."""
    if variant == "file":
        return {"anyOf": [{"type": "null"}, schema]}
    return schema


def _io_schema() -> dict[str, Any]:
    """The ``io`` section: every knob of the IO configuration model, with its doc."""
    import dataclasses

    from blockx.worker.io.config import IO_SECTIONS

    root: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {}}
    for section, cls in IO_SECTIONS.items():
        if section:
            target: dict[str, Any] = {
                "type": "object",
                "additionalProperties": False,
                "properties": {},
            }
            if cls.__doc__:
                target["description"] = " ".join(cls.__doc__.split()).split(". ")[0]
            root["properties"][section] = target
        else:
            target = root
        for f in dataclasses.fields(cls):
            if f.init and "kind" in f.metadata:
                target["properties"][f.name] = {"description": str(f.metadata.get("doc", ""))}
    return root


def _top_field(name: str, variant: Variant, ref: str) -> dict[str, Any]:
    if name == "task_id":
        schema: dict[str, Any] = {"type": "string", "pattern": f"^{TASK_ID_RE.pattern}$"}
    elif name == "instance":
        schema = {"type": "string", "minLength": 1, "pattern": "\\S"}
    elif name == "functions":
        return {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": f"^{FUNCTION_ID_RE.pattern}$"},
            "additionalProperties": _ref(ref, "FunctionSource"),
            "description": "{function_id: {path: FILE} or {source: CODE}}"
            if variant == "file"
            else "{function_id: {source: CODE}} (or {path: FILE} under the "
            "server's --functions-root)",
        }
    elif name == "calls":
        return {"type": "array", "items": _ref(ref, "Call"), "description": _FIELD_DOCS[name]}
    elif name == "calls_file":
        return {"type": "string", "minLength": 1, "description": _FIELD_DOCS[name]}
    elif name == "calls_stream":
        return {"type": "boolean", "description": _FIELD_DOCS[name]}
    elif name == "policy":
        return _optional(_ref(ref, "Policy"), variant)
    elif name == "audit":
        doc = _FIELD_DOCS[name]
        if variant == "submitted":
            doc += "; a server started with --require-audit refuses false"
        schema = {"type": "boolean"}
        return {**_optional(schema, variant), "description": doc}
    elif name == "io":
        return {**_optional(_io_schema(), variant), "description": _FIELD_DOCS[name]}
    else:
        raise KeyError(f"task field {name!r} has no schema (blockx.cli.schema)")
    return {**_optional(schema, variant), "description": _FIELD_DOCS[name]}


def task_document(
    variant: Variant = "file", *, ref: str = _DEFS, fields: tuple[str, ...] = TOP_FIELDS
) -> dict[str, Any]:
    """The schema of a whole task document with the top-level ``fields`` (a submitted
    task's: ``blockx.serve.documents.SUBMITTED_FIELDS``), its definitions referred to
    under ``ref``."""
    if variant == "file":
        description = "A BlockX task file (docs/taskspec.md)."
        one_of: list[dict[str, Any]] = [{"required": ["calls"]}, {"required": ["calls_file"]}]
    else:
        description = (
            "A task in the task-file schema (docs/taskspec.md), as a submitted task "
            "may use it: functions by source (a path only on a server with --functions-root, "
            "relative to it), calls inline or calls_stream: true; no calls_file, no io."
        )
        one_of = [
            {"required": ["calls"]},
            {"required": ["calls_stream"], "properties": {"calls_stream": {"const": True}}},
        ]
    return {
        "type": "object",
        "description": description,
        "additionalProperties": False,
        "required": ["functions"],
        "properties": {name: _top_field(name, variant, ref) for name in fields},
        "oneOf": one_of,
    }


def _function_source(variant: Variant) -> dict[str, Any]:
    docs = {
        "source": "the function's Python code (a module with an entry def)",
        "path": "a .py file, relative to the task file"
        if variant == "file"
        else "a .py file inside the server's --functions-root",
    }
    return {
        "oneOf": [
            {
                "type": "object",
                "required": [name],
                "additionalProperties": False,
                "properties": {name: {"type": "string", "minLength": 1, "description": docs[name]}},
            }
            for name in sorted(FUNCTION_FIELDS, reverse=True)  # source first, then path
        ]
    }


def _call() -> dict[str, Any]:
    docs = {
        "function": {"type": "string", "description": "one of the task's function ids"},
        "args": {
            "description": "any JSON value: a list is spread as positional arguments, "
            "anything else is the one argument; absent: no argument"
        },
    }
    return {
        "type": "object",
        "required": ["function"],
        "additionalProperties": False,
        "properties": {name: docs[name] for name in CALL_FIELDS},
    }


def _policy() -> dict[str, Any]:
    from blockx.worker.api import FAILURE_POLICIES, POLICY_INTEGERS

    others: dict[str, dict[str, Any]] = {
        "failure": {
            "enum": list(FAILURE_POLICIES),
            "default": "fast_fail",
            "description": "fast_fail: the first call that finally fails stops the task; "
            "continue: failures are listed and the others run",
        },
        "debug": {
            "type": "boolean",
            "default": False,
            "description": "capture each call's stdout and stderr",
        },
    }
    properties: dict[str, Any] = {}
    for name in (*POLICY_INTEGERS, *others):
        if name not in POLICY_FIELDS:
            continue
        if name in POLICY_INTEGERS:
            least, greatest, expected = POLICY_INTEGERS[name]
            schema: dict[str, Any] = {
                "type": ["integer", "null"],
                "minimum": least,
                "description": f"{expected}; null: the worker's configuration",
            }
            if greatest is not None:
                schema["maximum"] = greatest
            properties[name] = schema
        else:
            properties[name] = others[name]
    missing = [name for name in POLICY_FIELDS if name not in properties]
    if missing:
        raise KeyError(f"policy field(s) {missing} have no schema (blockx.cli.schema)")
    return {
        "type": "object",
        "description": "How the task's calls run (docs/taskspec.md#policy).",
        "additionalProperties": False,
        "properties": properties,
    }


def task_definitions(variant: Variant = "file") -> dict[str, Any]:
    """The definitions :func:`task_document` refers to: FunctionSource, Call, Policy."""
    return {"FunctionSource": _function_source(variant), "Call": _call(), "Policy": _policy()}


def task_file_schema() -> dict[str, Any]:
    """The standalone JSON Schema of a task file (what ``blockx schema`` prints)."""
    from blockx import __version__

    return {
        "$schema": SCHEMA_DIALECT,
        "title": f"BlockX task file (blockx {__version__})",
        **task_document("file"),
        "$defs": task_definitions("file"),
    }


def main(args: argparse.Namespace) -> int:
    """``blockx schema [-o FILE]``: print (or write) the task file's JSON Schema."""
    text = json.dumps(task_file_schema(), indent=2, sort_keys=False) + "\n"
    output = getattr(args, "output", None)
    if output and output != "-":
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0

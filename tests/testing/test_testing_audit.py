"""``load_function(audit=True)``: the engine's auditor and restricted runtime, in process."""

from __future__ import annotations

import pytest

from blockx.testing import AuditRejectedError, load_function

READER = "def _(k):\n    return [repr(Table('prices')), Table('prices').get_row(k)]\n"


def test_a_rejected_function_fails_at_load_with_the_auditors_message():
    with pytest.raises(AuditRejectedError, match=r"audit rejected function: .*os"):
        load_function("import os\ndef _():\n    return os.getcwd()\n", audit=True)


def test_sub_functions_are_audited_too():
    with pytest.raises(AuditRejectedError, match="audit rejected child"):
        load_function(
            "def _():\n    return function.call('child')\n",
            functions={"child": "def _():\n    return open('/etc/passwd').read()\n"},
            audit=True,
        )


def test_an_accepted_function_runs_in_the_restricted_runtime():
    rows = {"prices": [{"key": "ETH", "usd": 3000}]}
    plain = load_function(READER, tables=rows)
    audited = load_function(READER, tables=rows, audit=True)

    assert plain("ETH") == ["Table('prices')", {"key": "ETH", "usd": 3000}]
    # The same answer, through the restricted runtime's object facade of Table.
    assert audited("ETH") == ["<restricted Table object>", {"key": "ETH", "usd": 3000}]
    globals_ = audited.env.entry(audited.function_id).__globals__
    assert "open" not in globals_["__builtins__"]


def test_audited_sub_calls_and_json_work():
    f = load_function(
        "def _(x):\n    return json.dumps(function.call('child', x))\n",
        functions={"child": "def _(x):\n    return {'double': 2 * x}\n"},
        audit=True,
    )
    assert f(4) == '{"double": 8}'

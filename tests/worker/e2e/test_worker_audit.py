"""The worker-side audit gate, end to end on real executors (process spawn mode).

A task submitted with ``audit=True`` has its functions audited before their
first dispatch: a rejected function's calls fail with ``audit_rejected`` (not
retryable, naming the rule, line and column) without reaching an executor,
while accepted functions run restricted (their ``ExecuteCall`` carries the
verdict; the executor hands them facades, not modules). The gate's own
behaviour (caching, what it does to a task's code view) is tested first,
without processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from e2e_support import WorkerSession, e2e_config
from tests.helpers.compiled import skip_if_compiled

from blockx.audit import Auditor
from blockx.worker.api import Call, Task, TaskPolicy
from blockx.worker.audit_gate import AuditGate, audit_task_code
from blockx.worker.code import build_task_code_view

pytestmark = [pytest.mark.timeout(120)]

BENIGN = """
import json
import math
from decimal import Decimal


def _(p):
    total = sum(p["xs"])
    return {
        "total": total,
        "root": math.isqrt(total),
        "price": str(Decimal("1.10") * p["qty"]),
        "doc": json.dumps({"n": len(p["xs"])}, sort_keys=True),
    }
"""

# Looks harmless; `open` is not available to audited code.
READS_A_FILE = """
def _(p):
    with_config = p.get("config", "/etc/hostname")
    data = open(with_config).read()
    return {"n": len(data)}
"""

IMPORTS_OS = "import os\n\n\ndef _(p):\n    return {'cwd': os.getcwd()}\n"

DUNDER_WALK = "def _(p):\n    return {'n': len(().__class__.__base__.__subclasses__())}\n"

# Accepted: shows what the restricted runtime hands out instead of the real objects.
INTROSPECT = "def _(p):\n    return {'json': repr(json), 'print': repr(print)}\n"

CALLS_A_REJECTED_ONE = """
def _(p):
    try:
        function.call("reads_a_file", p)
    except Exception as e:
        return {"child_error": str(e)}
    return {"child_error": None}
"""

SYNTAX_ERROR = "def _(p):\n    return (\n"


# --- the gate alone ------------------------------------------------------------------------


def test_the_gate_marks_rejected_functions_and_pays_accepted_ones_their_verdict() -> None:
    gate = AuditGate(Auditor())
    view = build_task_code_view({"benign": BENIGN, "reads": READS_A_FILE, "broken": SYNTAX_ERROR})
    gated = gate.gate_view(view)
    benign, reads, broken = gated.get("benign"), gated.get("reads"), gated.get("broken")
    assert benign.error is None and benign.entry_selector == "_"
    assert benign.audit is not None and benign.audit["policy"] == "default"
    assert benign.audit["verdictDigest"].startswith("sha256:")
    assert reads.error is not None and reads.error.kind == "audit_rejected"
    assert reads.audit is None and reads.entry_selector == ""
    assert "[name.forbidden] line 4, col 12" in reads.error.message
    assert (reads.error.lineno, reads.error.offset) == (4, 12)
    assert reads.error.stack is not None and "open(with_config)" in reads.error.stack
    # A function that does not compile keeps its compile error (user_error).
    assert broken.error is not None and broken.error.kind == "user_error"
    assert set(gated.errors()) == {"reads", "broken"}
    # The unaudited view is untouched (tasks without audit run unrestricted).
    assert view.get("benign").audit is None and view.get("reads").error is None
    # Verdicts are cached by (function id, digest).
    assert (gate.audited, gate.hits, gate.rejected) == (2, 0, 1)
    gate.gate_view(build_task_code_view({"benign": BENIGN, "reads": READS_A_FILE}))
    assert (gate.audited, gate.hits) == (2, 2)
    gate.gate_view(build_task_code_view({"other_name": BENIGN}))
    assert gate.audited == 3  # another function id: its own verdict (entry, message)


def test_the_process_wide_gate() -> None:
    gated = audit_task_code(build_task_code_view({"dunder": DUNDER_WALK}))
    error = gated.get("dunder").error
    assert error is not None and error.kind == "audit_rejected"
    assert "[attr.underscore]" in error.message and "line 2" in error.message


# --- on a worker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session() -> Iterator[WorkerSession]:
    with WorkerSession(e2e_config()) as s:
        yield s


@skip_if_compiled("blockx.worker.link.adapter", "its sends cannot be replaced by a spy")
def test_rejected_functions_fail_without_reaching_an_executor(session: WorkerSession) -> None:
    async def scenario() -> None:
        worker = session.worker
        calls = [
            Call("benign", {"xs": [1, 2, 3, 10], "qty": 3}),
            Call("reads_a_file", {}),
            Call("imports_os", {}),
            Call("dunder_walk", {}),
            Call("benign", {"xs": [49], "qty": 1}),
        ]
        adapter = worker.adapter
        sent: list[str] = []
        real_send = adapter.send_execute_call_encoded

        def spy(executor_id: str, call_id: str, attempt_seq: int, body: bytes) -> None:
            payload = orjson.loads(body)["payload"]  # the orchestrator pre-encodes them
            sent.append(payload["functionId"])
            assert payload["audit"] is not None  # every audited ExecuteCall carries it
            real_send(executor_id, call_id, attempt_seq, body)

        adapter.send_execute_call_encoded = spy  # type: ignore[method-assign]
        try:
            result = await worker.run_task(
                Task(
                    functions={
                        "benign": BENIGN,
                        "reads_a_file": READS_A_FILE,
                        "imports_os": IMPORTS_OS,
                        "dunder_walk": DUNDER_WALK,
                    },
                    calls=calls,
                    policy=TaskPolicy(failure="continue", max_attempts=3),
                    audit=True,
                )
            )
        finally:
            del adapter.send_execute_call_encoded
        assert result.success  # policy continue: the other functions' outputs
        assert result.outputs == [
            {"total": 16, "root": 4, "price": "3.30", "doc": '{"n": 4}'},
            {"total": 49, "root": 7, "price": "1.10", "doc": '{"n": 1}'},
        ]
        errors = {e.function_id: e for e in result.errors}
        assert sorted(errors) == ["dunder_walk", "imports_os", "reads_a_file"]
        for error in errors.values():
            assert error.kind == "audit_rejected"
            assert not error.retryable and error.attempts == 1
            assert error.message.startswith(f"audit rejected {error.function_id}: [")
        assert "[name.forbidden] line 4, col 12: 'open'" in errors["reads_a_file"].message
        assert "[import.module] line 1, col 8" in errors["imports_os"].message
        assert "os" in errors["imports_os"].message
        assert "[attr.underscore] line 2" in errors["dunder_walk"].message
        assert set(result.code_errors) == set(errors)
        assert sent == ["benign", "benign"]  # the refused calls never reached an executor

    session.run(scenario())


def test_accepted_functions_run_restricted_and_unaudited_ones_do_not(
    session: WorkerSession,
) -> None:
    async def scenario() -> None:
        worker = session.worker
        audited = await worker.run_task(
            Task(functions={"introspect": INTROSPECT}, calls=[Call("introspect")], audit=True)
        )
        assert audited.success, audited.errors
        [seen] = audited.outputs
        assert seen["json"] == "<restricted module json>"  # a facade, not the module
        assert "built-in function print" not in seen["print"]  # sealed
        plain = await worker.run_task(
            Task(functions={"introspect": INTROSPECT}, calls=[Call("introspect")])
        )
        [unrestricted] = plain.outputs
        assert unrestricted["json"].startswith("<module 'json'")
        # Without audit, the same "harmless looking" file reader is not stopped here.
        reads = await worker.run_task(
            Task(
                functions={"reads_a_file": READS_A_FILE},
                calls=[Call("reads_a_file", {"config": __file__})],
            )
        )
        assert reads.success and reads.outputs[0]["n"] > 0

    session.run(scenario())


def test_a_sub_call_of_a_rejected_function_fails_with_audit_rejected(
    session: WorkerSession,
) -> None:
    async def scenario() -> None:
        result = await session.worker.run_task(
            Task(
                functions={"parent": CALLS_A_REJECTED_ONE, "reads_a_file": READS_A_FILE},
                calls=[Call("parent", {})],
                audit=True,
            )
        )
        assert result.success, result.errors
        [out] = result.outputs
        # the chain of functions once, then the child's kind (docs/sdk.md)
        assert out["child_error"].startswith("parent → reads_a_file: audit_rejected: ")
        assert "[name.forbidden] line 4, col 12" in out["child_error"]

    session.run(scenario())


def test_a_stream_task_is_gated_too(session: WorkerSession) -> None:
    async def scenario() -> None:
        def calls() -> Iterator[Call]:
            for i in range(20):
                yield Call("benign" if i % 2 else "imports_os", {"xs": [i], "qty": 1})

        result = await session.worker.run_task(
            Task(
                functions={"benign": BENIGN, "imports_os": IMPORTS_OS},
                calls=calls(),
                policy=TaskPolicy(failure="continue"),
                audit=True,
            )
        )
        assert len(result.outputs) == 10
        assert len(result.errors) == 10
        assert {e.kind for e in result.errors} == {"audit_rejected"}

    session.run(scenario())

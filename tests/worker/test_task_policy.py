"""TaskPolicy: one check of a task's policy, shared by the Python API and the task file."""

from __future__ import annotations

from typing import Any

import pytest

from blockx.worker.api import POLICY_INTEGERS, TaskPolicy, TaskSpecError, policy_problems


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"call_budget_ms": -1}, "policy.call_budget_ms: expected an integer from 0 to"),
        # Bounded to a day like CALL_DEADLINE_MS (the task file always was; the API now too).
        ({"call_budget_ms": 86_400_001}, "policy.call_budget_ms: expected an integer from 0"),
        ({"base_backoff_ms": "10"}, "policy.base_backoff_ms: expected an integer from 0"),
        ({"max_attempts": 0}, "policy.max_attempts: expected a positive integer, got 0"),
        ({"max_attempts": True}, "policy.max_attempts: expected a positive integer, got True"),
        ({"max_output_bytes": 0}, "policy.max_output_bytes: expected a positive integer"),
        ({"deadline_ms": 0}, "policy.deadline_ms: expected an integer from 1 to 86,400,000"),
        ({"failure": "sometimes"}, "policy.failure: expected fast_fail or continue, got "),
        ({"debug": "yes"}, "policy.debug: expected true or false, got 'yes'"),
    ],
)
def test_a_bad_policy_field_is_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TaskPolicy(**fields)


def test_every_bad_field_at_once_and_the_bounds_are_valid() -> None:
    assert policy_problems(
        {"max_attempts": 0, "call_budget_ms": 86_400_001, "failure": "x", "debug": None}
    ) == [
        ("max_attempts", "a positive integer"),
        ("call_budget_ms", POLICY_INTEGERS["call_budget_ms"][2]),
        ("failure", "fast_fail or continue"),
        ("debug", "true or false"),
    ]
    ok = TaskPolicy(call_budget_ms=86_400_000, base_backoff_ms=0, deadline_ms=1, debug=True)
    assert ok.core_policy().call_budget_ms == 86_400_000
    assert policy_problems({name: None for name in POLICY_INTEGERS}) == []


def test_the_task_file_knows_the_same_policy_fields() -> None:
    """The task-file checker keeps its own copies only to start without the worker."""
    from dataclasses import fields

    from blockx.cli.taskfile_checks import FAILURE_POLICIES, MAX_BUDGET_MS, POLICY_FIELDS
    from blockx.worker.api import FAILURE_POLICIES as API_FAILURE_POLICIES
    from blockx.worker.config import MAX_DURATION_MS

    assert POLICY_FIELDS == tuple(f.name for f in fields(TaskPolicy))
    assert FAILURE_POLICIES == API_FAILURE_POLICIES
    assert MAX_BUDGET_MS == MAX_DURATION_MS

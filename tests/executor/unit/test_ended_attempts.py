"""The executor's memory of ended attempts (``EndedAttempts``): the highest ended attempt
of the last ``FINISHED_ATTEMPTS_REMEMBERED`` calls, the call remembered longest forgotten
first."""

from __future__ import annotations

from blockx.executor.call_runner import FINISHED_ATTEMPTS_REMEMBERED, EndedAttempts


def test_the_highest_ended_attempt_is_remembered() -> None:
    ended = EndedAttempts()
    assert ended.get("t/c1") == 0
    ended.note("t/c1", 2)
    ended.note("t/c1", 1)  # a lower one does not lower it
    assert ended.get("t/c1") == 2
    ended.note("t/c1", 3)
    assert ended.get("t/c1") == 3 and len(ended) == 1


def test_past_the_bound_the_call_remembered_longest_is_forgotten() -> None:
    ended = EndedAttempts()
    for i in range(FINISHED_ATTEMPTS_REMEMBERED):
        ended.note(f"t/c{i}", 1)
    ended.note("t/c0", 2)  # a later attempt of a known call does not renew it
    ended.note("t/new", 1)
    assert len(ended) == FINISHED_ATTEMPTS_REMEMBERED
    assert ended.get("t/c0") == 0 and ended.get("t/c1") == 1 and ended.get("t/new") == 1

"""Fixtures for the executor's in-process unit tests.

Every test gets its runtimes shut down and checked for leaked greenlets at
teardown. pytest-timeout is switched to its thread method here: the runtime
owns SIGALRM (budget preemption), which the signal method also uses.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from executor_harness import Harness, live_call_greenlets

from blockx.executor.debug_capture import remove_debug_tee


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "executor/unit" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.timeout(60, method="thread"))


@pytest.fixture
def harnesses() -> Iterator[list[Harness]]:
    """Harnesses built by a test; shut down and leak-checked afterwards."""
    made: list[Harness] = []
    yield made
    for harness in made:
        harness.close()
    remove_debug_tee()
    leaked = live_call_greenlets()
    assert not leaked, f"greenlets still alive after shutdown: {leaked}"


@pytest.fixture
def make_harness(harnesses: list[Harness]):  # type: ignore[no-untyped-def]
    def make(**kwargs: object) -> Harness:
        harness = Harness(**kwargs)  # type: ignore[arg-type]
        harnesses.append(harness)
        return harness

    return make


@pytest.fixture
def h(make_harness) -> Harness:  # type: ignore[no-untyped-def]
    """A runtime ``exec-1`` without a session, with a fake monotonic clock."""
    return make_harness()

"""Fixtures of the adapter tests: every asyncio scenario runs on both event loops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None

_LOOPS = ["asyncio"] + (["uvloop"] if uvloop is not None else [])


@pytest.fixture(params=_LOOPS)
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Coroutine[Any, Any, Any]], Any]]:
    """``run(coro)``: run a scenario to completion on a fresh loop (asyncio, then uvloop)."""
    factory = asyncio.new_event_loop if request.param == "asyncio" else uvloop.new_event_loop

    def run_scenario(coro: Coroutine[Any, Any, Any]) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)

    yield run_scenario

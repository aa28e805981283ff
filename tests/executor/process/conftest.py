"""Process tests: a real ``python -m blockx.executor`` driven by the test-side worker."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[3]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.helpers.fake_worker import FakeWorker  # noqa: E402


@pytest.fixture
def start_worker() -> Iterator[Callable[..., FakeWorker]]:
    """``start_worker(**FakeWorker fields)``: a started worker, killed and reaped at teardown."""
    workers: list[FakeWorker] = []

    def start(**kwargs: Any) -> FakeWorker:
        worker = FakeWorker(**kwargs)
        workers.append(worker)
        return worker.start()

    yield start
    for worker in workers:
        worker.stop()

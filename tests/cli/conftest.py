"""Fixtures of the CLI tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from cli_support import Pipe


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    """A stream's stand-in: a pipe nobody reads unless the test does."""
    pipe = Pipe()
    yield pipe
    for fd in (pipe.write_end, pipe.read_end):
        try:
            os.close(fd)
        except OSError:  # the test closed it (the reader went away)
            pass

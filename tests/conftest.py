"""Suite-wide hooks."""

from __future__ import annotations

import pytest
from tests.helpers.compiled import skip_reason


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Tests marked interpreted_check (tests.helpers.compiled.skip_if_compiled) skip
    # while the module they reach inside runs compiled.
    reason = skip_reason(item)
    if reason is not None:
        pytest.skip(reason)

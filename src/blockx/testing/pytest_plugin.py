"""The ``blockx`` pytest plugin: the ``blockx_function`` fixture.

Registered as the ``blockx`` entry point of the ``pytest11`` group, so pytest
loads it wherever BlockX is installed (``-p blockx.testing.pytest_plugin``
loads it explicitly). It imports nothing of BlockX until a test asks for the
fixture, so other test suites pay nothing for it.

::

    def test_price(blockx_function):
        price = blockx_function("functions/token_price.py",
                                tables={"prices": [{"key": "ETH", "usd": 3000}]})
        assert price("ETH") == 3000

``blockx_function(path_or_source, **options)`` is
:func:`blockx.testing.load_function` with one difference: a relative path
is looked up next to the test file first, then from the current directory
(``base_dir=`` overrides both).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["blockx_function"]


@pytest.fixture
def blockx_function(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """A loader of BlockX functions for this test (see the module docstring)."""
    from blockx.function_files import is_function_path
    from blockx.testing import load_function

    test_dir = pathlib.Path(str(request.node.path)).parent

    def load(path_or_source: Any, **options: Any) -> Any:
        if "base_dir" not in options and _relative_path_next_to(path_or_source, test_dir):
            options["base_dir"] = test_dir
        if "base_dir" not in options:
            functions = options.get("functions") or {}
            if any(
                isinstance(v, (str, os.PathLike))
                and is_function_path(v)
                and _relative_path_next_to(v, test_dir)
                for v in functions.values()
            ):
                options["base_dir"] = test_dir
        return load_function(path_or_source, **options)

    return load


def _relative_path_next_to(value: Any, directory: pathlib.Path) -> bool:
    from blockx.function_files import is_function_path

    if not isinstance(value, (str, os.PathLike)) or not is_function_path(value):
        return False
    path = pathlib.Path(os.fspath(value).strip())
    return not path.is_absolute() and (directory / path).is_file()

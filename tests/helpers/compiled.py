"""Whether a BlockX module runs compiled (mypyc) or interpreted, for the few tests
that need to reach inside it in a way compiled code does not allow.

``make test`` runs the whole suite on the compiled modules, then the tests of the
compiled packages again with ``BLOCKX_PURE_PYTHON=1`` -- the tests marked slow
among them only if :func:`skip_if_compiled` marks them ``interpreted_check``, so
what a compiled run skips is still checked on the same source.
"""

from __future__ import annotations

import importlib

import pytest

__all__ = ["CORE_COMPILED", "is_compiled", "skip_if_compiled", "skip_reason"]


def is_compiled(module_name: str) -> bool:
    """True when ``module_name`` was loaded from an extension module, not a ``.py`` file."""
    module = importlib.import_module(module_name)
    return not (getattr(module, "__file__", None) or "").endswith(".py")


#: The dispatcher core runs compiled in this process.
CORE_COMPILED: bool = is_compiled("blockx.worker.core.dispatcher")


def skip_if_compiled(module_name: str, why: str) -> pytest.MarkDecorator:
    """Mark a test to be skipped while ``module_name`` is compiled (``why``: what it does
    that compiled code forbids); the interpreted pass still runs it. The skip itself
    is ``tests/conftest.py``'s, at set-up."""
    return pytest.mark.interpreted_check(module_name, why)


def skip_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is skipped here: its ``interpreted_check`` module runs compiled."""
    for mark in item.iter_markers("interpreted_check"):
        module_name, why = mark.args
        if is_compiled(module_name):
            return f"{module_name} compiled: {why}"
    return None

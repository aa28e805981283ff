"""Whether a BlockX module runs compiled (mypyc) or interpreted, for the few tests
that need to reach inside it in a way compiled code does not allow."""

from __future__ import annotations

import importlib

import pytest

__all__ = ["is_compiled", "skip_if_compiled"]


def is_compiled(module_name: str) -> bool:
    """True when ``module_name`` was loaded from an extension module, not a ``.py`` file."""
    module = importlib.import_module(module_name)
    return not (getattr(module, "__file__", None) or "").endswith(".py")


def skip_if_compiled(module_name: str, why: str) -> pytest.MarkDecorator:
    """Skip a test while ``module_name`` is compiled; the interpreted run still checks
    it (the source is the same). ``why``: what the test does that compiled code forbids."""
    return pytest.mark.skipif(is_compiled(module_name), reason=f"{module_name} compiled: {why}")

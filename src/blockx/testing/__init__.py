"""``blockx.testing``: unit-test BlockX functions with pytest, in process.

::

    from blockx.testing import load_function

    def test_price_is_read_from_the_table():
        price = load_function("functions/token_price.py",
                              tables={"prices": [{"key": "ETH", "usd": 3000}]})
        assert price("ETH") == 3000

:func:`load_function` runs a function file with the executor's own prelude
(``Table``, ``ChainState``, ``function``, ...) against in-memory tables
(:class:`InMemoryTables`), a fake chain (:class:`FakeChain`), other loaded
functions for sub-calls, and a virtual clock (:class:`VirtualClock`) for
``time.sleep``; ``audit=True`` applies the engine's audit and restricted
runtime. The pytest plugin (:mod:`blockx.testing.pytest_plugin`, registered as
the ``blockx`` pytest11 entry point) adds the ``blockx_function`` fixture.
See ``docs/testing.md``.
"""

from __future__ import annotations

from blockx.function_files import FunctionFileError

from .clock import VirtualClock
from .environment import AuditRejectedError, TestEnvironment, TestProvider
from .fake_chain import FakeChain, UnansweredRequestError
from .loader import LoadedFunction, load_function
from .tables import InMemoryTables

__all__ = [
    "AuditRejectedError",
    "FakeChain",
    "FunctionFileError",
    "InMemoryTables",
    "LoadedFunction",
    "TestEnvironment",
    "TestProvider",
    "UnansweredRequestError",
    "VirtualClock",
    "load_function",
]

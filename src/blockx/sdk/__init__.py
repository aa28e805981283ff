"""``blockx.sdk``: the executor-side SDK seam (the seed's ``blockx_sdk``).

A very thin layer: every entry point asks :func:`get_provider` for the current
call's :class:`Provider` and forwards to it. Inside the executor that provider
turns each call into a ``CallWaiting`` and suspends the call until the worker
answers; outside a call :func:`get_provider` raises :class:`NoProviderError`.

* :mod:`blockx.sdk.db` — ``db.read`` / ``db.write`` / ``db.get`` (backend ``blockdb``);
* :mod:`blockx.sdk.rpc` — ``rpc.call(chain, method, params)`` (backend ``rpc``);
* :func:`call_subfunc` — a sub-call with ``args`` passed through unchanged;
* :func:`sleep` — a cooperative sleep (``time.sleep`` inside a call does the same).

User-facing code usually goes through ``blockx.function.call`` instead.
"""

from __future__ import annotations

from typing import Any

from . import db, rpc
from .provider import Provider
from .runtime import (
    NoProviderError,
    current_provider,
    get_provider,
    reset_provider,
    set_provider,
)

__all__ = [
    "NoProviderError",
    "Provider",
    "call_subfunc",
    "current_provider",
    "db",
    "get_provider",
    "reset_provider",
    "rpc",
    "set_provider",
    "sleep",
]


def call_subfunc(function_id: str, args: Any = None) -> Any:
    """Run ``function_id`` as a sub-call with ``args`` as its ExecuteCall args; return its output.

    ``args`` follows the wire rule: a list is spread as positional arguments,
    anything else is the one argument.
    """
    return get_provider().subcall(function_id, args)


def sleep(seconds: float) -> None:
    """Suspend this call for ``seconds`` (charged to its budget; other calls run meanwhile)."""
    get_provider().sleep(seconds)

"""``blockx.function``: call another BlockX function from user code.

::

    def _(p):
        child = function.call("adder", {"left": p["left"], "right": p["right"]})
        return {"sum": child["sum"]}

``function`` is predefined in every module the executor loads (no import
needed). Inside the executor (``BLOCKX_EXECUTOR_RUNTIME=1``, a provider
installed) :func:`call` becomes a sub-call: the calling greenlet suspends, the
worker runs the child — on this same executor — and the child's output is
returned, or a ``SubcallFailedError`` is raised. Anywhere else it raises
:class:`FunctionCallOutsideExecutorError`.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["FunctionCallOutsideExecutorError", "call"]


class FunctionCallOutsideExecutorError(RuntimeError):
    """``blockx.function.call`` used outside a call run by the BlockX executor."""


def call(function_id: str, *args: Any) -> Any:
    """Call ``function_id`` and return its output.

    Arguments become the child's ``args``: one argument is passed as that value
    (a list value is spread by the wire rule: ``call("f", [1, 2])`` runs
    ``f(1, 2)``), several become a list (``call("f", 1, 2)`` also runs
    ``f(1, 2)``), none is an empty list (``f()``).
    """
    payload: Any = args[0] if len(args) == 1 else list(args)
    # Imported lazily, as the seed's blockx-py does: plain scripts pay nothing.
    from blockx.sdk.runtime import current_provider, get_provider

    provider = current_provider()
    if provider is not None:
        return provider.subcall(function_id, payload)
    if os.environ.get("BLOCKX_EXECUTOR_RUNTIME") == "1":
        return get_provider().subcall(function_id, payload)  # raises NoProviderError
    raise FunctionCallOutsideExecutorError(
        f"blockx.function.call({function_id!r}) only works inside a BlockX call "
        "(run the function through the BlockX worker/executor)"
    )

"""``blockx.sdk.rpc``: a thin node JSON-RPC read through the provider.

``call(chain, method, params)`` is one ``read_req`` on the ``rpc`` backend with
the JSON-RPC method as the operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from .runtime import get_provider

__all__ = ["BACKEND", "call"]

#: The IO backend these calls are addressed to.
BACKEND: Final = "rpc"


def call(
    chain: str, method: str, params: Sequence[Any] = (), *, cache_key: str | None = None
) -> Any:
    """``method(*params)`` on ``chain``'s node.

    Example: ``call("eth", "eth_getBalance", [address, "latest"])``.
    """
    return get_provider().read_req(
        BACKEND, method, {"chain": chain, "params": list(params)}, cache_key=cache_key
    )

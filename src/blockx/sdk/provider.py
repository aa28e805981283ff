"""The SDK seam: the :class:`Provider` protocol every SDK entry point talks to.

Inside the executor the provider is ``blockx.executor.sdk_bridge_provider.
SdkBridgeProvider``: each method suspends the calling greenlet, the worker does
the work, and the method returns its result (or raises a ``RemoteCallError``).
Tests and other hosts may install their own provider with
:func:`blockx.sdk.runtime.set_provider`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Provider"]


@runtime_checkable
class Provider(Protocol):
    """Where SDK calls go. Signatures are the seed's, verbatim.

    ``params`` may also be raw ``bytes`` (a protobuf, a JSON-RPC body): the
    executor then sends them as the frame's sidecar with ``params`` null, and a
    sidecar in the answer comes back as ``result["data"]``.
    """

    def read_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str | None = None,
    ) -> Any: ...

    def write_req(self, backend: str, operation: str, params: Mapping[str, Any]) -> Any: ...

    def capability_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str = "",
    ) -> Any: ...

    def subcall(self, function_id: str, args: Any) -> Any: ...

    def sleep(self, seconds: float) -> None: ...

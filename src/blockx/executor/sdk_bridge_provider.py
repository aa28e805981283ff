"""SdkBridgeProvider: the :class:`blockx.sdk.Provider` installed for every call.

The runtime builds one per process and installs it (``blockx.sdk.runtime.
set_provider``) in the ``contextvars.Context`` each call runs in, so
``blockx.sdk.get_provider()`` returns it inside a call and raises outside.
Each method forwards to the :class:`~blockx.executor.sdk_bridge.SdkBridge`,
which finds the running call itself (:func:`~blockx.executor.context.current_context`);
IO goes straight to ``SdkBridge.io_wait``, the body of its ``do_*_req`` methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blockx.wire.keys import IO_CAPABILITY, IO_READ, IO_WRITE

from .sdk_bridge import SdkBridge

__all__ = ["SdkBridgeProvider"]


class SdkBridgeProvider:
    """Forwards the seed's five provider methods to an :class:`SdkBridge`."""

    __slots__ = ("_bridge",)

    def __init__(self, bridge: SdkBridge) -> None:
        self._bridge = bridge

    def __repr__(self) -> str:
        return f"SdkBridgeProvider({self._bridge!r})"

    def read_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str | None = None,
    ) -> Any:
        return self._bridge.io_wait(IO_READ, backend, operation, params, cache_key)

    def write_req(self, backend: str, operation: str, params: Mapping[str, Any]) -> Any:
        return self._bridge.io_wait(IO_WRITE, backend, operation, params, None)

    def capability_req(
        self,
        backend: str,
        operation: str,
        params: Mapping[str, Any],
        *,
        cache_key: str = "",
    ) -> Any:
        return self._bridge.io_wait(IO_CAPABILITY, backend, operation, params, cache_key or None)

    def subcall(self, function_id: str, args: Any) -> Any:
        return self._bridge.do_subcall(function_id, args)

    def sleep(self, seconds: float) -> None:
        self._bridge.do_sleep(seconds)

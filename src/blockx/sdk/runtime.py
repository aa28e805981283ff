"""The current call's :class:`~blockx.sdk.provider.Provider`, held in a ContextVar.

The executor sets it when a call starts running and resets it when the call
ends (every call runs in its own ``contextvars.Context``, so one call never sees
another's provider). Outside a call :func:`get_provider` raises
:class:`NoProviderError` with a message that says so.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

from .provider import Provider

__all__ = [
    "NoProviderError",
    "current_provider",
    "get_provider",
    "reset_provider",
    "set_provider",
]

_provider: ContextVar[Provider | None] = ContextVar("blockx_sdk_provider", default=None)


class NoProviderError(RuntimeError):
    """An SDK call made outside a BlockX call (no provider is installed here)."""


def get_provider() -> Provider:
    """The provider of the call running here; raises :class:`NoProviderError` outside a call."""
    provider = _provider.get()
    if provider is None:
        raise NoProviderError(
            "no BlockX provider: blockx.sdk calls (db, rpc, call_subfunc, sleep, "
            "function.call) only work inside a call run by the BlockX executor"
        )
    return provider


def current_provider() -> Provider | None:
    """The provider, or None outside a call (never raises)."""
    return _provider.get()


def set_provider(provider: Provider | None) -> Token[Provider | None]:
    """Install ``provider`` for the current context; keep the token for :func:`reset_provider`."""
    return _provider.set(provider)


def reset_provider(token: Token[Provider | None]) -> None:
    """Restore the provider that was current before the matching :func:`set_provider`."""
    _provider.reset(token)

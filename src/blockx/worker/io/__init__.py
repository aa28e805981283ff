"""The worker's IO subsystem: how ``CallWaiting(waitKind=io)`` is answered.

This package holds the interface (:mod:`blockx.worker.io.handler`); the real
backends (table store, node RPC, per-task read cache and singleflight) come
with the product issue and plug in behind :class:`IOHandler`.
"""

from .handler import BackendRouter, IOHandler, IOResult, IOReturn, io_error, no_io_handler

__all__ = ["BackendRouter", "IOHandler", "IOResult", "IOReturn", "io_error", "no_io_handler"]

"""The client of ``blockx serve``: submit tasks to a server, read their rows, wait, cancel.

Theory of operation
-------------------
:class:`Client` speaks the HTTP API of docs/serve.md with the standard library's
:mod:`http.client` over one keep-alive connection (a :class:`Client` is for one
thread at a time); :class:`AsyncClient` is its twin on aiohttp's ``ClientSession``.
Neither imports the worker or the server: a client machine needs only this module
(and :mod:`blockx.cli.taskfile` to read a task file, which checks it the way
``blockx validate`` does).

``submit(task)`` takes a task file's path or a dict in the task-file schema (sent
as is). A task file is read here: functions are sent by ``source``, inline calls
inline; a ``calls_file`` task is created with ``"calls_stream": true``, its lines
are POSTed in batches (:data:`BATCH_LINES` lines or :data:`BATCH_BYTES` bytes) and
the task is closed. A batch whose answer was lost (the connection dropped) is
not sent twice: the task's ``calls`` counter says whether the server has it.

Rows: ``GET /v1/tasks/{id}/rows?after=N`` streams the task's rows while it runs
and closes when it ends. A :class:`RowStream` counts the whole lines it has
handed out (``position``); when the connection drops, times out or the server
answers 5xx, it reopens at ``?after=position`` after a short backoff
(:class:`RowCursor`, no clock inside: pure bookkeeping) and gives up with a
:class:`ClientError` after :attr:`Client.reconnect_attempts` failures in a row (a
successful reopen resets the count). A stream that ends cleanly is complete only
when the task is finished and ``position`` reached its ``rows``; otherwise it is
reopened. So every row is handed out exactly once, in the server's order.

Errors are :class:`ClientError` (``status``, the RFC 9457 ``problem``); the
message carries the problem's title, detail and each ``problems`` entry. A 401
says how to give a token; a server that cannot be reached is a
:class:`ServerUnavailable` naming the URL and suggesting ``blockx serve``.

The package: :mod:`blockx.client.common` (errors, the reconnect bookkeeping, what
``submit`` sends), :mod:`blockx.client.sync` (:class:`Client`, :class:`RemoteTask`,
:class:`RowStream`), :mod:`blockx.client.aio` (:class:`AsyncClient`,
:class:`AsyncRemoteTask`, :class:`AsyncRowStream`; loaded, with asyncio, on first use,
aiohttp when it connects).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blockx.client.common import (
    DEFAULT_SERVER,
    ClientError,
    RowCursor,
    ServerUnavailable,
    TaskUpload,
    prepare_upload,
)
from blockx.client.sync import Client, RemoteTask, RowStream

if TYPE_CHECKING:
    from blockx.client.aio import AsyncClient, AsyncRemoteTask, AsyncRowStream

#: The async twin is loaded on first use: the sync client and the CLI need no asyncio.
_ASYNC = frozenset({"AsyncClient", "AsyncRemoteTask", "AsyncRowStream"})

__all__ = [
    "DEFAULT_SERVER",
    "AsyncClient",
    "AsyncRemoteTask",
    "AsyncRowStream",
    "Client",
    "ClientError",
    "RemoteTask",
    "RowCursor",
    "RowStream",
    "ServerUnavailable",
    "TaskUpload",
    "prepare_upload",
]


def __getattr__(name: str) -> Any:
    if name in _ASYNC:
        from blockx.client import aio

        return getattr(aio, name)
    raise AttributeError(f"module 'blockx.client' has no attribute {name!r}")

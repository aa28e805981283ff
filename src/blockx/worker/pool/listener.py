"""The worker's listening socket: a private directory holding only ``worker.sock``.

The executor adapter (``blockx/worker/link/adapter.py``) listens there; executors get
the path as ``--socket-path`` and connect. :func:`bound_listener` binds and listens
before any event loop exists, so that ``blockx run`` can start its executors first
(:mod:`blockx.worker.pool.early`): a connection that arrives before the adapter
serves the socket waits in the kernel's backlog, not in a retry loop.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Final

__all__ = ["MAX_SOCKET_PATH_BYTES", "SOCKET_NAME", "bound_listener", "listen_backlog", "socket_dir"]

#: The socket's name in its private directory.
SOCKET_NAME: Final = "worker.sock"
#: What a Unix socket's ``sun_path`` holds on Linux.
MAX_SOCKET_PATH_BYTES: Final = 107


def listen_backlog(max_unattached: int) -> int:
    """The listen backlog for ``max_unattached`` connections not yet attached. It also caps
    how many connections asyncio accepts in one loop iteration: a flood holds at most
    about ``max_unattached + 2 x backlog`` of the worker's descriptors at once."""
    return max(16, 2 * max_unattached)


def socket_dir(parent: str | None) -> tuple[str, str]:
    """A new private directory under ``parent`` (None: the system's temporary directory)
    and the socket path in it. Raises :class:`ValueError` (the directory removed) when
    the path would not fit ``sun_path``."""
    directory = tempfile.mkdtemp(prefix="blockx-worker-", dir=parent)
    path = os.path.join(directory, SOCKET_NAME)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        shutil.rmtree(directory, ignore_errors=True)
        raise ValueError(
            f"socket path {path!r} is longer than the {MAX_SOCKET_PATH_BYTES} bytes a Unix "
            "socket allows; choose a shorter socket directory"
        )
    return directory, path


def bound_listener(parent: str | None, backlog: int) -> tuple[socket.socket, str, str]:
    """``(listening socket, its directory, its path)``: bound, listening, non-blocking."""
    directory, path = socket_dir(parent)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return sock, directory, path

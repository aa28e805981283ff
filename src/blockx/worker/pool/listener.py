"""The worker's listening socket: a private directory holding only ``worker.sock``.

The executor adapter (``blockx/worker/link/adapter.py``) listens there; executors get
the path as ``--socket-path`` and connect. :func:`bound_listener` binds and listens
before any event loop exists, so that ``blockx run`` can start its executors first
(:mod:`blockx.worker.pool.early`): a connection that arrives before the adapter
serves the socket waits in the kernel's backlog, not in a retry loop.

**Directories of dead workers.** A worker removes its directory when it stops; one
killed with SIGKILL (or by the OOM killer) cannot. So every directory holds an
``owner`` file naming the worker that made it (``<pid> <start time> <pid namespace>``,
written right after ``mkdtemp``), and :func:`sweep_dead_socket_dirs` -- run at every
pool start (:func:`sweep_beside`), beside ``process_tree.kill_orphans`` -- removes
the ``blockx-worker-*`` directories in the same parent whose owner no longer runs: same
user, same PID namespace (a worker in another container sharing the directory is never
judged by pids it cannot see), and that pid running with another start time or not at
all. A directory without a readable ``owner`` (a worker between ``mkdtemp`` and its
write, or one of an older version), or whose worker could not read its own start time
(it wrote 0), is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from typing import Final

from blockx.worker.pool.process_tree import process_start_time

__all__ = [
    "DIR_PREFIX",
    "MAX_SOCKET_PATH_BYTES",
    "OWNER_NAME",
    "SOCKET_NAME",
    "bound_listener",
    "listen_backlog",
    "socket_dir",
    "sweep_beside",
    "sweep_dead_socket_dirs",
]

_log = logging.getLogger("blockx.worker.pool")

#: The socket's name in its private directory.
SOCKET_NAME: Final = "worker.sock"
#: The private directory's name starts so (``tempfile.mkdtemp``'s prefix).
DIR_PREFIX: Final = "blockx-worker-"
#: The file naming the worker that made the directory (the module docstring).
OWNER_NAME: Final = "owner"
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
    directory = tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent)
    path = os.path.join(directory, SOCKET_NAME)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        shutil.rmtree(directory, ignore_errors=True)
        raise ValueError(
            f"socket path {path!r} is longer than the {MAX_SOCKET_PATH_BYTES} bytes a Unix "
            "socket allows; choose a shorter socket directory"
        )
    try:
        with open(os.path.join(directory, OWNER_NAME), "w", encoding="ascii") as f:
            f.write(_owner_line())
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory, path


def _pid_namespace() -> str:
    """This process's PID namespace (``pid:[4026531836]``), or ``-`` where none is named."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def _owner_line() -> str:
    pid = os.getpid()
    return f"{pid} {process_start_time(pid) or 0} {_pid_namespace()}\n"


def _owner_is_dead(directory: str, namespace: str) -> bool:
    """True when ``directory``'s ``owner`` names a worker of this PID namespace that no
    longer runs; False when it runs, or the file is missing, unreadable or malformed."""
    try:
        with open(os.path.join(directory, OWNER_NAME), encoding="ascii") as f:
            fields = f.read(256).split()
    except (OSError, UnicodeDecodeError):
        return False
    if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
        return False
    if fields[1] == "0":  # its worker could not read its own start time: never judged
        return False
    if fields[2] != namespace or namespace == "-":
        return False
    pid = int(fields[0])
    if pid == os.getpid():
        return False
    return process_start_time(pid) != int(fields[1])


def sweep_dead_socket_dirs(parent: str | None) -> list[str]:
    """Remove the socket directories under ``parent`` (None: the system's temporary
    directory) whose worker no longer runs (the module docstring); the removed paths.
    Blocking (directory scans): run it off the event loop. Never raises."""
    root = tempfile.gettempdir() if parent is None else parent
    namespace = _pid_namespace()
    removed: list[str] = []
    uid = os.getuid()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(DIR_PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if _owner_is_dead(entry.path, namespace):
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(entry.path)
    if removed:
        _log.info("removed %d socket directories of dead workers under %s", len(removed), root)
    return removed


def sweep_beside(socket_path: str) -> list[str]:
    """:func:`sweep_dead_socket_dirs` over the parent of ``socket_path``'s directory,
    when that directory is one :func:`socket_dir` made (else nothing)."""
    directory = os.path.dirname(os.path.abspath(socket_path))
    if not os.path.basename(directory).startswith(DIR_PREFIX):
        return []
    return sweep_dead_socket_dirs(os.path.dirname(directory))


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

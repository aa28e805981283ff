"""Executors started before their worker: ``blockx run`` spawns them first thing.

Theory of operation
-------------------
A ``blockx run`` process spends ~0.1-0.2 s importing the worker before it can start
an executor, and each executor then takes ~0.06-0.09 s to boot and connect. Started
as soon as the worker's configuration is known (the config file, the environment,
``--set``, ``--executors``: no task file needed), the executors boot while the rest
of the worker is imported and the task file is read.

:class:`EarlyExecutors` binds the worker's listening socket in its private directory
(:func:`~blockx.worker.pool.listener.bound_listener`: an executor that connects
before the worker serves it waits in the listen backlog) and starts the pool's spawns
(:meth:`PoolManager.spawn_early`). ``Worker(config, early=...)`` then serves that
socket and adopts that pool (:meth:`take`) in place of its own: the same processes,
launch specs, slots and exits as had it spawned them. What no worker adopted is
killed and reaped by :meth:`discard` (input found bad, Ctrl-C, a worker that failed
to start), and its socket directory removed.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from blockx.worker.pool.listener import bound_listener, listen_backlog
from blockx.worker.pool.manager import PoolManager

if TYPE_CHECKING:
    import socket

    from blockx.worker.config import WorkerConfig
    from blockx.worker.pool.spawner import ExecutorSpawner

__all__ = ["EarlyExecutors"]


class EarlyExecutors:
    """A listening socket and a pool whose executors are already starting (see above)."""

    def __init__(self, config: WorkerConfig, *, spawner: ExecutorSpawner | None = None) -> None:
        adapter = config.adapter
        self.listener: socket.socket
        self.listener, self.socket_dir, self.socket_path = bound_listener(
            adapter.socket_dir, listen_backlog(adapter.max_unattached_connections)
        )
        #: The configuration the pool was built for (a worker adopts it only for that one).
        self.config = config
        self._taken = False
        pool: PoolManager | None = None
        try:
            pool = PoolManager.from_config(config, self.socket_path, spawner=spawner)
            pool.spawn_early()
        except BaseException:  # a Ctrl-C between two spawns: the first one is killed too
            if pool is not None:
                pool.discard_early()
            self.remove_socket()
            raise
        self.pool = pool

    def __repr__(self) -> str:
        state = "taken" if self._taken else "waiting"
        return f"EarlyExecutors({self.socket_path!r}, {state}, {self.pool!r})"

    @property
    def pids(self) -> list[int]:
        """The executors' pids, once spawned (a spawn that failed has none: the pool
        restarts it). Waits for spawns still in flight."""
        return self.pool.early_pids()

    @property
    def taken(self) -> bool:
        return self._taken

    def take(self) -> PoolManager:
        """The pool, for the worker that serves :attr:`listener` (once)."""
        if self._taken:
            raise RuntimeError("these executors were taken or discarded already")
        self._taken = True
        return self.pool

    def discard(self) -> None:
        """Kill and reap the executors and remove the socket directory, unless a worker
        took them (it owns them then). Idempotent."""
        if self._taken:
            return
        self._taken = True
        try:
            self.pool.discard_early()
        finally:
            self.remove_socket()

    def remove_socket(self) -> None:
        """Close the listener and remove its directory (a worker that took them does, as
        it closes: its adapter may never have served them). Idempotent."""
        self.listener.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

"""What each of a pool's spawns is started with (``PoolManager``'s part that builds it).

Theory of operation
-------------------
A :class:`LaunchPlan` holds what every executor of one pool shares -- the worker's
socket, the executors' flags (:class:`blockx.wire.launch.ExecutorArgs`), the
interpreter, the black box directory and the pool's mark prefix
(:mod:`.process_tree`) -- and makes one :class:`~.launch.ExecutorLaunchSpec` per spawn
(:meth:`LaunchPlan.spec`): the slot's executor id, a freshly zeroed black box file
(``<dir>/<executor id>.blackbox``: the pool reads it once the process is reaped) and
the slot generation's run mark.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from blockx.wire.blackbox import BLACKBOX_SIZE
from blockx.wire.launch import ExecutorArgs
from blockx.worker.pool import process_tree
from blockx.worker.pool.launch import ExecutorLaunchSpec

__all__ = ["LaunchPlan"]

_log = logging.getLogger("blockx.worker.pool")


class LaunchPlan:
    """The launch specs of one pool's spawns (see the module docstring)."""

    def __init__(
        self,
        socket_path: str,
        *,
        flags: dict[str, Any],
        python: str | None,
        blackbox_dir: str,
        mark_prefix: str | None,
    ) -> None:
        self.socket_path = socket_path
        #: The executors' flags every spawn shares (ExecutorArgs fields).
        self.flags = flags
        self.python = python
        self.blackbox_dir = blackbox_dir
        self.mark_prefix = mark_prefix

    def __repr__(self) -> str:
        return f"LaunchPlan({self.socket_path!r}, mark_prefix={self.mark_prefix!r})"

    def spec(self, executor_id: str, generation: int) -> tuple[ExecutorLaunchSpec, str | None]:
        """The spec of the slot's ``generation``-th process and its black box (None: the
        directory is not writable; the process runs without one)."""
        blackbox = self.reset_blackbox(executor_id)
        args = ExecutorArgs(
            executor_id=executor_id,
            socket_path=self.socket_path,
            blackbox_path=blackbox,
            **self.flags,
        )
        run_mark = None
        if self.mark_prefix is not None:
            run_mark = process_tree.mark_of(self.mark_prefix, executor_id, generation)
        if self.python is not None:
            return ExecutorLaunchSpec(args=args, python=self.python, run_mark=run_mark), blackbox
        return ExecutorLaunchSpec(args=args, run_mark=run_mark), blackbox

    def reset_blackbox(self, executor_id: str) -> str | None:
        """A zeroed black box for the next process (None: the directory is not writable)."""
        path = os.path.join(self.blackbox_dir, f"{executor_id}.blackbox")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, bytes(BLACKBOX_SIZE))
            finally:
                os.close(fd)
        except OSError as exc:
            _log.warning("no black box for %s: %s", executor_id, exc)
            return None
        return path

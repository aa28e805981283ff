"""Spawners: how the pool starts one executor process (seed: ``adapters/executor/spawner.go``).

Theory of operation
-------------------
:class:`ExecutorSpawner` is the seam between the pool's slot state machine and
the way a process comes to life. :class:`ProcessSpawner` is the ``process``
spawn mode: a bare ``python -m blockx.executor`` with the seed's flags,
inheriting the worker's environment. The ``sandbox`` mode is
:class:`~blockx.worker.pool.sandbox.SandboxSpawner` (bubblewrap, a
whitelisted environment, cgroup/rlimit limits); :func:`spawner_for_mode`
picks one by ``EXECUTOR_SPAWN_MODE`` (it imports the sandbox module only
when asked for it; the sandbox imports nothing from here). What a spawn
starts — interpreter, flags, run mark — is an
:class:`~blockx.worker.pool.launch.ExecutorLaunchSpec` (re-exported here).

A spawner may also have ``exit_note(executor_id) -> str | None`` (why the
slot's last process died, when it knows: the pool adds it to its log line)
and ``close()`` (the pool calls it once, on its spawner thread, after every
process is reaped: the sandbox removes its cgroups there).

Every process is started so that it cannot outlive the worker:

* **its own session** (``start_new_session``): the pool signals the whole
  process group, so anything the executor started dies with it, and a
  Ctrl-C in the worker's terminal reaches the worker only (which then shuts
  the pool down in order);
* **parent-death signal** (``PR_SET_PDEATHSIG`` = SIGKILL): if the worker dies
  without cleaning up — even by SIGKILL — the kernel kills the executor. Set
  by exec'ing through util-linux ``setpriv --pdeathsig KILL`` when available;
  otherwise by a ``preexec_fn`` calling ``prctl`` through ctypes (both
  found by :mod:`.launch`, which the sandbox uses too). ``setpriv``
  keeps ``subprocess``'s fast vfork path: measured 0.45 ms per spawn against
  7 ms for fork + ``preexec_fn`` in a worker with 200 MB resident.
  The signal fires when the *thread* that spawned the process ends, so spawn
  from a thread that outlives the process (the pool's spawner thread), never
  from a short-lived one.

And the executor exits by itself when its socket closes (docs/protocol.md,
"Disconnects"), which covers a worker that dies before the signal is armed.

``spawn`` is synchronous and returns as soon as the child has exec'd
(``subprocess.Popen``); the interpreter's start-up then runs in parallel with
everything else. It is thread-safe: the pool calls it on its spawner thread.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from blockx.worker.errors import PoolError, SpawnError
from blockx.worker.pool import launch
from blockx.worker.pool.fork_server import ForkServer, ForkServerError, take_early
from blockx.worker.pool.launch import ExecutorLaunchSpec, ExecutorProcess, executor_command
from blockx.worker.pool.process_tree import MARK_ENV

if TYPE_CHECKING:
    from blockx.worker.config import PoolConfig

__all__ = [
    "ExecutorLaunchSpec",
    "ExecutorProcess",
    "ExecutorSpawner",
    "ProcessSpawner",
    "executor_command",
    "spawner_for_mode",
]

_log = logging.getLogger("blockx.worker.pool")


class ExecutorSpawner(Protocol):
    """Starts executor processes for the pool."""

    #: The spawn mode this spawner implements (``process``, ``sandbox``).
    mode: str

    def spawn(self, spec: ExecutorLaunchSpec) -> ExecutorProcess:
        """Start one executor; return once it has exec'd (or been forked).

        The process must lead its own process group (the pool signals the
        group), have stdin closed and stdout/stderr as pipes (the pool forwards
        them to the worker's log). Raises :class:`SpawnError`.
        """
        ...


class ProcessSpawner:
    """The ``process`` spawn mode: a bare ``python -m blockx.executor``.

    ``argv_factory`` replaces the command (tests start a process that crashes
    or sleeps); ``env`` replaces the inherited environment (default: the
    worker's own, as the seed does for bare processes); ``extra_env`` is added
    on top. ``pdeathsig=False`` skips the parent-death signal.

    ``fork_server=True`` forks the executors from a warm server
    (:mod:`.fork_server`) when the spawn is the default one: no ``argv_factory``,
    ``env``, ``extra_env`` or ``cwd``, the parent-death signal on, the server's
    interpreter. Other spawns, and every spawn once the server failed, start cold.
    """

    mode = "process"

    def __init__(
        self,
        *,
        argv_factory: Callable[[ExecutorLaunchSpec], Sequence[str]] | None = None,
        env: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        pdeathsig: bool = True,
        fork_server: bool = False,
    ) -> None:
        self._argv_factory = argv_factory
        self._env = None if env is None else dict(env)
        self._extra_env = dict(extra_env or {})
        self._cwd = cwd
        self._pdeathsig = pdeathsig and sys.platform.startswith("linux")
        default = argv_factory is None and env is None and not extra_env and cwd is None
        self._forks = fork_server and default and self._pdeathsig
        #: The fork server (started at the first spawn, or blockx run's, taken now).
        self._server: ForkServer | None = take_early() if self._forks else None

    def __repr__(self) -> str:
        how = (
            "setpriv"
            if self._pdeathsig and launch.setpriv_path()
            else ("prctl" if self._pdeathsig else "none")
        )
        server = "" if not self._forks else f", {self._server or 'fork server'}"
        return (
            f"ProcessSpawner(pdeathsig={how}, custom_argv={self._argv_factory is not None}{server})"
        )

    @property
    def fork_server(self) -> ForkServer | None:
        """The fork server its spawns use (None: none yet, or they start cold)."""
        return self._server if self._forks else None

    def command(self, spec: ExecutorLaunchSpec) -> list[str]:
        """The executor's argv (without the parent-death wrapper)."""
        if self._argv_factory is not None:
            return list(self._argv_factory(spec))
        return executor_command(spec)

    def environment(self, spec: ExecutorLaunchSpec) -> dict[str, str]:
        env = dict(os.environ if self._env is None else self._env)
        env.update(self._extra_env)
        if spec.run_mark is not None:
            env[MARK_ENV] = spec.run_mark
        return env

    def spawn(self, spec: ExecutorLaunchSpec) -> ExecutorProcess:
        return self.begin(spec)()

    def begin(self, spec: ExecutorLaunchSpec) -> Callable[[], ExecutorProcess]:
        """Start the spawn of ``spec`` now; the function returned finishes it (once, on
        any thread that outlives the process). Forked, the request is sent to the server
        now and its answer awaited by the function (``blockx run``'s main thread does
        not wait for a server still importing: ``PoolManager.spawn_early``); a refusal or
        a failed server then spawns it cold there. Cold, it is spawned now."""
        if self._forks:
            if self._server is None:
                self._server = ForkServer()
            if spec.python == self._server.python:
                try:
                    finish = self._server.request(spec)
                except ForkServerError as exc:
                    self._fork_failed(spec, exc)
                else:
                    return functools.partial(self._finish_forked, spec, finish)
        process = self.spawn_cold(spec)
        return lambda: process

    def _finish_forked(
        self, spec: ExecutorLaunchSpec, finish: Callable[[], ExecutorProcess]
    ) -> ExecutorProcess:
        try:
            return finish()
        except ForkServerError as exc:
            self._fork_failed(spec, exc)
            return self.spawn_cold(spec)

    def _fork_failed(self, spec: ExecutorLaunchSpec, exc: ForkServerError) -> None:
        # A refusal (this spawn's flags do not fit) costs this spawn only; a broken
        # server, every spawn from now on.
        server = self._server
        self._forks = server is not None and server.broken is None
        _log.warning(
            "executor %s: the fork server failed (%s); %s",
            spec.executor_id,
            exc,
            "this one starts cold" if self._forks else "executors start cold now",
            extra={"executorId": spec.executor_id},
        )

    def spawn_cold(self, spec: ExecutorLaunchSpec) -> subprocess.Popen[bytes]:
        """``python -m blockx.executor`` started afresh (no fork server)."""
        argv = self.command(spec)
        if not argv:
            raise SpawnError(spec.executor_id, "empty command")
        # Checked here: behind setpriv a missing program would only show as exit 127.
        env = self.environment(spec)
        program = shutil.which(argv[0], path=env.get("PATH"))
        if program is None:
            raise SpawnError(spec.executor_id, f"{argv[0]}: no such executable")
        preexec: Callable[[], object] | None = None
        if self._pdeathsig:
            setpriv = launch.setpriv_path()
            if setpriv is not None:
                argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
            else:
                preexec = launch.pdeathsig_preexec()
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=self._cwd,
                close_fds=True,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise SpawnError(spec.executor_id, f"{argv[0]}: {exc}") from exc

    def close(self) -> None:
        """End the fork server, if one runs (the pool calls this once every executor is
        reaped)."""
        server, self._server = self._server, None
        self._forks = False
        if server is not None:
            server.close()


def spawner_for_mode(mode: str, pool_config: PoolConfig | None = None) -> ExecutorSpawner:
    """The spawner of ``EXECUTOR_SPAWN_MODE``; ``pool_config`` carries the sandbox's knobs.

    Raises :class:`PoolError` for an unknown mode, and for ``sandbox`` where
    bubblewrap or user namespaces are not available, or the forced limit
    mechanism is not (the reason is in the message).
    """
    if mode == "process":
        return ProcessSpawner(fork_server=pool_config is None or pool_config.fork_server)
    if mode == "sandbox":
        from blockx.worker.pool.sandbox import SandboxSettings, SandboxSpawner

        settings = (
            SandboxSettings() if pool_config is None else SandboxSettings.from_pool(pool_config)
        )
        spawner = SandboxSpawner(settings)
        spawner.prepare()
        return spawner
    raise PoolError(f"unknown executor spawn mode {mode!r}; expected process or sandbox")


def spawn_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that runs a pool's spawns: ``Popen`` waits (vfork) until the child
    has exec'd, and the children's parent-death signal is tied to the thread that
    spawned them (``blockx/worker/pool/manager.py``)."""
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="blockx-executor-spawner"
    )

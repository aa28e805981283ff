"""Spawners: how the pool starts one executor process (seed: ``adapters/executor/spawner.go``).

Theory of operation
-------------------
:class:`ExecutorSpawner` is the seam between the pool's slot state machine and
the way a process comes to life. :class:`ProcessSpawner` is the ``process``
spawn mode: a bare ``python -m blockx.executor`` with the seed's flags,
inheriting the worker's environment. The ``sandbox`` mode is
:class:`~blockx.worker.pool.sandbox.SandboxSpawner` (bubblewrap, a
whitelisted environment, cgroup/rlimit limits); :func:`spawner_for_mode`
picks one by ``EXECUTOR_SPAWN_MODE``.

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
  otherwise by a ``preexec_fn`` calling ``prctl`` through ctypes. ``setpriv``
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

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from blockx.worker.errors import PoolError, SpawnError
from blockx.worker.pool.process_tree import MARK_ENV

if TYPE_CHECKING:
    from blockx.worker.config import PoolConfig

__all__ = [
    "ExecutorLaunchSpec",
    "ExecutorSpawner",
    "ProcessSpawner",
    "executor_command",
    "executor_flags",
    "spawner_for_mode",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorLaunchSpec:
    """Everything one executor process is started with."""

    executor_id: str
    socket_path: str
    max_inflight: int = 128
    max_runnable: int = 128
    heartbeat_interval_s: float = 1.0
    python: str = field(default_factory=lambda: sys.executable)
    #: The executor's black box (blockx.wire.blackbox); None: none.
    blackbox_path: str | None = None
    #: The executor's memory limit, MB; 0 = none.
    memory_limit_mb: int = 0
    #: RLIMIT_NOFILE of the executor; 0 = inherited.
    max_open_files: int = 0
    #: The executor's mark (``process_tree.MARK_ENV``), inherited by whatever it
    #: starts, so the pool can find those processes after it died; None: unmarked.
    run_mark: str | None = None


def executor_flags(spec: ExecutorLaunchSpec) -> list[str]:
    """The seed's executor flags (``--executor-id ... --heartbeat-interval ...``) and ours."""
    extra: list[str] = []
    if spec.blackbox_path is not None:
        extra += ["--blackbox-path", spec.blackbox_path]
    if spec.memory_limit_mb:
        extra += ["--memory-limit-mb", str(spec.memory_limit_mb)]
    if spec.max_open_files:
        extra += ["--max-open-files", str(spec.max_open_files)]
    return [
        "--executor-id",
        spec.executor_id,
        "--socket-path",
        spec.socket_path,
        "--executor-max-inflight",
        str(spec.max_inflight),
        "--executor-max-runnable",
        str(spec.max_runnable),
        "--heartbeat-interval",
        repr(float(spec.heartbeat_interval_s)),
        *extra,
    ]


def executor_command(spec: ExecutorLaunchSpec) -> list[str]:
    """``python -m blockx.executor`` with the seed's flags."""
    return [spec.python, "-m", "blockx.executor", *executor_flags(spec)]


class ExecutorSpawner(Protocol):
    """Starts executor processes for the pool."""

    #: The spawn mode this spawner implements (``process``, ``sandbox``).
    mode: str

    def spawn(self, spec: ExecutorLaunchSpec) -> subprocess.Popen[bytes]:
        """Start one executor; return once it has exec'd.

        The process must lead its own process group (the pool signals the
        group), have stdin closed and stdout/stderr as pipes (the pool forwards
        them to the worker's log). Raises :class:`SpawnError`.
        """
        ...


_PR_SET_PDEATHSIG = 1


@functools.cache
def _setpriv_path() -> str | None:
    """util-linux ``setpriv`` if it knows ``--pdeathsig`` (util-linux >= 2.33)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        result = subprocess.run(
            [path, "--help"], capture_output=True, timeout=5, check=False, text=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "--pdeathsig" in result.stdout else None


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _set_pdeathsig_in_child() -> None:
    """``preexec_fn``: runs in the forked child before exec; only a pre-resolved ctypes call."""
    prctl = _PRCTL_IN_CHILD
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


# Resolved in the parent, so the child does no lookup (and takes no lock) before exec.
_PRCTL_IN_CHILD: Callable[..., int] | None = None


class ProcessSpawner:
    """The ``process`` spawn mode: a bare ``python -m blockx.executor``.

    ``argv_factory`` replaces the command (tests start a process that crashes
    or sleeps); ``env`` replaces the inherited environment (default: the
    worker's own, as the seed does for bare processes); ``extra_env`` is added
    on top. ``pdeathsig=False`` skips the parent-death signal.
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
    ) -> None:
        self._argv_factory = argv_factory
        self._env = None if env is None else dict(env)
        self._extra_env = dict(extra_env or {})
        self._cwd = cwd
        self._pdeathsig = pdeathsig and sys.platform.startswith("linux")

    def __repr__(self) -> str:
        how = (
            "setpriv"
            if self._pdeathsig and _setpriv_path()
            else ("prctl" if self._pdeathsig else "none")
        )
        return f"ProcessSpawner(pdeathsig={how}, custom_argv={self._argv_factory is not None})"

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

    def spawn(self, spec: ExecutorLaunchSpec) -> subprocess.Popen[bytes]:
        argv = self.command(spec)
        if not argv:
            raise SpawnError(spec.executor_id, "empty command")
        # Checked here: behind setpriv a missing program would only show as exit 127.
        env = self.environment(spec)
        program = shutil.which(argv[0], path=env.get("PATH"))
        if program is None:
            raise SpawnError(spec.executor_id, f"{argv[0]}: no such executable")
        preexec: Callable[[], None] | None = None
        if self._pdeathsig:
            setpriv = _setpriv_path()
            if setpriv is not None:
                argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
            else:
                global _PRCTL_IN_CHILD
                _PRCTL_IN_CHILD = _prctl()
                if _PRCTL_IN_CHILD is not None:
                    preexec = _set_pdeathsig_in_child
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


def spawner_for_mode(mode: str, pool_config: PoolConfig | None = None) -> ExecutorSpawner:
    """The spawner of ``EXECUTOR_SPAWN_MODE``; ``pool_config`` carries the sandbox's knobs.

    Raises :class:`PoolError` for an unknown mode, and for ``sandbox`` where
    bubblewrap or user namespaces are not available, or the forced limit
    mechanism is not (the reason is in the message).
    """
    if mode == "process":
        return ProcessSpawner()
    if mode == "sandbox":
        from blockx.worker.pool.sandbox import SandboxSettings, SandboxSpawner

        settings = (
            SandboxSettings() if pool_config is None else SandboxSettings.from_pool(pool_config)
        )
        spawner = SandboxSpawner(settings)
        spawner.prepare()
        return spawner
    raise PoolError(f"unknown executor spawn mode {mode!r}; expected process or sandbox")

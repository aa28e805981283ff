"""What one executor process is started with, for every spawn mode.

Theory of operation
-------------------
:class:`ExecutorLaunchSpec` is one spawn: the interpreter, the executor's
command line (:class:`blockx.wire.launch.ExecutorArgs`, the one definition
both sides share) and the run mark (``process_tree.MARK_ENV``). Both spawners
build their argv from it — :mod:`.spawner` (``process`` mode) with
:func:`executor_command`, :mod:`.sandbox` with the same flags behind its own
interpreter bootstrap — and both arm the parent-death signal with the helpers
here. The spawners import this module and never each other's internals.

**Parent-death signal** (``PR_SET_PDEATHSIG`` = SIGKILL): if the worker dies
without cleaning up — even by SIGKILL — the kernel kills the executor.
:func:`setpriv_path` finds util-linux ``setpriv --pdeathsig`` (an exec
wrapper: keeps ``subprocess``'s fast vfork path); :func:`libc_prctl` is the
``prctl`` a ``preexec_fn`` calls instead (resolved in the parent, so the child
does no lookup and takes no lock between fork and exec); :func:`pdeathsig_preexec`
is that ``preexec_fn``. The signal fires when the *thread* that spawned the
process ends: spawn from a thread that outlives the process.
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:  # not imported to run: blockx run's fork server starts before blockx.wire
    from blockx.wire.launch import ExecutorArgs

__all__ = [
    "PR_SET_PDEATHSIG",
    "ExecutorLaunchSpec",
    "ExecutorProcess",
    "executor_command",
    "libc_prctl",
    "pdeathsig_preexec",
    "setpriv_path",
]

#: ``prctl`` option: the signal the process gets when its parent (thread) dies.
PR_SET_PDEATHSIG: Final = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorLaunchSpec:
    """Everything one executor process is started with."""

    #: The executor's command line (``--executor-id``, ``--socket-path``, ...).
    args: ExecutorArgs
    python: str = field(default_factory=lambda: sys.executable)
    #: The executor's mark (``process_tree.MARK_ENV``), inherited by whatever it
    #: starts, so the pool can find those processes after it died; None: unmarked.
    run_mark: str | None = None

    def __repr__(self) -> str:
        return f"ExecutorLaunchSpec({self.args.executor_id!r}, mark={self.run_mark!r})"

    @property
    def executor_id(self) -> str:
        return self.args.executor_id

    @property
    def socket_path(self) -> str:
        return self.args.socket_path

    @property
    def blackbox_path(self) -> str | None:
        """The executor's black box (blockx.wire.blackbox); None: none."""
        return self.args.blackbox_path


class ExecutorProcess(Protocol):
    """A started executor process, as the pool uses it: a ``subprocess.Popen``, or a
    process the fork server forked as this process's child
    (:class:`~blockx.worker.pool.fork_server.ForkedProcess`)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    @property
    def stderr(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None:
        """The exit status once it exited (reaping it), else None."""
        ...

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit and reap it; ``subprocess.TimeoutExpired`` past ``timeout``."""
        ...


def executor_command(spec: ExecutorLaunchSpec) -> list[str]:
    """``python -m blockx.executor`` with the spec's flags."""
    return [spec.python, "-m", "blockx.executor", *spec.args.to_argv()]


@functools.cache
def setpriv_path() -> str | None:
    """util-linux ``setpriv`` if it knows ``--pdeathsig`` (util-linux >= 2.33)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    if _names_option(path, b"pdeathsig"):
        return path
    try:
        result = subprocess.run(
            [path, "--help"], capture_output=True, timeout=5, check=False, text=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "--pdeathsig" in result.stdout else None


def _names_option(path: str, name: bytes) -> bool:
    """Whether the program file at ``path`` holds ``name`` (its long options' table
    does): found, the option is there, with no ``--help`` run -- a fork and an exec,
    ~1.6 ms before a ``blockx run``'s first spawn. Not found (a packed binary, a
    script), :func:`setpriv_path` asks ``--help``."""
    try:
        with open(path, "rb") as program:
            return name in program.read(_PROGRAM_READ_MAX)
    except OSError:
        return False


#: More than a ``setpriv`` binary's size (~50 KB); a bigger file is only read this far.
_PROGRAM_READ_MAX: Final = 4 * 1024 * 1024


@functools.cache
def libc_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` through ctypes (None: not Linux, or not found)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: only the fallback without a pdeathsig wrapper needs it

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def pdeathsig_preexec() -> Callable[[], object] | None:
    """A ``preexec_fn`` arming SIGKILL on parent death (None: no ``prctl`` here).

    Call it in the parent: the child then runs one pre-resolved ctypes call.
    """
    prctl = libc_prctl()
    if prctl is None:
        return None
    return functools.partial(prctl, PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

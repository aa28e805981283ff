"""The ``sandbox`` spawn mode: every executor in a bubblewrap sandbox, with limits.

Theory of operation
-------------------
(seed: ``sandboxSpawner`` + ``sandbox_config.go``; containerd there, bubblewrap
here: no container engine on our machines.) :class:`SandboxSpawner` starts
the same ``blockx.executor`` with the same flags as the ``process`` mode, but
inside ``bwrap``:

* **namespaces**: ``--unshare-all`` (network, pid, ipc, uts, cgroup, mount)
  and ``--unshare-user`` with ``--uid/--gid 65534`` and ``--disable-userns``
  (no nested user namespace), ``--cap-drop ALL``, ``--new-session``,
  ``--die-with-parent``. The network namespace has only a loopback interface
  of its own: no socket reaches the host or the outside.
* **file system**: an empty root, then read-only binds of ``/usr`` (and the
  ``/bin``, ``/lib*`` links or directories), ``/etc/ld.so.cache`` and
  ``/etc/localtime``, the
  interpreter's prefixes (``sys.prefix``, ``sys.base_prefix``, the
  interpreter's real location) and the directories the executor imports its
  packages from (``blockx``, ``greenlet``, ``orjson``, ``msgspec``; with an
  editable install that is the project's ``src``; never a home directory or a
  top-level directory such as ``/root`` whole); a private ``/proc`` and a
  private, read-only ``/dev`` (``null``, ``zero``, ``urandom``, ...); a private
  ``tmpfs`` on ``/tmp``, the only writable place; the worker's socket **directory**
  bound read-only at its own path (connecting to a socket needs no write
  access to the file system); ``--remount-ro /``. Nothing else of the host is
  there: not ``/etc``, ``/home``, ``/root``, the repository, other tasks'
  files. ``EXECUTOR_SANDBOX_RO_BINDS`` adds read-only paths.
* **environment**: ``--clearenv``, then only :data:`CHILD_ENV_KEYS` and the
  ``OTEL_*`` variables of the worker's environment (the seed's
  ``childEnvKeys``), plus ``PATH``, ``HOME=/tmp``, ``TMPDIR=/tmp`` and
  ``LANG``.
* **interpreter**: ``python -I`` (no ``PYTHON*`` variables, no user site, no
  current directory on ``sys.path``) with a one-line ``-c`` bootstrap that
  appends the package directories above to ``sys.path`` and runs
  ``blockx.executor`` as ``__main__`` (what ``-m`` does).
* **limits** (:mod:`.cgroups`): memory, CPU quota and pids per executor slot,
  by cgroup v2, else cgroup v1, else ``RLIMIT_AS`` for memory with a logged
  warning. The ``preexec_fn`` joins the slot's cgroups (and sets the rlimits,
  ``RLIMIT_CORE = 0`` and the parent-death signal) between ``fork`` and
  ``exec`` of ``bwrap``: nothing of the sandbox ever runs outside its limits.

No seccomp filter: the namespaces, the empty capability set and
``--disable-userns`` already close the usual kernel attack surface that a
filter would narrow further (see ``docs/security.md``).

The pool sees one process per executor: ``bwrap``. Killing its process group
(the wedge backstop, ``stop()``) kills ``bwrap``; the sandbox's init dies by
its parent-death signal and the kernel kills everything in the pid namespace
with it. ``SIGTERM`` on stop therefore ends the executor at once (no graceful
drain: the worker cancelled its tasks before stopping the pool).

:func:`sandbox_available` says whether this machine can run the mode (``bwrap``
present, user namespaces usable: a trivial ``bwrap ... true`` is tried once).
:func:`~blockx.worker.pool.spawner.spawner_for_mode` refuses ``sandbox``
with that reason where it cannot.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import resource
import shutil
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from blockx.worker.errors import PoolError, SpawnError
from blockx.worker.pool.cgroups import (
    LIMIT_MODES,
    CgroupError,
    LimitPlan,
    ResourceLimits,
    plan_limits,
)
from blockx.worker.pool.launch import PR_SET_PDEATHSIG, ExecutorLaunchSpec, libc_prctl

if TYPE_CHECKING:
    from blockx.worker.config import PoolConfig

__all__ = [
    "CHILD_ENV_KEYS",
    "CHILD_ENV_PREFIXES",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "SandboxSettings",
    "SandboxSpawner",
    "child_environment",
    "sandbox_available",
]

_log = logging.getLogger("blockx.worker.sandbox")

#: Worker environment variables the sandboxed executor gets (the seed's ``childEnvKeys``,
#: plus the executor's own knobs and trace-file settings).
CHILD_ENV_KEYS: Final = frozenset(
    {
        "BLOCKX_LOG_LEVEL",
        "BLOCKX_LOG_FORMAT",
        "BLOCKX_EXECUTOR_CODE_CACHE_MAX_ENTRIES",
        "BLOCKX_EXECUTOR_ABI_CACHE_TRIM_THRESHOLD",
        "BLOCKX_EXECUTOR_RELEASED_NAMESPACE_CACHE",
        "BLOCKX_EXECUTOR_LOCAL_READ_CACHE",
        "BLOCKX_EXECUTOR_LOCAL_READ_CACHE_BYTES",
        "BLOCKX_EXECUTOR_RUNTIME",
        "BLOCKX_OTEL_SPAN_FILE",
        "BLOCKX_OTEL_UDS_EVENTS",
        "LEAFAGE_ENDPOINT",
        "PROXY_SOCKET_PATH",
    }
)
#: Prefixes of the worker environment variables passed as well.
CHILD_ENV_PREFIXES: Final = ("OTEL_",)
#: The fixed part of the sandbox's environment.
_BASE_ENV: Final = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
}
#: ``nobody``: the sandbox's user and group.
SANDBOX_UID: Final = 65534
SANDBOX_GID: Final = 65534
#: Packages the executor imports from outside the standard library (the eth ones on a
#: function's first ``ChainState.call_function``: blockx.chain_abi); a package that is
#: not installed is left out.
_EXECUTOR_PACKAGES: Final = (
    "blockx",
    "greenlet",
    "orjson",
    "msgspec",
    "eth_abi",
    "eth_hash",
    "eth_utils",
    "eth_typing",
    "Crypto",
)
#: Top-level links or directories bound like ``/usr`` (merged-/usr systems link them).
_SYSTEM_DIRS: Final = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
_PROBE_TIMEOUT_S: Final = 15.0
_SIGKILL: Final = 9


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The sandbox's environment: the whitelisted variables of ``environ`` and the base."""
    env = {
        key: value
        for key, value in environ.items()
        if key in CHILD_ENV_KEYS or key.startswith(CHILD_ENV_PREFIXES)
    }
    env.update(_BASE_ENV)
    return env


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxSettings:
    """The sandbox's knobs (``pool.sandbox_*`` in :class:`~blockx.worker.config.PoolConfig`)."""

    #: Memory limit per executor, MiB; 0 = none.
    memory_mb: int = 1024
    #: CPU quota per executor, in CPUs; 0 = none.
    cpus: float = 1.0
    #: Processes + threads per executor; 0 = none.
    pids_max: int = 256
    #: ``auto``, ``cgroup2``, ``cgroup1`` or ``rlimit``.
    limits_mode: str = "auto"
    #: Extra read-only binds (absolute paths).
    ro_binds: tuple[str, ...] = ()
    #: The bubblewrap program.
    bwrap: str = "bwrap"

    def __post_init__(self) -> None:
        if self.memory_mb < 0 or self.cpus < 0 or self.pids_max < 0:
            raise ValueError("sandbox limits must be >= 0 (0 = none)")
        if self.limits_mode not in LIMIT_MODES:
            raise ValueError(f"limits_mode must be one of {LIMIT_MODES}, not {self.limits_mode!r}")
        for path in self.ro_binds:
            if not os.path.isabs(path):
                raise ValueError(f"sandbox read-only binds must be absolute paths, not {path!r}")

    @classmethod
    def from_pool(cls, pool: PoolConfig) -> SandboxSettings:
        binds = tuple(p for p in (pool.sandbox_ro_binds or "").split(":") if p.strip())
        try:
            return cls(
                memory_mb=pool.sandbox_memory_mb,
                cpus=pool.sandbox_cpus,
                pids_max=pool.sandbox_pids_max,
                limits_mode=pool.sandbox_limits,
                ro_binds=tuple(os.path.normpath(p.strip()) for p in binds),
            )
        except ValueError as exc:
            raise PoolError(f"EXECUTOR_SANDBOX_*: {exc}") from None

    def limits(self) -> ResourceLimits:
        return ResourceLimits(
            memory_bytes=self.memory_mb * 2**20, cpus=self.cpus, pids_max=self.pids_max
        )


# --- detection -------------------------------------------------------------------------------


def _system_binds() -> list[str]:
    """``/usr`` and the top-level system links/directories, as bwrap options."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/localtime"):  # the loader; local time as outside
        args += ["--ro-bind-try", path, path]
    return args


def _namespace_args(disable_userns: bool) -> list[str]:
    args = ["--unshare-all", "--unshare-user"]
    if disable_userns:
        args.append("--disable-userns")
    args += [
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--hostname",
        "blockx-sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    return args


@dataclass(frozen=True, slots=True)
class _Probe:
    ok: bool
    reason: str
    bwrap: str | None = None
    disable_userns: bool = True


@functools.cache
def _probe(bwrap: str) -> _Probe:
    if not sys.platform.startswith("linux"):
        return _Probe(False, f"the sandbox needs Linux (this is {sys.platform})")
    path = shutil.which(bwrap)
    if path is None:
        return _Probe(
            False,
            f"bubblewrap ({bwrap!r}) is not installed; install it (apt-get install bubblewrap, "
            "or `make system-deps` as root)",
        )
    true = shutil.which("true", path="/usr/bin:/bin") or "/usr/bin/true"
    last = ""
    for disable_userns in (True, False):
        argv = [
            path,
            *_namespace_args(disable_userns),
            *_system_binds(),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--remount-ro",
            "/",
            "--",
            true,
        ]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_PROBE_TIMEOUT_S,
                check=False,
                close_fds=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return _Probe(False, f"{path} could not run: {exc}")
        if done.returncode == 0:
            if not disable_userns:
                _log.warning(
                    "%s does not support --disable-userns (bubblewrap < 0.8): sandboxed code "
                    "may create nested user namespaces",
                    path,
                )
            return _Probe(True, f"{path} works", path, disable_userns)
        last = done.stderr.decode("utf-8", "replace").strip()
        if "disable-userns" not in last:
            break
    return _Probe(
        False,
        f"{path} cannot create its namespaces here (user namespaces disabled or restricted?): "
        f"{last or 'exit status non-zero'}",
    )


def sandbox_available(bwrap: str = "bwrap") -> tuple[bool, str]:
    """``(True, how)`` when the sandbox mode can run here, else ``(False, why not)``.

    Tries a trivial ``bwrap ... true`` with the sandbox's namespace options
    once per process (cached).
    """
    probe = _probe(bwrap)
    return probe.ok, probe.reason


# --- what the sandbox sees -------------------------------------------------------------------


def _package_root(name: str) -> str | None:
    """The ``sys.path`` directory that ``import name`` loads from (None: built-in or absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        location = next(iter(spec.submodule_search_locations))
        return os.path.dirname(os.path.abspath(location))
    if spec.origin and os.path.isabs(spec.origin):
        return os.path.dirname(spec.origin)
    return None


def _covered(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _minimal(paths: Sequence[str]) -> list[str]:
    """Existing absolute paths, without ``/`` and without paths inside another."""
    out: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths if p}, key=lambda p: (len(p), p)):
        if path == "/" or not os.path.isabs(path) or not os.path.exists(path):
            continue
        if not _covered(path, out):
            out.append(path)
    return sorted(out)


def python_import_roots(packages: Sequence[str] = _EXECUTOR_PACKAGES) -> list[str]:
    """The directories the executor's packages are imported from (appended to ``sys.path``)."""
    roots = []
    for name in packages:
        root = _package_root(name)
        if root is not None and root not in roots:
            roots.append(root)
    return roots


#: Never bound whole, even when an interpreter or a package seems to live right there:
#: a prefix that resolves to one of these is skipped (with a warning).
_NEVER_BIND: Final = frozenset({"/", "/root", "/home", "/etc", "/var", "/tmp", "/opt", "/srv"})


def python_read_roots(python: str, import_roots: Sequence[str]) -> list[str]:
    """Everything the interpreter and the executor's imports need, read-only.

    A candidate that is a home directory or a top-level system directory is
    left out: binding it would expose far more than the interpreter.
    """
    exe = os.path.abspath(python)
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(exe)),
        os.path.dirname(os.path.dirname(os.path.realpath(exe))),
        *import_roots,
    ]
    never = _NEVER_BIND | {os.path.expanduser("~")}
    kept = []
    for path in {os.path.normpath(p) for p in candidates if p}:
        if path in never or os.path.dirname(path) == "/home":
            _log.warning("sandbox: not binding %s (too broad); the executor may miss files", path)
        else:
            kept.append(path)
    return [p for p in _minimal(kept) if not _covered(p, ["/usr"])]


def _bootstrap(import_roots: Sequence[str]) -> str:
    """The ``-c`` program: extend ``sys.path`` (``-I`` ignores PYTHONPATH), run the executor."""
    return (
        "import sys;"
        f"sys.path.extend(p for p in {list(import_roots)!r} if p not in sys.path);"
        "import runpy;"
        "runpy.run_module('blockx.executor',run_name='__main__',alter_sys=True)"
    )


def _child_setup(
    cgroup_fds: tuple[int, ...],
    rlimit_as: int | None,
    prctl: Callable[..., int] | None,
) -> None:
    """``preexec_fn``: runs in the forked child before ``exec(bwrap)``; no locks, no lookups."""
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    for fd in cgroup_fds:
        os.write(fd, b"0")  # "this process" joins the cgroup
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if rlimit_as is not None:
        resource.setrlimit(resource.RLIMIT_AS, (rlimit_as, rlimit_as))


# --- the spawner -------------------------------------------------------------------------------


class SandboxSpawner:
    """The ``sandbox`` spawn mode (see the module docstring).

    ``environ`` replaces the worker environment the whitelist is applied to
    (default: ``os.environ`` at each spawn). :meth:`prepare` probes bubblewrap
    and sets the limits up; :func:`~blockx.worker.pool.spawner.spawner_for_mode`
    calls it at once, :meth:`spawn` otherwise does on first use.
    """

    mode = "sandbox"

    def __init__(
        self,
        settings: SandboxSettings | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings or SandboxSettings()
        self._environ = None if environ is None else dict(environ)
        self._lock = threading.Lock()
        self._probe: _Probe | None = None
        self._plan: LimitPlan | None = None
        self._import_roots: list[str] = []
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    def __repr__(self) -> str:
        plan = self._plan.describe() if self._plan is not None else "not prepared"
        return f"SandboxSpawner({self.settings.limits().describe()}; {plan})"

    @property
    def plan(self) -> LimitPlan | None:
        """How the limits are applied (after :meth:`prepare`)."""
        return self._plan

    def prepare(self) -> None:
        """Probe bubblewrap and set up the limits. Idempotent; raises :class:`PoolError`."""
        with self._lock:
            if self._closed:
                raise PoolError("the sandbox spawner is closed")
            if self._plan is not None:
                return
            probe = _probe(self.settings.bwrap)
            if not probe.ok:
                raise PoolError(f"EXECUTOR_SPAWN_MODE=sandbox is not available: {probe.reason}")
            limits = self.settings.limits()
            try:
                plan = plan_limits(limits, self.settings.limits_mode)
            except CgroupError as exc:
                raise PoolError(f"sandbox limits: {exc}") from None
            self._probe = probe
            self._plan = plan
            self._import_roots = python_import_roots()
            # A spawner dropped without close() (or a worker that exits without stopping
            # its pool) still removes its cgroups: when collected, or at interpreter exit.
            self._finalizer = weakref.finalize(self, plan.close)
        for note in plan.notes:
            _log.info("sandbox limits: %s", note)
        if plan.rlimit_as is not None or plan.unenforced:
            _log.warning("sandbox limits: no usable cgroup for all of them: %s", plan.describe())
        else:
            _log.info("sandbox: %s (%s)", limits.describe(), plan.describe())

    # --- what a spawn runs -------------------------------------------------------------------

    def environment(self, spec: ExecutorLaunchSpec) -> dict[str, str]:
        """The executor's environment inside the sandbox."""
        return child_environment(os.environ if self._environ is None else self._environ)

    def read_only_paths(self, spec: ExecutorLaunchSpec) -> list[str]:
        """The host paths bound read-only (besides ``/usr`` and the system links)."""
        roots = python_read_roots(spec.python, self._import_roots)
        extra = [p for p in self.settings.ro_binds if os.path.exists(p)]
        return _minimal([*roots, *extra])

    def command(self, spec: ExecutorLaunchSpec) -> list[str]:
        """The full ``bwrap ... -- python -I -c ... <executor flags>`` argv."""
        self.prepare()
        probe = self._probe
        assert probe is not None and probe.bwrap is not None
        argv = [probe.bwrap, *_namespace_args(probe.disable_userns), "--clearenv"]
        for key, value in sorted(self.environment(spec).items()):
            argv += ["--setenv", key, value]
        argv += _system_binds()
        argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev", "--tmpfs", "/tmp"]
        for path in self.read_only_paths(spec):
            argv += ["--ro-bind", path, path]
        socket_dir = os.path.dirname(os.path.abspath(spec.socket_path))
        argv += ["--ro-bind", socket_dir, socket_dir]
        if spec.blackbox_path is not None:
            # The executor's black box: the one file of the directory it may write.
            argv += ["--bind", spec.blackbox_path, spec.blackbox_path]
        argv += ["--chdir", "/tmp", "--remount-ro", "/", "--"]
        argv += [spec.python, "-I", "-c", _bootstrap(self._import_roots), *spec.args.to_argv()]
        return argv

    # --- spawning ------------------------------------------------------------------------------

    def spawn(self, spec: ExecutorLaunchSpec) -> subprocess.Popen[bytes]:
        try:
            argv = self.command(spec)
        except PoolError as exc:
            raise SpawnError(spec.executor_id, str(exc)) from None
        plan = self._plan
        assert plan is not None
        procs_files: list[str] = []
        if plan.cgroups is not None:
            try:
                procs_files = plan.cgroups.prepare(spec.executor_id)
            except CgroupError as exc:
                raise SpawnError(spec.executor_id, str(exc)) from None
        fds: list[int] = []
        try:
            for path in procs_files:
                fds.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
            preexec = functools.partial(_child_setup, tuple(fds), plan.rlimit_as, libc_prctl())
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={"PATH": _BASE_ENV["PATH"]},
                close_fds=True,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise SpawnError(spec.executor_id, f"bwrap: {exc}") from exc
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def exit_note(self, executor_id: str) -> str | None:
        """Why the slot's last process died, when the cgroup says (the OOM killer)."""
        plan = self._plan
        if plan is None or plan.cgroups is None:
            return None
        try:
            return plan.cgroups.exit_note(executor_id)
        except OSError:
            return None

    #: bubblewrap exits with 128 + N when the executor was killed by signal N (the pool
    #: reports it as the signal).
    signals_as_exit_status = True

    #: The pool's name for it: a note from here means the OOM killer ended the process
    #: (the lost era's cause is ``memory_exceeded``).
    oom_note = exit_note

    def close(self) -> None:
        """Kill what is left in the cgroups and remove them (the pool's stop). Idempotent."""
        with self._lock:
            self._closed = True
            finalizer = self._finalizer
        if finalizer is not None:
            finalizer()  # plan.close(), once

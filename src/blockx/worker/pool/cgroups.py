"""Resource limits of sandboxed executors: cgroup v2, cgroup v1, or rlimits.

Theory of operation
-------------------
The sandbox spawner (:mod:`.sandbox`) gives every executor slot a memory
limit, a CPU quota and a pids limit (:class:`ResourceLimits`, 0 = none).
:func:`plan_limits` decides once, when the spawner is prepared, how each limit
is enforced on this machine, best first:

1. **cgroup v2**, when the unified hierarchy offers the ``memory`` and ``cpu``
   controllers to a cgroup we may create: a base cgroup
   ``blockx-<pid>-<hex>`` under the worker's own cgroup (possible when ours
   may enable controllers for children: the namespace root or an empty
   delegated cgroup) or, else, beside it (when the parent hands the
   controllers down and is writable), with one leaf per executor slot:
   ``memory.max`` (+ ``memory.swap.max = 0``, ``memory.oom.group = 1``),
   ``cpu.max``, ``pids.max``;
2. **cgroup v1**, per controller hierarchy (``memory``, ``cpu``, ``pids``): a
   base cgroup under the worker's own path in that hierarchy and a leaf per
   slot: ``memory.limit_in_bytes`` (+ ``memory.memsw.limit_in_bytes``),
   ``cpu.cfs_period_us`` / ``cpu.cfs_quota_us``, ``pids.max``;
3. **rlimits**, for what no cgroup can hold: the memory limit becomes
   ``RLIMIT_AS`` (address space, a stricter measure than resident memory: an
   allocation beyond it raises ``MemoryError`` in the executor). CPU and pids
   have no per-process rlimit equivalent — ``RLIMIT_CPU`` is a lifetime total
   that would kill a resident executor after that many CPU seconds, and
   ``RLIMIT_NPROC`` counts every process of the (host) user — so they stay
   unlimited and a warning says so. The call budget and the wedge kill still
   bound a call's CPU time.

``EXECUTOR_SANDBOX_LIMITS`` forces a mechanism (``cgroup2``, ``cgroup1``,
``rlimit``); a forced cgroup version that cannot hold every requested limit
is a start-up error, never a silent downgrade.

**Joining before user code.** :meth:`ExecutorCgroups.prepare` creates (or
reuses) the slot's leaves, writes the limits and kills whatever a previous
process of the slot left in them; the spawner opens the leaves'
``cgroup.procs`` and its ``preexec_fn`` writes ``0`` ("this process") to each
between ``fork`` and ``exec``: bubblewrap, and everything it starts, is in
the cgroup from its first instruction.

**Clean-up.** :meth:`ExecutorCgroups.close` (the pool's stop; the spawner also
runs it when it is collected or at interpreter exit, whichever comes first)
kills what is left in the leaves and removes the leaves and the base. Nothing
else under the cgroup tree is touched. A worker killed outright leaves its
(empty) ``blockx-<pid>-<hex>`` cgroups behind.

Only the spawner thread uses these objects (``prepare`` / ``close``); the
event loop reads :meth:`ExecutorCgroups.exit_note` after an exit, which only
reads files.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "LIMIT_MODES",
    "CgroupError",
    "ExecutorCgroups",
    "LimitPlan",
    "ResourceLimits",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "plan_limits",
]

_log = logging.getLogger("blockx.worker.sandbox")

#: ``EXECUTOR_SANDBOX_LIMITS`` values.
LIMIT_MODES: Final = ("auto", "cgroup2", "cgroup1", "rlimit")
#: CFS period used for the CPU quota (the kernel's default).
CPU_PERIOD_US: Final = 100_000
#: The smallest CFS quota the kernel accepts.
_MIN_QUOTA_US: Final = 1000
#: How long :meth:`ExecutorCgroups.close` retries removing a cgroup whose processes are dying.
_RMDIR_WAIT_S: Final = 3.0


class CgroupError(Exception):
    """A cgroup could not be set up (or a forced mechanism is not available)."""


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """What one executor may use; 0 means no limit."""

    memory_bytes: int = 0
    cpus: float = 0.0
    pids_max: int = 0

    def wanted(self) -> tuple[str, ...]:
        """The controllers the non-zero limits need (``memory``, ``cpu``, ``pids``)."""
        out = []
        if self.memory_bytes > 0:
            out.append("memory")
        if self.cpus > 0:
            out.append("cpu")
        if self.pids_max > 0:
            out.append("pids")
        return tuple(out)

    def describe(self) -> str:
        memory = f"{self.memory_bytes / 2**20:.0f} MiB" if self.memory_bytes else "unlimited"
        cpus = f"{self.cpus:g}" if self.cpus else "unlimited"
        pids = str(self.pids_max) if self.pids_max else "unlimited"
        return f"memory {memory}, cpus {cpus}, pids {pids}"


# --- /proc parsing -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Mount:
    root: str
    mount_point: str
    fstype: str
    super_options: frozenset[str]


def _unescape(text: str) -> str:
    """Mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    if "\\" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        digits = text[i + 1 : i + 4]
        if text[i] == "\\" and len(digits) == 3 and digits.isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[_Mount]:
    """The cgroup and cgroup2 mounts of a ``/proc/<pid>/mountinfo`` text."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-")
        except ValueError:
            continue
        if len(fields) < sep + 4 or sep < 6:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            _Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fstype,
                super_options=frozenset(fields[sep + 3].split(",")),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """``(v2 path or None, {v1 controller: path})`` of a ``/proc/<pid>/cgroup`` text."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hid, controllers, path = parts
        if controllers == "":
            v2 = path
        else:
            for controller in controllers.split(","):
                v1[controller] = path
    return v2, v1


def _cgroup_dir(mount: _Mount, path: str) -> str:
    """The directory of cgroup ``path`` under ``mount`` (the mount may show a subtree)."""
    rel = path
    if mount.root not in ("", "/") and (path == mount.root or path.startswith(mount.root + "/")):
        rel = path[len(mount.root) :]
    return os.path.normpath(mount.mount_point + "/" + rel.lstrip("/"))


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode("ascii"))
    finally:
        os.close(fd)


def _procs(directory: str) -> list[int]:
    try:
        return [int(x) for x in _read(os.path.join(directory, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _kill_all(directory: str) -> int:
    """SIGKILL every process in a cgroup; how many there were."""
    pids = _procs(directory)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _rmdir_waiting(directory: str, deadline: float) -> bool:
    """Remove an (emptying) cgroup, killing and retrying until ``deadline``."""
    while True:
        try:
            os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                _log.warning("cannot remove cgroup %s: %s", directory, exc)
                return False
        _kill_all(directory)
        time.sleep(0.02)


# --- per-executor cgroups -------------------------------------------------------------------


@dataclass
class ExecutorCgroups:
    """One worker's cgroups: a base per hierarchy and a leaf per executor slot."""

    version: int
    #: The hierarchies used: ``{label: base directory}``; v2 has one (label ``unified``).
    bases: dict[str, str]
    #: Which limit lives in which hierarchy label.
    homes: dict[str, str]
    limits: ResourceLimits
    _oom_seen: dict[str, int] = field(default_factory=dict)
    _closed: bool = False

    def describe(self) -> str:
        where = ", ".join(f"{c} in {self.bases[h]}" for c, h in sorted(self.homes.items()))
        return f"cgroup v{self.version} ({where})"

    def leaves(self, executor_id: str) -> list[str]:
        return [os.path.join(base, executor_id) for base in self.bases.values()]

    def prepare(self, executor_id: str) -> list[str]:
        """Create (or reuse) the slot's leaves with their limits; empty them of any
        process a previous executor of the slot left; return their ``cgroup.procs``."""
        if self._closed:
            raise CgroupError("the executor cgroups were removed (pool stopped)")
        procs = []
        for label, base in self.bases.items():
            leaf = os.path.join(base, executor_id)
            try:
                os.mkdir(leaf)
            except FileExistsError:
                if _kill_all(leaf):
                    _log.info("killed processes a previous executor left in %s", leaf)
            except OSError as exc:
                raise CgroupError(f"cannot create cgroup {leaf}: {exc}") from exc
            self._write_limits(label, leaf)
            procs.append(os.path.join(leaf, "cgroup.procs"))
        self._oom_seen[executor_id] = self._oom_kills(executor_id)
        return procs

    def _write_limits(self, label: str, leaf: str) -> None:
        limits = self.limits
        try:
            for controller, home in self.homes.items():
                if home != label:
                    continue
                if controller == "memory":
                    self._write_memory(leaf, limits.memory_bytes)
                elif controller == "cpu":
                    quota = max(int(limits.cpus * CPU_PERIOD_US), _MIN_QUOTA_US)
                    if self.version == 2:
                        _write(os.path.join(leaf, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
                    else:
                        _write(os.path.join(leaf, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
                        _write(os.path.join(leaf, "cpu.cfs_quota_us"), str(quota))
                elif controller == "pids":
                    _write(os.path.join(leaf, "pids.max"), str(limits.pids_max))
        except OSError as exc:
            raise CgroupError(f"cannot write the limits of cgroup {leaf}: {exc}") from exc

    def _write_memory(self, leaf: str, memory: int) -> None:
        if self.version == 2:
            _write(os.path.join(leaf, "memory.max"), str(memory))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                path = os.path.join(leaf, name)
                if os.path.exists(path):
                    with contextlib.suppress(OSError):
                        _write(path, value)
            return
        _write(os.path.join(leaf, "memory.limit_in_bytes"), str(memory))
        memsw = os.path.join(leaf, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):  # swap accounting on: no swapping past the limit either
            with contextlib.suppress(OSError):
                _write(memsw, str(memory))

    def _memory_leaf(self, executor_id: str) -> str | None:
        home = self.homes.get("memory")
        return None if home is None else os.path.join(self.bases[home], executor_id)

    def _oom_kills(self, executor_id: str) -> int:
        leaf = self._memory_leaf(executor_id)
        if leaf is None:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = _read(os.path.join(leaf, name))
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def exit_note(self, executor_id: str) -> str | None:
        """Why the slot's last process died, when the cgroup knows: the OOM killer."""
        kills = self._oom_kills(executor_id)
        seen = self._oom_seen.get(executor_id, 0)
        if kills <= seen:
            return None
        self._oom_seen[executor_id] = kills
        mib = self.limits.memory_bytes / 2**20
        return f"the sandbox memory limit ({mib:.0f} MiB) was reached: killed by the OOM killer"

    def close(self) -> None:
        """Kill what is left in the leaves, remove leaves and bases. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + _RMDIR_WAIT_S
        for base in self.bases.values():
            try:
                names = [e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
            except FileNotFoundError:
                continue
            for name in names:
                leaf = os.path.join(base, name)
                _kill_all(leaf)
                _rmdir_waiting(leaf, deadline)
            _rmdir_waiting(base, deadline)


# --- planning --------------------------------------------------------------------------------


@dataclass
class LimitPlan:
    """How the limits are enforced here: cgroups for some (or all), ``RLIMIT_AS`` maybe."""

    limits: ResourceLimits
    mode: str
    cgroups: ExecutorCgroups | None = None
    #: ``RLIMIT_AS`` in bytes set in the child before exec (the memory fallback).
    rlimit_as: int | None = None
    #: Limits that nothing enforces.
    unenforced: tuple[str, ...] = ()
    #: Why a better mechanism was not used.
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.cgroups is not None:
            parts.append(self.cgroups.describe())
        if self.rlimit_as is not None:
            parts.append(f"memory as RLIMIT_AS={self.rlimit_as // 2**20} MiB")
        if self.unenforced:
            parts.append("NOT limited: " + ", ".join(self.unenforced))
        return "; ".join(parts) or "no limits requested"

    def close(self) -> None:
        if self.cgroups is not None:
            self.cgroups.close()


def _base_name() -> str:
    return f"blockx-{os.getpid()}-{secrets.token_hex(3)}"


def _controllers(directory: str) -> set[str]:
    try:
        return set(_read(os.path.join(directory, "cgroup.controllers")).split())
    except OSError:
        return set()


def _enable(directory: str, controllers: Iterable[str]) -> None:
    """Enable ``controllers`` for the children of ``directory`` (v2)."""
    have = set(_read(os.path.join(directory, "cgroup.subtree_control")).split())
    missing = [c for c in controllers if c not in have]
    if missing:
        _write(
            os.path.join(directory, "cgroup.subtree_control"),
            " ".join(f"+{c}" for c in missing),
        )


def _try_v2(
    mounts: list[_Mount], path: str | None, wanted: tuple[str, ...], limits: ResourceLimits
) -> tuple[ExecutorCgroups | None, str]:
    if path is None:
        return None, "no cgroup v2 membership"
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    if not v2:
        return None, "no cgroup v2 mount"
    own = top = None
    for mount in v2:
        candidate = _cgroup_dir(mount, path)
        if os.path.isdir(candidate):
            own, top = candidate, os.path.normpath(mount.mount_point)
            break
    if own is None or top is None:
        return None, f"own cgroup v2 directory for {path!r} not found"
    offered = _controllers(own)
    need = [c for c in wanted if c != "pids" or "pids" in offered]
    if not {"memory", "cpu"} <= offered:
        return None, f"cgroup v2 offers {sorted(offered) or 'no controllers'} (needs memory, cpu)"
    problems = []
    # Under our own cgroup (we may delegate to children), else beside it.
    parents = [own] if own == top else [own, os.path.dirname(own)]
    for parent in parents:
        base = os.path.join(parent, _base_name())
        try:
            if parent == own:
                _enable(own, need)
            os.mkdir(base)
        except OSError as exc:
            problems.append(f"{parent}: {exc.strerror or exc}")
            continue
        try:
            _enable(base, need)
        except OSError as exc:
            problems.append(f"{base}: {exc.strerror or exc}")
            with contextlib.suppress(OSError):
                os.rmdir(base)
            continue
        homes = {c: "unified" for c in need}
        return ExecutorCgroups(2, {"unified": base}, homes, limits), ""
    return None, "cgroup v2 not writable: " + "; ".join(problems)


def _try_v1(
    mounts: list[_Mount], paths: dict[str, str], wanted: tuple[str, ...], limits: ResourceLimits
) -> tuple[ExecutorCgroups | None, list[str], str]:
    """The v1 hierarchies of ``wanted`` that work: (cgroups, controllers held, problems)."""
    bases: dict[str, str] = {}
    homes: dict[str, str] = {}
    problems = []
    name = _base_name()
    for controller in wanted:
        path = paths.get(controller)
        if path is None:
            problems.append(f"{controller}: not in /proc/self/cgroup")
            continue
        hierarchy = [m for m in mounts if m.fstype == "cgroup" and controller in m.super_options]
        base = None
        for mount in hierarchy:
            label = ",".join(sorted(mount.super_options & {"memory", "cpu", "pids", "cpuacct"}))
            if label in bases:  # a co-mounted hierarchy (cpu,cpuacct) already has our base
                base = bases[label]
                homes[controller] = label
                break
            own = _cgroup_dir(mount, path)
            if not os.path.isdir(own):
                continue
            candidate = os.path.join(own, name)
            try:
                os.mkdir(candidate)
            except OSError as exc:
                problems.append(f"{controller}: {own}: {exc.strerror or exc}")
                continue
            bases[label] = candidate
            homes[controller] = label
            base = candidate
            break
        if base is None and not any(p.startswith(f"{controller}:") for p in problems):
            problems.append(f"{controller}: no usable cgroup v1 mount")
    if not bases:
        return None, [], "; ".join(problems)
    return ExecutorCgroups(1, bases, homes, limits), list(homes), "; ".join(problems)


def plan_limits(
    limits: ResourceLimits,
    mode: str = "auto",
    *,
    mountinfo_path: str = "/proc/self/mountinfo",
    cgroup_path: str = "/proc/self/cgroup",
) -> LimitPlan:
    """Decide how ``limits`` are enforced (see the module docstring).

    Creates the base cgroup(s) when cgroups are used. Raises :class:`CgroupError`
    when ``mode`` forces a mechanism that cannot hold every requested limit.
    """
    if mode not in LIMIT_MODES:
        raise CgroupError(f"unknown limit mode {mode!r}; expected one of {', '.join(LIMIT_MODES)}")
    wanted = limits.wanted()
    plan = LimitPlan(limits=limits, mode=mode)
    if not wanted:
        return plan
    held: list[str] = []
    if mode != "rlimit":
        try:
            mounts = parse_mountinfo(_read(mountinfo_path))
            v2_path, v1_paths = parse_proc_cgroup(_read(cgroup_path))
        except OSError as exc:
            mounts, v2_path, v1_paths = [], None, {}
            plan.notes.append(f"cannot read the cgroup layout: {exc}")
        if mode in ("auto", "cgroup2"):
            cgroups, why = _try_v2(mounts, v2_path, wanted, limits)
            if cgroups is not None:
                plan.cgroups = cgroups
                held = list(cgroups.homes)
            else:
                plan.notes.append(f"cgroup v2: {why}")
                if mode == "cgroup2":
                    raise CgroupError(f"EXECUTOR_SANDBOX_LIMITS=cgroup2: {why}")
        if plan.cgroups is None and mode in ("auto", "cgroup1"):
            cgroups, held, why = _try_v1(mounts, v1_paths, wanted, limits)
            if why:
                plan.notes.append(f"cgroup v1: {why}")
            if mode == "cgroup1" and set(held) != set(wanted):
                if cgroups is not None:
                    cgroups.close()
                raise CgroupError(f"EXECUTOR_SANDBOX_LIMITS=cgroup1: {why or 'not available'}")
            plan.cgroups = cgroups
    if "memory" in wanted and "memory" not in held:
        plan.rlimit_as = limits.memory_bytes
    plan.unenforced = tuple(c for c in wanted if c not in held and c != "memory")
    return plan

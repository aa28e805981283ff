"""Processes an executor started: find them and kill them, even after the executor is gone.

Theory of operation
-------------------
User code may start processes (``subprocess``, ``os.fork``), and a process that
calls ``setsid`` leaves the executor's process group, so signalling the group
is not enough. Two nets catch them (process spawn mode; in sandbox mode the
executor's PID namespace dies with it):

* **the tree** -- :func:`descendants` walks ``/proc/<pid>/task/*/children``
  recursively while the executor lives; the pool SIGKILLs the whole tree before
  the executor itself (``kill_executor``, ``stop``);
* **the mark** -- every executor runs with ``BLOCKX_EXECUTOR_OF=<worker pid>:
  <worker start time>:<pool token>:<executor id>:<generation>`` in its
  environment (the token tells apart pools of one worker process), which its
  children inherit. After an executor exited, :func:`kill_marked` finds every
  process still carrying its mark (``/proc/*/environ``), wherever it was
  reparented, and kills it. At the next pool start, :func:`kill_orphans` kills
  every marked process whose worker is dead (a worker killed with SIGKILL
  cleans up after itself the next time one starts on the machine).

A process that clears its own environment and leaves the tree escapes the
second net; docs/security.md says so. Only processes of the worker's own user
are readable, so only those are ever killed. Blocking (``/proc`` reads): run
the scans off the event loop.

Where there is no ``/proc`` (macOS; :data:`PROC_ROOT` names it) every reading
here comes from psutil when it is installed (a dependency on non-Linux
platforms): a process's children, parent, start time (milliseconds since the
epoch instead of clock ticks since boot: only compared with itself) and
environment (the mark). Without either, the scans find nothing and only the
process-group kill remains (README, "Supported platforms").
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from blockx.portability import load_psutil, proc_available

if TYPE_CHECKING:
    from blockx.worker.pool.launch import ExecutorProcess

__all__ = [
    "MARK_ENV",
    "descendants",
    "descends_from",
    "kill_marked",
    "kill_orphans",
    "kill_pids",
    "mark_of",
    "process_start_time",
    "signal_process_group",
    "worker_mark_prefix",
]

#: The Linux process table read here; where it is missing, psutil (the module docstring).
PROC_ROOT = "/proc"

#: The environment variable carrying an executor's mark.
MARK_ENV: Final = "BLOCKX_EXECUTOR_OF"
_MARK_BYTES: Final = MARK_ENV.encode() + b"="


def _psutil() -> Any:
    """psutil, when there is no ``/proc`` to read and it is installed; else None."""
    return None if proc_available(PROC_ROOT) else load_psutil()


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot), None if gone; without
    ``/proc``, psutil's creation time in milliseconds."""
    try:
        with open(f"{PROC_ROOT}/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        psutil = _psutil()
        if psutil is None:
            return None
        try:
            return int(psutil.Process(pid).create_time() * 1000)
        except (psutil.Error, OSError):
            return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def worker_mark_prefix(pid: int | None = None, token: str | None = None) -> str:
    """``<pid>:<start time>:<token>:`` of a pool in a worker process (default: this
    process, a fresh random token)."""
    if pid is None:
        pid = os.getpid()
    if token is None:
        import secrets  # here: blockx run's fork server starts before it is needed

        token = secrets.token_hex(4)
    return f"{pid}:{process_start_time(pid) or 0}:{token}:"


def mark_of(prefix: str, executor_id: str, generation: int) -> str:
    return f"{prefix}{executor_id}:{generation}"


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first, breadth-first)."""
    psutil = _psutil()
    if psutil is not None:
        try:
            return [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except (psutil.Error, OSError):
            return []
    found: list[int] = []
    seen = {pid}
    queue = [pid]
    while queue:
        parent = queue.pop(0)
        try:
            tasks = os.listdir(f"{PROC_ROOT}/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"{PROC_ROOT}/{parent}/task/{tid}/children", "rb") as f:
                    children = f.read().split()
            except OSError:
                continue
            for raw in children:
                try:
                    child = int(raw)
                except ValueError:
                    continue
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    queue.append(child)
    return found


def kill_pids(pids: Iterable[int], signum: int = signal.SIGKILL) -> int:
    """Signal each pid (gone or foreign ones are skipped); how many were signalled."""
    count = 0
    for pid in pids:
        if pid <= 1 or pid == os.getpid():
            continue
        try:
            os.kill(pid, signum)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
    return count


def _marked_processes() -> Iterable[tuple[int, str]]:
    """``(pid, mark)`` of every readable process carrying a mark."""
    me = os.getpid()
    psutil = _psutil()
    if psutil is not None:
        yield from _psutil_marked(psutil, me)
        return
    try:
        entries = os.listdir(PROC_ROOT)
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        try:
            with open(f"{PROC_ROOT}/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        at = environ.find(_MARK_BYTES)
        if at < 0 or (at > 0 and environ[at - 1] != 0):
            continue
        end = environ.find(b"\0", at)
        value = environ[at + len(_MARK_BYTES) : end if end >= 0 else len(environ)]
        yield pid, value.decode("utf-8", "replace")


def _psutil_marked(psutil: Any, me: int) -> Iterable[tuple[int, str]]:
    """:func:`_marked_processes` from psutil (no ``/proc``); nothing when it cannot list
    the processes (a scan that cannot read finds nothing, as with ``/proc``)."""
    try:
        processes = list(psutil.process_iter())
    except Exception:  # psutil's own failures are not all psutil.Error (an empty table)
        return
    for process in processes:
        if process.pid == me:
            continue
        try:
            value = process.environ().get(MARK_ENV)
        except (psutil.Error, OSError):
            continue
        if value is not None:
            yield process.pid, value


def kill_marked(mark: str, *, exact: bool = True) -> list[int]:
    """SIGKILL every process whose mark is ``mark`` (``exact=False``: starts with it)."""
    victims = [
        pid
        for pid, value in _marked_processes()
        if (value == mark if exact else value.startswith(mark))
    ]
    kill_pids(victims)
    return victims


def kill_orphans() -> list[int]:
    """SIGKILL marked processes whose worker (pid and start time) no longer runs."""
    victims: list[int] = []
    alive: dict[str, bool] = {}
    for pid, value in _marked_processes():
        parts = value.split(":")
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        key = f"{parts[0]}:{parts[1]}"
        live = alive.get(key)
        if live is None:
            worker = int(parts[0])
            live = alive[key] = str(process_start_time(worker)) == parts[1]
        if not live:
            victims.append(pid)
    with contextlib.suppress(Exception):
        kill_pids(victims)
    return victims


def signal_process_group(process: ExecutorProcess, signum: signal.Signals) -> None:
    """Signal the process's group when it leads one (our spawners make it so), else the
    process alone. A process that is gone already is not an error."""
    pid = process.pid
    try:
        leads_group = os.getpgid(pid) == pid
        if leads_group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


#: How many parents up :func:`_descends_from` looks (bubblewrap: executor, its init, bwrap).
MAX_SPAWN_DEPTH: Final = 4


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its first few generations of children."""
    for _ in range(MAX_SPAWN_DEPTH + 1):
        if pid == ancestor:
            return True
        try:
            with open(f"{PROC_ROOT}/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            psutil = _psutil()
            if psutil is None:
                return False
            try:
                pid = int(psutil.Process(pid).ppid())
            except (psutil.Error, OSError):
                return False
            if pid <= 1:
                return False
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            pid = int(fields[1])
        except (IndexError, ValueError):
            return False
        if pid <= 1:
            return False
    return False


def kill_tree(process: ExecutorProcess) -> None:
    """SIGKILL the process's descendants, then its group and itself."""
    # Walk while it lives: once it is dead its children are reparented away.
    for _ in range(2):  # a second pass for what forked during the first
        tree = descendants(process.pid)
        if not tree:
            break
        kill_pids(tree)
    signal_process_group(process, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(process.pid, signal.SIGKILL)


def kill_left_behind(mark: str) -> None:
    """SIGKILL what an executor (``mark``: its mark) left running when it exited."""
    victims = kill_marked(mark)
    if victims:
        logging.getLogger("blockx.worker.pool").warning(
            "killed %d process(es) left behind by executor %s: %s",
            len(victims),
            mark.split(":")[3],
            ", ".join(map(str, victims[:20])),
        )

"""PoolManager: one executor process per slot, restarted with throttling (seed: ``pool.go``).

Theory of operation
-------------------
The pool owns ``executor_count`` slots, ``exec-0`` … ``exec-{N-1}``; the slot's
id is the ``--executor-id`` of every process it runs, so a restarted executor
reattaches to the adapter under the same id (a new era there). Each slot is a
small state machine:

======== ============================================ ========
state    event                                        next
======== ============================================ ========
STOPPED  ``start()``                                  RUNNING
RUNNING  exit, < ``max_restarts`` in the window       WAITING
RUNNING  exit, ``max_restarts`` already in the window BACKOFF
WAITING  ``restart_delay_ms`` passed                  RUNNING
BACKOFF  ``backoff_ms`` passed (window forgotten)     RUNNING
any      ``stop()``                                   STOPPED
======== ============================================ ========

A spawn that fails counts as an exit. ``kill_executor`` (the wedge backstop)
SIGKILLs the slot's process tree and group; the exit then restarts it as above.

How a process ended is kept as a :class:`~blockx.worker.pool.exits.ProcessExit`
(exit status, the black box it left, the sandbox's OOM verdict, whether the pool
killed it on the worker's order and why) and handed to every exit listener; the
pool is the adapter's exit source (``ExecutorAdapter.set_exit_source``), which
turns it into the lost era's :class:`~blockx.worker.link.loss.ExecutorLoss`.
Each slot has a *generation* (its spawn count): the adapter matches an era to
its process by it.

The black box: every process gets ``--blackbox-path <socket dir>/<executor id>.blackbox``,
a file the pool zeroes before each spawn and reads once the process is reaped
(``blockx.wire.blackbox``; the sandbox binds that one file read-write).

Nothing the executor started outlives it (:mod:`.process_tree`): its descendants
are SIGKILLed with it (the tree is walked while it lives), and after any exit
the processes still carrying the slot generation's mark in their environment
are killed; at start the pool kills marked processes left by workers that died
(SIGKILL leaves no chance to clean up).

Spawns run on one long-lived spawner thread, so the event loop never waits
for a child to exec (under load a ``Popen`` takes up to ~15 ms on our
machines); the children's parent-death signal is tied to that thread, which
lives until ``stop()`` has reaped them (``spawn_early()``'s, before ``start()``: the
caller's thread, :mod:`.early`). No task or thread per process: exits
are seen through a pidfd registered with the event loop (``add_reader``; a
100 ms poll where pidfds are missing), and
the children's stdout/stderr are non-blocking pipes read the same way and
forwarded line by line to the ``blockx.worker.executor`` logger with the
executor id (the executor writes JSON log lines; their level, message and call
fields are kept). Before a dead executor is reaped, its process group is
SIGKILLed, so nothing it started survives it.

``stop()``: SIGTERM to every process group, up to ``stop_grace_ms`` for them to
exit (the executor cancels its calls and exits 0), SIGKILL for the rest, reap
all. Together with the spawner's parent-death signal, no executor outlives
the worker.

Every method runs on the event loop thread that called :meth:`PoolManager.start`;
only ``spawner.spawn`` runs on the spawner thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from blockx.wire.blackbox import read_blackbox
from blockx.worker.errors import AdapterUsageError, SpawnError
from blockx.worker.pool import process_tree
from blockx.worker.pool.exits import (
    LossCause,
    ProcessExit,
    describe_returncode,
    shell_status_as_signal,
)
from blockx.worker.pool.launch import ExecutorLaunchSpec, ExecutorProcess
from blockx.worker.pool.launch_plan import LaunchPlan
from blockx.worker.pool.listener import sweep_beside
from blockx.worker.pool.output import OutputReader
from blockx.worker.pool.slots import SlotInfo, SlotState, _Slot
from blockx.worker.pool.spawner import ExecutorSpawner, ProcessSpawner, spawn_thread

if TYPE_CHECKING:
    from blockx.worker.config import WorkerConfig

__all__ = ["PoolManager", "SlotInfo", "SlotState"]

_log = logging.getLogger("blockx.worker.pool")

#: Poll interval when pidfds are unavailable.
_POLL_INTERVAL_S: Final = 0.1


_describe_exit = describe_returncode
#: Exits kept per slot for the adapter to ask about.
_EXITS_KEPT: Final = 4


class PoolManager:
    """The executor processes of one worker; see the module docstring."""

    def __init__(
        self,
        socket_path: str,
        *,
        executor_count: int,
        spawner: ExecutorSpawner | None = None,
        max_inflight: int = 128,
        max_runnable: int = 128,
        heartbeat_interval_s: float = 1.0,
        python: str | None = None,
        restart_delay_ms: int = 1000,
        max_restarts: int = 10,
        restart_window_ms: int = 60_000,
        backoff_ms: int = 30_000,
        stop_grace_ms: int = 5000,
        memory_limit_mb: int = 0,
        max_open_files: int = 0,
        blackbox_dir: str | None = None,
        mark_processes: bool = True,
        on_slot_state: Callable[[str, SlotState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_slot_state(executor_id, state)`` is called on every state change (plain
        synchronous function, like the adapter's callbacks). ``memory_limit_mb`` and
        ``max_open_files`` are the executors' ``--memory-limit-mb`` / ``--max-open-files``
        (0: none / inherited). ``blackbox_dir`` holds the black boxes (default: the
        socket's directory). ``mark_processes``: mark executors and kill what they leave
        behind (the module docstring)."""
        if executor_count < 1:
            raise ValueError(f"executor_count must be at least 1, got {executor_count}")
        for name, value in (
            ("restart_delay_ms", restart_delay_ms),
            ("max_restarts", max_restarts),
            ("backoff_ms", backoff_ms),
            ("stop_grace_ms", stop_grace_ms),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if restart_window_ms <= 0:
            raise ValueError(f"restart_window_ms must be positive, got {restart_window_ms}")
        self._socket_path = socket_path
        self._spawner: ExecutorSpawner = spawner or ProcessSpawner()
        if memory_limit_mb < 0 or max_open_files < 0:
            raise ValueError("memory_limit_mb and max_open_files must be >= 0")
        self._memory_limit_mb = memory_limit_mb
        self._mark_prefix = process_tree.worker_mark_prefix() if mark_processes else None
        self._plan = LaunchPlan(
            socket_path,
            flags={
                "executor_max_inflight": max_inflight,
                "executor_max_runnable": max_runnable,
                "heartbeat_interval": float(heartbeat_interval_s),
                "memory_limit_mb": memory_limit_mb,
                "max_open_files": max_open_files,
            },
            python=python,
            blackbox_dir=(
                os.path.dirname(os.path.abspath(socket_path))
                if blackbox_dir is None
                else blackbox_dir
            ),
            mark_prefix=self._mark_prefix,
        )
        self._exit_listeners: list[Callable[[ProcessExit], None]] = []
        self._restart_delay_s = restart_delay_ms / 1000.0
        self._max_restarts = max_restarts
        self._restart_window_s = restart_window_ms / 1000.0
        self._backoff_s = backoff_ms / 1000.0
        self._stop_grace_s = stop_grace_ms / 1000.0
        self._on_slot_state = on_slot_state
        self._clock = clock
        self._slots = {f"exec-{i}": _Slot(f"exec-{i}") for i in range(executor_count)}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopping = False
        self._all_exited: asyncio.Future[None] | None = None
        # The one spawner thread (spawner.spawn_thread), which the children's parent-death
        # signal is tied to: it lives until stop() has reaped them all.
        self._spawn_thread: concurrent.futures.ThreadPoolExecutor | None = None

    @classmethod
    def from_config(
        cls,
        config: WorkerConfig,
        socket_path: str,
        *,
        spawner: ExecutorSpawner | None = None,
        on_slot_state: Callable[[str, SlotState], None] | None = None,
    ) -> PoolManager:
        """A pool as ``config`` says (``spawner`` default: the one of ``pool.spawn_mode``)."""
        from blockx.worker.pool.spawner import spawner_for_mode

        pool = config.pool
        return cls(
            socket_path,
            executor_count=pool.executor_count,
            spawner=spawner or spawner_for_mode(pool.spawn_mode, pool),
            max_inflight=config.dispatcher.executor_max_inflight,
            max_runnable=config.dispatcher.executor_max_runnable,
            heartbeat_interval_s=pool.heartbeat_interval_s,
            python=pool.python_executable,
            restart_delay_ms=pool.restart_delay_ms,
            max_restarts=pool.max_restarts,
            restart_window_ms=pool.restart_window_ms,
            backoff_ms=pool.backoff_ms,
            stop_grace_ms=pool.stop_grace_ms,
            memory_limit_mb=pool.memory_limit_mb_effective,
            max_open_files=pool.max_open_files,
            on_slot_state=on_slot_state,
        )

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for slot in self._slots.values():
            counts[slot.state.name] = counts.get(slot.state.name, 0) + 1
        states = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        return f"PoolManager({len(self._slots)} slots: {states}, {self._spawner.mode})"

    # --- views ------------------------------------------------------------------------

    @property
    def executor_ids(self) -> list[str]:
        return list(self._slots)

    def slot_state(self, executor_id: str) -> SlotState:
        return self._slot(executor_id).state

    def pid(self, executor_id: str) -> int | None:
        process = self._slot(executor_id).process
        return None if process is None else process.pid

    def pids(self) -> dict[str, int]:
        """Pids of the running processes, by executor id."""
        return {s.executor_id: s.process.pid for s in self._slots.values() if s.process is not None}

    def check_peer(self, executor_id: str, pid: int | None) -> str | None:
        """May the process ``pid`` attach as ``executor_id``? None if so, else why not.

        Only the process this pool started for that slot, or one of its descendants
        (bubblewrap runs the executor a fork or two below the process it started), may
        be that executor: another slot's executor, or user code that escaped its
        sandbox, cannot take over an executor id. A connection without a peer pid
        (an in-process transport, no Unix socket) is not vetted.
        """
        if pid is None:
            return None
        slot = self._slots.get(executor_id)
        if slot is None:
            return "not an executor slot of this worker's pool"
        process = slot.process
        if process is None or process.returncode is not None:
            return "the slot has no running executor process"
        if not _descends_from(pid, process.pid):
            return f"process {pid} is not the slot's executor (pid {process.pid}) or its child"
        return None

    # --- the adapter's exit source (loss.ProcessExitSource) ----------------------------------

    def running_generation(self, executor_id: str) -> int | None:
        """The generation of the slot's running process; None when none runs."""
        slot = self._slots.get(executor_id)
        if slot is None or slot.process is None:
            return None
        return slot.generation

    def exit_of(self, executor_id: str, generation: int) -> ProcessExit | None:
        """How that generation's process ended; None while it runs (or long forgotten)."""
        slot = self._slots.get(executor_id)
        return None if slot is None else slot.exits.get(generation)

    def add_exit_listener(self, listener: Callable[[ProcessExit], None]) -> None:
        """``listener(exit)`` after every reaped process, on the event loop thread."""
        self._exit_listeners.append(listener)

    def slots(self) -> list[SlotInfo]:
        now = self._clock()
        return [slot.info(now - self._restart_window_s) for slot in self._slots.values()]

    def slot(self, executor_id: str) -> SlotInfo:
        return self._slot(executor_id).info(self._clock() - self._restart_window_s)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn every slot's executor; they boot in parallel.

        Returns once every process exists (or its spawn failed and it went the
        restart way), not once they attached: the adapter's
        ``on_executor_attached`` says that.
        """
        if self._started:
            raise AdapterUsageError("PoolManager.start() called twice")
        self._started = True
        self._loop = asyncio.get_running_loop()
        if self._spawn_thread is None:
            self._spawn_thread = spawn_thread()
        early = [(slot, slot.early) for slot in self._slots.values() if slot.early is not None]
        for slot, spawned in early:  # spawn_early's: registered (or pending) before any await
            slot.early = None
            if spawned.done():
                self._spawned(slot, spawned)  # type: ignore[arg-type]  # a done Future all the same
            else:  # a forked one whose answer the spawner thread still awaits
                slot.spawning = asyncio.wrap_future(spawned)
                slot.spawning.add_done_callback(functools.partial(self._spawned, slot))
        # What workers killed with SIGKILL left behind: their socket directories
        # (listener.sweep_dead_socket_dirs) and their executors' children.
        await self._loop.run_in_executor(self._spawn_thread, sweep_beside, self._socket_path)
        if self._mark_prefix is not None:
            orphans = await self._loop.run_in_executor(
                self._spawn_thread, process_tree.kill_orphans
            )
            if orphans:
                _log.warning(
                    "killed %d process(es) left behind by executors of dead workers: %s",
                    len(orphans),
                    ", ".join(map(str, orphans[:20])),
                )
        for slot in self._slots.values():
            if all(slot is not adopted for adopted, _ in early):
                self._spawn(slot)
        await self._spawns_settled()
        _log.info("executor pool started: %d slot(s), %r", len(self._slots), self._spawner)

    def spawn_early(self) -> None:
        """Spawn every slot's executor now, before :meth:`start`, with no event loop, from
        the calling thread (``blockx run``'s main thread: it outlives them, and their
        parent-death signal is tied to it). A spawner with ``begin`` (the fork server's
        request sent now, its answer read on the spawner thread) leaves this thread to
        import the worker meanwhile. :meth:`start` adopts them; :meth:`discard_early`
        (or :meth:`stop` before :meth:`start`) kills them; :meth:`early_pids` waits."""
        if self._started or self._spawn_thread is not None:
            raise AdapterUsageError("PoolManager.spawn_early() after a spawn")
        self._spawn_thread = spawn_thread()  # restarts and the rest, as usual
        begin = getattr(self._spawner, "begin", None)
        for slot in self._slots.values():
            spawned: concurrent.futures.Future[ExecutorProcess]
            try:
                spec = self._spec(slot, 1)
                if begin is not None:
                    spawned = self._spawn_thread.submit(begin(spec))
                else:
                    spawned = concurrent.futures.Future()
                    spawned.set_result(self._spawner.spawn(spec))
            except Exception as exc:  # start() registers it as a failed spawn
                spawned = concurrent.futures.Future()
                spawned.set_exception(exc)
            slot.early = spawned  # (a Ctrl-C above leaves none: nothing began)

    def early_pids(self) -> list[int]:
        """The pids of :meth:`spawn_early`'s executors (waiting for their spawns)."""
        spawns = [s.early for s in self._slots.values() if s.early is not None]
        concurrent.futures.wait(spawns)
        return [spawned.result().pid for spawned in spawns if spawned.exception() is None]

    def discard_early(self) -> None:
        """The pool never started: kill and reap what :meth:`spawn_early` started, close
        the spawner; the pool is stopped for good. Idempotent."""
        if self._started or self._stopping:
            return
        self._stopping = True
        for slot in self._slots.values():
            early, slot.early = slot.early, None
            if early is None:
                continue
            try:  # a spawn still on the spawner thread is waited for: no executor escapes
                slot.process = early.result()
            except Exception:  # the spawn failed (or never began): nothing runs
                continue
            self._kill_tree(slot)
            slot.process.wait()
            slot.process = None
        self._close_spawner()
        if self._spawn_thread is not None:
            self._spawn_thread.shutdown(wait=False)

    async def _spawns_settled(self) -> None:
        """Wait until no spawn is in flight (their results are registered by then)."""
        while True:
            pending = [s.spawning for s in self._slots.values() if s.spawning is not None]
            if not pending:
                return
            await asyncio.wait(pending)
            await asyncio.sleep(0)  # let the done-callbacks register the processes

    async def stop(self) -> None:
        """Terminate every executor: SIGTERM, ``stop_grace_ms``, SIGKILL; reap all. Idempotent."""
        if self._stopping or not self._started:
            self.discard_early()
            return
        self._stopping = True
        loop = self._loop
        assert loop is not None
        await self._spawns_settled()
        for slot in self._slots.values():
            if slot.timer is not None:
                slot.timer.cancel()
                slot.timer = None
            if slot.process is None:
                self._set_state(slot, SlotState.STOPPED)
        running = [s for s in self._slots.values() if s.process is not None]
        # What the executors started, seen while they live (once they exit their children
        # are reparented away): killed below unless gone (the start time guards against a
        # reused pid).
        started: list[tuple[int, int | None]] = []
        for slot in running:
            assert slot.process is not None
            for pid in process_tree.descendants(slot.process.pid):
                started.append((pid, process_tree.process_start_time(pid)))
        if running:
            self._all_exited = loop.create_future()
            for slot in running:
                # The executor kills what it started when it exits; anything that escapes
                # is killed by its mark or by the list above once it has.
                self._signal(slot, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._all_exited), self._stop_grace_s)
            except TimeoutError:
                left = [s for s in self._slots.values() if s.process is not None]
                _log.warning(
                    "%d executor(s) still running %.1fs after SIGTERM; sending SIGKILL: %s",
                    len(left),
                    self._stop_grace_s,
                    ", ".join(s.executor_id for s in left),
                )
                for slot in left:
                    self._kill_tree(slot)
                try:
                    await asyncio.wait_for(asyncio.shield(self._all_exited), 10.0)
                except TimeoutError:  # pragma: no cover - SIGKILL not delivered (D state)
                    _log.error("executors did not die after SIGKILL; reaping what exited")
                    for slot in self._slots.values():
                        if slot.process is not None:
                            self._reap(slot)
        for slot in self._slots.values():
            for reader in slot.outputs:
                reader.close()
            slot.outputs.clear()
        process_tree.kill_pids(
            pid for pid, start in started if process_tree.process_start_time(pid) == start
        )
        if self._spawn_thread is not None:
            if self._mark_prefix is not None:
                # Whatever any of this pool's executors started and is still running.
                await loop.run_in_executor(
                    self._spawn_thread,
                    functools.partial(process_tree.kill_marked, self._mark_prefix, exact=False),
                )
            # Every child is reaped: the spawner may clean up (the sandbox's cgroups), and
            # the thread their parent-death signal is tied to may end.
            await loop.run_in_executor(self._spawn_thread, self._close_spawner)
            self._spawn_thread.shutdown(wait=False)
        _log.info("executor pool stopped")

    async def __aenter__(self) -> PoolManager:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    def kill_executor(
        self,
        executor_id: str,
        why: str = "the wedge backstop",
        *,
        cause: LossCause = "executor_wedged",
    ) -> bool:
        """SIGKILL the slot's process, everything it started, and its group now; it
        restarts as usual. Its :class:`ProcessExit` records ``why`` and ``cause`` (the
        lost era's loss then has that cause).

        False when the slot has no running process.
        """
        slot = self._slot(executor_id)
        if slot.process is None:
            return False
        _log.warning(
            "killing executor %s (pid %d): %s",
            executor_id,
            slot.process.pid,
            why,
            extra={"executorId": executor_id},
        )
        if slot.killed is None:
            slot.killed = (why, cause)
        self._kill_tree(slot)
        return True

    # --- internals ------------------------------------------------------------------------

    def _close_spawner(self) -> None:
        close = getattr(self._spawner, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                _log.exception("closing the %s spawner failed", self._spawner.mode)

    def _slot(self, executor_id: str) -> _Slot:
        try:
            return self._slots[executor_id]
        except KeyError:
            raise KeyError(f"no executor slot {executor_id!r}") from None

    def _set_state(self, slot: _Slot, state: SlotState) -> None:
        if slot.state is state:
            return
        slot.state = state
        if self._on_slot_state is not None:
            try:
                self._on_slot_state(slot.executor_id, state)
            except Exception:
                _log.exception("on_slot_state callback failed for %s", slot.executor_id)

    def _spec(self, slot: _Slot, generation: int) -> ExecutorLaunchSpec:
        spec, slot.blackbox_path = self._plan.spec(slot.executor_id, generation)
        return spec

    def _spawn(self, slot: _Slot) -> None:
        """Start the slot's process on the spawner thread; ``_spawned`` registers it."""
        slot.timer = None
        if self._stopping or slot.spawning is not None:
            return
        loop = self._loop
        assert loop is not None and self._spawn_thread is not None
        spec = self._spec(slot, slot.generation + 1)
        spawning = loop.run_in_executor(self._spawn_thread, self._spawner.spawn, spec)
        slot.spawning = spawning
        spawning.add_done_callback(functools.partial(self._spawned, slot))

    def _spawned(self, slot: _Slot, spawning: asyncio.Future[ExecutorProcess]) -> None:
        slot.spawning = None
        loop = self._loop
        assert loop is not None
        try:
            process = spawning.result()
        except Exception as exc:
            if not isinstance(exc, SpawnError):
                exc = SpawnError(slot.executor_id, repr(exc))
            _log.error("%s", exc, extra={"executorId": slot.executor_id})
            slot.exits_total += 1
            slot.last_returncode = None
            slot.last_exit_reason = f"spawn failed: {exc}"
            if self._stopping:
                self._set_state(slot, SlotState.STOPPED)
            else:
                self._schedule_restart(slot)
            return
        # Registered even while stopping: stop() signals it like the others.
        slot.process = process
        slot.generation += 1
        slot.killed = None
        slot.started_at = self._clock()
        for stream, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            if pipe is not None:
                # The reader owns the fd from here; detach it from the file object.
                fd = os.dup(pipe.fileno())
                pipe.close()
                slot.outputs.append(OutputReader(loop, fd, slot.executor_id, stream))
        try:
            slot.pidfd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):
            slot.pidfd = -1
            slot.timer = loop.call_later(_POLL_INTERVAL_S, self._poll, slot, process)
        else:
            loop.add_reader(slot.pidfd, self._exited, slot, process)
        _log.info(
            "executor %s started (pid %d)",
            slot.executor_id,
            process.pid,
            extra={"executorId": slot.executor_id},
        )
        self._set_state(slot, SlotState.RUNNING)

    def _poll(self, slot: _Slot, process: ExecutorProcess) -> None:
        slot.timer = None
        if slot.process is not process:
            return
        if process.poll() is None:
            assert self._loop is not None
            slot.timer = self._loop.call_later(_POLL_INTERVAL_S, self._poll, slot, process)
            return
        self._exited(slot, process)

    def _exited(self, slot: _Slot, process: ExecutorProcess) -> None:
        """The process is dead (pidfd readable): kill its group, reap, decide what next."""
        if slot.process is not process:
            return
        self._reap(slot)
        returncode = slot.last_returncode
        reason = _describe_exit(returncode)
        if self._stopping:
            _log.info(
                "executor %s %s", slot.executor_id, reason, extra={"executorId": slot.executor_id}
            )
            self._record_exit(slot, process, stopping=True)
            self._set_state(slot, SlotState.STOPPED)
            if self._all_exited is not None and not self._all_exited.done():
                if all(s.process is None for s in self._slots.values()):
                    self._all_exited.set_result(None)
            return
        # The sandbox's cgroup knows of OOM kills (its note is the verdict); other notes
        # just explain.
        oom_note = getattr(self._spawner, "oom_note", None)
        note = oom_note(slot.executor_id) if oom_note is not None else None
        memory_killed = note is not None
        if note is None:
            exit_note = getattr(self._spawner, "exit_note", None)
            note = exit_note(slot.executor_id) if exit_note is not None else None
        if note:
            slot.last_exit_reason = reason = f"{reason} ({note})"
        self._record_exit(slot, process, memory_killed=memory_killed, note=note)
        _log.warning(
            "executor %s (pid %d) %s after %.1fs",
            slot.executor_id,
            process.pid,
            reason,
            self._clock() - slot.started_at,
            extra={"executorId": slot.executor_id},
        )
        self._schedule_restart(slot)

    def _record_exit(
        self,
        slot: _Slot,
        process: ExecutorProcess,
        *,
        stopping: bool = False,
        memory_killed: bool = False,
        note: str | None = None,
    ) -> None:
        """Keep the exit for the adapter, tell the listeners, kill what it left behind."""
        box = None if slot.blackbox_path is None else read_blackbox(slot.blackbox_path)
        killed = slot.killed
        slot.killed = None
        returncode = slot.last_returncode
        if getattr(self._spawner, "signals_as_exit_status", False):
            returncode = shell_status_as_signal(returncode)
        exit_ = ProcessExit(
            executor_id=slot.executor_id,
            generation=slot.generation,
            pid=process.pid,
            returncode=returncode,
            blackbox=box,
            memory_killed=memory_killed,
            memory_limit_mb=self._memory_limit_mb,
            killed_why=None if killed is None else killed[0],
            killed_cause=None if killed is None else killed[1],
            stopping=stopping,
            note=note,
        )
        exits = slot.exits
        exits[slot.generation] = exit_
        for old in [g for g in exits if g <= slot.generation - _EXITS_KEPT]:
            del exits[old]
        if self._mark_prefix is not None and self._spawn_thread is not None and not stopping:
            # Off the loop (a /proc scan); on the spawner thread, before the next spawn.
            mark = process_tree.mark_of(self._mark_prefix, slot.executor_id, slot.generation)
            assert self._loop is not None
            self._loop.run_in_executor(self._spawn_thread, process_tree.kill_left_behind, mark)
        for listener in list(self._exit_listeners):
            try:
                listener(exit_)
            except Exception:
                _log.exception("exit listener failed for %s", slot.executor_id)

    def _kill_tree(self, slot: _Slot) -> None:
        if slot.process is not None:
            process_tree.kill_tree(slot.process)

    def _reap(self, slot: _Slot) -> None:
        process = slot.process
        assert process is not None
        if slot.pidfd >= 0:
            assert self._loop is not None
            self._loop.remove_reader(slot.pidfd)
            os.close(slot.pidfd)
            slot.pidfd = -1
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        # The leader is not reaped yet, so its pid (the group id) cannot be reused:
        # safe to kill whatever else is left in its group.
        _signal_process_group(process, signal.SIGKILL)
        returncode = process.poll()
        if returncode is None:
            try:
                returncode = process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - pidfd said it was dead
                _log.error("executor %s: pid %d not reapable", slot.executor_id, process.pid)
        slot.process = None
        slot.exits_total += 1
        slot.last_returncode = returncode
        slot.last_exit_reason = _describe_exit(returncode)

    def _schedule_restart(self, slot: _Slot) -> None:
        loop = self._loop
        assert loop is not None
        now = self._clock()
        window_start = now - self._restart_window_s
        times = slot.restart_times
        while times and times[0] <= window_start:
            times.popleft()
        if len(times) >= self._max_restarts:
            _log.error(
                "executor %s restarted %d times within %.0fs; backing off for %.1fs",
                slot.executor_id,
                len(times),
                self._restart_window_s,
                self._backoff_s,
                extra={"executorId": slot.executor_id},
            )
            self._set_state(slot, SlotState.BACKOFF)
            slot.timer = loop.call_later(self._backoff_s, self._restart, slot, True)
        else:
            self._set_state(slot, SlotState.WAITING)
            slot.timer = loop.call_later(self._restart_delay_s, self._restart, slot, False)

    def _restart(self, slot: _Slot, after_backoff: bool) -> None:
        slot.timer = None
        if self._stopping:
            return
        if after_backoff:
            slot.restart_times.clear()
        slot.restart_times.append(self._clock())
        slot.restarts_total += 1
        self._spawn(slot)

    def _signal(self, slot: _Slot, signum: signal.Signals) -> None:
        process = slot.process
        if process is not None:
            _signal_process_group(process, signum)


# Kept under their old names for callers and tests.
_signal_process_group = process_tree.signal_process_group
_descends_from = process_tree.descends_from

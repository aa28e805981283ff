"""PoolManager and ProcessSpawner with real processes: restarts, backoff, kill, stop, no orphans."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from executor_peer import eventually, process_is_gone

from blockx.worker.config import load_config
from blockx.worker.errors import AdapterUsageError, PoolError
from blockx.worker.pool.manager import PoolManager, SlotState
from blockx.worker.pool.spawner import (
    ExecutorLaunchSpec,
    ProcessSpawner,
    executor_command,
    spawner_for_mode,
)

pytestmark = pytest.mark.timeout(60)

PY = sys.executable
CRASH = [PY, "-c", "import sys; sys.exit(3)"]
SLEEP = [PY, "-c", "import time; time.sleep(60)"]
IGNORE_TERM = [
    PY,
    "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)",
]


def argv(command: Sequence[str]) -> Callable[[ExecutorLaunchSpec], Sequence[str]]:
    return lambda spec: list(command)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class StateLog:
    def __init__(self) -> None:
        self.entries: list[tuple[float, str, SlotState]] = []

    def __call__(self, executor_id: str, state: SlotState) -> None:
        self.entries.append((time.monotonic(), executor_id, state))

    def states(self, executor_id: str = "exec-0") -> list[SlotState]:
        return [s for _, e, s in self.entries if e == executor_id]

    def times(self, executor_id: str = "exec-0") -> list[tuple[float, SlotState]]:
        return [(t, s) for t, e, s in self.entries if e == executor_id]


def pool_of(command: Sequence[str], count: int = 1, **kwargs: Any) -> PoolManager:
    kwargs.setdefault("restart_delay_ms", 50)
    return PoolManager(
        "/nonexistent/worker.sock",
        executor_count=count,
        spawner=ProcessSpawner(argv_factory=argv(command)),
        **kwargs,
    )


def test_crashing_executor_restarts_after_the_delay_then_backs_off() -> None:
    log = StateLog()

    async def scenario() -> None:
        pool = pool_of(
            CRASH,
            restart_delay_ms=80,
            max_restarts=3,
            restart_window_ms=30_000,
            backoff_ms=500,
            on_slot_state=log,
        )
        await pool.start()
        try:
            await eventually(lambda: SlotState.BACKOFF in log.states(), timeout=20)
            info = pool.slot("exec-0")
            assert info.last_returncode == 3 and info.last_exit_reason == "exited with status 3"
            assert info.restarts_total == 3 and info.exits_total == 4
            assert info.restarts_in_window == 3 and info.pid is None
            # After the backoff the window is forgotten: it runs (and crashes) again.
            await eventually(lambda: log.states().count(SlotState.RUNNING) == 5, timeout=20)
        finally:
            await pool.stop()

    run(scenario())
    states = log.states()
    assert states[:8] == [
        SlotState.RUNNING, SlotState.WAITING,
        SlotState.RUNNING, SlotState.WAITING,
        SlotState.RUNNING, SlotState.WAITING,
        SlotState.RUNNING, SlotState.BACKOFF,
    ]  # fmt: skip
    assert states[8] is SlotState.RUNNING and states[-1] is SlotState.STOPPED
    times = log.times()
    for (t0, s0), (t1, s1) in itertools.pairwise(times):
        if s0 is SlotState.WAITING and s1 is SlotState.RUNNING:
            assert t1 - t0 >= 0.075
        if s0 is SlotState.BACKOFF and s1 is SlotState.RUNNING:
            assert t1 - t0 >= 0.48


def test_restarts_spread_wider_than_the_window_never_back_off() -> None:
    log = StateLog()
    short_life = [PY, "-c", "import time; time.sleep(0.25)"]

    async def scenario() -> None:
        pool = pool_of(
            short_life,
            restart_delay_ms=20,
            max_restarts=1,
            restart_window_ms=200,
            on_slot_state=log,
        )
        async with pool:
            await eventually(lambda: pool.slot("exec-0").restarts_total >= 3, timeout=20)
        assert SlotState.BACKOFF not in log.states()

    run(scenario())


def test_spawn_failure_counts_as_an_exit() -> None:
    log = StateLog()

    async def scenario() -> None:
        pool = pool_of(
            ["/nonexistent/blockx-executor"],
            restart_delay_ms=10,
            max_restarts=2,
            backoff_ms=60_000,
            on_slot_state=log,
        )
        async with pool:
            await eventually(lambda: pool.slot_state("exec-0") is SlotState.BACKOFF)
            info = pool.slot("exec-0")
            assert info.last_exit_reason is not None
            assert info.last_exit_reason.startswith("spawn failed")
            assert info.exits_total == 3
        assert pool.slot_state("exec-0") is SlotState.STOPPED

    run(scenario())
    assert SlotState.RUNNING not in log.states()


def test_kill_executor_sigkills_and_the_slot_restarts() -> None:
    async def scenario() -> None:
        pool = pool_of(SLEEP, restart_delay_ms=50)
        async with pool:
            first = pool.pid("exec-0")
            assert first is not None and pool.slot_state("exec-0") is SlotState.RUNNING
            assert pool.kill_executor("exec-0")
            await eventually(lambda: pool.slot("exec-0").exits_total == 1)
            info = pool.slot("exec-0")
            assert info.last_returncode == -signal.SIGKILL
            assert info.last_exit_reason == "killed by SIGKILL"
            assert process_is_gone(first)
            await eventually(lambda: pool.slot_state("exec-0") is SlotState.RUNNING)
            second = pool.pid("exec-0")
            assert second is not None and second != first
        assert process_is_gone(second)
        assert not pool.kill_executor("exec-0")
        with pytest.raises(KeyError, match="exec-9"):
            pool.kill_executor("exec-9")

    run(scenario())


def test_stop_terminates_everything_and_leaves_no_orphans(tmp_path: Path) -> None:
    grandchild_file = tmp_path / "grandchild.pid"
    spawns_grandchild = [
        PY,
        "-c",
        textwrap.dedent(
            f"""
            import subprocess, time
            child = subprocess.Popen(["sleep", "60"])
            open({str(grandchild_file)!r}, "w").write(str(child.pid))
            time.sleep(60)
            """
        ),
    ]
    commands = {"exec-0": SLEEP, "exec-1": IGNORE_TERM, "exec-2": spawns_grandchild}
    log = StateLog()

    async def scenario() -> float:
        pool = PoolManager(
            "/nonexistent/worker.sock",
            executor_count=3,
            spawner=ProcessSpawner(argv_factory=lambda spec: commands[spec.executor_id]),
            stop_grace_ms=500,
            on_slot_state=log,
        )
        await pool.start()
        pids = pool.pids()
        assert sorted(pids) == ["exec-0", "exec-1", "exec-2"]
        await eventually(lambda: grandchild_file.exists() and grandchild_file.read_text() != "")
        await asyncio.sleep(0.3)  # let exec-1 install its SIGTERM handler
        grandchild = int(grandchild_file.read_text())
        started = time.monotonic()
        await pool.stop()
        took = time.monotonic() - started
        for pid in (*pids.values(), grandchild):
            assert process_is_gone(pid), pid
        assert all(s.state is SlotState.STOPPED for s in pool.slots())
        assert pool.slot("exec-1").last_returncode == -signal.SIGKILL  # ignored SIGTERM
        assert pool.slot("exec-0").last_returncode == -signal.SIGTERM
        await pool.stop()  # idempotent
        return took

    took = run(scenario())
    assert 0.45 <= took < 5


def test_executor_output_is_forwarded_with_the_executor_id(caplog) -> None:
    chatty = [
        PY,
        "-c",
        "import sys, time\n"
        "print('plain stderr line', file=sys.stderr, flush=True)\n"
        'print(\'{"level": "error", "logger": "blockx.executor", "msg": "structured", '
        '"callId": "t1/c7"}\', file=sys.stderr, flush=True)\n'
        "print('from user code', flush=True)\n"
        "time.sleep(60)\n",
    ]

    async def scenario() -> None:
        async with pool_of(chatty, count=1):
            await eventually(lambda: len(_forwarded(caplog)) >= 3)

    with caplog.at_level(logging.DEBUG, "blockx.worker.executor"):
        run(scenario())
    records = {r.getMessage(): r for r in _forwarded(caplog)}
    plain = records["[exec-0] plain stderr line"]
    assert plain.levelno == logging.WARNING and plain.executorStream == "stderr"
    structured = records["[exec-0] structured"]
    assert structured.levelno == logging.ERROR and structured.callId == "t1/c7"
    assert structured.executorId == "exec-0"
    assert records["[exec-0] from user code"].executorStream == "stdout"


def _forwarded(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "blockx.worker.executor"]


def test_from_config_passes_the_seed_flags(tmp_path: Path) -> None:
    config = load_config(
        env={},
        overrides={
            "pool.executor_count": 2,
            "pool.heartbeat_interval_s": 0.5,
            "dispatcher.executor_max_inflight": 64,
            "dispatcher.executor_max_runnable": 32,
            "pool.memory_limit_mb": 700,
            "pool.max_open_files": 512,
        },
    )
    specs: list[ExecutorLaunchSpec] = []

    def capture(spec: ExecutorLaunchSpec) -> list[str]:
        specs.append(spec)
        return SLEEP

    async def scenario() -> None:
        pool = PoolManager.from_config(
            config, str(tmp_path / "worker.sock"), spawner=ProcessSpawner(argv_factory=capture)
        )
        assert pool.executor_ids == ["exec-0", "exec-1"]
        async with pool:
            pass

    run(scenario())
    assert executor_command(specs[1]) == [
        sys.executable, "-m", "blockx.executor",
        "--executor-id", "exec-1",
        "--socket-path", str(tmp_path / "worker.sock"),
        "--heartbeat-interval", "0.5",
        "--executor-max-inflight", "64",
        "--executor-max-runnable", "32",
        "--blackbox-path", str(tmp_path / "exec-1.blackbox"),
        "--memory-limit-mb", "700",
        "--max-open-files", "512",
    ]  # fmt: skip
    assert specs[1].run_mark is not None and specs[1].run_mark.endswith(":exec-1:1")


def test_spawn_modes() -> None:
    assert spawner_for_mode("process").mode == "process"
    try:  # bubblewrap where it works here (tests/sandbox/), a clear refusal where not
        sandbox = spawner_for_mode("sandbox")
    except PoolError as exc:
        assert "sandbox" in str(exc)
    else:
        assert sandbox.mode == "sandbox"
        sandbox.close()  # type: ignore[attr-defined]
    with pytest.raises(PoolError, match="unknown"):
        spawner_for_mode("vm")


def test_pool_misuse() -> None:
    with pytest.raises(ValueError):
        PoolManager("/x", executor_count=0)
    with pytest.raises(ValueError):
        PoolManager("/x", executor_count=1, restart_window_ms=0)

    async def scenario() -> None:
        pool = pool_of(SLEEP)
        async with pool:
            with pytest.raises(AdapterUsageError):
                await pool.start()
            assert "RUNNING=1" in repr(pool)

    run(scenario())


@pytest.mark.slow
def test_eight_executors_start_in_parallel_without_stalling_the_loop() -> None:
    async def scenario() -> tuple[float, float]:
        pool = pool_of(SLEEP, count=8)
        lags: list[float] = []
        ticking = True

        async def ticker() -> None:
            while ticking:
                before = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - before - 0.001)

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.02)
        lags.clear()
        started = time.perf_counter()
        await pool.start()
        took = time.perf_counter() - started
        ticking = False
        await tick
        try:
            assert all(s.state is SlotState.RUNNING for s in pool.slots())
            assert len(set(pool.pids().values())) == 8
        finally:
            await pool.stop()
        return took, max(lags)

    took, worst_lag = run(scenario())
    # Spawns run on the pool's spawner thread: the loop keeps turning meanwhile
    # (bounds are loose: CI machines are shared).
    assert took < 10.0, took
    assert worst_lag < 0.5, worst_lag


PARENT_SCRIPT = """
import asyncio, os, signal, sys
sys.path[:0] = {paths!r}
from blockx.worker.pool import launch
from blockx.worker.pool.manager import PoolManager
from blockx.worker.pool.spawner import ProcessSpawner

if {force_prctl!r}:
    launch.setpriv_path = lambda: None

async def main():
    pool = PoolManager(
        "/nonexistent/worker.sock",
        executor_count=2,
        spawner=ProcessSpawner(argv_factory=lambda spec: [sys.executable, "-c",
                               "import time; time.sleep(60)"]),
    )
    await pool.start()
    with open({pid_file!r}, "w") as f:
        f.write(" ".join(str(p) for p in pool.pids().values()))
    await asyncio.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)  # die without any cleanup

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["setpriv", "prctl"])
def test_executors_die_with_a_killed_worker(tmp_path: Path, how: str) -> None:
    pid_file = tmp_path / "pids"
    script = PARENT_SCRIPT.format(
        paths=sys.path, force_prctl=how == "prctl", pid_file=str(pid_file)
    )
    worker = subprocess.run([PY, "-c", script], timeout=30, check=False)
    assert worker.returncode == -signal.SIGKILL
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(process_is_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"orphaned executors: {pids}"
        time.sleep(0.05)
    for pid in pids:  # belt and braces, should the assertion above ever be loosened
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _setpriv_at(directory: Path, body: str) -> None:
    """A ``setpriv`` script first on PATH: what it says to ``--help`` is ``body``."""
    program = directory / "setpriv"
    program.write_text(f"#!/bin/sh\necho '{body}'\n")
    program.chmod(0o755)


@pytest.mark.parametrize(
    ("help_text", "expected"),
    [
        ("Usage: setpriv [options] <program> --pdeathsig keep|clear|<signal>", True),
        ("Usage: setpriv [options] <program> --reuid <uid>", False),
    ],
)
def test_setpriv_is_used_only_when_it_knows_pdeathsig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, help_text: str, expected: bool
) -> None:
    # A script holds its help text: found in the file or asked for with --help, the
    # verdict is the option's presence either way.
    from blockx.worker.pool import launch

    _setpriv_at(tmp_path, help_text)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    launch.setpriv_path.cache_clear()
    try:
        found = launch.setpriv_path()
    finally:
        launch.setpriv_path.cache_clear()
    assert found == (str(tmp_path / "setpriv") if expected else None)


def test_setpriv_found_in_its_file_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The option's name in the program file decides without a --help run: this script
    # would leave a mark if it ran.
    from blockx.worker.pool import launch

    ran = tmp_path / "ran"
    program = tmp_path / "setpriv"
    program.write_text(f"#!/bin/sh\n# --pdeathsig\ntouch {ran}\necho --pdeathsig\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    launch.setpriv_path.cache_clear()
    try:
        assert launch.setpriv_path() == str(program)
    finally:
        launch.setpriv_path.cache_clear()
    assert not ran.exists()

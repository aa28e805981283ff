"""The executor fork server (blockx/executor/fork_server.py, blockx/worker/pool/fork_server.py):
a forked executor is this process's child, looks like a cold one in /proc, forwards its
output, dies with its worker; a server that fails or refuses leaves spawns cold."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from executor_peer import Recorder, process_is_gone

from blockx.executor.fork_server import unsupported
from blockx.wire import keys
from blockx.wire.launch import ExecutorArgs
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.pool import fork_server as worker_side
from blockx.worker.pool import process_tree
from blockx.worker.pool.fork_server import ForkedProcess, ForkServer, ForkServerError
from blockx.worker.pool.launch import ExecutorLaunchSpec
from blockx.worker.pool.manager import PoolManager
from blockx.worker.pool.process_tree import MARK_ENV
from blockx.worker.pool.spawner import ProcessSpawner

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(unsupported() is not None, reason=f"no fork server here: {unsupported()}"),
]

PY = sys.executable
MARK_PREFIX = process_tree.worker_mark_prefix()


def _cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode() for a in raw.split(b"\0") if a]


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (e.decode().partition("=") for e in entries if b"=" in e)
    return {k: v for k, _, v in pairs}


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def _spec(socket_path: str, executor_id: str = "exec-0", **args: object) -> ExecutorLaunchSpec:
    return ExecutorLaunchSpec(
        args=ExecutorArgs(executor_id=executor_id, socket_path=socket_path, **args),  # type: ignore[arg-type]
        # A mark of this live process: a made-up worker would make the executor an
        # orphan to any pool starting meanwhile (process_tree.kill_orphans kills those).
        run_mark=process_tree.mark_of(MARK_PREFIX, executor_id, 1),
    )


def _reap(process: subprocess.Popen[bytes] | ForkedProcess) -> int:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    code = process.wait(10)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    return code


def test_a_forked_executor_is_our_child_and_looks_like_a_cold_one(caplog) -> None:
    caplog.set_level(logging.INFO, logger="blockx.worker.executor")

    async def scenario() -> None:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks()) as adapter:
            spawner = ProcessSpawner(fork_server=True)
            pool = PoolManager(
                adapter.socket_path, executor_count=2, spawner=spawner, heartbeat_interval_s=0.2
            )
            async with pool:
                await rec.wait("attached", 2, timeout=60)
                server = spawner.fork_server
                assert server is not None and server.forked == 2 and server.pid is not None
                for executor_id, pid in pool.pids().items():
                    # The worker's child, not the server's: the pool reaps it as any other.
                    assert _ppid(pid) == os.getpid()
                    assert os.getpgid(pid) == pid and os.getsid(pid) == pid
                    argv = _cmdline(pid)
                    assert argv[:5] == [PY, "-m", "blockx.executor", "--executor-id", executor_id]
                    assert argv[argv.index("--socket-path") + 1] == adapter.socket_path
                    mark = _environ(pid)[MARK_ENV]
                    assert mark.split(":")[3:] == [executor_id, "1"], mark
                # The server: blockx run's `ps` shows it for what it is, and no mark.
                assert "blockx.executor.fork_server" in _cmdline(server.pid)
                assert _environ(server.pid)[MARK_ENV].startswith("fork-server")
            # Stopped: the executors exited 0 (SIGTERM) and were reaped; the server is gone.
            assert {s.last_returncode for s in pool.slots()} == {0}
            assert spawner.fork_server is None
            assert process_is_gone(server.pid)

    asyncio.run(scenario())
    # Their stderr reached the worker's log, line by line, with the executor id.
    started = [
        (r.executorId, r.executorStream)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "blockx.worker.executor" and "executor started" in r.getMessage()
    ]
    assert sorted(started) == [("exec-0", "stderr"), ("exec-1", "stderr")]


def test_exit_statuses_and_signals_of_forked_executors(tmp_path: Path) -> None:
    server = ForkServer()
    try:
        # No worker listens there: the executor gives up connecting and exits 3.
        gone = server.spawn(_spec(str(tmp_path / "none.sock"), connect_timeout=0.2))
        assert gone.wait(30) == 3
        assert b"executor start-up failed" in (gone.stderr.read() if gone.stderr else b"")
        # Its black box cannot be opened: start-up fails, status 4, as a cold executor.
        boxless = server.spawn(_spec(str(tmp_path / "none.sock"), blackbox_path="/proc/no/box"))
        assert boxless.wait(30) == 4
        assert b"cannot open the black box" in (boxless.stderr.read() if boxless.stderr else b"")
        # Killed: minus the signal, as Popen says it.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / "w.sock"))
        listener.listen(4)
        alive = server.spawn(_spec(str(tmp_path / "w.sock")))
        assert alive.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            alive.wait(0.05)
        alive.kill()
        assert alive.wait(10) == -signal.SIGKILL
        assert server.forked == 3
        for process in (gone, boxless, alive):
            _reap(process)
        listener.close()
    finally:
        server.close()


def test_a_refused_spawn_starts_cold_and_the_server_serves_on(tmp_path: Path, caplog) -> None:
    spawner = ProcessSpawner(fork_server=True)
    sock = str(tmp_path / "w.sock")
    try:
        first = spawner.spawn(_spec(sock))
        assert isinstance(first, ForkedProcess)
        # Flags longer than the room left for the command line: this one starts cold.
        long_box = str(tmp_path / ("b" * 200)) + "/" + "c" * 3000
        with caplog.at_level(logging.WARNING, logger="blockx.worker.pool"):
            cold = spawner.spawn(_spec(sock, "exec-1", blackbox_path=long_box))
        assert isinstance(cold, subprocess.Popen)
        assert "this one starts cold" in caplog.text and "longer than the room" in caplog.text
        again = spawner.spawn(_spec(sock, "exec-2"))
        assert isinstance(again, ForkedProcess)
        for process in (first, cold, again):
            _reap(process)
    finally:
        spawner.close()


def test_a_dead_fork_server_leaves_every_later_spawn_cold(tmp_path: Path, caplog) -> None:
    spawner = ProcessSpawner(fork_server=True)
    sock = str(tmp_path / "w.sock")
    try:
        first = spawner.spawn(_spec(sock))
        server = spawner.fork_server
        assert isinstance(first, ForkedProcess) and server is not None and server.pid
        os.kill(server.pid, signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="blockx.worker.pool"):
            second = spawner.spawn(_spec(sock, "exec-1"))
        assert isinstance(second, subprocess.Popen)
        assert "the fork server ended" in caplog.text and "start cold now" in caplog.text
        assert spawner.fork_server is None and server.broken is not None
        third = spawner.spawn(_spec(sock, "exec-2"))
        assert isinstance(third, subprocess.Popen)
        # The forked one still runs, and is still ours to reap.
        assert first.poll() is None and _ppid(first.pid) == os.getpid()
        for process in (first, second, third):
            _reap(process)
    finally:
        spawner.close()


def test_custom_spawns_never_use_the_fork_server(tmp_path: Path) -> None:
    for spawner in (
        ProcessSpawner(fork_server=True, argv_factory=lambda spec: [PY, "-c", "pass"]),
        ProcessSpawner(fork_server=True, extra_env={"A": "1"}),
        ProcessSpawner(fork_server=True, cwd=tmp_path),
        ProcessSpawner(fork_server=True, pdeathsig=False),
    ):
        assert spawner.fork_server is None
        process = spawner.spawn(_spec(str(tmp_path / "w.sock"), connect_timeout=0.1))
        assert isinstance(process, subprocess.Popen)
        _reap(process)
        assert spawner.fork_server is None
    other_python = ProcessSpawner(fork_server=True)
    spec = ExecutorLaunchSpec(
        args=ExecutorArgs(executor_id="exec-0", socket_path=str(tmp_path / "w.sock")),
        python=os.path.realpath(PY) + "",
    )
    if spec.python != PY:  # a venv's python is a link: another path, another interpreter
        process = other_python.spawn(spec)
        assert isinstance(process, subprocess.Popen)
        _reap(process)
    other_python.close()


WORKER_SCRIPT = """
import os, signal, socket, sys, time
sys.path[:0] = {paths!r}
from blockx.wire.launch import ExecutorArgs
from blockx.worker.pool.launch import ExecutorLaunchSpec
from blockx.worker.pool.spawner import ProcessSpawner

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind({sock!r})
listener.listen(8)
spawner = ProcessSpawner(fork_server=True)
pids = []
for i in range(2):
    spec = ExecutorLaunchSpec(args=ExecutorArgs(executor_id=f"exec-{{i}}", socket_path={sock!r}))
    pids.append(spawner.spawn(spec).pid)
pids.append(spawner.fork_server.pid)
with open({pid_file!r}, "w") as f:
    f.write(" ".join(map(str, pids)))
time.sleep(0.3)
os.kill(os.getpid(), signal.SIGKILL)  # die without any cleanup
"""


@pytest.mark.slow
def test_forked_executors_and_their_server_die_with_a_killed_worker(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    script = WORKER_SCRIPT.format(
        paths=sys.path, sock=str(tmp_path / "w.sock"), pid_file=str(pid_file)
    )
    worker = subprocess.run([PY, "-c", script], timeout=60, check=False)
    assert worker.returncode == -signal.SIGKILL
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while not all(process_is_gone(p) for p in pids):
        assert time.monotonic() < deadline, (
            f"left alive: {[p for p in pids if not process_is_gone(p)]}"
        )
        time.sleep(0.05)


PROBE = "BLOCKX_TEST_FORK_ENV"
DRAW = (
    "import os, random\n\n"
    "def _(p):\n"
    f"    return {{'r': random.getrandbits(64), 'env': os.environ.get({PROBE!r})}}\n"
)
DRAW_DIGEST = "sha256:" + hashlib.sha256(DRAW.encode()).hexdigest()


def _draw_call() -> dict[str, object]:
    return {
        keys.FP_TASK_ID: "t1",
        keys.FP_FUNCTION_ID: "draw",
        keys.FP_FUNCTION_CODE_DIGEST: DRAW_DIGEST,
        keys.FP_ENTRY_SELECTOR: "_",
        keys.FP_ARGS: {},
        keys.FP_CALL_BUDGET_MS: 10_000,
        keys.FP_ATTEMPT_SEQ: 1,
    }


def test_forked_executors_draw_their_own_random_numbers_in_their_spawns_environment() -> None:
    """Each child ran the at-fork hooks (``random`` reseeded: two executors of one server
    draw apart), and has the environment of its spawn: a variable changed after the
    server started (``blockx run`` sets the executors' log format so) reaches user code."""

    async def scenario() -> list[dict[str, object]]:
        rec = Recorder()
        async with ExecutorAdapter(
            callbacks=rec.callbacks(), function_code_resolver=lambda *_: DRAW
        ) as adapter:
            worker_side.start_early()  # the server starts with the variable "before"
            os.environ[PROBE] = "after"
            spawner = ProcessSpawner(fork_server=True)  # takes the early server
            assert spawner.fork_server is not None and spawner.fork_server.pid is not None
            pool = PoolManager(
                adapter.socket_path, executor_count=2, spawner=spawner, heartbeat_interval_s=0.2
            )
            async with pool:
                await rec.wait("attached", 2, timeout=60)
                for executor_id in ("exec-0", "exec-1"):
                    adapter.bind(f"t1/{executor_id}", executor_id)
                    adapter.send_execute_call(executor_id, f"t1/{executor_id}", _draw_call())
                completed = await rec.wait("completed", 2, timeout=30)
                assert spawner.fork_server is not None and spawner.fork_server.forked == 2
            return [payload[keys.FP_OUTPUT] for _, _, payload in completed]

    os.environ[PROBE] = "before"
    try:
        first, second = asyncio.run(scenario())
    finally:
        os.environ.pop(PROBE, None)
        worker_side.discard_early()
    assert first["env"] == second["env"] == "after"
    assert first["r"] != second["r"]


def test_blockx_run_uses_and_then_ends_its_fork_server(tmp_path: Path) -> None:
    token = f"fork-server-test-{os.getpid()}-{time.monotonic_ns()}"
    task = tmp_path / "task.yaml"
    task.write_text(
        textwrap.dedent(
            """\
            functions:
              f: {source: "def f(x):\\n    return x + 1\\n"}
            calls:
              - {function: f, args: [1]}
              - {function: f, args: [2]}
            """
        )
    )
    env = {**os.environ, "BLOCKX_TEST_TOKEN": token, "EXECUTOR_COUNT": "2"}
    env.pop("EXECUTOR_FORK_SERVER", None)
    done = subprocess.run(
        [PY, "-m", "blockx", "run", "-v", str(task)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "3"]
    assert "forked=2" in done.stderr, done.stderr
    assert not _processes_with(token), "a fork server outlived blockx run"
    # Off: the executors start cold, and no server runs.
    env["EXECUTOR_FORK_SERVER"] = "0"
    cold = subprocess.run(
        [PY, "-m", "blockx", "run", "-v", str(task)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert cold.returncode == 0, cold.stderr
    assert "ForkServer" not in cold.stderr and "pool started" in cold.stderr


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if token.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_the_early_server_is_taken_only_by_its_own_thread() -> None:
    worker_side.start_early()
    try:
        taken: list[ForkServer | None] = []
        other = threading.Thread(target=lambda: taken.append(worker_side.take_early()))
        other.start()
        other.join()
        assert taken == [None]
        server = worker_side.take_early()
        assert server is not None and server.pid is not None
        assert worker_side.take_early() is None  # once
        pid = server.pid
        server.close()
        assert pid is not None and process_is_gone(pid) and server.pid is None
    finally:
        worker_side.discard_early()


def test_a_fork_server_that_cannot_start_raises_and_spawns_go_cold(tmp_path: Path) -> None:
    server = ForkServer(python=str(tmp_path / "no-python"))
    with pytest.raises(ForkServerError, match="cannot start the fork server"):
        server.start()
    with pytest.raises(ForkServerError):
        server.spawn(_spec(str(tmp_path / "w.sock")))


def _gated_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that waits for ``gate`` to exist before it starts: a fork server
    started with it cannot answer until the test opens the gate."""
    gate = tmp_path / "gate"
    wrapper = tmp_path / "gated-python"
    wrapper.write_text(f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.02; done\nexec {PY} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, gate


def _early_pool(tmp_path: Path, wrapper: Path) -> tuple[PoolManager, ProcessSpawner]:
    worker_side.start_early(python=str(wrapper))  # blockx run's first step, this thread
    spawner = ProcessSpawner(fork_server=True)  # takes it
    assert spawner.fork_server is not None and spawner.fork_server.python == str(wrapper)
    pool = PoolManager(
        str(tmp_path / "w.sock"), executor_count=2, spawner=spawner, python=str(wrapper)
    )
    return pool, spawner


def _in_thread(function: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=function, daemon=True)
    thread.start()
    return thread


def test_early_spawns_send_their_requests_and_do_not_wait_for_the_server(tmp_path: Path) -> None:
    """blockx run's main thread sends the early spawns' requests and goes on importing the
    worker; the answers are awaited on the spawner thread (the server may still be
    importing itself)."""
    wrapper, gate = _gated_python(tmp_path)
    pool, spawner = _early_pool(tmp_path, wrapper)
    pids: list[int] = []
    try:
        spawning = _in_thread(pool.spawn_early)
        spawning.join(30)
        assert not spawning.is_alive(), "spawn_early waited for the fork server's answers"
        assert spawner.fork_server is not None and spawner.fork_server.forked == 0
        gate.touch()
        pids = pool.early_pids()
        assert len(pids) == 2 and all(_ppid(pid) == os.getpid() for pid in pids)
        assert spawner.fork_server.forked == 2
    finally:
        gate.touch()
        pool.discard_early()
    assert all(process_is_gone(pid) for pid in pids)


def test_early_spawns_discarded_before_the_server_answered_leave_no_executor(
    tmp_path: Path,
) -> None:
    wrapper, gate = _gated_python(tmp_path)
    pool, spawner = _early_pool(tmp_path, wrapper)
    pool.spawn_early()
    server = spawner.fork_server
    assert server is not None and server.forked == 0
    discarding = _in_thread(pool.discard_early)  # waits for the answers, then kills
    time.sleep(0.1)
    assert discarding.is_alive()
    gate.touch()
    discarding.join(60)
    assert not discarding.is_alive()
    assert server.forked == 2 and server.pid is None  # forked, then closed with the pool
    left = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _is_our_executor(int(entry.name))
    ]
    assert left == [], f"executors left behind: {left}"


def _is_our_executor(pid: int) -> bool:
    try:
        return _ppid(pid) == os.getpid() and "blockx.executor" in _cmdline(pid)
    except (OSError, IndexError, ValueError):
        return False


def test_wait_for_exit_reaps_an_exit_and_raises_past_its_timeout() -> None:
    # ForkServer's close waits for its server this way (a pidfd where Linux has one).
    quick = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(0.2); raise SystemExit(3)"]
    )
    assert worker_side.wait_for_exit(quick, 30.0) == 3
    assert quick.returncode == 3
    assert worker_side.wait_for_exit(quick, 30.0) == 3  # reaped already: its status again
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            worker_side.wait_for_exit(stuck, 0.2)
        assert stuck.poll() is None
    finally:
        stuck.kill()
        stuck.wait()
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    assert worker_side.wait_for_exit(killed, 30.0) == -signal.SIGKILL


def test_wait_for_exit_works_with_descriptors_past_select_s_limit() -> None:
    # A worker serving many connections holds descriptors past FD_SETSIZE (1024): the
    # pidfd it waits on is then one of them, which select() refuses.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}: cannot open 1,100 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held: list[int] = []
    try:
        while len(held) < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        quick = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"], close_fds=True)
        assert worker_side.wait_for_exit(quick, 30.0) == 4
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

"""Socket directories of dead workers are removed at the next pool start.

A worker removes its private socket directory when it stops; one killed with SIGKILL
cannot. Every directory names its worker in an ``owner`` file, and a pool starting
removes the directories beside its own whose worker no longer runs -- and nothing else
(blockx/worker/pool/listener.py).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from executor_peer import Recorder

from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.pool import listener, process_tree
from blockx.worker.pool.manager import PoolManager


def _namespace() -> str:
    return os.readlink("/proc/self/ns/pid")


def _dir(parent: Path, name: str, owner: str | None) -> Path:
    directory = parent / f"{listener.DIR_PREFIX}{name}"
    directory.mkdir()
    (directory / listener.SOCKET_NAME).write_bytes(b"")
    (directory / "exec-0.blackbox").write_bytes(b"\0" * 64)
    if owner is not None:
        (directory / listener.OWNER_NAME).write_text(owner)
    return directory


def _exited_pid() -> tuple[int, int]:
    """A pid and start time of a process that ran and is gone."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = process_tree.process_start_time(child.pid)
    assert start is not None
    child.kill()
    child.wait()
    return child.pid, start


def test_a_socket_directory_names_its_worker(tmp_path: Path) -> None:
    directory, path = listener.socket_dir(str(tmp_path))
    assert Path(path).parent == Path(directory)
    pid, start, namespace = (Path(directory) / listener.OWNER_NAME).read_text().split()
    assert int(pid) == os.getpid()
    assert int(start) == process_tree.process_start_time(os.getpid())
    assert namespace == _namespace()
    # Its own worker runs: a sweep leaves it.
    assert listener.sweep_dead_socket_dirs(str(tmp_path)) == []
    assert Path(directory).is_dir()


def test_only_directories_of_dead_workers_are_removed(tmp_path: Path) -> None:
    ns = _namespace()
    dead_pid, dead_start = _exited_pid()
    live = subprocess.Popen(["sleep", "60"])
    try:
        live_start = process_tree.process_start_time(live.pid)
        dead = _dir(tmp_path, "dead", f"{dead_pid} {dead_start} {ns}\n")
        # The pid runs, but it is another process than the one that made the directory.
        reused = _dir(tmp_path, "reused", f"{live.pid} {live_start + 1 if live_start else 1} {ns}")
        kept = {
            "live": _dir(tmp_path, "live", f"{live.pid} {live_start} {ns}\n"),
            "this process": _dir(
                tmp_path,
                "self",
                f"{os.getpid()} {process_tree.process_start_time(os.getpid())} {ns}",
            ),
            # A worker between mkdtemp and its owner write, or of an older version.
            "no owner": _dir(tmp_path, "no-owner", None),
            "malformed owner": _dir(tmp_path, "malformed", "not a pid"),
            # A worker that could not read its own start time wrote 0: never judged.
            "unknown start": _dir(tmp_path, "unknown-start", f"{dead_pid} 0 {ns}"),
            # A dead pid as seen from another PID namespace is never judged from here.
            "other namespace": _dir(tmp_path, "elsewhere", f"{dead_pid} {dead_start} pid:[1]"),
            "not ours by name": tmp_path / "other-dir",
        }
        kept["not ours by name"].mkdir()
        (kept["not ours by name"] / listener.OWNER_NAME).write_text(f"{dead_pid} {dead_start} {ns}")
        # A link to a dead worker's directory is not followed (nor removed).
        elsewhere = tmp_path / "target"
        elsewhere.mkdir()
        (elsewhere / listener.OWNER_NAME).write_text(f"{dead_pid} {dead_start} {ns}")
        link = tmp_path / f"{listener.DIR_PREFIX}link"
        link.symlink_to(elsewhere)

        removed = listener.sweep_dead_socket_dirs(str(tmp_path))

        assert sorted(removed) == sorted([str(dead), str(reused)])
        assert not dead.exists() and not reused.exists()
        for name, directory in kept.items():
            assert directory.is_dir(), name
        assert link.is_symlink() and elsewhere.is_dir()
    finally:
        live.kill()
        live.wait()


def test_a_missing_parent_is_no_error(tmp_path: Path) -> None:
    assert listener.sweep_dead_socket_dirs(str(tmp_path / "nowhere")) == []
    assert listener.sweep_beside(str(tmp_path / "plain" / "worker.sock")) == []


#: A worker's link and pool in a process of its own, its socket directory under argv[1]:
#: prints that directory once its executor attached, then waits to be killed.
WORKER = r"""
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from executor_peer import Recorder
from blockx.worker.link.adapter import ExecutorAdapter
from blockx.worker.pool.manager import PoolManager

async def main():
    rec = Recorder()
    async with ExecutorAdapter(callbacks=rec.callbacks(), socket_dir=sys.argv[1]) as adapter:
        pool = PoolManager(adapter.socket_path, executor_count=1, heartbeat_interval_s=0.2)
        adapter.set_peer_check(pool.check_peer)
        async with pool:
            await rec.wait("attached", timeout=60)
            print(adapter.socket_dir, flush=True)
            await asyncio.sleep(300)

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_directory_of_a_worker_killed_with_sigkill_goes_at_the_next_pool_start(
    tmp_path: Path,
) -> None:
    here = os.path.dirname(__file__)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path), here], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline().strip()
        assert line, f"the worker never attached its executor (exit {worker.poll()})"
    finally:
        worker.kill()
        worker.wait()
    left = Path(line)
    assert left.parent == tmp_path and (left / listener.SOCKET_NAME).exists()

    async def scenario() -> Path:
        rec = Recorder()
        async with ExecutorAdapter(callbacks=rec.callbacks(), socket_dir=tmp_path) as adapter:
            pool = PoolManager(adapter.socket_path, executor_count=1, heartbeat_interval_s=0.2)
            adapter.set_peer_check(pool.check_peer)
            async with pool:
                await rec.wait("attached", timeout=60)
                assert not left.exists()
                mine = Path(adapter.socket_dir)
                assert mine.is_dir()
                return mine

    mine = asyncio.run(scenario())
    # And a worker that stops removes its own, as always.
    deadline = time.monotonic() + 10
    while mine.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not mine.exists()
    assert list(tmp_path.iterdir()) == []

"""The sandbox spawner's pieces: detection and its skip reason, the environment
whitelist, the bubblewrap command, the cgroup layout parsing and the limit plan,
and the executor itself speaking the protocol from inside the sandbox (driven
by the test-side worker, no worker runtime)."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from sandbox_support import SANDBOX_OK, SANDBOX_REASON, needs_sandbox
from tests.helpers.fake_worker import FakeWorker, IoReply

from blockx.wire import Frame, keys
from blockx.wire.launch import ExecutorArgs
from blockx.worker.config import ConfigError, load_config
from blockx.worker.errors import PoolError
from blockx.worker.pool.cgroups import (
    CgroupError,
    ResourceLimits,
    parse_mountinfo,
    parse_proc_cgroup,
    plan_limits,
)
from blockx.worker.pool.launch import ExecutorLaunchSpec
from blockx.worker.pool.sandbox import (
    CHILD_ENV_KEYS,
    SandboxSettings,
    SandboxSpawner,
    child_environment,
    python_import_roots,
    python_read_roots,
    sandbox_available,
)
from blockx.worker.pool.spawner import spawner_for_mode

pytestmark = [pytest.mark.timeout(60)]


def blockx_file() -> str:
    import blockx

    return os.path.abspath(blockx.__file__)


# --- detection ---------------------------------------------------------------------------


def test_detection_says_why_when_bubblewrap_is_missing() -> None:
    ok, reason = sandbox_available("/nonexistent/bwrap-for-blockx-tests")
    assert not ok
    assert "not installed" in reason and "bubblewrap" in reason


def test_detection_on_this_machine_is_stated() -> None:
    ok, reason = sandbox_available()
    assert (ok, reason) == (SANDBOX_OK, SANDBOX_REASON)
    assert reason  # the skip reason of every sandbox test is never empty


def test_the_sandbox_mode_is_refused_with_the_reason_where_it_cannot_run() -> None:
    settings = SandboxSettings(bwrap="/nonexistent/bwrap-for-blockx-tests")
    with pytest.raises(PoolError, match=r"sandbox is not available.*not installed"):
        SandboxSpawner(settings).prepare()


# --- configuration ----------------------------------------------------------------------


def test_sandbox_knobs_come_from_the_config() -> None:
    config = load_config(
        env={
            "EXECUTOR_SPAWN_MODE": "sandbox",
            "EXECUTOR_SANDBOX_MEMORY_MB": "512",
            "EXECUTOR_SANDBOX_CPUS": "0.5",
            "EXECUTOR_SANDBOX_PIDS_MAX": "0",
            "EXECUTOR_SANDBOX_LIMITS": "rlimit",
            "EXECUTOR_SANDBOX_RO_BINDS": "/opt/models:/srv/data/",
        }
    )
    settings = SandboxSettings.from_pool(config.pool)
    assert settings == SandboxSettings(
        memory_mb=512,
        cpus=0.5,
        pids_max=0,
        limits_mode="rlimit",
        ro_binds=("/opt/models", "/srv/data"),
    )
    assert settings.limits() == ResourceLimits(memory_bytes=512 << 20, cpus=0.5, pids_max=0)
    defaults = SandboxSettings.from_pool(load_config(env={}).pool)
    assert (defaults.memory_mb, defaults.cpus, defaults.pids_max) == (1024, 1.0, 256)
    with pytest.raises(ConfigError, match="EXECUTOR_SANDBOX_CPUS"):
        load_config(env={"EXECUTOR_SANDBOX_CPUS": "-1"})
    with pytest.raises(ConfigError, match="EXECUTOR_SANDBOX_LIMITS"):
        load_config(env={"EXECUTOR_SANDBOX_LIMITS": "docker"})
    with pytest.raises(PoolError, match="absolute"):
        SandboxSettings.from_pool(load_config(env={"EXECUTOR_SANDBOX_RO_BINDS": "rel/path"}).pool)


def test_the_environment_is_the_whitelist_plus_the_base() -> None:
    worker_env = {
        "BLOCKX_LOG_LEVEL": "debug",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "LEAFAGE_ENDPOINT": "http://node",
        "PROXY_SOCKET_PATH": "/run/proxy.sock",
        "AWS_SECRET_ACCESS_KEY": "no",
        "DATABASE_URL": "postgres://user:pw@db/x",
        "PYTHONPATH": "/somewhere",
        "LD_PRELOAD": "/evil.so",
        "HOME": "/root",
        "PATH": "/root/bin:/usr/bin",
    }
    env = child_environment(worker_env)
    assert env == {
        "BLOCKX_LOG_LEVEL": "debug",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "LEAFAGE_ENDPOINT": "http://node",
        "PROXY_SOCKET_PATH": "/run/proxy.sock",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
    }
    assert {
        "BLOCKX_LOG_FORMAT",
        "BLOCKX_EXECUTOR_CODE_CACHE_MAX_ENTRIES",
        "BLOCKX_EXECUTOR_ABI_CACHE_TRIM_THRESHOLD",
        "BLOCKX_EXECUTOR_RUNTIME",
    } <= CHILD_ENV_KEYS


@needs_sandbox
def test_the_bubblewrap_command() -> None:
    spawner = SandboxSpawner(
        SandboxSettings(memory_mb=0, cpus=0, pids_max=0), environ={"DATABASE_URL": "x"}
    )
    spec = ExecutorLaunchSpec(
        args=ExecutorArgs(executor_id="exec-3", socket_path="/tmp/blockx-w-1/worker.sock")
    )
    argv = spawner.command(spec)
    text = " ".join(argv)
    for option in (
        "--unshare-all --unshare-user",
        "--uid 65534 --gid 65534",
        "--die-with-parent",
        "--new-session",
        "--cap-drop ALL",
        "--clearenv",
        "--ro-bind /usr /usr",
        "--proc /proc",
        "--dev /dev --remount-ro /dev",
        "--tmpfs /tmp",
        "--ro-bind /tmp/blockx-w-1 /tmp/blockx-w-1",
        "--remount-ro /",
    ):
        assert option in text, option
    assert "DATABASE_URL" not in text
    # Nothing is bound read-write; only read-only binds of what the executor needs.
    assert "--bind " not in text and "--dev-bind" not in text
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]
    for path in binds:
        assert path not in ("/", "/root", "/home", "/etc", str(Path.home()))
    # The program: the interpreter isolated (-I), the executor's own flags.
    dash = argv.index("--", argv.index("--remount-ro"))
    assert argv[dash + 1 : dash + 3] == [sys.executable, "-I"]
    assert argv[dash + 3] == "-c" and "blockx.executor" in argv[dash + 4]
    assert argv[dash + 5 :][:4] == ["--executor-id", "exec-3", "--socket-path", spec.socket_path]
    spawner.close()


@needs_sandbox
def test_the_black_box_is_the_one_file_bound_read_write() -> None:
    spawner = SandboxSpawner(SandboxSettings(memory_mb=0, cpus=0, pids_max=0))
    spec = ExecutorLaunchSpec(
        args=ExecutorArgs(
            executor_id="exec-3",
            socket_path="/tmp/blockx-w-1/worker.sock",
            blackbox_path="/tmp/blockx-w-1/exec-3.blackbox",
        )
    )
    argv = spawner.command(spec)
    writable = [argv[i + 1 : i + 3] for i, a in enumerate(argv) if a in ("--bind", "--dev-bind")]
    assert writable == [[spec.blackbox_path, spec.blackbox_path]]
    # After the read-only bind of its directory, so it is writable on top of it.
    assert argv.index("--bind") > argv.index("/tmp/blockx-w-1")
    assert argv[argv.index("--blackbox-path") + 1] == spec.blackbox_path
    spawner.close()


def test_read_only_roots_never_take_a_home_or_top_level_directory_whole() -> None:
    roots = python_read_roots(sys.executable, python_import_roots())

    def visible(path: str) -> bool:
        return path.startswith("/usr/") or any(path.startswith(r + "/") for r in roots)

    assert visible(os.path.realpath(sys.executable)) and visible(blockx_file())
    home = os.path.expanduser("~")
    broad = python_read_roots(os.path.join(home, "bin", "python"), ["/root", "/"])
    assert not {home, "/root", "/"} & set(broad)


@needs_sandbox
def test_spawner_for_mode_builds_a_prepared_sandbox_spawner() -> None:
    config = load_config(env={"EXECUTOR_SPAWN_MODE": "sandbox"})
    spawner = spawner_for_mode("sandbox", config.pool)
    try:
        assert isinstance(spawner, SandboxSpawner) and spawner.mode == "sandbox"
        assert spawner.plan is not None
        assert "memory 1024 MiB" in repr(spawner)
    finally:
        spawner.close()
    if spawner.plan.cgroups is not None:
        assert all(not os.path.exists(b) for b in spawner.plan.cgroups.bases.values())


@needs_sandbox
def test_a_spawner_dropped_without_close_removes_its_cgroups() -> None:
    spawner = spawner_for_mode("sandbox")
    assert isinstance(spawner, SandboxSpawner) and spawner.plan is not None
    if spawner.plan.cgroups is None:
        pytest.skip("no usable cgroups here: nothing to remove")
    bases = list(spawner.plan.cgroups.bases.values())
    assert all(os.path.isdir(b) for b in bases)
    del spawner
    gc.collect()
    assert not any(os.path.exists(b) for b in bases)


# --- cgroup layout and the limit plan ---------------------------------------------------

MOUNTINFO = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
29 25 0:26 /docker/abc /sys/fs/cgroup/pids rw,relatime shared:5 - cgroup cgroup rw,pids
30 1 8:1 / / rw - ext4 /dev/root rw
31 25 0:27 / /sys/fs/cgroup/with\\040space rw - cgroup cgroup rw,name=x
"""

PROC_CGROUP = """\
12:pids:/docker/abc
4:memory:/process_api/eae4
2:cpu,cpuacct:/
1:name=x:/
0::/
"""


def test_parsing_the_cgroup_layout() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert [(m.mount_point, m.fstype) for m in mounts] == [
        ("/sys/fs/cgroup/unified", "cgroup2"),
        ("/sys/fs/cgroup/memory", "cgroup"),
        ("/sys/fs/cgroup/cpu,cpuacct", "cgroup"),
        ("/sys/fs/cgroup/pids", "cgroup"),
        ("/sys/fs/cgroup/with space", "cgroup"),
    ]
    assert "cpu" in mounts[2].super_options and mounts[3].root == "/docker/abc"
    v2, v1 = parse_proc_cgroup(PROC_CGROUP)
    assert v2 == "/"
    assert v1 == {
        "pids": "/docker/abc",
        "memory": "/process_api/eae4",
        "cpu": "/",
        "cpuacct": "/",
        "name=x": "/",
    }


def _fake_tree(tmp_path: Path, *, v2_controllers: str) -> tuple[str, str]:
    """A cgroup v2 mount in a plain directory (no kernel behind it)."""
    root = tmp_path / "cg"
    (root / "user").mkdir(parents=True)
    (root / "user" / "cgroup.controllers").write_text(v2_controllers + "\n")
    (root / "user" / "cgroup.subtree_control").write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"26 25 0:23 / {root} rw - cgroup2 cgroup2 rw\n")
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/user\n")
    return str(mountinfo), str(cgroup)


def test_a_v2_hierarchy_without_memory_and_cpu_is_not_used(tmp_path: Path) -> None:
    mountinfo, cgroup = _fake_tree(tmp_path, v2_controllers="hugetlb pids")
    limits = ResourceLimits(memory_bytes=64 << 20, cpus=1.0, pids_max=32)
    plan = plan_limits(limits, "auto", mountinfo_path=mountinfo, cgroup_path=cgroup)
    # No v1 hierarchy in this fake layout either: memory falls back to RLIMIT_AS.
    assert plan.cgroups is None
    assert plan.rlimit_as == 64 << 20 and plan.unenforced == ("cpu", "pids")
    assert any("needs memory, cpu" in note for note in plan.notes)
    assert "NOT limited: cpu, pids" in plan.describe()
    with pytest.raises(CgroupError, match="cgroup2"):
        plan_limits(limits, "cgroup2", mountinfo_path=mountinfo, cgroup_path=cgroup)
    with pytest.raises(CgroupError, match="cgroup1"):
        plan_limits(limits, "cgroup1", mountinfo_path=mountinfo, cgroup_path=cgroup)


def test_rlimit_mode_and_no_limits() -> None:
    limits = ResourceLimits(memory_bytes=128 << 20, cpus=2.0, pids_max=0)
    plan = plan_limits(limits, "rlimit")
    assert plan.cgroups is None and plan.rlimit_as == 128 << 20 and plan.unenforced == ("cpu",)
    nothing = plan_limits(ResourceLimits(), "auto")
    assert nothing.cgroups is None and nothing.rlimit_as is None and nothing.unenforced == ()
    with pytest.raises(CgroupError, match="unknown limit mode"):
        plan_limits(limits, "systemd")


# --- the executor alone, in the sandbox ---------------------------------------------------

ECHO = "def _(x):\n    return {'y': x + 1}\n"
ONE_READ = """\
import os
from blockx.sdk import get_provider


def _(i):
    value = get_provider().read_req("blockdb", "get_row", {"i": i})
    return {"i": i, "value": value["v"], "uid": os.getuid(), "pid": os.getpid()}
"""


class _SandboxedFakeWorker(FakeWorker):
    """The test-side worker, spawning its executor through the sandbox spawner."""

    def command(self) -> list[str]:
        spec = ExecutorLaunchSpec(
            args=ExecutorArgs(
                executor_id=self.executor_id,
                socket_path=self.socket_path,
                executor_max_inflight=self.max_inflight,
                executor_max_runnable=self.max_runnable,
                heartbeat_interval=float(self.heartbeat_interval),
            )
        )
        spawner = SandboxSpawner(
            SandboxSettings(memory_mb=0, cpus=0, pids_max=0),
            environ={"BLOCKX_LOG_LEVEL": "debug"},
        )
        return spawner.command(spec)


@needs_sandbox
@pytest.mark.slow
def test_the_executor_speaks_the_protocol_from_inside_the_sandbox() -> None:
    def io(frame: Frame) -> Any:
        params = frame.envelope[keys.F_PAYLOAD][keys.FP_PARAMS]
        return IoReply(result={"v": params["i"] * 10}, budget_used_ms=1)

    worker = _SandboxedFakeWorker(io_handler=io)
    with worker:
        worker.execute_call("c1", source=ECHO, function_id="echo", args=41)
        done = worker.wait_terminal("c1")
        assert done.message_type == keys.MT_CALL_COMPLETED
        assert done.envelope[keys.F_PAYLOAD][keys.FP_OUTPUT] == {"y": 42}
        worker.execute_call("c2", source=ONE_READ, function_id="reader", args=4)
        done = worker.wait_terminal("c2")
        assert done.message_type == keys.MT_CALL_COMPLETED, done.envelope
        output = done.envelope[keys.F_PAYLOAD][keys.FP_OUTPUT]
        assert output["value"] == 40 and output["uid"] == 65534
        assert output["pid"] < 10  # the sandbox's own pid namespace
        assert worker.function_code_requests == 2 and worker.io_requests == 1
        heartbeat = worker.heartbeats[-1].envelope[keys.F_PAYLOAD]
        assert heartbeat[keys.FP_MEMORY_BYTES] > 0  # the metrics probe works in there

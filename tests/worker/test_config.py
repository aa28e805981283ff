"""WorkerConfig: defaults, file, environment, overrides, validation messages, derived values."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from blockx.worker.config import (
    AdapterConfig,
    ConfigError,
    DispatcherSettings,
    PoolConfig,
    WorkerConfig,
    iter_knobs,
    knob_table,
    load_config,
)


def test_defaults_are_the_seeds() -> None:
    c = load_config(env={})
    assert c.pool.executor_count == 8  # the seed's default (`blockx run`: one per core)
    assert c.pool.spawn_mode == "process"
    assert (c.pool.restart_delay_ms, c.pool.max_restarts) == (1000, 10)
    assert (c.pool.restart_window_ms, c.pool.backoff_ms) == (60_000, 30_000)
    assert c.pool.heartbeat_interval_s == 1.0
    d = c.dispatcher
    assert (d.executor_max_inflight, d.executor_max_runnable) == (128, 128)
    assert d.executor_selection_sample_size == 0
    assert d.executor_memory_high_watermark == 0
    assert d.task_max_inflight_calls == 1024
    assert d.call_deadline_ms == 5000
    assert d.scheduler_stall_timeout_ms is None and d.stall_timeout_ms == 10_000
    assert (d.max_subcall_depth, d.base_backoff_ms) == (8, 10)
    assert d.instance_fairness is False and d.instance_fairness_quantum == 0
    assert d.max_collected_output_bytes == 0
    assert d.default_max_attempts == 3
    assert c.admission.executor_task_slots == 32
    sb = c.stream_build
    assert (sb.enabled, sb.max_outstanding_batches, sb.batch_max_rows) == (False, 2, 8192)
    assert sb.batch_max_args_bytes == 32 * 1024 * 1024
    assert c.adapter.heartbeat_timeout_ms == 10_000
    assert (c.adapter.outbox_depth, c.adapter.frames_per_write) == (256, 64)
    # Coupled: stall (10000) + 5000.
    assert c.heartbeat_timeout_ms == 15_000
    assert WorkerConfig() == c


def test_environment_overrides_defaults() -> None:
    c = load_config(
        env={
            "EXECUTOR_COUNT": "3",
            "EXECUTOR_SPAWN_MODE": "SANDBOX",
            "CALL_DEADLINE_MS": " 2000 ",
            "DISPATCH_INSTANCE_FAIRNESS": "yes",
            "DISPATCH_INSTANCE_FAIRNESS_QUANTUM": "16",
            "EXECUTOR_SELECTION_SAMPLE_SIZE": "2",
            "MAX_COLLECTED_OUTPUT_BYTES": "1_000_000",
            "CALL_RETRY_MAX_ATTEMPTS": "5",
            "EXECUTOR_TASK_SLOTS": "4",
            "EXECUTOR_HEARTBEAT_INTERVAL_S": "0.25",
            "EXECUTOR_SOCKET_DIR": "/run/blockx",
            "STREAM_BUILD_ENABLED": "on",
            "UNRELATED": "x",
        }
    )
    assert c.pool.executor_count == 3 and c.pool.spawn_mode == "sandbox"
    assert c.dispatcher.call_deadline_ms == 2000 and c.dispatcher.stall_timeout_ms == 7000
    assert c.dispatcher.instance_fairness is True
    assert c.dispatcher.instance_fairness_quantum == 16
    assert c.dispatcher.executor_selection_sample_size == 2
    assert c.dispatcher.max_collected_output_bytes == 1_000_000
    assert c.dispatcher.default_max_attempts == 5
    assert c.admission.executor_task_slots == 4
    assert c.pool.heartbeat_interval_s == 0.25
    assert c.adapter.socket_dir == "/run/blockx"
    assert c.stream_build.enabled is True
    assert c.heartbeat_timeout_ms == 12_000


def test_empty_environment_variables_count_as_unset() -> None:
    c = load_config(env={"CALL_DEADLINE_MS": "", "EXECUTOR_SOCKET_DIR": "  "})
    assert c.dispatcher.call_deadline_ms == 5000 and c.adapter.socket_dir is None


def test_toml_file_then_environment_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(
        "[pool]\nexecutor_count = 4\nrestart_delay_ms = 10\n"
        "[dispatcher]\ncall_deadline_ms = 3000\ninstance_fairness = true\n"
    )
    c = load_config(path, env={"EXECUTOR_COUNT": "6"}, overrides={"pool.restart_delay_ms": 20})
    assert c.pool.executor_count == 6  # environment beats the file
    assert c.pool.restart_delay_ms == 20  # overrides beat everything
    assert c.dispatcher.call_deadline_ms == 3000  # from the file
    assert c.dispatcher.instance_fairness is True


def test_json_file_and_nested_overrides(tmp_path: Path) -> None:
    path = tmp_path / "worker.json"
    path.write_text(json.dumps({"admission": {"executor_task_slots": 8}}))
    c = load_config(path, env={}, overrides={"stream_build": {"batch_max_rows": "100"}})
    assert c.admission.executor_task_slots == 8
    assert c.stream_build.batch_max_rows == 100


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[admission]\nexecutor_task_slots = 2\n")
    c = load_config(env={"BLOCKX_CONFIG": str(path)})
    assert c.admission.executor_task_slots == 2


def test_environment_errors_name_the_variable_and_value() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            env={
                "CALL_DEADLINE_MS": "abc",
                "EXECUTOR_COUNT": "0",
                "DISPATCH_INSTANCE_FAIRNESS": "maybe",
                "EXECUTOR_SPAWN_MODE": "vm",
                "EXECUTOR_HEARTBEAT_INTERVAL_S": "-1",
                "EXECUTOR_MAX_INFLIGHT": "-5",
            }
        )
    assert set(info.value.problems) == {
        "CALL_DEADLINE_MS='abc': expected a non-negative integer",
        "EXECUTOR_COUNT='0': expected a positive integer",
        "DISPATCH_INSTANCE_FAIRNESS='maybe': expected true or false (1/0, yes/no, on/off)",
        "EXECUTOR_SPAWN_MODE='vm': expected one of process, sandbox",
        "EXECUTOR_HEARTBEAT_INTERVAL_S='-1': expected a positive number",
        "EXECUTOR_MAX_INFLIGHT='-5': expected a non-negative integer",
    }
    assert isinstance(info.value, ValueError)


def test_file_errors_name_the_file_and_knob(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(
        '[pool]\nexecutor_count = 0\nexecutor_cuont = 2\n[dispatcher]\ncall_deadline_ms = "x"\n'
        "[nonsense]\na = 1\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert set(info.value.problems) == {
        f"{path}: pool.executor_count=0: expected a positive integer",
        f"{path}: unknown knob pool.executor_cuont",
        f"{path}: dispatcher.call_deadline_ms='x': expected a non-negative integer",
        f"{path}: unknown knob nonsense",
    }


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration file"):
        load_config(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[pool\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a table of sections"):
        load_config(bad_json, env={})


def test_override_errors() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={"pool.executor_count": True, "pool.nope": 1})
    assert set(info.value.problems) == {
        "pool.executor_count=True: expected a positive integer",
        "unknown knob pool.nope",
    }


def test_direct_construction_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"pool\.executor_count=0: expected a positive"):
        PoolConfig(executor_count=0)
    with pytest.raises(ConfigError, match="max_backoff_ms"):
        DispatcherSettings(base_backoff_ms=100, max_backoff_ms=50)
    with pytest.raises(ConfigError, match="adapter: expected a AdapterConfig"):
        WorkerConfig(adapter="fast")  # type: ignore[arg-type]
    # Strings are parsed like the environment's.
    assert AdapterConfig(outbox_depth="12").outbox_depth == 12  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("deadline", "requested", "stall"),
    [
        (5000, None, 10_000),  # derived
        (5000, 6000, 10_000),  # at or below deadline + 1000: raised to the derived value
        (5000, 6001, 6001),  # above: kept
        (5000, 30_000, 30_000),
        (0, None, 5000),  # unlimited budget
    ],
)
def test_stall_timeout_derivation(deadline: int, requested: int | None, stall: int) -> None:
    d = DispatcherSettings(call_deadline_ms=deadline, scheduler_stall_timeout_ms=requested)
    assert d.stall_timeout_ms == stall
    env = {"CALL_DEADLINE_MS": str(deadline)}
    if requested is not None:
        env["SCHEDULER_STALL_TIMEOUT_MS"] = str(requested)
    assert load_config(env=env).stall_timeout_ms == stall


@pytest.mark.parametrize(
    ("heartbeat", "stall", "effective"),
    [(10_000, None, 15_000), (60_000, None, 60_000), (1000, 30_000, 35_000)],
)
def test_heartbeat_timeout_is_coupled_to_the_stall_timeout(
    heartbeat: int, stall: int | None, effective: int
) -> None:
    c = load_config(
        env={},
        overrides={
            "adapter.heartbeat_timeout_ms": heartbeat,
            "dispatcher.scheduler_stall_timeout_ms": stall,
        },
    )
    assert c.heartbeat_timeout_ms == effective


def test_replace_re_derives() -> None:
    c = load_config(env={})
    shorter = c.replace(**{"dispatcher.call_deadline_ms": 1000, "pool.executor_count": 2})
    assert shorter.stall_timeout_ms == 6000 and shorter.heartbeat_timeout_ms == 11_000
    assert shorter.pool.executor_count == 2
    assert c.pool.executor_count == 8  # the original is unchanged
    with pytest.raises(ConfigError):
        c.replace(**{"dispatcher.call_deadline_ms": -1})


def test_dispatcher_kwargs_build_the_cores_config() -> None:
    core_config = pytest.importorskip("blockx.worker.core.config")
    c = load_config(
        env={"CALL_DEADLINE_MS": "2000", "DISPATCH_INSTANCE_FAIRNESS_QUANTUM": "4096"},
        overrides={"stream_build.max_outstanding_batches": 3},
    )
    core = core_config.DispatcherConfig(**c.dispatcher_kwargs())
    assert core.call_deadline_ms == 2000
    assert core.stall_timeout_ms == c.stall_timeout_ms == 7000
    assert core.max_outstanding_batches == 3
    assert core.fairness_quantum == 1024  # the seed's cap, applied by the core
    init_fields = {f.name for f in dataclasses.fields(core_config.DispatcherConfig) if f.init}
    assert set(c.dispatcher_kwargs()) <= init_fields


def test_the_knob_table_lists_every_knob() -> None:
    table = knob_table()
    knobs = list(iter_knobs())
    for section, name, f in knobs:
        assert f"``{section}.{name}``\n    ``{f.metadata['env']}``" in table
    knobs = list(iter_knobs())
    assert len(knobs) == 44  # pool.fork_server: +1
    envs = [f.metadata["env"] for _, _, f in knobs]
    assert len(set(envs)) == len(envs)
    seed_envs = {f.metadata["env"] for _, _, f in knobs if f.metadata["seed_env"]}
    assert seed_envs == {
        "EXECUTOR_COUNT",
        "EXECUTOR_SPAWN_MODE",
        "EXECUTOR_SELECTION_SAMPLE_SIZE",
        "CALL_DEADLINE_MS",
        "SCHEDULER_STALL_TIMEOUT_MS",
        "DISPATCH_INSTANCE_FAIRNESS",
        "DISPATCH_INSTANCE_FAIRNESS_QUANTUM",
        "MAX_COLLECTED_OUTPUT_BYTES",
        "CALL_RETRY_MAX_ATTEMPTS",
        "EXECUTOR_TASK_SLOTS",
    }
    markdown = knob_table(markdown=True)
    assert markdown.count("\n") == len(knobs) + 1
    assert "| `dispatcher.call_deadline_ms` | `CALL_DEADLINE_MS` (seed) | `5000` |" in markdown


def test_budget_knobs_are_bounded_to_a_day() -> None:
    from blockx.worker.config import MAX_DURATION_MS

    assert MAX_DURATION_MS == 86_400_000
    ok = load_config(env={"CALL_DEADLINE_MS": "86400000", "EXECUTOR_BACKOFF_MS": "0"})
    assert ok.dispatcher.call_deadline_ms == 86_400_000
    with pytest.raises(ConfigError) as info:
        load_config(
            env={
                "CALL_DEADLINE_MS": "10000000000000",
                "SCHEDULER_STALL_TIMEOUT_MS": "86400001",
                "EXECUTOR_HEARTBEAT_TIMEOUT_MS": "99999999999",
                "EXECUTOR_ATTACH_TIMEOUT_MS": "0",
            }
        )
    problems = "\n".join(info.value.problems)
    assert (
        "CALL_DEADLINE_MS='10000000000000': expected a non-negative integer of at most 86400000"
        in problems
    )
    assert "SCHEDULER_STALL_TIMEOUT_MS" in problems and "EXECUTOR_HEARTBEAT_TIMEOUT_MS" in problems
    assert "EXECUTOR_ATTACH_TIMEOUT_MS='0': expected a positive integer" in problems


def test_executor_memory_and_descriptor_limits() -> None:
    from blockx.worker.config import auto_memory_limit_mb

    default = load_config(env={})
    assert default.pool.memory_limit_mb is None  # sized from the machine
    effective = default.pool.memory_limit_mb_effective
    assert 256 <= effective <= 4096 and effective == auto_memory_limit_mb(8)
    assert auto_memory_limit_mb(10_000_000) == 256  # never below the floor
    assert default.pool.max_open_files == 1024
    none = load_config(env={"EXECUTOR_MEMORY_LIMIT_MB": "0", "EXECUTOR_MAX_OPEN_FILES": "0"})
    assert none.pool.memory_limit_mb_effective == 0 and none.pool.max_open_files == 0
    set_ = load_config(env={"EXECUTOR_MEMORY_LIMIT_MB": "700"})
    assert set_.pool.memory_limit_mb_effective == 700
    with pytest.raises(ConfigError, match="EXECUTOR_MEMORY_LIMIT_MB='-1'"):
        load_config(env={"EXECUTOR_MEMORY_LIMIT_MB": "-1"})
    with pytest.raises(ConfigError, match="EXECUTOR_MAX_OPEN_FILES='abc'"):
        load_config(env={"EXECUTOR_MAX_OPEN_FILES": "abc"})

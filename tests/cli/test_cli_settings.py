"""build_settings: the CLI's layers resolved by the one configuration model (in process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockx.cli.settings import UsageError, build_settings
from blockx.worker.config_kinds import cpu_count


def test_the_cli_layers_and_their_sources(tmp_path: Path) -> None:
    conf = tmp_path / "w.toml"
    conf.write_text("[dispatcher]\ncall_deadline_ms = 3000\n[io.rpc]\ntimeout_s = 5\n")
    settings = build_settings(
        config_file=str(conf),
        sets=["pool.executor_count=3", "RPC_MAX_BATCH=9"],
        executors=2,
        task_io={"rpc": {"timeout_s": 6}},
        task_label="t.yaml",
        environ={"EXECUTOR_COUNT": "5", "RPC_TIMEOUT_S": "4"},
    )
    # --executors wins over --set, and its source says so (it said "--set" before).
    assert settings.worker.pool.executor_count == 2
    assert settings.sources["pool.executor_count"] == "--executors"
    assert settings.worker.dispatcher.call_deadline_ms == 3000
    assert settings.sources["dispatcher.call_deadline_ms"] == f"file {conf}"
    assert settings.io.rpc.timeout_s == 6.0  # the task's io: beats the environment
    assert settings.sources["io.rpc.timeout_s"] == "task t.yaml"
    assert settings.io.rpc.max_batch == 9 and settings.sources["io.rpc.max_batch"] == "--set"
    default = build_settings(environ={}, task_dir=str(tmp_path))
    assert default.worker.pool.executor_count == cpu_count()
    assert default.sources["pool.executor_count"] == "default (one per core)"
    assert default.io.data_dir == str(tmp_path / ".blockx")
    assert default.sources["io.data_dir"] == "default (next to the task file)"


def test_every_bad_value_of_every_layer_at_once(tmp_path: Path) -> None:
    conf = tmp_path / "w.toml"
    conf.write_text("[io.blockdb]\nengine = 'mysql'\n")
    with pytest.raises(UsageError) as info:
        build_settings(
            config_file=str(conf),
            sets=["io.rpc.max_batch=0"],
            executors=0,
            task_io={"cache_max_entries": -1},
            task_label="t.yaml",
            environ={"EXECUTOR_COUNT": "0", "RPC_TIMEOUT_S": "x"},
        )
    # Before, the IO problems waited for the worker's to be fixed, one layer at a time.
    assert set(info.value.problems) == {
        f"{conf}: io.blockdb.engine='mysql': expected one of auto, sqlite, postgres",
        "EXECUTOR_COUNT='0': expected a positive integer",
        "RPC_TIMEOUT_S='x': expected a positive number of at most 86,400 (24 h)",
        "t.yaml: io.cache_max_entries=-1: expected a non-negative integer",
        "--set io.rpc.max_batch='0': expected a positive integer",
        "--executors 0: expected a positive integer",
    }

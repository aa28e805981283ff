"""One configuration model: knob() for every section, resolve(layers) with provenance;
the model (config_model) works over any schema it is given."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from blockx.worker import config_model
from blockx.worker.config import ConfigError, PoolConfig, load_config
from blockx.worker.config_kinds import POSITIVE, OptionalText, check_section, knob
from blockx.worker.config_layers import (
    Layer,
    environment_layer,
    file_layer,
    knobs,
    mapping_layer,
    resolve,
)
from blockx.worker.config_model import Schema
from blockx.worker.io.config import (
    ENV_VARS,
    BlockDBConfig,
    HttpConfig,
    IOConfig,
    IOConfigError,
    RpcConfig,
    load_io_config,
)


def test_every_knob_worker_and_io_is_declared_once_with_knob() -> None:
    specs = knobs()
    io_specs = [s for s in specs.values() if s.part == "io"]
    assert len(specs) == 44 + 27 and len(io_specs) == 27  # io.rpc: +2 (rate limits), io.http: 6
    for cls in (IOConfig, BlockDBConfig, RpcConfig, HttpConfig):
        for f in dataclasses.fields(cls):
            if f.name in ("blockdb", "rpc", "http"):
                continue
            assert {"kind", "env", "doc"} <= set(f.metadata), f"{cls.__name__}.{f.name}"
    # The IO variables table is read from the declarations, not written a second time.
    assert ENV_VARS[("blockdb", "engine")] == "BLOCKDB_ENGINE"
    assert ENV_VARS[("", "data_dir")] == "BLOCKX_DATA_DIR"
    envs = [s.env for s in specs.values()]
    assert len(set(envs)) == len(envs)


def test_resolve_keeps_the_precedence_and_says_where_each_value_came_from(
    tmp_path: Path,
) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(
        "[pool]\nexecutor_count = 4\nrestart_delay_ms = 10\n"
        "[dispatcher]\ncall_deadline_ms = 3000\n"
        '[io.rpc]\ntimeout_s = 5\n[io.blockdb]\ntable_prefix = "f_"\n'
    )
    settings = resolve(
        [
            file_layer(path),
            environment_layer({"EXECUTOR_COUNT": "6", "RPC_TIMEOUT_S": "7", "UNRELATED": "x"}),
            mapping_layer({"blockdb": {"table_prefix": "t_"}}, source="task t.yaml", io_only=True),
            mapping_layer({"pool.restart_delay_ms": "20"}, source="--set", prefix="--set "),
        ]
    )
    assert settings.worker.pool.executor_count == 6
    assert settings.provenance["pool.executor_count"] == "env EXECUTOR_COUNT"
    assert settings.worker.pool.restart_delay_ms == 20
    assert settings.provenance["pool.restart_delay_ms"] == "--set"
    assert settings.worker.dispatcher.call_deadline_ms == 3000
    assert settings.provenance["dispatcher.call_deadline_ms"] == f"file {path}"
    assert settings.io.rpc.timeout_s == 7.0
    assert settings.provenance["io.rpc.timeout_s"] == "env RPC_TIMEOUT_S"
    assert settings.io.blockdb.table_prefix == "t_"
    assert settings.provenance["io.blockdb.table_prefix"] == "task t.yaml"
    assert settings.provenance["adapter.outbox_depth"] == "default"
    assert settings.describe("pool.executor_count") == (
        "pool.executor_count=6 (from env EXECUTOR_COUNT)"
    )


def test_every_problem_of_every_layer_is_reported_at_once_naming_its_source(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[pool]\nexecutor_count = 0\n[io.blockdb]\nengine = 'mysql'\nnope = 1\n")
    with pytest.raises(ConfigError) as info:
        resolve(
            [
                file_layer(path),
                environment_layer({"CALL_DEADLINE_MS": "abc", "RPC_TIMEOUT_S": "-1"}),
                mapping_layer({"io.rpc.max_batch": "0"}, source="--set", prefix="--set "),
            ]
        )
    assert set(info.value.problems) == {
        f"{path}: pool.executor_count=0: expected a positive integer",
        f"{path}: io.blockdb.engine='mysql': expected one of auto, sqlite, postgres",
        f"{path}: io.blockdb.nope: unknown knob",
        "CALL_DEADLINE_MS='abc': expected a non-negative integer",
        "RPC_TIMEOUT_S='-1': expected a positive number of at most 86,400 (24 h)",
        "--set io.rpc.max_batch='0': expected a positive integer",
    }


def test_a_check_between_knobs_names_where_they_came_from() -> None:
    with pytest.raises(ConfigError) as info:
        resolve(
            [
                environment_layer({"CALL_RETRY_BASE_BACKOFF_MS": "100"}),
                mapping_layer({"dispatcher.max_backoff_ms": 50}, source="--set"),
                mapping_layer({"blockdb": {"engine": "postgres"}}, source="task t", io_only=True),
            ]
        )
    assert info.value.problems == (
        "dispatcher.max_backoff_ms=50: expected at least base_backoff_ms (100) "
        "(dispatcher.max_backoff_ms: --set)",
        "io.blockdb.engine='postgres' needs io.blockdb.postgres_dsn (BLOCKDB_POSTGRES_DSN), "
        "e.g. postgresql://user:pass@127.0.0.1:5432/blockx (io.blockdb.engine: task t)",
    )


def test_load_config_resolves_the_worker_part_only(tmp_path: Path) -> None:
    """``Worker()``'s configuration: the same file as `blockx run` (its [io] tables are the
    IO subsystem's) and a bad IO variable does not stop a worker."""
    path = tmp_path / "w.toml"
    path.write_text("[pool]\nexecutor_count = 2\n[io.blockdb]\nengine = 'sqlite'\n")
    config = load_config(path, env={"RPC_TIMEOUT_S": "bad", "EXECUTOR_COUNT": "3"})
    assert config.pool.executor_count == 3
    replaced = config.replace(**{"pool.executor_count": 5})
    assert replaced.pool.executor_count == 5 and replaced.dispatcher == config.dispatcher


def test_io_environment_errors_name_the_variable() -> None:
    """Better than before (``io.rpc.timeout_s='x'``): the name the user actually set."""
    with pytest.raises(IOConfigError) as info:
        load_io_config({}, env={"RPC_TIMEOUT_S": "x", "BLOCKDB_ENGINE": "mysql"})
    assert set(info.value.problems) == {
        "RPC_TIMEOUT_S='x': expected a positive number of at most 86,400 (24 h)",
        "BLOCKDB_ENGINE='mysql': expected one of auto, sqlite, postgres",
    }
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_io_sections_built_directly_run_the_same_checks() -> None:
    with pytest.raises(IOConfigError, match=r"io\.rpc\.max_batch=0: expected a positive"):
        RpcConfig(max_batch=0)
    with pytest.raises(IOConfigError, match=r"io\.cache_max_bytes=-1"):
        IOConfig(cache_max_bytes=-1)
    assert BlockDBConfig(engine=" SQLite ").engine == "sqlite"
    assert RpcConfig(endpoints="eth=http://a").endpoints == {"eth": ("http://a",)}  # type: ignore[arg-type]
    base = load_io_config({"rpc": {"max_batch": 7}}, env={})
    assert load_io_config({"data_dir": "/d"}, env={}, base=base).rpc.max_batch == 7


def test_a_layer_shows_what_it_holds() -> None:
    layer = Layer(source="--executors", values={"pool.executor_count": 2})
    assert repr(layer) == "Layer('--executors', 1 values, 0 problems)"
    assert resolve([layer]).worker.pool == PoolConfig(executor_count=2)


def test_load_settings_gives_the_python_api_the_provenance_too(tmp_path: Path) -> None:
    from blockx.worker.config_layers import load_settings

    path = tmp_path / "w.toml"
    path.write_text("[admission]\nexecutor_task_slots = 2\n[io]\ndata_dir = '/srv/bx'\n")
    settings = load_settings(
        env={"BLOCKX_CONFIG": str(path), "IO_CACHE_MAX_ENTRIES": "5"},
        overrides={"pool.executor_count": 3, "io": {"rpc": {"max_batch": 1}}},
    )
    assert settings.worker.admission.executor_task_slots == 2
    assert settings.provenance["admission.executor_task_slots"] == f"file {path}"
    assert settings.io.data_dir == "/srv/bx" and settings.io.cache_max_entries == 5
    assert settings.provenance["io.cache_max_entries"] == "env IO_CACHE_MAX_ENTRIES"
    assert settings.describe("io.rpc.max_batch") == "io.rpc.max_batch=1 (from override)"
    assert settings.worker == load_config(path, env={}, overrides={"pool.executor_count": 3})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Limits:
    depth: int = knob(3, kind=POSITIVE, env="TOY_DEPTH", doc="How deep.")

    def __post_init__(self) -> None:
        check_section(self, "toy.limits")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Toy:
    name: str = knob("t", kind=OptionalText("a name"), env="TOY_NAME", doc="Its name.")
    limits: _Limits = dataclasses.field(default_factory=_Limits)

    def __post_init__(self) -> None:
        check_section(self, "toy")


def test_the_model_resolves_any_schema_it_is_given() -> None:
    """config_model knows no knob by name: a schema of its own works the same way, and
    the tables of a part resolved elsewhere (``foreign``) are left alone."""
    schema = Schema(
        part="toy", root=_Toy, sections={"": _Toy, "limits": _Limits}, prefix="toy", title="toy"
    )
    assert list(schema.knobs) == ["toy.name", "toy.limits.depth"]
    layers = [
        config_model.mapping_layer(
            (schema,),
            {"toy": {"limits": {"depth": "5"}}, "io": {"x": 1}},
            source="f",
            foreign=("io",),
        ),
        config_model.environment_layer((schema,), {"TOY_NAME": "env-name", "EXECUTOR_COUNT": "x"}),
    ]
    resolution = config_model.resolve((schema,), layers)
    assert resolution.configs["toy"] == _Toy(name="env-name", limits=_Limits(depth=5))
    assert resolution.provenance == {"toy.name": "env TOY_NAME", "toy.limits.depth": "f"}
    with pytest.raises(ConfigError) as info:
        config_model.resolve(
            (schema,),
            [
                config_model.mapping_layer(
                    (schema,), {"limits": {"depth": 0}}, source="s", prefix="s: ", within=schema
                )
            ],
        )
    assert info.value.problems == ("s: toy.limits.depth=0: expected a positive integer",)

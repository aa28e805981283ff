"""WorkerConfig: every knob of the worker runtime, with defaults, environment variables and checks.

Theory of operation
-------------------
One frozen dataclass tree, built once at start-up and passed down: the pool,
the executor adapter, the admission gate and the stream builder read their
section; the orchestrator builds the core's ``DispatcherConfig`` from
:meth:`WorkerConfig.dispatcher_kwargs` (the ``dispatcher`` section's fields
carry the core's field names). :data:`WORKER_SCHEMA` hands these sections to
the one configuration model (:mod:`blockx.worker.config_model`, shared with the
IO knobs and ``blockx run``), and :func:`load_config` layers the sources with
its ``resolve``::

    defaults  <-  file (TOML or JSON)  <-  environment  <-  explicit overrides

and collects every bad value before raising one :class:`ConfigError` whose
lines name the source, the knob and the value::

    CALL_DEADLINE_MS='abc': expected a non-negative integer
    worker.toml: pool.executor_count=0: expected a positive integer

Building a section directly (``PoolConfig(executor_count=0)``) runs the same
checks. An empty environment variable counts as unset. ``BLOCKX_CONFIG`` names
the file when :func:`load_config` is given none.

File layout: one table per section, keys are the field names below::

    [pool]
    executor_count = 4
    [dispatcher]
    call_deadline_ms = 3000

Two values are derived, never set:

* ``dispatcher.stall_timeout_ms`` — the effective scheduler-stall (wedge)
  timeout: ``call_deadline_ms + 5000``; an explicit
  ``scheduler_stall_timeout_ms`` is used only when it is greater than
  ``call_deadline_ms + 1000`` (a lower one is raised to the derived value: an
  executor legitimately runs a call for its whole budget). One rule, stated once
  (``blockx.worker.core.config.effective_stall_timeout_ms``, the core's too).
* ``heartbeat_timeout_ms`` (on :class:`WorkerConfig`) — the seed couples the
  heartbeat timeout to the stall timeout:
  ``max(adapter.heartbeat_timeout_ms, stall_timeout_ms + 5000)`` (15000 with
  the defaults), so a wedged executor is killed by the wedge backstop before
  its calls are declared lost.

Every knob is a field of a section below, declared with its environment
variable, default and meaning; :func:`knob_table` renders the reference table
from the fields (docs/configuration.md is generated from it and a test keeps
the two equal; ``blockx config`` prints every knob's effective value). The
value kinds that parse and check each knob live in
:mod:`blockx.worker.config_kinds`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from blockx.worker.config_kinds import (
    NON_NEGATIVE,
    POSITIVE,
    Bool,
    Choice,
    ConfigError,
    Float,
    Int,
    OptionalText,
    check_section,
    knob,
)
from blockx.worker.config_model import Resolution, Schema, api_layers, mapping_layer, resolve
from blockx.worker.core.config import (
    STALL_TIMEOUT_MARGIN_MS,
    STALL_TIMEOUT_MIN_MARGIN_MS,
    effective_stall_timeout_ms,
)

__all__ = [
    "CONFIG_FILE_ENV",
    "HEARTBEAT_TIMEOUT_MARGIN_MS",
    "IO_TABLES",
    "MAX_DURATION_MS",
    "SECTIONS",
    "STALL_TIMEOUT_MARGIN_MS",
    "STALL_TIMEOUT_MIN_MARGIN_MS",
    "WORKER_SCHEMA",
    "AdapterConfig",
    "AdmissionConfig",
    "ConfigError",
    "DispatcherSettings",
    "PoolConfig",
    "StreamBuildConfig",
    "WorkerConfig",
    "auto_memory_limit_mb",
    "config_file",
    "iter_knobs",
    "knob_table",
    "load_config",
]

#: Environment variable naming the configuration file.
CONFIG_FILE_ENV: Final = "BLOCKX_CONFIG"
#: The heartbeat timeout is at least ``stall_timeout_ms`` + this.
HEARTBEAT_TIMEOUT_MARGIN_MS: Final = 5000
#: The longest duration any knob takes: 24 h, in ms.
MAX_DURATION_MS: Final = 86_400_000
#: A duration in ms, 0 allowed (it means "none" or "unlimited" where the knob says so).
DURATION_MS: Final = Int(0, maximum=MAX_DURATION_MS)
#: A duration in ms that must not be 0.
POSITIVE_DURATION_MS: Final = Int(1, maximum=MAX_DURATION_MS)
#: The automatic executor memory limit: total memory / executors, within these bounds.
AUTO_MEMORY_LIMIT_MIN_MB: Final = 256
AUTO_MEMORY_LIMIT_MAX_MB: Final = 4096


def auto_memory_limit_mb(executor_count: int) -> int:
    """The default ``EXECUTOR_MEMORY_LIMIT_MB``: the machine's memory shared by the executors,
    at least 256 and at most 4096 MB."""
    try:
        total_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError, AttributeError):
        return AUTO_MEMORY_LIMIT_MAX_MB
    share = total_mb // max(executor_count, 1)
    return max(AUTO_MEMORY_LIMIT_MIN_MB, min(AUTO_MEMORY_LIMIT_MAX_MB, share))


# --- sections ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolConfig:
    """The executor pool: how many processes, how they start and restart."""

    executor_count: int = knob(
        8,
        kind=POSITIVE,
        env="EXECUTOR_COUNT",
        seed_env=True,
        doc="Executor processes. `blockx run` starts one per core unless told otherwise.",
    )
    spawn_mode: str = knob(
        "process",
        kind=Choice("process", "sandbox"),
        env="EXECUTOR_SPAWN_MODE",
        seed_env=True,
        doc="``process`` (bare processes) or ``sandbox`` (bubblewrap).",
    )
    restart_delay_ms: int = knob(
        1000,
        kind=DURATION_MS,
        env="EXECUTOR_RESTART_DELAY_MS",
        doc="Wait before restarting an executor that exited.",
    )
    max_restarts: int = knob(
        10,
        kind=NON_NEGATIVE,
        env="EXECUTOR_MAX_RESTARTS",
        doc="Restarts allowed within ``restart_window_ms`` before the slot backs off.",
    )
    restart_window_ms: int = knob(
        60_000,
        kind=POSITIVE_DURATION_MS,
        env="EXECUTOR_RESTART_WINDOW_MS",
        doc="Window in which restarts are counted.",
    )
    backoff_ms: int = knob(
        30_000,
        kind=DURATION_MS,
        env="EXECUTOR_BACKOFF_MS",
        doc="How long a slot that restarted too often waits (state BACKOFF).",
    )
    stop_grace_ms: int = knob(
        5000,
        kind=DURATION_MS,
        env="EXECUTOR_STOP_GRACE_MS",
        doc="On shutdown, SIGTERM first and SIGKILL after this long.",
    )
    heartbeat_interval_s: float = knob(
        1.0,
        kind=Float(),
        env="EXECUTOR_HEARTBEAT_INTERVAL_S",
        doc="Executor ``--heartbeat-interval``, seconds.",
    )
    fork_server: bool = knob(
        True,
        kind=Bool(),
        env="EXECUTOR_FORK_SERVER",
        doc="``process`` mode: fork executors from a warm server process (~10 ms to start "
        "instead of ~100 ms of imports; docs/operations.md). Off: each one starts cold. "
        "Only on x86_64 and aarch64 Linux with glibc; elsewhere, or if the server fails, "
        "they start cold.",
    )
    python: str | None = knob(
        None,
        kind=OptionalText("a path to a Python interpreter"),
        env="EXECUTOR_PYTHON",
        default_text="sys.executable",
        doc="Python interpreter that runs ``-m blockx.executor``.",
    )
    memory_limit_mb: int | None = knob(
        None,
        kind=Int(0, optional=True, maximum=1 << 22),
        env="EXECUTOR_MEMORY_LIMIT_MB",
        default_text="total memory / executor_count, 256..4096",
        doc="Memory of each executor process, MiB (0 = none), enforced by the executor itself "
        "in both spawn modes (address-space limit + resident-set watchdog): over it the "
        "executor exits at once naming the call, which fails ``memory_exceeded``. The inner "
        "of two limits: see ``pool.sandbox_memory_mb``.",
    )
    max_open_files: int = knob(
        1024,
        kind=Int(0, maximum=1 << 20),
        env="EXECUTOR_MAX_OPEN_FILES",
        doc="RLIMIT_NOFILE of each executor (0 = inherited from the worker); an executor "
        "whose calls run out of descriptors recycles itself.",
    )
    sandbox_memory_mb: int = knob(
        1024,
        kind=NON_NEGATIVE,
        env="EXECUTOR_SANDBOX_MEMORY_MB",
        doc="Sandbox mode: the outer memory limit the sandbox puts around each executor and "
        "what it starts, its private ``/tmp`` included (cgroup ``memory.max``; ``RLIMIT_AS`` "
        "with ``rlimit``), MiB (0 = none). Over it the kernel kills the executor (the call "
        "fails ``memory_exceeded`` by blame). Set it above ``pool.memory_limit_mb`` (the "
        "executor's own limit, which may reach 4096 by default) to have that one end a "
        "greedy call first, with the call named; the lower of the two acts first.",
    )
    sandbox_cpus: float = knob(
        1.0,
        kind=Float(zero=True),
        env="EXECUTOR_SANDBOX_CPUS",
        doc="Sandbox mode: CPU quota of each executor, in CPUs (0 = none).",
    )
    sandbox_pids_max: int = knob(
        256,
        kind=NON_NEGATIVE,
        env="EXECUTOR_SANDBOX_PIDS_MAX",
        doc="Sandbox mode: processes and threads of each executor (0 = none).",
    )
    sandbox_limits: str = knob(
        "auto",
        kind=Choice("auto", "cgroup2", "cgroup1", "rlimit"),
        env="EXECUTOR_SANDBOX_LIMITS",
        doc="Sandbox mode: how limits are applied; ``auto`` is cgroup v2, else v1, else rlimits.",
    )
    sandbox_ro_binds: str | None = knob(
        None,
        kind=OptionalText("paths separated by ':'"),
        env="EXECUTOR_SANDBOX_RO_BINDS",
        default_text="none",
        doc="Sandbox mode: extra paths the executor may read, separated by ``:``.",
    )

    def __post_init__(self) -> None:
        check_section(self, "pool")

    @property
    def python_executable(self) -> str:
        return self.python or sys.executable

    @property
    def memory_limit_mb_effective(self) -> int:
        """``memory_limit_mb``, or the machine's share when it is unset (0 = none)."""
        if self.memory_limit_mb is None:
            return auto_memory_limit_mb(self.executor_count)
        return self.memory_limit_mb


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatcherSettings:
    """The dispatcher core's knobs; field names are ``DispatcherConfig``'s."""

    executor_max_inflight: int = knob(
        128,
        kind=NON_NEGATIVE,
        env="EXECUTOR_MAX_INFLIGHT",
        doc="Calls one executor holds at once (0 = unlimited); also its "
        "``--executor-max-inflight``.",
    )
    executor_max_runnable: int = knob(
        128,
        kind=NON_NEGATIVE,
        env="EXECUTOR_MAX_RUNNABLE",
        doc="Executors with this many runnable calls (after completion compensation) get "
        "none (0 = off).",
    )
    executor_selection_sample_size: int = knob(
        0,
        kind=NON_NEGATIVE,
        env="EXECUTOR_SELECTION_SAMPLE_SIZE",
        seed_env=True,
        doc=(
            "0 scores every eligible executor; N > 0 only N of them (power-of-d), the scan "
            "starting one executor further on each decision."
        ),
    )
    executor_memory_high_watermark: int = knob(
        0,
        kind=NON_NEGATIVE,
        env="EXECUTOR_MEMORY_HIGH_WATERMARK",
        doc="Executors whose RSS reaches this many bytes get no new calls (0 = off).",
    )
    task_max_inflight_calls: int = knob(
        1024,
        kind=POSITIVE,
        env="TASK_MAX_INFLIGHT_CALLS",
        doc="Calls of one task in flight at once.",
    )
    call_deadline_ms: int = knob(
        5000,
        kind=DURATION_MS,
        env="CALL_DEADLINE_MS",
        seed_env=True,
        doc="Execution budget of every root call attempt, ms (0 = unlimited).",
    )
    scheduler_stall_timeout_ms: int | None = knob(
        None,
        kind=Int(0, optional=True, maximum=MAX_DURATION_MS),
        env="SCHEDULER_STALL_TIMEOUT_MS",
        seed_env=True,
        default_text="call_deadline_ms + 5000",
        doc="Wedge backstop threshold; at or below ``call_deadline_ms + 1000`` it is raised "
        "to the default.",
    )
    max_subcall_depth: int = knob(
        8, kind=POSITIVE, env="MAX_SUBCALL_DEPTH", doc="Deepest sub-call chain."
    )
    base_backoff_ms: int = knob(
        10,
        kind=DURATION_MS,
        env="CALL_RETRY_BASE_BACKOFF_MS",
        doc="Retry backoff base (``base * 2^(attempt-1)`` + up to 5% jitter) when the task "
        "names none.",
    )
    max_backoff_ms: int = knob(
        60_000,
        kind=DURATION_MS,
        env="CALL_RETRY_MAX_BACKOFF_MS",
        doc="Longest single retry backoff.",
    )
    default_max_attempts: int = knob(
        3,
        kind=POSITIVE,
        env="CALL_RETRY_MAX_ATTEMPTS",
        seed_env=True,
        doc="Attempts per call when the task names none.",
    )
    instance_fairness: bool = knob(
        False,
        kind=Bool(),
        env="DISPATCH_INSTANCE_FAIRNESS",
        seed_env=True,
        doc="Max-min fair release across instances (tenants) instead of task round-robin.",
    )
    instance_fairness_quantum: int = knob(
        0,
        kind=NON_NEGATIVE,
        env="DISPATCH_INSTANCE_FAIRNESS_QUANTUM",
        seed_env=True,
        doc="Binds served to one instance before it is re-picked; 0 and 1 re-pick every "
        "call; capped at 1024.",
    )
    max_collected_output_bytes: int = knob(
        0,
        kind=NON_NEGATIVE,
        env="MAX_COLLECTED_OUTPUT_BYTES",
        seed_env=True,
        doc="A task whose outputs are collected for its result (a one-shot task, or a "
        "stream run with ``run_task``) stops with ``OUTPUT_BYTES_EXCEEDED`` once they exceed "
        "this (0 = no limit); streams handed out batch by batch (``blockx run`` with a calls "
        "file, ``blockx serve``, cluster nodes) are not subject to it.",
    )
    call_cache_max_entries: int = knob(
        65_536,
        kind=NON_NEGATIVE,
        env="CALL_CACHE_MAX_ENTRIES",
        doc="Results kept per task for call-cache hits (0 = no cache); 4,096 until the task "
        "repeats a call (a cache hit, or a call joining an equal one in flight).",
    )
    #: Derived: the effective wedge threshold (see the module docstring).
    stall_timeout_ms: int = field(init=False)

    def __post_init__(self) -> None:
        check_section(self, "dispatcher")
        if self.max_backoff_ms < self.base_backoff_ms:
            raise ConfigError(
                [
                    f"dispatcher.max_backoff_ms={self.max_backoff_ms!r}: expected at least "
                    f"base_backoff_ms ({self.base_backoff_ms})"
                ]
            )
        stall = effective_stall_timeout_ms(self.call_deadline_ms, self.scheduler_stall_timeout_ms)
        object.__setattr__(self, "stall_timeout_ms", stall)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterConfig:
    """The executor adapter: connections, outboxes, the heartbeat timeout."""

    heartbeat_timeout_ms: int = knob(
        10_000,
        kind=POSITIVE_DURATION_MS,
        env="EXECUTOR_HEARTBEAT_TIMEOUT_MS",
        doc="No heartbeat for this long = transport lost; coupled: at least "
        "``stall_timeout_ms + 5000``.",
    )
    outbox_depth: int = knob(
        256,
        kind=POSITIVE,
        env="EXECUTOR_OUTBOX_DEPTH",
        doc="Frames queued per executor connection past which heartbeat acks are dropped; "
        "call frames wait for the connection to drain instead (never refused).",
    )
    max_unattached_connections: int = knob(
        8,
        kind=Int(1, maximum=4096),
        env="EXECUTOR_MAX_UNATTACHED_CONNECTIONS",
        doc="Connections to the worker's socket that have not attached (sent a valid "
        "Heartbeat), held at once; the oldest is dropped for a new one.",
    )
    attach_timeout_ms: int = knob(
        2000,
        kind=POSITIVE_DURATION_MS,
        env="EXECUTOR_ATTACH_TIMEOUT_MS",
        doc="A connection that sent no valid Heartbeat this long after connecting is dropped.",
    )
    exit_wait_ms: int = knob(
        1500,
        kind=DURATION_MS,
        env="EXECUTOR_EXIT_WAIT_MS",
        doc="How long a lost connection's report waits for its process's exit status "
        "(which says why it was lost).",
    )
    frames_per_write: int = knob(
        64,
        kind=POSITIVE,
        env="EXECUTOR_FRAMES_PER_WRITE",
        doc=(
            "Frames coalesced into one socket write (one batched frame when the executor "
            'announced ``features: ["batch"]``, docs/protocol.md "Batched frames").'
        ),
    )
    socket_dir: str | None = knob(
        None,
        kind=OptionalText("a directory path"),
        env="EXECUTOR_SOCKET_DIR",
        default_text="system temp dir",
        doc="Parent of the private directory that holds the worker's Unix socket.",
    )

    def __post_init__(self) -> None:
        check_section(self, "adapter")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionConfig:
    """How many tasks run their executor phase at once."""

    executor_task_slots: int = knob(
        32,
        kind=POSITIVE,
        env="EXECUTOR_TASK_SLOTS",
        seed_env=True,
        doc="Tasks in the executor phase at once.",
    )

    def __post_init__(self) -> None:
        check_section(self, "admission")


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamBuildConfig:
    """Streamed call lists: the producer's window and the batch size."""

    enabled: bool = knob(
        False,
        kind=Bool(),
        env="STREAM_BUILD_ENABLED",
        doc="Build call lists as streams of batches.",
    )
    max_outstanding_batches: int = knob(
        2,
        kind=POSITIVE,
        env="STREAM_BUILD_MAX_OUTSTANDING_BATCHES",
        doc="Committed batches not yet settled (the producer's credit window).",
    )
    batch_max_rows: int = knob(
        8192,
        kind=POSITIVE,
        env="STREAM_BUILD_BATCH_MAX_ROWS",
        doc="Calls per streamed batch.",
    )
    batch_max_args_bytes: int = knob(
        32 * 1024 * 1024,
        kind=POSITIVE,
        env="STREAM_BUILD_BATCH_MAX_ARGS_BYTES",
        doc="Argument bytes per streamed batch (32 MiB).",
    )

    def __post_init__(self) -> None:
        check_section(self, "stream_build")


#: Section name -> section class, in table order.
SECTIONS: Final[dict[str, type[Any]]] = {
    "pool": PoolConfig,
    "dispatcher": DispatcherSettings,
    "adapter": AdapterConfig,
    "admission": AdmissionConfig,
    "stream_build": StreamBuildConfig,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """The whole worker runtime configuration (see the module docstring)."""

    pool: PoolConfig = field(default_factory=PoolConfig)
    dispatcher: DispatcherSettings = field(default_factory=DispatcherSettings)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    stream_build: StreamBuildConfig = field(default_factory=StreamBuildConfig)
    #: Derived: the effective heartbeat timeout, coupled to the stall timeout.
    heartbeat_timeout_ms: int = field(init=False)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError([f"{name}: expected a {cls.__name__}"])
        coupled = self.dispatcher.stall_timeout_ms + HEARTBEAT_TIMEOUT_MARGIN_MS
        object.__setattr__(
            self, "heartbeat_timeout_ms", max(self.adapter.heartbeat_timeout_ms, coupled)
        )

    @property
    def stall_timeout_ms(self) -> int:
        """The effective scheduler-stall timeout (``dispatcher.stall_timeout_ms``)."""
        return self.dispatcher.stall_timeout_ms

    def dispatcher_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the core's ``DispatcherConfig``.

        The ``dispatcher`` section's init fields plus the stream builder's
        ``max_outstanding_batches`` (the core owns the producer's window).
        """
        kwargs = {
            f.name: getattr(self.dispatcher, f.name)
            for f in dataclasses.fields(self.dispatcher)
            if f.init
        }
        kwargs["max_outstanding_batches"] = self.stream_build.max_outstanding_batches
        return kwargs

    def replace(self, **overrides: Any) -> WorkerConfig:
        """A copy with knobs replaced, by dotted name: ``replace(**{"pool.executor_count": 2})``."""
        layer = mapping_layer(
            (WORKER_SCHEMA,), overrides, source="override", annotate=False, foreign=IO_TABLES
        )
        return _worker(resolve((WORKER_SCHEMA,), [layer], bases={"worker": self}))


#: The worker's knobs, for :func:`blockx.worker.config_model.resolve`.
WORKER_SCHEMA: Final = Schema(part="worker", root=WorkerConfig, sections=SECTIONS)
#: A configuration file's tables (and dotted names) that are the IO subsystem's
#: (:mod:`blockx.worker.io.config`): the worker's own loading leaves them alone.
IO_TABLES: Final = ("io",)


def _worker(resolution: Resolution) -> WorkerConfig:
    config = resolution.configs["worker"]
    assert isinstance(config, WorkerConfig)
    return config


# --- loading -------------------------------------------------------------------------------


def iter_knobs() -> Iterator[tuple[str, str, dataclasses.Field[Any]]]:
    """``(section, field name, dataclass field)`` of every knob, in table order."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.init and "kind" in f.metadata:
                yield section, f.name, f


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> WorkerConfig:
    """Build the configuration: defaults ← file ← environment ← ``overrides``.

    ``path`` is a TOML file (JSON when it ends in ``.json``); without one,
    ``$BLOCKX_CONFIG`` is used when set. ``env`` defaults to ``os.environ``.
    ``overrides`` maps dotted knob names (``"pool.executor_count"``) or section
    tables to values (typed, or strings as a command line gives them).
    The file may hold ``[io]`` tables too (it is ``blockx run``'s file): they are
    the IO subsystem's (:func:`~blockx.worker.io.config.load_io_config`), not
    read here, and neither are the IO environment variables.
    Raises :class:`ConfigError` listing every bad value.
    """
    environ = os.environ if env is None else env
    layers = api_layers(
        (WORKER_SCHEMA,), config_file(path, environ), environ, overrides, foreign=IO_TABLES
    )
    return _worker(resolve((WORKER_SCHEMA,), layers))


def config_file(
    path: str | os.PathLike[str] | None, environ: Mapping[str, str]
) -> str | os.PathLike[str] | None:
    """``path``, else the file ``$BLOCKX_CONFIG`` names (unset or blank: none)."""
    if path is None and environ.get(CONFIG_FILE_ENV, "").strip():
        return environ[CONFIG_FILE_ENV]
    return path


def knob_table(
    *,
    markdown: bool = False,
    knobs: Iterable[tuple[str, str, dataclasses.Field[Any]]] | None = None,
    prefix: str = "",
) -> str:
    """The knob table of the module docstring, rendered from the fields.

    The docstring form is a definition list (it fits the line length); with
    ``markdown=True`` it is a four-column Markdown table for the docs. ``knobs``
    (default: the worker's) and ``prefix`` render another set, e.g. the IO
    subsystem's (``iter_io_knobs()``, ``"io."``).
    """
    rows: list[tuple[str, str, str, str]] = []
    for section, name, f in iter_knobs() if knobs is None else knobs:
        dotted = prefix + (f"{section}.{name}" if section else name)
        env = f"``{f.metadata['env']}``" + (" (seed)" if f.metadata["seed_env"] else "")
        default_text = f.metadata["default_text"]
        if default_text is None:
            default = f.default
            text = str(default).lower() if isinstance(default, bool) else str(default)
            default_text = f"``{text}``"
        elif default_text != "system temp dir":
            default_text = f"``{default_text}``"
        rows.append((f"``{dotted}``", env, default_text, f.metadata["doc"]))
    if markdown:
        out = [
            "| knob | environment variable | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for row in rows:
            out.append("| " + " | ".join(cell.replace("``", "`") for cell in row) + " |")
        return "\n".join(out)
    lines: list[str] = []
    for name, env, default_text, doc in rows:
        lines.append(name)
        lines.append(f"    {env}; default {default_text}.")
        lines.extend(textwrap.wrap(doc, width=96, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines)

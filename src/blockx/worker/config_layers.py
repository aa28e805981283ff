"""Worker and IO knobs resolved together, with each value's source: ``blockx run``'s model.

Theory of operation
-------------------
Every knob, the worker's (:mod:`blockx.worker.config`) and the IO subsystem's
(:mod:`blockx.worker.io.config`), is a dataclass field made by
:func:`~blockx.worker.config_kinds.knob`: its kind (type and bounds), default,
environment variable and meaning are written once, there. Each of those modules
declares its :class:`~blockx.worker.config_model.Schema` (``WORKER_SCHEMA``,
``IO_SCHEMA``) and resolves its own knobs with
:func:`blockx.worker.config_model.resolve`; this module, which imports both,
resolves them *together*. :func:`knobs` lists every knob by dotted name
(``pool.executor_count``, ``io.blockdb.engine``) as :class:`KnobSpec` rows.

A :class:`Layer` is one source of raw values: a config file, the environment,
a task file's ``io:`` section, ``--set``, ``--executors``, the ``overrides``
of :func:`load_settings`. :func:`resolve` takes them lowest precedence first,
checks each value with its knob's kind *in its layer* (so a bad value's line
names where it was written), lets a later layer win, builds the sections (which
run the checks between knobs) and returns :class:`ResolvedSettings`: the
``WorkerConfig``, the ``IOConfig`` and, for every knob, the source of its value.
Every problem of every layer is collected into one
:class:`~blockx.worker.config_kinds.ConfigError`::

    worker.toml: pool.executor_count=0: expected a positive integer
    CALL_DEADLINE_MS='abc': expected a non-negative integer
    --set io.rpc.timeout_s='x': expected a positive number of at most 86,400 (24 h)
    dispatcher.max_backoff_ms=5: expected at least base_backoff_ms (10) \
(dispatcher.max_backoff_ms: --set)

The one precedence, lowest first (``blockx run`` and ``blockx config`` use all
of it; :func:`~blockx.worker.config.load_config`, hence ``blockx.Worker()``,
the part up to its ``overrides``)::

    defaults < [blockx run: one executor per core] < config file < environment
             < task file io: < --set / load_config(overrides=...) < --executors

Who calls it: :func:`blockx.cli.settings.build_settings` and users of
:func:`load_settings`. ``load_config``, ``WorkerConfig.replace`` and
``load_io_config`` call :mod:`blockx.worker.config_model` with their own schema
(imports point one way: this module -> the two schemas' modules -> the model).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Literal

from blockx.worker import config_model
from blockx.worker.config import WORKER_SCHEMA, WorkerConfig, config_file
from blockx.worker.config_model import DEFAULT, KnobSpec, Layer, api_layers
from blockx.worker.io.config import IO_SCHEMA, IOConfig

__all__ = [
    "DEFAULT",
    "KnobSpec",
    "Layer",
    "Part",
    "ResolvedSettings",
    "environment_layer",
    "file_layer",
    "knobs",
    "load_settings",
    "mapping_layer",
    "resolve",
]

#: Which configuration a knob belongs to (:attr:`KnobSpec.part`).
Part = Literal["worker", "io"]
#: The schemas resolved together, in table order: the worker's, then the IO subsystem's.
SCHEMAS: Final = (WORKER_SCHEMA, IO_SCHEMA)


@cache
def knobs() -> dict[str, KnobSpec]:
    """Every knob by dotted name: the worker's in table order, then the IO subsystem's."""
    return config_model.schema_knobs(SCHEMAS)


def environment_layer(environ: Mapping[str, str]) -> Layer:
    """Every knob whose variable is set in ``environ`` (an empty or blank one is unset)."""
    return config_model.environment_layer(SCHEMAS, environ)


def mapping_layer(
    mapping: Mapping[str, Any],
    *,
    source: str,
    prefix: str = "",
    annotate: bool = True,
    io_only: bool = False,
) -> Layer:
    """A layer from a nested ``{section: {knob: value}, "io": {...}}`` mapping (a config
    file's form) or dotted keys (``{"pool.executor_count": 4}``); ``io_only``: the mapping
    is an ``io`` table itself (a task file's ``io:``, :func:`load_io_config`'s argument).
    Unknown knobs become the layer's problems."""
    return config_model.mapping_layer(
        SCHEMAS,
        mapping,
        source=source,
        prefix=prefix,
        annotate=annotate,
        within=IO_SCHEMA if io_only else None,
    )


def file_layer(path: str | os.PathLike[str]) -> Layer:
    """The configuration file's layer: TOML, or JSON when the name ends in ``.json``."""
    return config_model.file_layer(SCHEMAS, path)


@dataclass(frozen=True, slots=True)
class ResolvedSettings:
    """The effective configuration and, per dotted knob, where its value came from
    (``default``, ``file PATH``, ``env VAR``, ``task FILE``, ``--set``, ...)."""

    worker: WorkerConfig
    io: IOConfig
    provenance: Mapping[str, str]

    def value(self, name: str) -> Any:
        """The value of a knob by dotted name."""
        spec = knobs()[name]
        if spec.part == "worker":
            return WORKER_SCHEMA.value(self.worker, spec)
        return IO_SCHEMA.value(self.io, spec)

    def describe(self, name: str) -> str:
        """``pool.executor_count=4 (from env EXECUTOR_COUNT)``."""
        return f"{name}={self.value(name)!r} (from {self.provenance[name]})"

    def __repr__(self) -> str:
        changed = sum(1 for source in self.provenance.values() if source != DEFAULT)
        return f"ResolvedSettings({len(self.provenance)} knobs, {changed} not default)"


def resolve(
    layers: Iterable[Layer],
    *,
    parts: Iterable[Part] = ("worker", "io"),
    worker_base: WorkerConfig | None = None,
    io_base: IOConfig | None = None,
) -> ResolvedSettings:
    """Apply ``layers`` (lowest precedence first) over the defaults, or over the bases.

    Only the knobs of ``parts`` are taken from the layers (``load_settings(parts=
    ("worker",))`` takes the worker's: a bad IO variable does not stop a ``Worker``);
    the other part is its base or defaults. Raises :class:`ConfigError` listing every
    problem of every layer, then those of the checks between knobs, each naming its
    source (:func:`blockx.worker.config_model.resolve`).
    """
    resolution = config_model.resolve(
        SCHEMAS, layers, parts=frozenset(parts), bases={"worker": worker_base, "io": io_base}
    )
    worker, io = resolution.configs["worker"], resolution.configs["io"]
    assert isinstance(worker, WorkerConfig) and isinstance(io, IOConfig)
    return ResolvedSettings(worker=worker, io=io, provenance=resolution.provenance)


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    parts: Iterable[Part] = ("worker", "io"),
) -> ResolvedSettings:
    """The Python API's layers: defaults ← file (``path``, else ``$BLOCKX_CONFIG``) ←
    environment (``os.environ`` by default) ← ``overrides`` (dotted names or section
    tables, ``{"io": {...}}`` for IO knobs), with every value's provenance.

    :func:`~blockx.worker.config.load_config` resolves the same layers for the worker's
    knobs alone. Raises :class:`ConfigError` listing every bad value.
    """
    environ = os.environ if env is None else env
    layers = api_layers(SCHEMAS, config_file(path, environ), environ, overrides)
    return resolve(layers, parts=parts)

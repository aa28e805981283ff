"""One configuration model: every knob, resolved from ordered layers, with each value's source.

Theory of operation
-------------------
Every knob, the worker's (:mod:`blockx.worker.config`) and the IO subsystem's
(:mod:`blockx.worker.io.config`), is a dataclass field made by
:func:`~blockx.worker.config_kinds.knob`: its kind (type and bounds), default,
environment variable and meaning are written once, there. :func:`knobs` lists
them by dotted name (``pool.executor_count``, ``io.blockdb.engine``) as
:class:`KnobSpec` rows.

A :class:`Layer` is one source of raw values: a config file, the environment,
a task file's ``io:`` section, ``--set``, ``--executors``, the ``overrides``
of :func:`~blockx.worker.config.load_config`. :func:`resolve` takes them lowest
precedence first, checks each value with its knob's kind *in its layer* (so a
bad value's line names where it was written), lets a later layer win, builds
the sections (which run the checks between knobs) and returns
:class:`ResolvedSettings`: the ``WorkerConfig``, the ``IOConfig`` and, for
every knob, the source of its value. Every problem of every layer is collected
into one :class:`~blockx.worker.config_kinds.ConfigError`::

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

Who calls it: :func:`blockx.worker.config.load_config` (``Worker()`` without a
config), :meth:`WorkerConfig.replace <blockx.worker.config.WorkerConfig.replace>`,
:func:`blockx.worker.io.config.load_io_config` and
:func:`blockx.cli.settings.build_settings`.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal

from blockx.worker.config import CONFIG_FILE_ENV, SECTIONS, WorkerConfig, iter_knobs
from blockx.worker.config_kinds import ConfigError, Kind
from blockx.worker.io.config import IO_SECTIONS, IOConfig, iter_io_knobs

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

#: The provenance of a value no layer set.
DEFAULT: Final = "default"
#: Which configuration a knob belongs to.
Part = Literal["worker", "io"]


@dataclass(frozen=True, slots=True)
class KnobSpec:
    """One knob as declared by its field (see :func:`~blockx.worker.config_kinds.knob`)."""

    #: Dotted name: ``pool.executor_count``, ``io.data_dir``, ``io.blockdb.engine``.
    name: str
    part: Part
    #: Section key: ``pool`` ...; for IO ``""`` (``IOConfig`` itself), ``blockdb``, ``rpc``.
    section: str
    field: str
    env: str
    kind: Kind

    def __repr__(self) -> str:
        return f"KnobSpec({self.name}, env={self.env})"


@cache
def knobs() -> dict[str, KnobSpec]:
    """Every knob by dotted name: the worker's in table order, then the IO subsystem's."""
    out: dict[str, KnobSpec] = {}
    for section, name, f in iter_knobs():
        spec = KnobSpec(
            f"{section}.{name}", "worker", section, name, f.metadata["env"], f.metadata["kind"]
        )
        out[spec.name] = spec
    for section, name, f in iter_io_knobs():
        dotted = "io." + (f"{section}.{name}" if section else name)
        out[dotted] = KnobSpec(dotted, "io", section, name, f.metadata["env"], f.metadata["kind"])
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One source of raw knob values; :func:`resolve` applies layers lowest first.

    ``problems`` were found while reading the source (an unreadable file, an
    unknown knob), already worded, each with the part it concerns (``None``:
    always reported).
    """

    #: The provenance of the values it sets: ``file worker.toml``, ``--set``, ``task t.yaml``.
    source: str
    #: Dotted knob name -> raw value (typed, or text as a file or command line gives it).
    values: Mapping[str, Any] = field(default_factory=dict)
    problems: tuple[tuple[Part | None, str], ...] = ()
    #: Put before a bad value's line: ``"worker.toml: "``, ``"--set "``.
    prefix: str = ""
    #: The values are environment variables' text: parsed as text, named by variable,
    #: and the provenance is ``env VARIABLE``.
    from_environment: bool = False
    #: Name this layer in the lines of a check between knobs (off for the caller's own values).
    annotate: bool = True

    def provenance(self, spec: KnobSpec) -> str:
        return f"env {spec.env}" if self.from_environment else self.source

    def bad_value(self, spec: KnobSpec, raw: Any, expected: str) -> str:
        if self.from_environment:
            return f"{spec.env}={raw!r}: expected {expected}"
        return f"{self.prefix}{spec.name}={raw!r}: expected {expected}"

    def __repr__(self) -> str:
        return f"Layer({self.source!r}, {len(self.values)} values, {len(self.problems)} problems)"


def environment_layer(environ: Mapping[str, str]) -> Layer:
    """Every knob whose variable is set in ``environ`` (an empty or blank one is unset)."""
    values: dict[str, Any] = {}
    for spec in knobs().values():
        text = environ.get(spec.env)
        if text is not None and text.strip():
            values[spec.name] = text
    return Layer(source="env", values=values, from_environment=True)


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
    values: dict[str, Any] = {}
    problems: list[tuple[Part | None, str]] = []
    specs = knobs()

    def put(name: str, value: Any) -> None:
        if name in specs:
            values[name] = value
        elif name == "io" or name.startswith("io."):
            problems.append(("io", f"{prefix}{name}: unknown knob"))
        else:
            problems.append(("worker", f"{prefix}unknown knob {name}"))

    def put_io(table: Mapping[str, Any]) -> None:
        for key, value in table.items():
            key = str(key)
            if key in IO_SECTIONS and key:
                if not isinstance(value, Mapping):
                    problems.append(("io", f"{prefix}io.{key}: expected a table of knobs"))
                    continue
                for name, item in value.items():
                    put(f"io.{key}.{name}", item)
            else:
                put(f"io.{key}", value)

    if io_only:
        put_io(mapping)
        return Layer(
            source=source, values=values, problems=tuple(problems), prefix=prefix, annotate=annotate
        )
    for key, value in mapping.items():
        key = str(key)
        if key == "io":
            if isinstance(value, Mapping):
                put_io(value)
            elif value is not None:
                problems.append(("io", f"{prefix}io: expected a table of IO knobs"))
        elif key in SECTIONS and isinstance(value, Mapping):
            for name, item in value.items():
                put(f"{key}.{name}", item)
        else:
            put(key, value)
    return Layer(
        source=source, values=values, problems=tuple(problems), prefix=prefix, annotate=annotate
    )


def file_layer(path: str | os.PathLike[str]) -> Layer:
    """The configuration file's layer: TOML, or JSON when the name ends in ``.json``."""
    label = os.fspath(path)
    prefix = f"{label}: "
    source = f"file {label}"
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        problem = f"{label}: cannot read the configuration file: {exc.strerror or exc}"
        return Layer(source=source, problems=((None, problem),))
    is_json = label.lower().endswith(".json")
    try:
        data = json.loads(raw) if is_json else tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        problem = f"{label}: not valid {'JSON' if is_json else 'TOML'}: {exc}"
        return Layer(source=source, problems=((None, problem),))
    if not isinstance(data, dict):
        problem = f"{label}: expected a table of sections at the top level"
        return Layer(source=source, problems=((None, problem),))
    return mapping_layer(data, source=source, prefix=prefix)


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
            holder: Any = getattr(self.worker, spec.section)
        else:
            holder = getattr(self.io, spec.section) if spec.section else self.io
        return getattr(holder, spec.field)

    def describe(self, name: str) -> str:
        """``pool.executor_count=4 (from env EXECUTOR_COUNT)``."""
        return f"{name}={self.value(name)!r} (from {self.provenance[name]})"

    def __repr__(self) -> str:
        changed = sum(1 for source in self.provenance.values() if source != DEFAULT)
        return f"ResolvedSettings({len(self.provenance)} knobs, {changed} not default)"


_NAME_RE: Final = re.compile(r"\b[a-z_]+(?:\.[a-z_]+)+\b")


def _annotated(problem: str, provenance: Mapping[str, str], shown: set[str]) -> str:
    """A check between knobs' line, with the source of each knob it names that a layer set."""
    named = [n for n in dict.fromkeys(_NAME_RE.findall(problem)) if n in shown]
    if not named:
        return problem
    return problem + " (" + "; ".join(f"{n}: {provenance[n]}" for n in named) + ")"


def resolve(
    layers: Iterable[Layer],
    *,
    parts: Iterable[Part] = ("worker", "io"),
    worker_base: WorkerConfig | None = None,
    io_base: IOConfig | None = None,
) -> ResolvedSettings:
    """Apply ``layers`` (lowest precedence first) over the defaults, or over the bases.

    Only the knobs of ``parts`` are taken from the layers (``load_config`` takes the
    worker's: a bad IO variable does not stop a ``Worker``); the other part is its
    base or defaults. Raises :class:`ConfigError` listing every problem of every layer,
    then those of the checks between knobs, each naming its source.
    """
    wanted = frozenset(parts)
    specs = knobs()
    values: dict[str, Any] = {}
    provenance: dict[str, str] = {name: DEFAULT for name in specs}
    annotated: set[str] = set()
    if worker_base is not None and "worker" in wanted:
        values.update(_values_of(worker_base, None, "worker"))
    if io_base is not None and "io" in wanted:
        values.update(_values_of(None, io_base, "io"))
    problems: list[str] = []
    for layer in layers:
        problems.extend(text for part, text in layer.problems if part is None or part in wanted)
        for name, raw in layer.values.items():
            spec = specs[name]
            if spec.part not in wanted:
                continue
            kind = spec.kind
            try:
                value = kind.from_text(raw) if layer.from_environment else kind.check(raw)
            except ValueError as exc:
                problems.append(layer.bad_value(spec, raw, str(exc)))
                continue
            values[name] = value
            provenance[name] = layer.provenance(spec)
            if layer.annotate:
                annotated.add(name)
            else:
                annotated.discard(name)
    if problems:
        raise ConfigError(problems)
    worker, worker_problems = (
        _build_worker(values) if "worker" in wanted else (worker_base or WorkerConfig(), [])
    )
    io, io_problems = _build_io(values) if "io" in wanted else (io_base or IOConfig(), [])
    problems = [_annotated(p, provenance, annotated) for p in worker_problems + io_problems]
    if problems or worker is None or io is None:
        raise ConfigError(problems)
    return ResolvedSettings(worker=worker, io=io, provenance=provenance)


def _values_of(worker: WorkerConfig | None, io: IOConfig | None, part: Part) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in knobs().values():
        if spec.part != part:
            continue
        if worker is not None:
            out[spec.name] = getattr(getattr(worker, spec.section), spec.field)
        elif io is not None:
            holder = getattr(io, spec.section) if spec.section else io
            out[spec.name] = getattr(holder, spec.field)
    return out


def _section_values(values: Mapping[str, Any], part: Part, section: str) -> dict[str, Any]:
    return {
        spec.field: values[name]
        for name, spec in knobs().items()
        if spec.part == part and spec.section == section and name in values
    }


def _build_worker(values: Mapping[str, Any]) -> tuple[WorkerConfig | None, list[str]]:
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        try:
            sections[name] = cls(**_section_values(values, "worker", name))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        return None, problems
    return WorkerConfig(**sections), []


def _build_io(values: Mapping[str, Any]) -> tuple[IOConfig | None, list[str]]:
    problems: list[str] = []
    subsections: dict[str, Any] = {}
    for name, cls in IO_SECTIONS.items():
        if not name:
            continue
        try:
            subsections[name] = cls(**_section_values(values, "io", name))
        except ConfigError as exc:
            problems.extend(exc.problems)
    try:
        io = IOConfig(**_section_values(values, "io", ""), **subsections) if not problems else None
    except ConfigError as exc:
        return None, problems + list(exc.problems)
    return io, problems


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

    :func:`~blockx.worker.config.load_config` is ``load_settings(..., parts=("worker",))
    .worker``. Raises :class:`ConfigError` listing every bad value.
    """
    environ = os.environ if env is None else env
    if path is None and environ.get(CONFIG_FILE_ENV, "").strip():
        path = environ[CONFIG_FILE_ENV]
    layers = [] if path is None else [file_layer(path)]
    layers.append(environment_layer(environ))
    if overrides:
        layers.append(mapping_layer(overrides, source="override", annotate=False))
    return resolve(layers, parts=parts)

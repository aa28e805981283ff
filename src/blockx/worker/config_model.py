"""The configuration model: schemas of knobs, layers of raw values, and their resolution.

Theory of operation
-------------------
This module knows no knob by name: it works over the :class:`Schema` it is
given. A schema describes one configuration object — the worker's
``WorkerConfig`` (:mod:`blockx.worker.config`), the IO subsystem's ``IOConfig``
(:mod:`blockx.worker.io.config`) — as a root class and its sections, each a
dataclass whose knobs are fields made by
:func:`~blockx.worker.config_kinds.knob` (kind, default, environment variable,
meaning). From the fields it lists the knobs by dotted name
(``pool.executor_count``, ``io.blockdb.engine``) as :class:`KnobSpec` rows.

A :class:`Layer` is one source of raw values: a config file
(:func:`file_layer`), the environment (:func:`environment_layer`), a mapping
(:func:`mapping_layer`: a task file's ``io:``, ``--set``, ``overrides``).
:func:`resolve` takes them lowest precedence first, checks each value with its
knob's kind *in its layer* (so a bad value's line names where it was written),
lets a later layer win, builds each schema's object (its sections' own checks
and those between knobs run there) and returns a :class:`Resolution`: the
objects by part and every knob's provenance. Every problem of every layer is
collected into one :class:`~blockx.worker.config_kinds.ConfigError`.

Imports point one way: the schemas' modules import this one (each declares its
schema and calls :func:`resolve`), and :mod:`blockx.worker.config_layers`,
which knows both schemas, resolves worker and IO knobs together for
``blockx run`` and :func:`~blockx.worker.config_layers.load_settings`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from blockx.worker.config_kinds import ConfigError, Kind

__all__ = [
    "DEFAULT",
    "KnobSpec",
    "Layer",
    "Resolution",
    "Schema",
    "api_layers",
    "environment_layer",
    "file_layer",
    "mapping_layer",
    "resolve",
    "schema_knobs",
]

#: The provenance of a value no layer set.
DEFAULT: Final = "default"


@dataclass(frozen=True, slots=True)
class KnobSpec:
    """One knob as declared by its field (see :func:`~blockx.worker.config_kinds.knob`)."""

    #: Dotted name: ``pool.executor_count``, ``io.data_dir``, ``io.blockdb.engine``.
    name: str
    #: The schema it belongs to (:attr:`Schema.part`): ``worker``, ``io``.
    part: str
    #: Section key: ``pool`` ...; ``""`` for a knob of the root class itself (``io.data_dir``).
    section: str
    field: str
    env: str
    kind: Kind

    def __repr__(self) -> str:
        return f"KnobSpec({self.name}, env={self.env})"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Schema:
    """One configuration object's knobs: where they sit and how the object is built.

    The object is ``root(**own knobs, **{section: section_class(**its knobs)})``;
    building a section or the root runs its checks (``ConfigError``). Knob names are
    ``[prefix.][section.]field``; in a file, a prefixed schema's knobs sit in the
    ``prefix`` table (``[io]``, ``[io.blockdb]``), the others' in one table per section.
    """

    #: Which configuration: ``worker``, ``io`` (:attr:`KnobSpec.part`).
    part: str
    #: The configuration object's class (``WorkerConfig``, ``IOConfig``).
    root: type[Any]
    #: Section name -> its class, in table order; ``""`` names the root's own knobs.
    sections: Mapping[str, type[Any]]
    #: The first part of every knob's name and the file's table for them (``io``), or ``""``.
    prefix: str = ""
    #: What the knobs are called in "``io``: expected a table of IO knobs".
    title: str = ""
    #: The line for a name under this schema that is no knob: ``{prefix}`` is the layer's.
    unknown_knob: str = "{prefix}unknown knob {name}"
    #: Every knob by dotted name, in table order (read from the fields).
    knobs: Mapping[str, KnobSpec] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        knobs: dict[str, KnobSpec] = {}
        for section, cls in self.sections.items():
            for f in dataclasses.fields(cls):
                if f.init and "kind" in f.metadata:
                    name = ".".join(p for p in (self.prefix, section, f.name) if p)
                    meta = f.metadata
                    knobs[name] = KnobSpec(
                        name, self.part, section, f.name, meta["env"], meta["kind"]
                    )
        object.__setattr__(self, "knobs", knobs)

    def owns(self, name: str) -> bool:
        """Whether a dotted name is under this schema (a knob of it or not)."""
        return not self.prefix or name == self.prefix or name.startswith(self.prefix + ".")

    def value(self, config: Any, spec: KnobSpec) -> Any:
        """The value of one of this schema's knobs in a configuration object."""
        holder = getattr(config, spec.section) if spec.section else config
        return getattr(holder, spec.field)

    def values(self, config: Any) -> dict[str, Any]:
        """Every knob's value in a configuration object, by dotted name."""
        return {name: self.value(config, spec) for name, spec in self.knobs.items()}

    def build(self, values: Mapping[str, Any]) -> tuple[Any, list[str]]:
        """The configuration object from checked values (the others default), or the
        problems its sections' and root's checks found (then ``None``)."""
        problems: list[str] = []
        sections: dict[str, Any] = {}
        for name, cls in self.sections.items():
            if not name:
                continue
            try:
                sections[name] = cls(**self._section_values(values, name))
            except ConfigError as exc:
                problems.extend(exc.problems)
        if problems:
            return None, problems
        try:
            return self.root(**self._section_values(values, ""), **sections), []
        except ConfigError as exc:
            return None, list(exc.problems)

    def _section_values(self, values: Mapping[str, Any], section: str) -> dict[str, Any]:
        return {
            spec.field: values[name]
            for name, spec in self.knobs.items()
            if spec.section == section and name in values
        }

    def __repr__(self) -> str:
        return f"Schema({self.part}, {self.root.__name__}, {len(self.knobs)} knobs)"


def schema_knobs(schemas: Iterable[Schema]) -> dict[str, KnobSpec]:
    """Every knob of ``schemas`` by dotted name, in their order."""
    return {name: spec for schema in schemas for name, spec in schema.knobs.items()}


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
    problems: tuple[tuple[str | None, str], ...] = ()
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


def environment_layer(schemas: Sequence[Schema], environ: Mapping[str, str]) -> Layer:
    """Every knob of ``schemas`` whose variable is set in ``environ`` (an empty or blank
    one is unset)."""
    values: dict[str, Any] = {}
    for spec in schema_knobs(schemas).values():
        text = environ.get(spec.env)
        if text is not None and text.strip():
            values[spec.name] = text
    return Layer(source="env", values=values, from_environment=True)


def mapping_layer(
    schemas: Sequence[Schema],
    mapping: Mapping[str, Any],
    *,
    source: str,
    prefix: str = "",
    annotate: bool = True,
    within: Schema | None = None,
    foreign: Collection[str] = (),
) -> Layer:
    """A layer from a nested mapping (a config file's form: one table per section, a
    prefixed schema's knobs in its own table, ``{"pool": {...}, "io": {"rpc": {...}}}``)
    or dotted keys (``{"pool.executor_count": 4}``).

    ``within``: the mapping is that prefixed schema's table itself (a task file's
    ``io:``). ``foreign``: names of tables and dotted prefixes that belong to a schema
    resolved elsewhere (``io`` for the worker alone): skipped. Unknown knobs become the
    layer's problems, each tagged with the part of the schema that owns its name.
    """
    values: dict[str, Any] = {}
    problems: list[tuple[str | None, str]] = []
    specs = schema_knobs(schemas)
    prefixed = [s for s in schemas if s.prefix]
    plain = [s for s in schemas if not s.prefix]

    def is_foreign(name: str) -> bool:
        return any(name == f or name.startswith(f + ".") for f in foreign)

    def put(name: str, value: Any) -> None:
        if name in specs:
            values[name] = value
        elif not is_foreign(name):
            owner = next((s for s in prefixed if s.owns(name)), plain[0] if plain else None)
            if owner is not None:
                problems.append((owner.part, owner.unknown_knob.format(prefix=prefix, name=name)))

    def put_table(schema: Schema, table: Mapping[str, Any]) -> None:
        for key, value in table.items():
            key = str(key)
            if key in schema.sections and key:
                if not isinstance(value, Mapping):
                    problem = f"{prefix}{schema.prefix}.{key}: expected a table of knobs"
                    problems.append((schema.part, problem))
                    continue
                for name, item in value.items():
                    put(f"{schema.prefix}.{key}.{name}", item)
            else:
                put(f"{schema.prefix}.{key}", value)

    def done() -> Layer:
        return Layer(
            source=source, values=values, problems=tuple(problems), prefix=prefix, annotate=annotate
        )

    if within is not None:
        put_table(within, mapping)
        return done()
    tables = {s.prefix: s for s in prefixed}
    sections = {name for s in plain for name in s.sections if name}
    for key, value in mapping.items():
        key = str(key)
        if key in tables:
            schema = tables[key]
            if isinstance(value, Mapping):
                put_table(schema, value)
            elif value is not None:
                problem = f"{prefix}{key}: expected a table of {schema.title} knobs"
                problems.append((schema.part, problem))
        elif key in sections and isinstance(value, Mapping):
            for name, item in value.items():
                put(f"{key}.{name}", item)
        else:
            put(key, value)
    return done()


def file_layer(
    schemas: Sequence[Schema], path: str | os.PathLike[str], *, foreign: Collection[str] = ()
) -> Layer:
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
        if is_json:
            data = json.loads(raw)
        else:
            import tomllib  # only for a TOML file (4 ms at start-up otherwise)

            data = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        problem = f"{label}: not valid {'JSON' if is_json else 'TOML'}: {exc}"
        return Layer(source=source, problems=((None, problem),))
    if not isinstance(data, dict):
        problem = f"{label}: expected a table of sections at the top level"
        return Layer(source=source, problems=((None, problem),))
    return mapping_layer(schemas, data, source=source, prefix=prefix, foreign=foreign)


def api_layers(
    schemas: Sequence[Schema],
    path: str | os.PathLike[str] | None,
    environ: Mapping[str, str],
    overrides: Mapping[str, Any] | None,
    *,
    foreign: Collection[str] = (),
) -> list[Layer]:
    """The Python API's layers, lowest first: the file at ``path`` (if any), the
    environment, the caller's ``overrides`` (provenance ``override``; not named in the
    lines of a check between knobs: the caller knows what they passed)."""
    layers = [] if path is None else [file_layer(schemas, path, foreign=foreign)]
    layers.append(environment_layer(schemas, environ))
    if overrides:
        layers.append(
            mapping_layer(schemas, overrides, source="override", annotate=False, foreign=foreign)
        )
    return layers


@dataclass(frozen=True, slots=True)
class Resolution:
    """The configuration objects by part, and per dotted knob where its value came from
    (``default``, ``file PATH``, ``env VAR``, ``task FILE``, ``--set``, ...)."""

    configs: Mapping[str, Any]
    provenance: Mapping[str, str]

    def __repr__(self) -> str:
        changed = sum(1 for source in self.provenance.values() if source != DEFAULT)
        return f"Resolution({', '.join(self.configs)}: {changed} knobs not default)"


#: A knob's dotted name in a problem's text (compiled on first use: an error path).
_NAME_PATTERN: Final = r"\b[a-z_]+(?:\.[a-z_]+)+\b"


def _annotated(problem: str, provenance: Mapping[str, str], shown: set[str]) -> str:
    """A check between knobs' line, with the source of each knob it names that a layer set."""
    named = [n for n in dict.fromkeys(re.findall(_NAME_PATTERN, problem)) if n in shown]
    if not named:
        return problem
    return problem + " (" + "; ".join(f"{n}: {provenance[n]}" for n in named) + ")"


def resolve(
    schemas: Sequence[Schema],
    layers: Iterable[Layer],
    *,
    parts: Collection[str] | None = None,
    bases: Mapping[str, Any] | None = None,
) -> Resolution:
    """Apply ``layers`` (lowest precedence first) over the defaults, or over the bases
    (part -> configuration object).

    Only the knobs of ``parts`` (default: every schema's) are taken from the layers;
    another part's object is its base, or its defaults. Raises :class:`ConfigError`
    listing every problem of every layer, then those of the checks run while building
    the objects, each naming the sources of the knobs it names.
    """
    wanted = frozenset(s.part for s in schemas) if parts is None else frozenset(parts)
    given = bases or {}
    specs = schema_knobs(schemas)
    values: dict[str, Any] = {}
    provenance: dict[str, str] = {name: DEFAULT for name in specs}
    annotated: set[str] = set()
    for schema in schemas:
        if schema.part in wanted and given.get(schema.part) is not None:
            values.update(schema.values(given[schema.part]))
    problems: list[str] = []
    for layer in layers:
        problems.extend(text for part, text in layer.problems if part is None or part in wanted)
        for name, raw in layer.values.items():
            spec = specs.get(name)
            if spec is None or spec.part not in wanted:
                continue
            try:
                kind = spec.kind
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
    configs: dict[str, Any] = {}
    for schema in schemas:
        if schema.part in wanted:
            config, found = schema.build(values)
            problems.extend(_annotated(p, provenance, annotated) for p in found)
        else:
            config = given.get(schema.part)
            config = schema.root() if config is None else config
        configs[schema.part] = config
    if problems:
        raise ConfigError(problems)
    return Resolution(configs=configs, provenance=provenance)

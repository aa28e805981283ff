"""How the worker's configuration knobs are declared, parsed from text and checked.

Theory of operation
-------------------
A knob is a dataclass field made by :func:`knob`: its metadata carries its
:class:`Kind` (how a value is parsed from an environment variable or a file
and checked), its environment variable, its meaning and whether the seed
names that variable. :func:`check_section` runs every kind of a section
instance and collects every bad value into one :class:`ConfigError`, so a user
sees all their mistakes at once. :mod:`blockx.worker.config` declares the
sections with these; nothing here knows a knob by name.

The IO subsystem's sections (:mod:`blockx.worker.io.config`) are declared the
same way, so :mod:`blockx.worker.config_model` resolves every knob of both with
one model (:mod:`blockx.worker.config_layers`: both together).

A kind's ``check`` accepts the value in its Python type or as text (a file may
give ``"4"``), returns it converted, or raises ``ValueError`` whose text is
what was expected (``expected a positive integer``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import field
from typing import Any, Final

__all__ = [
    "NON_NEGATIVE",
    "POSITIVE",
    "Bool",
    "Checked",
    "Choice",
    "ConfigError",
    "Float",
    "Int",
    "Kind",
    "OptionalText",
    "check_section",
    "cpu_count",
    "knob",
]


class ConfigError(ValueError):
    """One or more bad configuration values; each line of the message names one."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class Kind:
    """How one knob's value is parsed from text and checked."""

    expected = "a value"

    def from_text(self, text: str) -> Any:
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        """Return the value (converted if needed) or raise ValueError."""
        raise NotImplementedError


class Int(Kind):
    """An integer of at least ``minimum`` (``optional``: None too)."""

    def __init__(self, minimum: int, *, optional: bool = False, maximum: int | None = None) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.optional = optional
        self.expected = "a positive integer" if minimum == 1 else "a non-negative integer"

    def from_text(self, text: str) -> Any:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise ValueError(self.expected) from None
        return self.check(value)

    def check(self, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if isinstance(value, str):
            return self.from_text(value)
        if type(value) is not int or value < self.minimum:
            raise ValueError(self.expected)
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"{self.expected} of at most {self.maximum}")
        return value


class Float(Kind):
    """A finite number above 0 (``zero``: 0 allowed too), stored as a float."""

    def __init__(self, *, zero: bool = False) -> None:
        self.zero = zero
        self.expected = "a non-negative number" if zero else "a positive number"

    def from_text(self, text: str) -> Any:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(self.expected) from None
        return self.check(value)

    def check(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.from_text(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(self.expected)
        value = float(value)
        if not (value < float("inf") and (value > 0 or (self.zero and value == 0))):
            raise ValueError(self.expected)
        return value


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


class Bool(Kind):
    expected = "true or false (1/0, yes/no, on/off)"

    def from_text(self, text: str) -> Any:
        word = text.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(self.expected)

    def check(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.from_text(value)
        if type(value) is not bool:
            raise ValueError(self.expected)
        return value


class Choice(Kind):
    """One of a closed set of words (text is matched case-insensitively)."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.expected = "one of " + ", ".join(choices)

    def from_text(self, text: str) -> Any:
        return self.check(text.strip().lower())

    def check(self, value: Any) -> Any:
        if value not in self.choices:
            raise ValueError(self.expected)
        return value


class OptionalText(Kind):
    """None, or a non-blank string (a path-like is taken as its path)."""

    def __init__(self, expected: str) -> None:
        self.expected = expected

    def from_text(self, text: str) -> Any:
        return self.check(text)

    def check(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(self.expected)
        return value


class Checked(Kind):
    """A kind made of one function that takes a value or its text and returns it checked
    (raising ``ValueError``, or ``TypeError``, whose text is what was expected)."""

    def __init__(self, check: Callable[[Any], Any], expected: str = "a value") -> None:
        self._check = check
        self.expected = expected

    def from_text(self, text: str) -> Any:
        return self.check(text)

    def check(self, value: Any) -> Any:
        try:
            return self._check(value)
        except TypeError as exc:
            raise ValueError(str(exc)) from None


NON_NEGATIVE: Final = Int(0)
POSITIVE: Final = Int(1)


def knob(
    default: Any = dataclasses.MISSING,
    *,
    kind: Kind,
    env: str,
    doc: str,
    seed_env: bool = False,
    default_text: str | None = None,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A section field that is a knob: its kind, environment variable and meaning."""
    metadata = {
        "kind": kind,
        "env": env,
        "doc": doc,
        "seed_env": seed_env,
        "default_text": default_text,
    }
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def check_section(section: Any, name: str, *, error: type[ConfigError] | None = None) -> None:
    """Check every knob of a section instance; store converted values.

    Raises :class:`ConfigError` (or ``error``, a subclass) naming every bad knob
    (``name.field=value``).
    """
    problems: list[str] = []
    for f in dataclasses.fields(section):
        if not f.init or "kind" not in f.metadata:
            continue
        value = getattr(section, f.name)
        try:
            checked = f.metadata["kind"].check(value)
        except ValueError as exc:
            problems.append(f"{name}.{f.name}={value!r}: expected {exc}")
            continue
        if checked is not value:
            object.__setattr__(section, f.name, checked)
    if problems:
        raise (error or ConfigError)(problems)


def cpu_count() -> int:
    """The default executor count: the machine's cores."""
    return os.cpu_count() or 1

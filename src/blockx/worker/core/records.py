"""Record: the base of the per-call value records (commands and call specs).

Theory of operation
-------------------
BlockX writes events and commands as frozen, slotted, keyword-only
dataclasses: facts and orders that cannot change once made. The records built
once or more *per call* on the worker's hot path (``BindCall``,
``DispatchCallCmd``, ``UnbindCall``, ``CallSpec``,
``PreparedCall``, ...) are plain ``__slots__`` classes deriving from
:class:`Record` instead, for one measured reason: a frozen dataclass sets every
field through ``object.__setattr__``, and a keyword-only call binds every
argument by name. Measured on the worker's box (Python 3.11, ``timeit``, best
of 5; on a loaded box both columns double):

==========================================  =============  ====================
record                                      frozen dc, kw  slotted, positional
==========================================  =============  ====================
``BindCall`` (5 fields)                     1.05 µs        0.20 µs
``UnbindCall`` (3 fields)                   0.75 µs        0.18 µs
``DispatchCallCmd`` (9 fields)              1.80 µs        0.22 µs
``CallSpec`` + ``PreparedCall``             1.54 µs        0.35 µs
==========================================  =============  ====================

Five of these are built per call: 5.1 µs as dataclasses against 0.95 µs, on a
worker that spends 8–15 µs of CPU per trivial call compiled
(docs/operations.md, "Compiled modules").

What a subclass keeps of the dataclass contract: value equality (same type and
equal fields), a hash, a ``repr`` naming every field, ``__match_args__`` for
``match`` statements, and keyword construction (hot paths in the core pass
arguments by position, in declaration order). What it gives up: immutability is
by convention -- nobody assigns to a record after building it -- and there is
no ``dataclasses.replace``.

A subclass declares its fields three times, checked against each other when the
class is built interpreted: as ``__slots__``, as the parameters of an ``__init__``
that assigns each, and as ``_fields`` in the parameters' order (``repr``,
``__match_args__``, positional construction). ``_fields`` is spelled out because
the core may be compiled by mypyc (:mod:`blockx.worker.core`), and a compiled
class keeps neither ``__slots__`` nor a code object to read the order from.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["Record"]


class Record:
    """Base of slotted per-call records: equality, hash, repr and match by ``__slots__``."""

    __slots__ = ()
    #: The record's fields in declaration order: every subclass spells them out,
    #: because a class compiled by mypyc keeps neither ``__slots__`` nor its
    #: ``__init__``'s code object to derive them from.
    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Interpreted (the class has its code object): hold ``_fields`` to the
        # ``__init__`` parameters, in order, and to ``__slots__``. Compiled, the
        # same source passed this check in the pure-Python test run.
        code = getattr(cls.__init__, "__code__", None)
        if code is not None:
            params = code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]
            if cls._fields != params:
                raise TypeError(
                    f"{cls.__name__}: _fields must be the __init__ parameters, in order"
                )
            if set(params) != set(vars(cls).get("__slots__", ())):
                raise TypeError(
                    f"{cls.__name__}: __slots__ must be exactly the __init__ parameters"
                )
        setattr(cls, "__match_args__", cls._fields)  # noqa: B010 -- mypy forbids assigning it

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({body})"

"""The type parameters of :class:`~blockx.wire.frames.Frame` and its decoders.

Their defaults (PEP 696) exist for type checkers only: a bare ``Frame`` is
``Frame[Any]``, a ``FrameDecoder()`` without a typed hook a
``FrameDecoder[Never]`` (its frames' envelopes are dicts). Python 3.11's
``typing.TypeVar`` takes no default, so at run time they are plain type
variables. Not compiled by mypyc: it would take the run-time branch for
unreachable (mypy reads ``TYPE_CHECKING`` as true) and raise at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Never, TypeVar

__all__ = ["E", "T"]

if TYPE_CHECKING:
    from typing_extensions import TypeVar as DefaultedTypeVar

    #: A frame's envelope: ``dict[str, Any]`` from the generic decoders; that, or what a
    #: typed hook decoded, from a :class:`~blockx.wire.frames.FrameDecoder` with one.
    E = DefaultedTypeVar("E", covariant=True, default=Any)
    #: What a :class:`~blockx.wire.frames.TypedHook` decodes to (a union of
    #: :mod:`blockx.wire.schema` envelopes); nothing for a decoder without a hook.
    T = DefaultedTypeVar("T", default=Never)
else:
    E = TypeVar("E", covariant=True)
    T = TypeVar("T")

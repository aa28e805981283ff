"""msgspec imported without ``typing_extensions``: a process's start pays for neither it
nor what it imports.

msgspec takes ``typing_extensions`` when it is installed (it often is, for other
packages), and with it ``inspect``, ``dis`` and ``ast``: ~12 ms of an executor's start,
~2.6 ms of a ``blockx run`` worker's (which imports ``inspect`` for ``dataclasses``
anyway). Python 3.11's ``typing`` has all msgspec needs (``get_type_hints``,
``Required``, ``NotRequired``), and msgspec falls back to it when the import fails.

:func:`import_msgspec` makes that import fail while msgspec is imported, so it must run
before any other thread could import ``typing_extensions``: at the very start of a
process BlockX owns (the executor, the ``blockx`` command), never from a library
import. Code imported later gets ``typing_extensions`` as usual.
"""

from __future__ import annotations

import sys

__all__ = ["import_msgspec"]


def import_msgspec() -> None:
    """Import msgspec with ``typing_extensions`` hidden (a no-op once either is imported)."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # an ImportError
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]

"""Dataclass methods compiled once per installation, not at every start.

Theory of operation
-------------------
``@dataclass`` writes every method it adds (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, a frozen class's ``__setattr__`` and ``__delattr__``) as source text and
runs it with ``exec``. A ``blockx run`` worker creates ~100 dataclasses at start-up: ~400
texts parsed and compiled, a quarter of the instructions of its whole start
(callgrind: ~260 M of ~860 M), at every start of every worker and executor process.

:func:`install` gives ``dataclasses`` an ``exec`` of its own (a module global shadows
the builtin for that module's code only) that compiles a text once and keeps the
code object: in memory, and in a file beside this module's bytecode
(``__pycache__/method_cache.<tag>.o<optimize>.methods``, a ``marshal`` of the
bytecode's magic number and ``{text: marshalled code}``), so the next process loads
the code instead of compiling it (each code at its first use: an executor uses a few
dozen of the worker's ~400). The result is
the same function: the same text compiled as ``exec(text)`` in ``dataclasses``
compiles it (file name ``<string>``, no inherited ``__future__`` flags), run in the
same namespaces. Anything but a text goes to the builtin unchanged.

Only BlockX's own classes' texts are written (those run in a ``blockx.*`` module's
namespace): a user's classes are compiled as before and kept in memory only, and an
executor stops recording (:func:`save` with ``stop=True``) before it runs user code.
The file is written as bytecode is: not when ``sys.dont_write_bytecode`` is set
(``PYTHONDONTWRITEBYTECODE``), atomically (a temporary file renamed over it: a reader
sees the old or the new file), and only by a process that compiled a text the file
lacked (:func:`save`: at exit, or by an executor once started, as it leaves with
``os._exit``). It keeps the texts of every process kind that ran (worker, executor,
service), at most :data:`MAX_ENTRIES`: past that a process writes only those it used.
A file that cannot be read (another Python's, damaged) is ignored and replaced.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import marshal
import os
import sys
from importlib.util import MAGIC_NUMBER
from types import CodeType
from typing import Any, Final

__all__ = ["MAX_ENTRIES", "cache_path", "install", "save"]

#: The most texts the file keeps (a worker uses ~400; every process kind together ~1,000).
MAX_ENTRIES: Final = 4096

#: Code by text: the file's (marshalled, loaded at its first use), then what this
#: process compiled.
_codes: dict[str, CodeType | bytes] = {}
#: BlockX's texts this process used (from the file or compiled), and those it compiled.
_used: set[str] = set()
_compiled: set[str] = set()
_recording = True
_installed = False
_builtin_exec = builtins.exec


def cache_path() -> str | None:
    """Where the compiled methods are kept (None: nowhere, this module has no bytecode
    path, e.g. run from a zip)."""
    cached = globals().get("__cached__")
    if not cached:
        return None
    base, _ = os.path.splitext(cached)  # .../__pycache__/method_cache.cpython-311
    return f"{base}.o{sys.flags.optimize}.methods"


def _exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
    if globals is None:  # the caller's namespaces, as the builtin takes them
        frame = sys._getframe(1)
        globals = frame.f_globals
        locals = frame.f_locals if locals is None else locals
    if type(source) is str:
        code = _codes.get(source)
        new = code is None
        if code is None:
            code = _codes[source] = compile(source, "<string>", "exec", dont_inherit=True)
        elif type(code) is bytes:
            code = _codes[source] = _unmarshal(source, code)
        if _recording and str(globals.get("__name__", "")).startswith("blockx."):
            _used.add(source)
            if new:
                _compiled.add(source)
        source = code
    _builtin_exec(source, globals, locals)


def _unmarshal(text: str, data: bytes) -> CodeType:
    """The file's code of ``text`` (compiled again if it is not one)."""
    try:
        code = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        code = None
    if type(code) is not CodeType:
        return compile(text, "<string>", "exec", dont_inherit=True)
    return code


def _load(path: str) -> dict[str, bytes]:
    """The file's entries, each code still marshalled (``marshal.load`` of a file object
    reads it a few bytes per call: ~35x the instructions of ``loads`` of its bytes). A
    file another bytecode wrote (its magic number, as a ``.pyc`` file's) holds nothing."""
    try:
        with open(path, "rb") as file:
            loaded = marshal.loads(file.read())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not (
        type(loaded) is tuple
        and len(loaded) == 2
        and loaded[0] == MAGIC_NUMBER
        and isinstance(loaded[1], dict)
    ):
        return {}
    return {
        text: data for text, data in loaded[1].items() if type(text) is str and type(data) is bytes
    }


def install() -> None:
    """Give ``dataclasses`` the caching ``exec`` and load the file (once per process;
    before the classes whose methods it should keep)."""
    global _installed
    if _installed:
        return
    _installed = True
    import dataclasses

    path = cache_path()
    if path is not None:
        _codes.update(_load(path))
    dataclasses.exec = _exec  # type: ignore[attr-defined]
    atexit.register(save)


def _marshalled(text: str) -> bytes:
    code = _codes[text]
    return code if type(code) is bytes else marshal.dumps(code)


def save(*, stop: bool = False) -> None:
    """Write the file when this process compiled a text it lacked (see the module
    docstring); never raises. ``stop``: record nothing more (user code runs next)."""
    global _recording
    if stop:
        _recording = False
    path = cache_path()
    if not _compiled or path is None or sys.dont_write_bytecode:
        return
    try:
        entries = _load(path)
        entries.update({text: _marshalled(text) for text in _compiled})
        if len(entries) > MAX_ENTRIES:
            entries = {text: _marshalled(text) for text in _used}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "wb") as file:
                file.write(marshal.dumps((MAGIC_NUMBER, entries)))
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except (OSError, ValueError):  # ValueError: a code object marshal cannot write
        return
    finally:
        _compiled.clear()

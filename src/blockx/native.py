"""Compiled modules: which of BlockX's modules run compiled by mypyc, and the way back.

Theory of operation
-------------------
The per-call modules (the dispatcher core, the worker's runtime and IO scope, the
executor's runtime, the frame codec: ``setup.py``'s ``NATIVE_MODULES``) are
compiled by mypyc when the package is installed and a C compiler is at hand;
the ``.so`` files sit next to their ``.py`` sources (in the source tree itself
for an editable install) and shadow them on import. The build writes a stamp,
``blockx/_native_build.json``: every module it was asked to compile, with the
SHA-256 of the source it compiled (``null`` when it did not compile them).

:func:`install` runs when ``blockx`` is imported, before any of those modules,
and decides once per process. The compiled modules are used only when all of
these hold; otherwise every module the stamp lists is loaded from its ``.py``
source (a finder put first on ``sys.meta_path``), and nothing else changes:

* ``BLOCKX_PURE_PYTHON`` is unset, empty or ``0`` (``1`` forces pure Python,
  e.g. to debug or profile the core line by line);
* the build compiled them (no compiler, or ``BLOCKX_PURE_PYTHON`` set at install
  time, makes a pure build);
* every listed source is byte for byte what was compiled. An edited source after
  a compiled build would otherwise run the *old* compiled code; instead the
  process runs the sources and warns once, naming the files: ``make setup``
  rebuilds. All or nothing, because modules compiled together call each other
  natively: a fresh source beside stale compiled neighbours would mix versions.
  A source whose size and modification time (nanoseconds) are still those the
  stamp recorded is not read again: every process start would otherwise hash
  ~750 KB of sources (~1.8 ms). Any other source is hashed and compared, so a
  file touched but unchanged still runs compiled.

Without a stamp (a source tree nobody installed) there is nothing to decide. An
unreadable stamp vouches for nothing: every compiled module found beside its
source runs from the source.
:func:`status` says what was decided and why (``blockx --version`` prints it).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

__all__ = ["ENV_PURE", "STAMP_NAME", "NativeStatus", "install", "source_digest", "status"]

#: Set to ``1`` to run every compiled module from its source.
ENV_PURE = "BLOCKX_PURE_PYTHON"
#: The build's stamp, in the ``blockx`` package directory.
STAMP_NAME = "_native_build.json"
#: How a stale build's reason begins (install() warns about that one).
_STALE = "sources changed since the build"

# Light imports only: every executor process pays for them at start (importlib.abc,
# dataclasses and pathlib would add ~20 ms, and pull in random and tempfile).
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class NativeStatus(NamedTuple):
    """What :func:`install` decided for this process."""

    #: Modules running compiled (empty when pure).
    compiled: tuple[str, ...]
    #: Modules the build lists that run from their sources instead.
    pure: tuple[str, ...]
    #: Why they run pure ("" when compiled, or when nothing was built).
    reason: str

    def describe(self) -> str:
        if self.compiled:
            return f"{len(self.compiled)} modules compiled (mypyc)"
        if self.pure:
            return f"pure Python ({self.reason})"
        return "pure Python (no native build)"


_status: NativeStatus | None = None


def source_digest(path: str) -> str:
    """The SHA-256 of a source file, as the build stamps it."""
    # Imported here: a start whose sources match the stamp's stats hashes nothing, and
    # hashlib is ~3 ms of every executor's start.
    import hashlib

    with open(path, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def _module_path(name: str) -> str:
    # "blockx.worker.core.lifecycle" -> <package dir>/worker/core/lifecycle.py
    return os.path.join(_PACKAGE_DIR, *name.split(".")[1:]) + ".py"


class _SourceFinder:
    """A ``sys.meta_path`` finder: the listed modules' ``.py`` sources ahead of their ``.so``."""

    def __init__(self, modules: Sequence[str]) -> None:
        self._paths = {name: _module_path(name) for name in modules}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        source = self._paths.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _decide(stamp: dict[str, object]) -> NativeStatus:
    raw_modules = stamp.get("modules")
    modules: dict[str, str | None] = dict(raw_modules) if isinstance(raw_modules, dict) else {}
    names = tuple(sorted(modules))
    if not names:
        return NativeStatus((), (), "")
    if os.environ.get(ENV_PURE, "") not in ("", "0"):
        return NativeStatus((), names, f"{ENV_PURE} is set")
    if not all(modules.values()):
        note = stamp.get("note") or "the build compiled nothing"
        return NativeStatus((), names, str(note))
    raw_stats = stamp.get("stats")
    stats: dict[str, object] = raw_stats if isinstance(raw_stats, dict) else {}
    changed = []
    for name in names:
        path = _module_path(name)
        try:
            info = os.stat(path)
            if stats.get(name) == [info.st_size, info.st_mtime_ns]:
                continue  # untouched since the build: its digest stands (not read again)
            current: str | None = source_digest(path)
        except OSError:
            current = None
        if current != modules[name]:
            changed.append(os.path.relpath(path, os.path.dirname(_PACKAGE_DIR)))
    if changed:
        return NativeStatus((), names, f"{_STALE}: {', '.join(changed)}; run `make setup`")
    return NativeStatus(names, (), "")


def _compiled_beside_sources() -> tuple[str, ...]:
    """Every module of the package with an extension file next to its ``.py``."""
    found = []
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    root = os.path.dirname(_PACKAGE_DIR)
    for folder, _dirs, files in os.walk(_PACKAGE_DIR):
        for file in files:
            if not file.endswith(suffixes):
                continue
            stem = file.split(".", 1)[0]
            if stem + ".py" in files:
                found.append(os.path.relpath(os.path.join(folder, stem), root).replace(os.sep, "."))
    return tuple(sorted(found))


def _read_stamp() -> tuple[dict[str, object], str]:
    """The build's stamp ({} when there is none), or why it cannot be read."""
    path = os.path.join(_PACKAGE_DIR, STAMP_NAME)
    try:
        with open(path, encoding="utf-8") as file:
            stamp = json.load(file)
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as exc:
        return {}, f"unreadable {STAMP_NAME}: {exc}"
    if not isinstance(stamp, dict):
        return {}, f"unreadable {STAMP_NAME}: not a JSON object"
    return stamp, ""


def install() -> NativeStatus:
    """Decide, once per process, whether the compiled modules run (see the module doc)."""
    global _status
    if _status is not None:
        return _status
    stamp, unreadable = _read_stamp()
    if unreadable:  # it vouches for nothing: whatever is compiled runs from its source
        decided = NativeStatus((), _compiled_beside_sources(), unreadable)
        warnings.warn(f"blockx: running pure Python: {unreadable}", stacklevel=2)
    else:
        decided = _decide(stamp)
    if decided.pure:
        already = [name for name in decided.pure if name in sys.modules]
        if already:  # imported before the decision: cannot be swapped any more
            raise RuntimeError(f"blockx.native.install() after {already[0]} was imported")
        sys.meta_path.insert(0, _SourceFinder(decided.pure))
        if decided.reason.startswith(_STALE):
            warnings.warn(f"blockx: running pure Python: {decided.reason}", stacklevel=2)
    _status = decided
    return decided


def status() -> NativeStatus:
    """What :func:`install` decided (it runs when ``blockx`` is imported)."""
    return install()

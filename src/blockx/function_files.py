"""Function sources given as file paths: ``"functions/f.py"`` instead of the source text.

``Task(functions=...)``, :func:`blockx.testing.load_function` and :func:`blockx.map`
accept, for each function, either its Python source or the path of a ``.py`` file.
The rule (one place, so all three agree):

* a ``str`` or :class:`os.PathLike` that is one line ending in ``.py`` is a path
  (relative paths against ``base_dir``, default the current directory); a
  ``PathLike`` is always a path;
* anything else is source text (a module has a newline or a ``def``: a path
  never does).

A path that does not exist, or is not a readable UTF-8 file, raises
:class:`FunctionFileError` naming the function and the resolved path. Reading
happens once, when the value is given (``Task`` resolves at construction), so a
later edit of the file does not change a task already built.
"""

from __future__ import annotations

import os
import pathlib
from typing import Final

__all__ = ["FunctionFileError", "is_function_path", "read_function_source"]

_SUFFIX: Final = ".py"


class FunctionFileError(ValueError):
    """A function given as a path whose file is missing or unreadable."""


def is_function_path(value: str | os.PathLike[str]) -> bool:
    """Whether ``value`` names a ``.py`` file rather than holding source text."""
    if isinstance(value, os.PathLike):
        return True
    text = value.strip()
    return bool(text) and "\n" not in text and text.endswith(_SUFFIX)


def read_function_source(
    value: str | os.PathLike[str],
    *,
    function_id: str = "",
    base_dir: str | os.PathLike[str] | None = None,
) -> tuple[str, pathlib.Path | None]:
    """``(source, path)`` of a function value: the file's text when ``value`` is a path
    (``path`` then the resolved file), else ``(value, None)``."""
    if not is_function_path(value):
        return str(value), None
    path = pathlib.Path(os.fspath(value).strip()).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = pathlib.Path(base_dir) / path
    who = f"function {function_id!r}: " if function_id else ""
    if not path.is_file():
        where = path if path.is_absolute() else f"{path} (from {pathlib.Path.cwd()})"
        raise FunctionFileError(f"{who}no such function file: {where}")
    try:
        return path.read_text(encoding="utf-8"), path.resolve()
    except (OSError, UnicodeDecodeError) as exc:
        raise FunctionFileError(f"{who}cannot read function file {path}: {exc}") from None

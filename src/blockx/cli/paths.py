"""``blockx run``'s output paths, checked before anything runs.

Theory of operation
-------------------
``-o FILE``, ``--errors FILE`` and ``--summary-json FILE`` are opened (created
or truncated) by the run: ``-o`` before it starts, the other two at its end.
A path that cannot be written would otherwise be found out too late — after
every row was written, as a traceback, with no summary — and a path that is
one of the task's inputs would be truncated while it is read (``-o
calls.jsonl`` destroys the calls file and the run reports success). So every
output path is checked here, before any process starts, and each problem is
one line naming the option and the path:

- its directory exists, and it is not a directory itself;
- it is not the same file (device and inode, through symlinks and hard links)
  as the task file, a function file or the calls file — nor as another output;
- it can be written: an existing file is opened for writing (not truncated);
  a new one is created and removed again (``/proc/x``, a read-only mount and a
  directory without write permission all fail here).

:func:`check_output_paths` returns the problems (empty: all good); the
command exits 2 with them. Nothing here is kept open: the run opens the
outputs itself.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from blockx.cli.taskfile import TaskFile

__all__ = ["check_output_paths", "input_files", "why_unwritable"]


def input_files(spec: TaskFile) -> list[tuple[str, Path]]:
    """The files the run reads: ``(how messages name it, path)``."""
    out: list[tuple[str, Path]] = [(f"the task file {spec.label}", spec.path)]
    for fid, fn in spec.functions.items():
        if fn.path is not None:
            out.append((f"the source of function {fid!r} ({fn.origin})", fn.path))
    if spec.calls_file is not None:
        out.append((f"the calls file {spec.calls_label}", spec.calls_file))
    return out


_Identity = tuple[int | str, int | str]


def _identity(path: str | os.PathLike[str]) -> _Identity | None:
    """(device, inode) of the regular file at ``path`` (symlinks followed); for a file
    that does not exist yet, its real path (two outputs may name the same new file);
    None for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ("new", os.path.realpath(path))
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None  # /dev/null and other devices may be named twice
    return st.st_dev, st.st_ino


def why_unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written, or None. Leaves an existing file as it is and
    removes a file it had to create."""
    try:
        if os.path.lexists(path) and os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK)
            os.close(fd)
            return None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO with no reader yet: writable once one comes
            return None
        return f"cannot be written: {exc.strerror or exc}"
    os.close(fd)
    try:
        os.unlink(path)
    except OSError:  # pragma: no cover - it was just created
        pass
    return None


def check_output_paths(spec: TaskFile, outputs: Sequence[tuple[str, str | None]]) -> list[str]:
    """Problems with the output paths ``outputs`` (``(flag, path or None)``), one line each."""
    problems: list[str] = []
    inputs = [(what, _identity(path)) for what, path in input_files(spec)]
    seen: list[tuple[str, _Identity | None]] = []
    for flag, path in outputs:
        if path is None:
            continue
        named = f"{flag} {path}"
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            problems.append(f"{named}: no such directory {parent}")
            continue
        if os.path.isdir(path):
            problems.append(f"{named}: is a directory; name a file")
            continue
        identity = _identity(path)
        clash = _same_file(identity, inputs)
        if clash is not None:
            problems.append(
                f"{named}: is the same file as {clash}: writing it would destroy the input; "
                "write the output somewhere else"
            )
            continue
        clash = _same_file(identity, seen)
        if clash is not None:
            problems.append(f"{named}: is the same file as {clash}: give each output its own")
            continue
        why = why_unwritable(path)
        if why is not None:
            problems.append(f"{named}: {why}")
            continue
        seen.append((named, identity))
    return problems


def _same_file(
    identity: _Identity | None, others: Iterable[tuple[str, _Identity | None]]
) -> str | None:
    if identity is None:
        return None
    for what, other in others:
        if other == identity:
            return what
    return None

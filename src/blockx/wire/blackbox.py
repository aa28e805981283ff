"""The executor's black box: which call was running when the process died.

Theory of operation
-------------------
An executor runs one greenlet at a time, so when its process dies of something
a call did (``os._exit``, a segfault in C code, a memory limit, a wedge), the
call that held the thread at that moment is the one to suspect, and the calls
suspended beside it are not. No frame can carry that fact out of a dying
process, so the executor keeps it in a small shared file that outlives it: the
worker names the file (``--blackbox-path``, in the socket directory, which the
sandbox binds read-write), the executor maps it and writes the running call's
id at every switch into a call's greenlet and clears it at every switch back to
the scheduler; after the process has exited the worker reads it once.

Layout (:data:`BLACKBOX_SIZE` bytes, big-endian)::

    0   4  magic b"BXBB"
    4   4  u32 cause: CAUSE_* (set by the executor just before it exits on purpose)
    8   4  u32 length L of the running call id (0: no call was running)
    12  4  u32 attemptSeq of that call
    16  L  the call id, UTF-8 (at most MAX_CALL_ID_BYTES)

A switch-in writes the id first and its length last, a switch-out zeroes the
length: the reader, which runs only after the writer is dead, never sees a
length that does not belong to the bytes before it. This module is IO-free but
for the two functions that open the file; both sides import it.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Final, NamedTuple

__all__ = [
    "BLACKBOX_SIZE",
    "CAUSE_DESCRIPTORS_EXHAUSTED",
    "CAUSE_MEMORY_EXCEEDED",
    "CAUSE_NONE",
    "EXIT_DESCRIPTORS_EXHAUSTED",
    "EXIT_MEMORY_EXCEEDED",
    "MAX_CALL_ID_BYTES",
    "BlackboxRecord",
    "BlackboxWriter",
    "read_blackbox",
]

MAGIC: Final = b"BXBB"
BLACKBOX_SIZE: Final = 4096
MAX_CALL_ID_BYTES: Final = BLACKBOX_SIZE - 16

#: Why the executor ended itself (0: it did not, or it could not say).
CAUSE_NONE: Final = 0
#: Its memory watchdog found the process over ``--memory-limit-mb``.
CAUSE_MEMORY_EXCEEDED: Final = 1
#: A call failed for want of file descriptors: the process recycles itself.
CAUSE_DESCRIPTORS_EXHAUSTED: Final = 2

#: Exit statuses of an executor that ends itself for these causes (the worker
#: reads them even where the black box could not be written).
EXIT_MEMORY_EXCEEDED: Final = 87
EXIT_DESCRIPTORS_EXHAUSTED: Final = 88

_HEADER: Final = struct.Struct(">4sIII")
_U32: Final = struct.Struct(">I")


class BlackboxRecord(NamedTuple):
    """What a dead executor's black box says."""

    #: The call that was running, or ``None`` (none was, or nothing was written).
    call_id: str | None
    attempt_seq: int
    #: One of the ``CAUSE_*`` values.
    cause: int


class BlackboxWriter:
    """The executor's side: a mapped black box, written at every greenlet switch.

    A call's record is packed once (:meth:`record_of`, kept on its context); before
    switching into the call's greenlet :meth:`enter` writes it (one slice assignment,
    then one store to the length field), and when control is back in the scheduler
    :meth:`leave` zeroes the length (one store): ~0.3 µs a switch. Neither raises once
    the writer is open.
    """

    __slots__ = ("_fd", "_length", "_map")

    def __init__(self, path: str) -> None:
        # mmap and ctypes are imported here, by the executor that writes: the worker,
        # which only reads a dead executor's box, imports neither.
        import ctypes
        import mmap

        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, BLACKBOX_SIZE)
            self._map: Any = mmap.mmap(fd, BLACKBOX_SIZE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _HEADER.pack_into(self._map, 0, MAGIC, CAUSE_NONE, 0, 0)
        # The length field, stored through a ctypes view of the map: one store a switch.
        self._length: Any = ctypes.c_uint32.__ctype_be__.from_buffer(self._map, 8)

    def __repr__(self) -> str:
        return f"BlackboxWriter(fd={self._fd})"

    @staticmethod
    def record_of(call_id: str, attempt_seq: int) -> tuple[bytes, int]:
        """``(attemptSeq + call id bytes, the id's length)`` for :meth:`enter`."""
        encoded = call_id.encode("utf-8", "replace")[:MAX_CALL_ID_BYTES]
        return _U32.pack(attempt_seq & 0xFFFFFFFF) + encoded, len(encoded)

    def enter(self, record: tuple[bytes, int]) -> None:
        """Name the call about to hold the thread: its attemptSeq and id first, the
        length last (a reader of a dead writer never sees a length without its bytes)."""
        body, length = record
        self._map[12 : 12 + len(body)] = body
        self._length.value = length

    def leave(self) -> None:
        """Control is back in the scheduler: no call is named."""
        self._length.value = 0

    def set_cause(self, cause: int) -> None:
        self._map[4:8] = _U32.pack(cause)

    def close(self) -> None:
        self._length = None  # the ctypes view pins the map: released before it closes
        try:
            self._map.close()
        finally:
            os.close(self._fd)


def read_blackbox(path: str) -> BlackboxRecord | None:
    """The record in ``path``, or ``None`` when the file is missing, short or foreign."""
    try:
        with open(path, "rb") as f:
            data = f.read(BLACKBOX_SIZE)
    except OSError:
        return None
    if len(data) < 16:
        return None
    magic, cause, n, attempt_seq = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        return None
    if n == 0 or n > MAX_CALL_ID_BYTES or 16 + n > len(data):
        return BlackboxRecord(None, 0, cause)
    call_id = data[16 : 16 + n].decode("utf-8", "replace")
    return BlackboxRecord(call_id, attempt_seq, cause)

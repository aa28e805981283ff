"""Call keys and sub-call ids.

Theory of operation
-------------------
A *call key* names what a call computes: a hash of (function id, code digest,
argument bytes). Within a task, equal keys share one result (call cache) and
one execution at a time (singleflight); along a chain of sub-calls, a key that
reappears in the ancestry is a cycle. The key goes to the executor
(``ExecuteCall.callKey``) and comes back inside ``ancestry`` lists, so it must
be stable across processes: BLAKE2b-128 of a length-prefixed encoding, hex.
Length prefixes keep ("ab", "c") and ("a", "bc") apart.

Sub-call ids are ``{parent}/sub-{n}`` with ``n`` from one counter per worker
process (:data:`PROCESS_SUBCALL_IDS`), so two dispatcher cores in one process
never mint the same id. Tests inject their own :class:`SubcallIdSequence`.
"""

from __future__ import annotations

from hashlib import blake2b

__all__ = [
    "PROCESS_SUBCALL_IDS",
    "SubcallIdSequence",
    "call_key",
    "function_hasher",
    "subcall_id",
]


def function_hasher(function_id: str, function_code_digest: str) -> blake2b:
    """A hasher primed with (function_id, digest); ``.copy()`` it per call."""
    fid = function_id.encode()
    digest = function_code_digest.encode()
    h = blake2b(digest_size=16)
    h.update(len(fid).to_bytes(4, "big") + fid + len(digest).to_bytes(4, "big") + digest)
    return h


def call_key(function_id: str, function_code_digest: str, args_json: bytes) -> str:
    """The stable key of a call: 32 hex digits."""
    h = function_hasher(function_id, function_code_digest)
    h.update(args_json)
    return h.hexdigest()


class SubcallIdSequence:
    """A monotonic counter of sub-calls; one per worker process.

    Not thread-safe by design: only the dispatch actor creates sub-calls.
    """

    __slots__ = ("_last",)

    def __init__(self, start: int = 0) -> None:
        self._last = start

    def next(self) -> int:
        """The next number, starting at ``start + 1``."""
        self._last += 1
        return self._last

    @property
    def last(self) -> int:
        """The number most recently handed out (``start`` before any)."""
        return self._last

    def __repr__(self) -> str:
        return f"SubcallIdSequence(last={self._last})"


#: The worker process's sub-call counter (the seed's process-level ``subcallSeq``).
PROCESS_SUBCALL_IDS = SubcallIdSequence()


def subcall_id(parent_call_id: str, n: int) -> str:
    """The id of the ``n``-th sub-call of the process, made by ``parent_call_id``."""
    return f"{parent_call_id}/sub-{n}"

"""Auditor: verdicts for sources, cached by verdict digest.

Theory of operation
-------------------
:meth:`Auditor.audit` checks a ``(source, function_id)`` pair and returns a
:class:`~blockx.audit.verdict.Verdict`. The expensive part — parsing and
checking — depends only on the source and the policy, so it is cached in an
LRU keyed by the verdict digest (``sha256:`` of the policy version and the
source); the entry function depends on the functionId too and is resolved per
call from the cached top-level ``def`` names (cheap).

The worker calls this in-process (or through
:class:`~blockx.audit.client.AuditDaemonClient`, which runs the same code in a
child process so a parser crash cannot take the worker down) before a
function's first dispatch: an accepted verdict goes into ``ExecuteCall.audit``
(:meth:`Verdict.audit_payload`), a rejected one fails the calls with
``audit_rejected`` and :meth:`Verdict.error_message`.

Thread-safe: the cache is guarded by a lock, so ``asyncio.to_thread`` callers
may share one auditor. A check never raises for ``str`` input.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

from .checker import CheckResult, check_source
from .entry import entry_from_defs
from .tables import POLICY_NAME
from .verdict import Verdict, Violation, compute_verdict_digest

__all__ = ["DEFAULT_CACHE_ENTRIES", "Auditor", "audit_source", "default_auditor"]

DEFAULT_CACHE_ENTRIES: Final = 1024


class Auditor:
    """Audits sources under the ``default`` policy, with an LRU of results.

    ``max_entries`` bounds the cache (0 = unlimited).
    """

    def __init__(self, *, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0 (0 = unlimited), got {max_entries}")
        self.max_entries = max_entries
        self.policy = POLICY_NAME
        self._cache: OrderedDict[str, CheckResult] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return (
            f"Auditor(policy={self.policy!r}, cached={len(self._cache)}/"
            f"{self.max_entries or 'unlimited'}, hits={self.hits}, misses={self.misses})"
        )

    @staticmethod
    def verdict_digest(source: str) -> str:
        """The digest a verdict for ``source`` carries (computed without auditing)."""
        return compute_verdict_digest(source)

    def audit(self, source: str, function_id: str) -> Verdict:
        """The verdict for ``source`` run as ``function_id`` (cached by digest)."""
        if not isinstance(source, str):
            raise TypeError(f"source must be str, got {type(source).__name__}")
        if not isinstance(function_id, str):
            raise TypeError(f"function_id must be str, got {type(function_id).__name__}")
        digest = compute_verdict_digest(source)
        with self._lock:
            result = self._cache.get(digest)
            if result is not None:
                self._cache.move_to_end(digest)
                self.hits += 1
        if result is None:
            result = check_source(source, f"<blockx:{function_id}>")
            with self._lock:
                self.misses += 1
                self._cache[digest] = result
                self._cache.move_to_end(digest)
                if self.max_entries:
                    while len(self._cache) > self.max_entries:
                        self._cache.popitem(last=False)
        return _verdict(result, digest, function_id, self.policy)

    def cached(self, verdict_digest: str) -> bool:
        """Whether a result for this digest is cached."""
        with self._lock:
            return verdict_digest in self._cache

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._cache), "hits": self.hits, "misses": self.misses}


def _verdict(result: CheckResult, digest: str, function_id: str, policy: str) -> Verdict:
    violations = result.violations
    entry = entry_from_defs(result.defs, result.alias, function_id)
    parsed = not violations or violations[0].rule not in _UNPARSED_RULES
    if entry is None and parsed:
        violations = (
            *violations,
            Violation(
                rule="entry.missing",
                message=(
                    f"no entry function for {function_id!r}: define `def _(...)`, "
                    "a def named after the function id, or a public def"
                ),
                line=1,
                col=1,
            ),
        )
    return Verdict(
        function_id=function_id,
        accepted=not violations,
        verdict_digest=digest,
        entry=entry,
        violations=violations,
        policy=policy,
    )


_UNPARSED_RULES: Final = frozenset(
    {"syntax.error", "limit.source_size", "limit.parser", "limit.nodes", "limit.depth"}
)

_default: Auditor | None = None
_default_lock = threading.Lock()


def default_auditor() -> Auditor:
    """The process-wide auditor :func:`audit_source` uses."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Auditor()
        return _default


def audit_source(source: str, function_id: str) -> Verdict:
    """Audit ``source`` as ``function_id`` with the process-wide :class:`Auditor`."""
    return default_auditor().audit(source, function_id)

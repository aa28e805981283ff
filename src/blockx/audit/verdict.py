"""Verdicts: what the auditor says about one source, and the digest that names it.

A :class:`Verdict` is a fact: accepted, or rejected with :class:`Violation` s
(rule id, message, 1-based line and column). Its ``verdict_digest`` is
``sha256:`` over the policy name, the policy's table fingerprint, the Python
minor version (the parser is part of the policy) and the source, so the same
source audited under the same policy always gets the same digest and any
policy change invalidates every cached verdict. The worker puts it into
``ExecuteCall.audit`` (:meth:`Verdict.audit_payload`) and refuses a rejected
function with ``audit_rejected`` and :meth:`Verdict.error_message`.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Any, Final

from .tables import POLICY_NAME, POLICY_REVISION, policy_fingerprint

__all__ = ["POLICY_VERSION", "Verdict", "Violation", "compute_verdict_digest"]

#: The policy's full version: name, checker revision, table fingerprint, Python.
POLICY_VERSION: Final = (
    f"{POLICY_NAME}/{POLICY_REVISION}/{policy_fingerprint()}/py{sys.version_info[0]}."
    f"{sys.version_info[1]}"
)
_DIGEST_PREFIX: Final = (POLICY_VERSION + "\n").encode("utf-8")


def compute_verdict_digest(source: str) -> str:
    """``sha256:<hex>`` of the policy version and ``source`` (the verdict cache key)."""
    data = source.encode("utf-8", "surrogatepass")
    return "sha256:" + hashlib.sha256(_DIGEST_PREFIX + data).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One broken rule: ``rule`` (a key of ``tables.RULES``), where, and why."""

    rule: str
    message: str
    line: int
    col: int

    def to_wire(self) -> dict[str, Any]:
        return {"rule": self.rule, "message": self.message, "line": self.line, "col": self.col}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Violation:
        return cls(
            rule=str(data["rule"]),
            message=str(data["message"]),
            line=int(data["line"]),
            col=int(data["col"]),
        )

    def __str__(self) -> str:
        return f"[{self.rule}] line {self.line}, col {self.col}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The auditor's answer for one ``(source, function_id)``.

    ``entry`` is the entry function's name (``resolve_entry_name``) or None;
    ``violations`` is empty exactly when ``accepted``.
    """

    function_id: str
    accepted: bool
    verdict_digest: str
    entry: str | None
    violations: tuple[Violation, ...] = field(default=())
    policy: str = POLICY_NAME

    def audit_payload(self) -> dict[str, str]:
        """The ``ExecuteCall.audit`` object for an accepted function."""
        return {"policy": self.policy, "verdictDigest": self.verdict_digest}

    def error_message(self) -> str:
        """The ``audit_rejected`` message: the function, then each rule, line and column."""
        if self.accepted:
            return ""
        shown = "; ".join(str(v) for v in self.violations[:5])
        more = len(self.violations) - 5
        tail = f" (+{more} more)" if more > 0 else ""
        return f"audit rejected {self.function_id}: {shown}{tail}"

    def to_wire(self, request_id: Any = None) -> dict[str, Any]:
        """The daemon's response body (without ``messageType``)."""
        return {
            "requestId": request_id,
            "functionId": self.function_id,
            "accepted": self.accepted,
            "verdictDigest": self.verdict_digest,
            "policy": self.policy,
            "entry": self.entry,
            "violations": [v.to_wire() for v in self.violations],
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any], function_id: str | None = None) -> Verdict:
        return cls(
            function_id=function_id if function_id is not None else str(data["functionId"]),
            accepted=bool(data["accepted"]),
            verdict_digest=str(data["verdictDigest"]),
            entry=data.get("entry"),
            violations=tuple(Violation.from_wire(v) for v in data.get("violations") or ()),
            policy=str(data.get("policy") or POLICY_NAME),
        )

    def __repr__(self) -> str:
        state = "accepted" if self.accepted else f"rejected×{len(self.violations)}"
        return (
            f"Verdict({self.function_id!r}, {state}, entry={self.entry!r}, "
            f"{self.verdict_digest[:19]}…)"
        )

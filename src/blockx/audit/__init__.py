"""``blockx.audit``: the static auditor for untrusted function code.

A strict whitelist over Python's own :mod:`ast` — check, then run the code
unchanged. The policy is data (:mod:`blockx.audit.tables`, rendered in
``docs/security.md``); the checker is :mod:`blockx.audit.checker`.

In-process::

    from blockx.audit import Auditor
    verdict = Auditor().audit(source, "tenant/adder")
    if verdict.accepted:
        execute_call_payload["audit"] = verdict.audit_payload()
    else:
        fail_calls("audit_rejected", verdict.error_message())

Out of process (a parser crash cannot take the caller down)::

    async with AuditDaemonClient() as client:
        verdict = await client.audit(source, "tenant/adder")

``python -m blockx.audit`` is the daemon the client starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .auditor import Auditor, audit_source, default_auditor
    from .client import AuditDaemonClient, AuditDaemonError
    from .entry import resolve_entry_name
    from .tables import POLICY_NAME
    from .verdict import POLICY_VERSION, Verdict, Violation, compute_verdict_digest

__all__ = [
    "POLICY_NAME",
    "POLICY_VERSION",
    "AuditDaemonClient",
    "AuditDaemonError",
    "Auditor",
    "Verdict",
    "Violation",
    "audit_source",
    "compute_verdict_digest",
    "default_auditor",
    "resolve_entry_name",
]

# Loaded on first use: the executor reads only `blockx.audit.tables` and should not
# pay for the checker, and only the client needs asyncio.
_HOMES = {
    "POLICY_NAME": "tables",
    "POLICY_VERSION": "verdict",
    "AuditDaemonClient": "client",
    "AuditDaemonError": "client",
    "Auditor": "auditor",
    "Verdict": "verdict",
    "Violation": "verdict",
    "audit_source": "auditor",
    "compute_verdict_digest": "verdict",
    "default_auditor": "auditor",
    "resolve_entry_name": "entry",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'blockx.audit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

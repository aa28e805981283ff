"""The worker-side audit gate: audit a task's functions before their first dispatch.

Theory of operation
-------------------
A task submitted with ``audit=True`` has every one of its functions audited
when it is submitted — before any call is registered, so before any
function's first dispatch — by :func:`audit_task_code`, which returns the
task's pinned :class:`~blockx.worker.code.TaskCodeView` with the verdicts in
it:

* **accepted** — the function's :class:`~blockx.worker.code.FunctionCode`
  carries ``audit = verdict.audit_payload()``; the orchestrator puts it into
  every ``ExecuteCall`` of the function (its sub-calls included), and the
  executor runs the module restricted (``restricted_runtime``);
* **rejected** — the function gets a :class:`~blockx.worker.code.CodeError`
  of kind ``audit_rejected`` whose message is ``verdict.error_message()``
  (the function, then each rule, line and column). This is the path of a
  function that does not compile: the orchestrator fails each of its calls
  with that kind and message, not retryable, *without sending it to an
  executor*; the task's other functions run (under ``policy.failure =
  continue`` the task succeeds with their outputs), and
  ``TaskResult.code_errors`` lists the function.

A function that does not compile keeps its compile error (``user_error``):
the auditor would only say the same thing as ``syntax.error``.

**Which auditor.** The in-process :class:`~blockx.audit.Auditor` (the
process-wide :func:`~blockx.audit.default_auditor`), not the daemon: the
checker is bounded before it recurses (source size, node count and depth are
measured without recursion; a parser that gives up is a violation, never a
crash), so the daemon's protection — a parser crash cannot take the caller
down — buys little for its cost (a process, a round trip per function, and an
``await`` in a path that is synchronous today). A verdict costs a parse and a
walk the first time (~1 ms for a typical function) and a dictionary look-up
after: verdicts are cached here by ``(functionId, functionCodeDigest)`` and
the auditor caches its check results by verdict digest.

Thread-safe (the cache is guarded by a lock); pure otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Final

from blockx.wire import keys
from blockx.worker.code import CodeError, FunctionCode, TaskCodeView, module_filename

if TYPE_CHECKING:
    from blockx.audit import Auditor, Verdict

__all__ = ["DEFAULT_GATE_ENTRIES", "AuditGate", "audit_task_code", "default_gate"]

_log = logging.getLogger("blockx.worker.audit")

#: Verdicts kept by ``(function id, digest)``.
DEFAULT_GATE_ENTRIES: Final = 4096


class AuditGate:
    """Audits functions and caches the verdicts by ``(function id, digest)``."""

    def __init__(
        self, auditor: Auditor | None = None, *, max_entries: int = DEFAULT_GATE_ENTRIES
    ) -> None:
        self._auditor = auditor
        self._max_entries = max_entries
        self._verdicts: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._lock = threading.Lock()
        self.audited = 0
        self.hits = 0
        self.rejected = 0

    def __repr__(self) -> str:
        return (
            f"AuditGate(cached={len(self._verdicts)}, audited={self.audited}, "
            f"hits={self.hits}, rejected={self.rejected})"
        )

    def _the_auditor(self) -> Auditor:
        if self._auditor is None:
            from blockx.audit import default_auditor

            self._auditor = default_auditor()
        return self._auditor

    def verdict(self, function_id: str, source: str, digest: str) -> Verdict:
        """The verdict for one function (cached by ``(function_id, digest)``)."""
        key = (function_id, digest)
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is not None:
                self._verdicts.move_to_end(key)
                self.hits += 1
                return verdict
        verdict = self._the_auditor().audit(source, function_id)
        with self._lock:
            self.audited += 1
            if not verdict.accepted:
                self.rejected += 1
            self._verdicts[key] = verdict
            if self._max_entries and len(self._verdicts) > self._max_entries:
                self._verdicts.popitem(last=False)
        return verdict

    def gate(self, code: FunctionCode) -> FunctionCode:
        """``code`` with its verdict: the audit payload, or an ``audit_rejected`` error."""
        if code.error is not None:
            return code  # does not compile (or is missing): already refused
        verdict = self.verdict(code.function_id, code.source, code.digest)
        if verdict.accepted:
            return dataclasses.replace(code, audit=verdict.audit_payload())
        message = verdict.error_message()
        first = verdict.violations[0] if verdict.violations else None
        _log.warning("function %s refused: %s", code.function_id, message)
        return dataclasses.replace(
            code,
            entry_selector="",
            error=CodeError(
                function_id=code.function_id,
                message=message,
                lineno=first.line if first is not None else None,
                offset=first.col if first is not None else None,
                stack=_stack(code, verdict),
                kind=keys.ERR_AUDIT_REJECTED,
            ),
        )

    def gate_view(self, view: TaskCodeView) -> TaskCodeView:
        """The task's code view with every function's verdict in it."""
        return TaskCodeView({code.function_id: self.gate(code) for code in view})


def _stack(code: FunctionCode, verdict: Verdict) -> str:
    """A traceback-like text pointing at each violation (the calls' "user stack")."""
    lines = code.source.splitlines()
    filename = module_filename(code.function_id)
    out = []
    for violation in verdict.violations:
        out.append(f'  File "{filename}", line {violation.line}\n')
        if 0 < violation.line <= len(lines):
            text = lines[violation.line - 1]
            stripped = text.strip()
            indent = len(text) - len(text.lstrip())
            out.append(f"    {stripped}\n")
            out.append("    " + " " * max(violation.col - 1 - indent, 0) + "^\n")
        out.append(f"AuditRejected: [{violation.rule}] {violation.message}\n")
    return "".join(out)


_default: AuditGate | None = None
_default_lock = threading.Lock()


def default_gate() -> AuditGate:
    """The process-wide gate :func:`audit_task_code` uses."""
    global _default
    with _default_lock:
        if _default is None:
            _default = AuditGate()
        return _default


def audit_task_code(view: TaskCodeView) -> TaskCodeView:
    """Audit a task's functions with the process-wide gate (see the module docstring)."""
    return default_gate().gate_view(view)

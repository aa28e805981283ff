"""docs/security.md embeds the policy tables exactly as `python -m blockx.audit --print-tables`
renders them, so the documented whitelist is the enforced one."""

from __future__ import annotations

from pathlib import Path

from blockx.audit import tables as audit_tables
from blockx.audit.policy_markdown import render_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN = "<!-- BEGIN AUDIT TABLES"
END = "<!-- END AUDIT TABLES -->"


def embedded_tables() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n", text.index(BEGIN)) + 1
    return text[start : text.index(END)]


def test_the_documented_tables_are_the_policy() -> None:
    assert embedded_tables() == render_markdown(), (
        "docs/security.md is out of date: paste `python -m blockx.audit --print-tables` "
        "between the AUDIT TABLES markers"
    )


def test_every_rule_and_module_is_documented() -> None:
    rendered = render_markdown()
    for rule in audit_tables.RULES:
        assert f"| `{rule}` |" in rendered
    for module in audit_tables.MODULES:
        assert f"| `{module}` |" in rendered

"""The policy tables as Markdown: what ``docs/security.md`` embeds.

``python -m blockx.audit --print-tables`` prints :func:`render_markdown`;
``tests/audit/test_audit_docs.py`` fails when the document and the tables
differ, so the documented whitelist is the enforced one.
"""

from __future__ import annotations

from .tables import (
    ALLOWED_NODES,
    DENIED_NODES,
    FORBIDDEN_ATTRIBUTE_PREFIXES,
    FORBIDDEN_ATTRIBUTES,
    FORBIDDEN_BUILTINS,
    FORMAT_METHODS,
    INTERNAL_IMPORTS,
    MATCH_CLASSES,
    MAX_AST_DEPTH,
    MAX_AST_NODES,
    MAX_SOURCE_BYTES,
    MAX_VIOLATIONS,
    MODULES,
    OBJECT_FACADES,
    POLICY_NAME,
    POLICY_REVISION,
    PRELUDE_NAMES,
    RULES,
    SAFE_BUILTIN_NAMES,
    policy_fingerprint,
)

__all__ = ["render_markdown"]


def _code_list(names: object) -> str:
    return ", ".join(f"`{name}`" for name in names)  # type: ignore[attr-defined]


def render_markdown() -> str:
    """The tables as Markdown, as embedded in ``docs/security.md``."""
    out: list[str] = []
    add = out.append
    add(
        f"Policy `{POLICY_NAME}`, revision {POLICY_REVISION}, fingerprint `{policy_fingerprint()}`."
    )
    add("")
    add("**Limits**: ")
    add(
        f"source ≤ {MAX_SOURCE_BYTES} UTF-8 bytes, ≤ {MAX_AST_NODES} AST nodes, "
        f"AST depth ≤ {MAX_AST_DEPTH}; a verdict lists at most {MAX_VIOLATIONS} violations."
    )
    add("")
    add("**Rules** (a violation's `rule`):")
    add("")
    add("| rule | meaning |")
    add("| --- | --- |")
    for rule, meaning in RULES.items():
        add(f"| `{rule}` | {meaning} |")
    add("")
    add("**Allowed syntax nodes** (`ALLOWED_NODES`): " + _code_list(sorted(ALLOWED_NODES)) + ".")
    add("")
    add("**Refused node types with a reason** (`DENIED_NODES`; every unlisted node is refused):")
    add("")
    add("| node | why |")
    add("| --- | --- |")
    for name, why in sorted(DENIED_NODES.items()):
        add(f"| `{name}` | {why} |")
    add("")
    add("**Safe builtins** (`SAFE_BUILTIN_NAMES`): " + _code_list(sorted(SAFE_BUILTIN_NAMES)) + ".")
    add("")
    add("**Forbidden builtins** (`FORBIDDEN_BUILTINS`):")
    add("")
    add("| name | why |")
    add("| --- | --- |")
    for name, why in sorted(FORBIDDEN_BUILTINS.items()):
        add(f"| `{name}` | {why} |")
    add("")
    add("**Predefined names** (`PRELUDE_NAMES`):")
    add("")
    add("| name | is |")
    add("| --- | --- |")
    for name, (module, member) in sorted(PRELUDE_NAMES.items()):
        what = f"module `{module}`" if member is None else f"`{module}.{member}`"
        add(f"| `{name}` | {what} |")
    add("")
    add("**Forbidden attributes** (`FORBIDDEN_ATTRIBUTES`), besides every name starting with `_`:")
    add("")
    add("| attribute | why |")
    add("| --- | --- |")
    for name, why in sorted(FORBIDDEN_ATTRIBUTES.items()):
        add(f"| `{name}` | {why} |")
    add("")
    add(
        "Forbidden attribute prefixes (`FORBIDDEN_ATTRIBUTE_PREFIXES`): "
        + _code_list(FORBIDDEN_ATTRIBUTE_PREFIXES)
        + ". Template methods (`FORMAT_METHODS`): "
        + _code_list(sorted(FORMAT_METHODS))
        + ", only on a string literal with plain field names."
    )
    add("")
    add("**Match class patterns** (`MATCH_CLASSES`): " + _code_list(sorted(MATCH_CLASSES)) + ".")
    add("")
    add("**Importable modules and members** (`MODULES`):")
    add("")
    add("| module | members |")
    add("| --- | --- |")
    for module, members in sorted(MODULES.items()):
        add(f"| `{module}` | {_code_list(sorted(members))} |")
    add("")
    add("**SDK object facades** (`OBJECT_FACADES`; methods exposed on instances):")
    add("")
    add("| class | methods |")
    add("| --- | --- |")
    for cls, methods in sorted(OBJECT_FACADES.items()):
        add(f"| `{cls}` | {_code_list(sorted(methods))} |")
    add("")
    add(
        "**Internal imports** (`INTERNAL_IMPORTS`; imported for C code of exposed types, "
        "never handed to user code): " + _code_list(sorted(INTERNAL_IMPORTS)) + "."
    )
    return "\n".join(out) + "\n"

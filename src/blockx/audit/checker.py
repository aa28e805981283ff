"""The checker: one whitelist pass over Python's own AST.

Theory of operation
-------------------
:func:`check_source` parses the source with :func:`ast.parse` (nothing is
rewritten: accepted code is later compiled and run unchanged) and returns its
violations. In order:

1. **Limits before parsing**: the UTF-8 size (``limit.source_size``).
2. **Parsing**: a :class:`SyntaxError` is ``syntax.error``; the parser's own
   ``RecursionError`` / ``MemoryError`` on pathological nesting is
   ``limit.parser`` — never an exception out of the checker.
3. **Shape**: node count and depth, measured without recursion
   (``limit.nodes``, ``limit.depth``), so the recursive passes below cannot
   overflow the stack.
4. **Scopes** (:mod:`.scopes`): what every function binds, and how.
5. **Rules**: every node is checked against the tables of :mod:`.tables`;
   a node type that is not listed is refused and not descended into.

Identifiers are checked after NFKC normalisation (what the tokenizer does, so
``ｅｖａｌ`` is ``eval`` and ``_＿class__`` is ``__class__``). Columns in
violations are 1-based characters.

The checker is pure: no IO, no global state; one :class:`_Checker` per source.
"""

from __future__ import annotations

import ast
import re
import string
import unicodedata
import warnings
from collections.abc import Iterable

from . import tables
from .entry import top_level_entries
from .scopes import Scope, all_args, build_scopes
from .verdict import Violation

__all__ = ["CheckResult", "attribute_allowed", "check_source"]

_FORMATTER = string.Formatter()
_PLAIN_FIELD = re.compile(r"\d*|[^\W\d]\w*")
_FREE_NAMES = tables.SAFE_BUILTIN_NAMES | frozenset(tables.PRELUDE_NAMES)


class CheckResult:
    """Violations plus what entry resolution needs (top-level defs, ``_`` alias)."""

    __slots__ = ("alias", "defs", "violations")

    def __init__(
        self, violations: tuple[Violation, ...], defs: tuple[str, ...], alias: bool
    ) -> None:
        self.violations = violations
        self.defs = defs
        self.alias = alias

    def __repr__(self) -> str:
        return f"CheckResult(violations={len(self.violations)}, defs={self.defs})"


def _normalize(name: str) -> str:
    return unicodedata.normalize("NFKC", name)


def attribute_allowed(name: str) -> bool:
    """Whether audited code may read attribute ``name`` of some object.

    The restricted runtime's reachability test walks exactly these names:
    no ``_`` prefix, not forbidden, and not a template method (``format`` is
    only allowed on a literal with plain fields, which returns a ``str``).
    """
    norm = _normalize(name)
    return not (
        norm.startswith("_")
        or norm in tables.FORBIDDEN_ATTRIBUTES
        or norm.startswith(tables.FORBIDDEN_ATTRIBUTE_PREFIXES)
        or norm in tables.FORMAT_METHODS
    )


def _measure(tree: ast.AST) -> tuple[int, int]:
    """(node count, depth) without recursion; stops early past the limits."""
    nodes = 0
    depth = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    while stack:
        node, level = stack.pop()
        nodes += 1
        if level > depth:
            depth = level
        if nodes > tables.MAX_AST_NODES or depth > tables.MAX_AST_DEPTH:
            break
        for child in ast.iter_child_nodes(node):
            stack.append((child, level + 1))
    return nodes, depth


def _template_problem(template: str, depth: int = 0) -> str | None:
    """Why a ``str.format`` template is refused, or None when it only has plain fields."""
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        return f"malformed template: {exc}"
    for _literal, field, spec, _conversion in parsed:
        if field is None:
            continue
        if not _PLAIN_FIELD.fullmatch(field):
            return f"template field {{{field}}} looks up an attribute or an item"
        if spec and depth < 2:
            problem = _template_problem(spec, depth + 1)
            if problem is not None:
                return problem
    return None


def _finally_escapes(statements: Iterable[ast.stmt]) -> ast.stmt | None:
    """A return/break/continue that would leave a ``finally`` block, if any."""

    def walk(stmts: Iterable[ast.stmt], in_loop: bool) -> ast.stmt | None:
        for stmt in stmts:
            if isinstance(stmt, ast.Return):
                return stmt
            if isinstance(stmt, (ast.Break, ast.Continue)) and not in_loop:
                return stmt
            if isinstance(stmt, ast.FunctionDef):
                continue
            loop = in_loop or isinstance(stmt, (ast.For, ast.While))
            for field in ("body", "orelse", "finalbody"):
                found = walk(getattr(stmt, field, ()) or (), loop)
                if found is not None:
                    return found
            for handler in getattr(stmt, "handlers", ()) or ():
                found = walk(handler.body, in_loop)
                if found is not None:
                    return found
            for case in getattr(stmt, "cases", ()) or ():
                found = walk(case.body, in_loop)
                if found is not None:
                    return found
        return None

    return walk(statements, False)


class _Checker:
    def __init__(self, source: str) -> None:
        self.lines = source.splitlines()
        self.violations: list[Violation] = []
        self.scopes: dict[int, Scope] = {}
        self._line = 1
        self._col = 1

    # --- reporting -------------------------------------------------------------------

    def _position(self, node: ast.AST | None) -> tuple[int, int]:
        line = getattr(node, "lineno", None)
        offset = getattr(node, "col_offset", None)
        if line is None or offset is None:
            return self._line, self._col
        col = offset + 1
        if 0 < line <= len(self.lines):
            text = self.lines[line - 1]
            if not text.isascii():  # col_offset counts UTF-8 bytes
                col = len(text.encode("utf-8")[:offset].decode("utf-8", "ignore")) + 1
        return line, col

    def _attribute_position(self, node: ast.Attribute) -> tuple[int, int]:
        """Where the attribute's name starts (not the whole expression)."""
        line = node.end_lineno
        end = node.end_col_offset
        if line is not None and end is not None and 0 < line <= len(self.lines):
            text = self.lines[line - 1]
            if not text.isascii():  # end_col_offset counts UTF-8 bytes
                end = len(text.encode("utf-8")[:end].decode("utf-8", "ignore"))
            start = end - len(node.attr)
            if 0 <= start and text[start:end] == node.attr:
                return line, start + 1
        return self._position(node)

    def report(
        self,
        rule: str,
        message: str,
        node: ast.AST | None,
        position: tuple[int, int] | None = None,
    ) -> None:
        if len(self.violations) >= tables.MAX_VIOLATIONS:
            return
        line, col = position if position is not None else self._position(node)
        self.violations.append(Violation(rule=rule, message=message, line=line, col=col))

    # --- identifiers -----------------------------------------------------------------

    def check_name(self, name: str, node: ast.AST) -> None:
        norm = _normalize(name)
        if norm.startswith("_") and norm != "_":
            self.report(
                "name.underscore",
                f"name {norm!r} starts with '_' (only '_' itself is allowed)",
                node,
            )

    def check_attribute_name(self, name: str, node: ast.AST) -> bool:
        """Report a refused attribute name; True when it is allowed."""
        norm = _normalize(name)
        where = self._attribute_position(node) if isinstance(node, ast.Attribute) else None
        if norm.startswith("_"):
            self.report("attr.underscore", f"attribute {norm!r} starts with '_'", node, where)
            return False
        reason = tables.FORBIDDEN_ATTRIBUTES.get(norm)
        if reason is None and norm.startswith(tables.FORBIDDEN_ATTRIBUTE_PREFIXES):
            reason = "interpreter internals (frames, code, generators, tracebacks)"
        if reason is not None:
            self.report(
                "attr.forbidden", f"attribute {norm!r} is not allowed: {reason}", node, where
            )
            return False
        return True

    # --- traversal -------------------------------------------------------------------

    def run(self, tree: ast.Module) -> None:
        module, self.scopes = build_scopes(tree)
        for stmt in tree.body:
            self.visit(stmt, module)

    def visit(self, node: ast.AST, scope: Scope) -> None:
        kind = type(node).__name__
        if hasattr(node, "lineno"):
            self._line, self._col = self._position(node)
        if kind not in tables.ALLOWED_NODES:
            reason = tables.DENIED_NODES.get(kind)
            suffix = f": {reason}" if reason else ""
            self.report("syntax.node", f"{kind} is not allowed{suffix}", node)
            return
        handler = getattr(self, f"visit_{kind}", None)
        if handler is not None:
            handler(node, scope)
        else:
            self.children(node, scope)

    def children(self, node: ast.AST, scope: Scope) -> None:
        for child in ast.iter_child_nodes(node):
            self.visit(child, scope)

    def _check_type(self, node: ast.AST) -> bool:
        kind = type(node).__name__
        if kind in tables.ALLOWED_NODES:
            return True
        self.report("syntax.node", f"{kind} is not allowed", node)
        return False

    def _arguments(self, args: ast.arguments, outer: Scope, *, annotations: bool) -> None:
        self._check_type(args)
        for default in (*args.defaults, *args.kw_defaults):
            if default is not None:
                self.visit(default, outer)
        for arg in all_args(args):
            if not self._check_type(arg):
                continue
            self.check_name(arg.arg, arg)
            if annotations and arg.annotation is not None:
                self.visit(arg.annotation, outer)

    # --- statements ------------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef, scope: Scope) -> None:
        self.check_name(node.name, node)
        for decorator in node.decorator_list:
            self.report("syntax.decorator", "decorators are not allowed", decorator)
        for param in getattr(node, "type_params", ()) or ():
            self.visit(param, scope)  # 3.12 type parameters: not allowed nodes
        self._arguments(node.args, scope, annotations=True)
        if node.returns is not None:
            self.visit(node.returns, scope)
        inner = self.scopes[id(node)]
        for stmt in node.body:
            self.visit(stmt, inner)

    def visit_Import(self, node: ast.Import, scope: Scope) -> None:
        for alias in node.names:
            self._check_type(alias)
            name = _normalize(alias.name)
            if name not in tables.MODULES or name.startswith("_"):
                self.report(
                    "import.module", f"module {name!r} is not in the import whitelist", alias
                )
            if alias.asname is not None:
                self.check_name(alias.asname, alias)

    def visit_ImportFrom(self, node: ast.ImportFrom, scope: Scope) -> None:
        if node.level:
            self.report("import.relative", "relative imports are not allowed", node)
            return
        module = _normalize(node.module or "")
        members = tables.MODULES.get(module)
        if members is None:
            self.report("import.module", f"module {module!r} is not in the import whitelist", node)
            return
        for alias in node.names:
            self._check_type(alias)
            name = _normalize(alias.name)
            if name == "*":
                self.report("import.star", f"'from {module} import *' is not allowed", alias)
                continue
            if name not in members:
                allowed = ", ".join(sorted(members))
                self.report(
                    "import.member",
                    f"{module}.{name} is not exposed (allowed: {allowed})",
                    alias,
                )
            if alias.asname is not None:
                self.check_name(alias.asname, alias)
            elif module != "__future__":
                self.check_name(name, alias)

    def visit_Try(self, node: ast.Try, scope: Scope) -> None:
        escape = _finally_escapes(node.finalbody)
        if escape is not None:
            word = type(escape).__name__.lower()
            self.report(
                "finally.control_flow",
                f"'{word}' inside 'finally' would swallow an exception (cancellation included)",
                escape,
            )
        self.children(node, scope)

    def visit_ExceptHandler(self, node: ast.ExceptHandler, scope: Scope) -> None:
        if node.type is None:
            self.report(
                "except.bare",
                "bare 'except:' is not allowed (it would catch cancellation); "
                "use 'except Exception:'",
                node,
            )
        if node.name is not None:
            self.check_name(node.name, node)
        self.children(node, scope)

    # --- expressions -----------------------------------------------------------------

    def visit_Lambda(self, node: ast.Lambda, scope: Scope) -> None:
        self._arguments(node.args, scope, annotations=False)
        self.visit(node.body, self.scopes[id(node)])

    def _comprehension(self, node: ast.expr, scope: Scope) -> None:
        generators: list[ast.comprehension] = node.generators  # type: ignore[attr-defined]
        inner = self.scopes[id(node)]
        for i, gen in enumerate(generators):
            if not self._check_type(gen):
                continue
            if gen.is_async:
                self.report("syntax.node", "async comprehensions are not allowed", node)
            self.visit(gen.iter, scope if i == 0 else inner)
            self.visit(gen.target, inner)
            for cond in gen.ifs:
                self.visit(cond, inner)
        if isinstance(node, ast.DictComp):
            self.visit(node.key, inner)
            self.visit(node.value, inner)
        else:
            self.visit(node.elt, inner)  # type: ignore[attr-defined]

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Name(self, node: ast.Name, scope: Scope) -> None:
        self.check_name(node.id, node)
        if not isinstance(node.ctx, ast.Load):
            return
        name = _normalize(node.id)
        if scope.resolve(name) is not None:
            return
        reason = tables.FORBIDDEN_BUILTINS.get(name)
        if reason is not None:
            self.report("name.forbidden", f"{name!r} is not available: {reason}", node)
        elif name not in _FREE_NAMES and not name.startswith("_"):
            self.report(
                "name.unknown",
                f"name {name!r} is not defined in this module and is not a safe builtin",
                node,
            )

    def _module_of(self, node: ast.expr, scope: Scope) -> str | None:
        """The whitelisted module an expression statically names (a facade), if any."""
        if isinstance(node, ast.Name):
            name = _normalize(node.id)
            owner = scope.resolve(name)
            if owner is None:
                prelude = tables.PRELUDE_NAMES.get(name)
                if prelude is not None and prelude[1] is None:
                    return prelude[0]
                return None
            if owner.bindings.get(name) != {"import"}:
                return None
            path = owner.imports.get(name)
            return path if path in tables.MODULES else None
        if isinstance(node, ast.Attribute):
            parent = self._module_of(node.value, scope)
            if parent is None:
                return None
            path = f"{parent}.{_normalize(node.attr)}"
            return path if path in tables.MODULES else None
        return None

    def visit_Attribute(self, node: ast.Attribute, scope: Scope) -> None:
        allowed = self.check_attribute_name(node.attr, node)
        attr = _normalize(node.attr)
        if allowed and attr in tables.FORMAT_METHODS:
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                problem = _template_problem(value.value)
                if problem is not None:
                    self.report("format.template", f"str.{attr}: {problem}", node)
            else:
                self.report(
                    "format.template",
                    f"str.{attr} is only allowed on a string literal with plain fields; "
                    "use an f-string",
                    node,
                )
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_attribute_target(node, scope)
        elif allowed:
            module = self._module_of(node.value, scope)
            if module is not None:
                members = tables.MODULES[module]
                if attr not in members:
                    self.report(
                        "import.member",
                        f"{module}.{attr} is not exposed (allowed: {', '.join(sorted(members))})",
                        node,
                        self._attribute_position(node),
                    )
        self.visit(node.value, scope)

    def _check_attribute_target(self, node: ast.Attribute, scope: Scope) -> None:
        value = node.value
        ok = False
        if isinstance(value, ast.Name) and scope.kind == "function":
            name = _normalize(value.id)
            kinds = scope.bindings.get(name)
            ok = kinds is not None and kinds <= {"assign"}
        if not ok:
            self.report(
                "attr.assign",
                "attribute assignment or deletion is only allowed on a local variable "
                "that this function binds by assignment",
                node,
            )

    def visit_keyword(self, node: ast.keyword, scope: Scope) -> None:
        if node.arg is not None:
            self.check_name(node.arg, node)
        self.visit(node.value, scope)

    # --- match -----------------------------------------------------------------------

    def visit_MatchClass(self, node: ast.MatchClass, scope: Scope) -> None:
        cls = node.cls
        name = _normalize(cls.id) if isinstance(cls, ast.Name) else None
        if name is None or name not in tables.MATCH_CLASSES:
            shown = name if name is not None else type(cls).__name__
            self.report(
                "match.class",
                f"class pattern {shown!r} is not allowed "
                f"(allowed: {', '.join(sorted(tables.MATCH_CLASSES))})",
                node,
            )
        for attr in node.kwd_attrs:
            self.check_attribute_name(attr, node)
        for pattern in (*node.patterns, *node.kwd_patterns):
            self.visit(pattern, scope)

    def visit_MatchAs(self, node: ast.MatchAs, scope: Scope) -> None:
        if node.name is not None:
            self.check_name(node.name, node)
        self.children(node, scope)

    def visit_MatchStar(self, node: ast.MatchStar, scope: Scope) -> None:
        if node.name is not None:
            self.check_name(node.name, node)

    def visit_MatchMapping(self, node: ast.MatchMapping, scope: Scope) -> None:
        if node.rest is not None:
            self.check_name(node.rest, node)
        self.children(node, scope)


def _parse(source: str, filename: str) -> tuple[ast.Module | None, Violation | None]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for invalid escapes
            return ast.parse(source, filename, "exec"), None
    except SyntaxError as exc:
        line = exc.lineno or 1
        col = exc.offset or 1
        return None, Violation(
            rule="syntax.error", message=f"{type(exc).__name__}: {exc.msg}", line=line, col=col
        )
    except (RecursionError, MemoryError) as exc:
        return None, Violation(
            rule="limit.parser",
            message=f"the parser gave up ({type(exc).__name__}): nesting is too deep",
            line=1,
            col=1,
        )
    except ValueError as exc:  # e.g. NUL bytes on older Pythons
        return None, Violation(rule="syntax.error", message=str(exc), line=1, col=1)


def check_source(source: str, filename: str = "<audit>") -> CheckResult:
    """Check ``source`` against the policy; never raises for any ``str`` input."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > tables.MAX_SOURCE_BYTES:
        violation = Violation(
            rule="limit.source_size",
            message=f"source is {size} bytes (limit {tables.MAX_SOURCE_BYTES})",
            line=1,
            col=1,
        )
        return CheckResult((violation,), (), False)
    tree, failure = _parse(source, filename)
    if tree is None:
        assert failure is not None
        return CheckResult((failure,), (), False)
    nodes, depth = _measure(tree)
    if nodes > tables.MAX_AST_NODES:
        violation = Violation(
            rule="limit.nodes",
            message=f"more than {tables.MAX_AST_NODES} syntax nodes",
            line=1,
            col=1,
        )
        return CheckResult((violation,), (), False)
    if depth > tables.MAX_AST_DEPTH:
        violation = Violation(
            rule="limit.depth",
            message=f"syntax nested deeper than {tables.MAX_AST_DEPTH} levels",
            line=1,
            col=1,
        )
        return CheckResult((violation,), (), False)
    checker = _Checker(source)
    try:
        checker.run(tree)
    except (RecursionError, MemoryError, KeyError, AttributeError, TypeError) as exc:
        violation = Violation(
            rule="audit.internal",
            message=f"the auditor failed on this source ({type(exc).__name__}); refused",
            line=1,
            col=1,
        )
        return CheckResult((violation,), (), False)
    violations = tuple(sorted(checker.violations, key=lambda v: (v.line, v.col)))
    if not violations:
        # What only the compiler sees ('return' outside a function, duplicate
        # parameters, 'break' outside a loop): the executor would refuse it too.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compile(tree, filename, "exec", dont_inherit=True)
        except SyntaxError as exc:
            violations = (
                Violation(
                    rule="syntax.error",
                    message=f"{type(exc).__name__}: {exc.msg}",
                    line=exc.lineno or 1,
                    col=exc.offset or 1,
                ),
            )
        except (RecursionError, MemoryError, ValueError) as exc:
            violations = (
                Violation(
                    rule="limit.parser",
                    message=f"the compiler gave up ({type(exc).__name__})",
                    line=1,
                    col=1,
                ),
            )
    defs, alias = top_level_entries(tree)
    return CheckResult(violations, defs, alias)

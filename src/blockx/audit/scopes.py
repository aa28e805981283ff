"""Scopes: which names each function, lambda and comprehension binds, and how.

The checker needs Python's own name resolution to tell a local variable from
a module global from a builtin (rule ``name.unknown``) and an *assigned*
local from a parameter or an import (rule ``attr.assign``). This module runs
once over a parsed module before the checker and records, per scope node, every
name it binds and the kinds of binding (``param``, ``assign``, ``loop``,
``def``, ``import``, ``except``, ``capture``, ``del``, ``annotation``).

Python's rules, as far as the allowed syntax needs them: a function,
lambda or comprehension resolves a name in its own bindings, then in the
enclosing function-like scopes, then in the module, then in the builtins;
defaults, decorators and annotations are evaluated in the enclosing scope, and
so is a comprehension's first iterable; a walrus inside a comprehension binds
in the nearest enclosing non-comprehension scope. There are no class scopes
(classes are refused) and no ``global``/``nonlocal`` (refused).
"""

from __future__ import annotations

import ast
from typing import Literal

__all__ = ["COMPREHENSIONS", "Scope", "ScopeKind", "all_args", "build_scopes"]

ScopeKind = Literal["module", "function", "lambda", "comprehension"]

COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class Scope:
    """One scope: its bindings (name → kinds) and its import bindings (name → module)."""

    __slots__ = ("bindings", "imports", "kind", "parent")

    def __init__(self, kind: ScopeKind, parent: Scope | None) -> None:
        self.kind: ScopeKind = kind
        self.parent = parent
        self.bindings: dict[str, set[str]] = {}
        self.imports: dict[str, str] = {}

    def bind(self, name: str, kind: str) -> None:
        self.bindings.setdefault(name, set()).add(kind)

    def resolve(self, name: str) -> Scope | None:
        """The scope whose binding ``name`` refers to here, or None (a builtin)."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope.bindings:
                return scope
            scope = scope.parent
        return None

    def __repr__(self) -> str:
        return f"Scope({self.kind}, names={sorted(self.bindings)})"


def _all_args(args: ast.arguments) -> list[ast.arg]:
    out = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if args.vararg is not None:
        out.append(args.vararg)
    if args.kwarg is not None:
        out.append(args.kwarg)
    return out


class _Builder:
    def __init__(self) -> None:
        self.scopes: dict[int, Scope] = {}

    def build(self, tree: ast.Module) -> Scope:
        module = Scope("module", None)
        self.scopes[id(tree)] = module
        for stmt in tree.body:
            self.visit(stmt, module)
        return module

    def _new(self, kind: ScopeKind, node: ast.AST, parent: Scope) -> Scope:
        scope = Scope(kind, parent)
        self.scopes[id(node)] = scope
        return scope

    def target(self, node: ast.AST, scope: Scope, kind: str) -> None:
        if isinstance(node, ast.Name):
            scope.bind(node.id, kind)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                self.target(elt, scope, kind)
        elif isinstance(node, ast.Starred):
            self.target(node.value, scope, kind)
        else:  # Attribute / Subscript targets bind nothing; their parts are loads
            self.visit(node, scope)

    def visit(self, node: ast.AST, scope: Scope) -> None:
        if isinstance(node, ast.FunctionDef):
            scope.bind(node.name, "def")
            for expr in node.decorator_list:
                self.visit(expr, scope)
            self._outer_parts(node.args, scope)
            if node.returns is not None:
                self.visit(node.returns, scope)
            inner = self._new("function", node, scope)
            for arg in _all_args(node.args):
                inner.bind(arg.arg, "param")
            for stmt in node.body:
                self.visit(stmt, inner)
        elif isinstance(node, ast.ClassDef):  # refused by the checker; bind it for clarity
            scope.bind(node.name, "def")
        elif isinstance(node, ast.Lambda):
            self._outer_parts(node.args, scope)
            inner = self._new("lambda", node, scope)
            for arg in _all_args(node.args):
                inner.bind(arg.arg, "param")
            self.visit(node.body, inner)
        elif isinstance(node, COMPREHENSIONS):
            generators = node.generators
            self.visit(generators[0].iter, scope)
            inner = self._new("comprehension", node, scope)
            for i, gen in enumerate(generators):
                self.target(gen.target, inner, "loop")
                if i:
                    self.visit(gen.iter, inner)
                for cond in gen.ifs:
                    self.visit(cond, inner)
            if isinstance(node, ast.DictComp):
                self.visit(node.key, inner)
                self.visit(node.value, inner)
            else:
                self.visit(node.elt, inner)
        elif isinstance(node, ast.NamedExpr):
            owner = scope
            while owner.kind == "comprehension" and owner.parent is not None:
                owner = owner.parent
            self.target(node.target, owner, "assign")
            self.visit(node.value, scope)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self.target(target, scope, "assign")
            self.visit(node.value, scope)
        elif isinstance(node, ast.AugAssign):
            self.target(node.target, scope, "assign")
            self.visit(node.value, scope)
        elif isinstance(node, ast.AnnAssign):
            self.target(node.target, scope, "assign" if node.value is not None else "annotation")
            self.visit(node.annotation, scope)
            if node.value is not None:
                self.visit(node.value, scope)
        elif isinstance(node, ast.For):
            self.target(node.target, scope, "loop")
            for child in (node.iter, *node.body, *node.orelse):
                self.visit(child, scope)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                self.target(target, scope, "del")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is not None:
                    scope.bind(alias.asname, "import")
                    scope.imports[alias.asname] = alias.name
                else:
                    top = alias.name.partition(".")[0]
                    scope.bind(top, "import")
                    scope.imports[top] = top
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                if alias.name == "*":
                    continue
                bound = alias.asname or alias.name
                scope.bind(bound, "import")
                scope.imports[bound] = f"{module}.{alias.name}"
        elif isinstance(node, ast.ExceptHandler):
            if node.name is not None:
                scope.bind(node.name, "except")
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)):
            if node.name is not None:
                scope.bind(node.name, "capture")
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope)
        elif isinstance(node, ast.MatchMapping):
            if node.rest is not None:
                scope.bind(node.rest, "capture")
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope)
        else:
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope)

    def _outer_parts(self, args: ast.arguments, scope: Scope) -> None:
        for default in (*args.defaults, *args.kw_defaults):
            if default is not None:
                self.visit(default, scope)
        for arg in _all_args(args):
            if arg.annotation is not None:
                self.visit(arg.annotation, scope)


def build_scopes(tree: ast.Module) -> tuple[Scope, dict[int, Scope]]:
    """The module scope, and every nested scope keyed by ``id()`` of its node.

    The tree must stay alive while the map is used (ids are only unique then).
    """
    builder = _Builder()
    module = builder.build(tree)
    return module, builder.scopes


def all_args(args: ast.arguments) -> list[ast.arg]:
    """Every parameter of ``args`` (positional-only, normal, ``*``, keyword-only, ``**``)."""
    return _all_args(args)

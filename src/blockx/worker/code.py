"""Function Code View: the sources a task runs, pinned by digest (seed: Function Code View).

Theory of operation
-------------------
A task names its functions by id and gives their sources. When the task
starts, :func:`build_task_code_view` turns them into a :class:`TaskCodeView`:
per function its ``sha256:<hex>`` digest (of the UTF-8 source), its entry
selector and — when the source does not compile or has no entry function —
its :class:`CodeError`. The view is immutable: a task's code never changes
once it started, so every attempt and every sub-call of the task runs the same
code (the seed's "pinned view").

What reads it:

* the worker, at registration: each call's digest (the core keys calls by it);
* the orchestrator, per ``DispatchCallCmd``: the entry selector and the audit
  payload, or the function's :class:`CodeError` — a call of a function that
  failed to compile is failed as ``user_error`` (one the audit gate refused:
  ``audit_rejected``) with the error's message and line instead of being sent
  (calls of the task's other functions run normally). The audit verdicts are
  put in by :mod:`blockx.worker.audit_gate` for tasks submitted with
  ``audit=True``;
* the executor adapter, through :meth:`FunctionCodeView.resolve` (its
  function-code resolver): ``ExecuteCall`` carries only the digest, and the
  executor fetches the source with ``CallWaiting(waitKind=function_code)`` the
  first time it sees a digest.

:class:`FunctionCodeView` is the worker-wide registry of pinned views, keyed
by the task id the executors see. Sources are interned by (function id,
digest), so many tasks running the same function hold one copy. The compile
check (``compile()`` of the whole module, which also catches errors ``ast``
alone lets through, such as ``return`` outside a function) is cached by digest.

Entry selection (``entrySelector``), the seed's rule, implemented once in
:mod:`blockx.audit.entry`: the top-level ``def`` named like the function id's
last segment (after the last ``/`` or ``.``), else ``def _`` (or ``_ = f``),
else the first public top-level ``def``. The executor takes the selector as
given when it names a top-level ``def``.

Single-threaded: everything runs on the worker's event loop thread, except
:func:`build_task_code_view`, which is pure and may run anywhere.
"""

from __future__ import annotations

import ast
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from blockx.audit.entry import entry_from_defs, top_level_entries
from blockx.wire import RemoteError, keys

__all__ = [
    "MISSING_FUNCTION_DIGEST",
    "CodeError",
    "FunctionCode",
    "FunctionCodeView",
    "TaskCodeView",
    "build_task_code_view",
    "module_filename",
    "source_digest",
]

_log = logging.getLogger("blockx.worker.code")

#: The digest given to a function id the task does not define, so that its calls
#: (a stream's, a sub-call's) fail like those of a broken function.
MISSING_FUNCTION_DIGEST: Final = "sha256:" + "0" * 64
#: Compile checks kept, by digest.
_COMPILE_CACHE_ENTRIES: Final = 1024


def source_digest(source: str) -> str:
    """``sha256:<64 hex>`` of the UTF-8 source (docs/protocol.md ``functionCodeDigest``)."""
    return "sha256:" + hashlib.sha256(source.encode("utf-8")).hexdigest()


def module_filename(function_id: str) -> str:
    """The filename the executor compiles a module under (so lines and names match)."""
    return f"<blockx:{function_id}>"


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeError:
    """Why a function cannot run: its calls fail with ``kind`` and this message."""

    function_id: str
    #: One line: ``SyntaxError: invalid syntax (<blockx:f>, line 3, column 7)``.
    message: str
    lineno: int | None = None
    offset: int | None = None
    #: A traceback-like text showing the offending line (the call's "user stack").
    stack: str | None = None
    #: The calls' error kind: ``user_error`` (does not compile, no entry, not defined)
    #: or ``audit_rejected`` (the audit gate refused it). Never retryable.
    kind: str = keys.ERR_USER_ERROR

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCode:
    """One function of a task: its source, digest and entry selector, or its error."""

    function_id: str
    source: str
    digest: str
    #: The ``entrySelector`` sent with every ``ExecuteCall`` ("" when ``error`` is set).
    entry_selector: str
    error: CodeError | None = None
    #: ``ExecuteCall.audit`` of an audited, accepted function (the audit gate sets it);
    #: None: the function runs unrestricted.
    audit: dict[str, str] | None = None

    def __repr__(self) -> str:
        what = f"error={self.error.message!r}" if self.error else f"entry={self.entry_selector!r}"
        return f"FunctionCode({self.function_id!r}, {self.digest[:15]}…, {what})"


class _Checked:
    """A digest's compile check: the entry names it offers, or its syntax error."""

    __slots__ = ("error", "top_level_defs", "underscore_alias")

    def __init__(
        self,
        top_level_defs: tuple[str, ...],
        underscore_alias: bool,
        error: SyntaxError | None,
    ) -> None:
        self.top_level_defs = top_level_defs
        self.underscore_alias = underscore_alias
        self.error = error


_compile_cache: OrderedDict[str, _Checked] = OrderedDict()


def _check_source(function_id: str, source: str, digest: str) -> _Checked:
    checked = _compile_cache.get(digest)
    if checked is not None:
        _compile_cache.move_to_end(digest)
        return checked
    filename = module_filename(function_id)
    try:
        tree = ast.parse(source, filename)
        compile(tree, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        checked = _Checked((), False, exc)
    except (ValueError, MemoryError, RecursionError) as exc:  # NUL bytes, absurd nesting
        error = SyntaxError(f"{type(exc).__name__}: {exc}", (filename, 1, 1, "", 1, 1))
        checked = _Checked((), False, error)
    else:
        defs, alias = top_level_entries(tree)
        checked = _Checked(defs, alias, None)
    _compile_cache[digest] = checked
    if len(_compile_cache) > _COMPILE_CACHE_ENTRIES:
        _compile_cache.popitem(last=False)
    return checked


def _syntax_error(function_id: str, source: str, error: SyntaxError) -> CodeError:
    lineno = error.lineno
    offset = error.offset
    where = f"line {lineno}" if lineno else "unknown line"
    if lineno and offset:
        where += f", column {offset}"
    filename = module_filename(function_id)
    message = f"SyntaxError: {error.msg} ({filename}, {where})"
    line_text = error.text
    if line_text is None and lineno:
        lines = source.splitlines()
        if 0 < lineno <= len(lines):
            line_text = lines[lineno - 1]
    stack = f'  File "{filename}", line {lineno or "?"}\n'
    if line_text:
        stripped = line_text.rstrip("\n")
        stack += f"    {stripped.strip()}\n"
        if offset:
            indent = len(stripped) - len(stripped.lstrip())
            stack += "    " + " " * max(offset - 1 - indent, 0) + "^\n"
    stack += f"SyntaxError: {error.msg}\n"
    return CodeError(
        function_id=function_id, message=message, lineno=lineno, offset=offset, stack=stack
    )


def select_entry(
    top_level_defs: tuple[str, ...], underscore_alias: bool, function_id: str
) -> str | None:
    """The entry ``def`` of a module (see the module docstring), or None."""
    return entry_from_defs(top_level_defs, underscore_alias, function_id)


def function_code(function_id: str, source: str) -> FunctionCode:
    """Check one function's source: digest, entry selector or :class:`CodeError`. Pure."""
    if not isinstance(function_id, str) or not function_id:
        raise ValueError(f"function ids must be non-empty strings, got {function_id!r}")
    if not isinstance(source, str):
        raise TypeError(f"the source of {function_id!r} must be a str, got {type(source).__name__}")
    digest = source_digest(source)
    checked = _check_source(function_id, source, digest)
    if checked.error is not None:
        return FunctionCode(
            function_id=function_id,
            source=source,
            digest=digest,
            entry_selector="",
            error=_syntax_error(function_id, source, checked.error),
        )
    entry = select_entry(checked.top_level_defs, checked.underscore_alias, function_id)
    if entry is None:
        message = (
            f"{module_filename(function_id)} defines no entry function: write `def _(...)`, "
            f"a `def` named after the function id, or any public top-level `def`"
        )
        return FunctionCode(
            function_id=function_id,
            source=source,
            digest=digest,
            entry_selector="",
            error=CodeError(function_id=function_id, message=message),
        )
    return FunctionCode(function_id=function_id, source=source, digest=digest, entry_selector=entry)


def _missing_function(function_id: str, known: list[str]) -> FunctionCode:
    message = f"function {function_id!r} is not defined in this task (it defines {known})"
    return FunctionCode(
        function_id=function_id,
        source="",
        digest=MISSING_FUNCTION_DIGEST,
        entry_selector="",
        error=CodeError(function_id=function_id, message=message),
    )


class TaskCodeView:
    """One task's functions, immutable once built (see the module docstring)."""

    __slots__ = ("_by_digest", "_functions")

    def __init__(self, functions: Mapping[str, FunctionCode]) -> None:
        self._functions: dict[str, FunctionCode] = dict(functions)
        self._by_digest: dict[tuple[str, str], FunctionCode] = {
            (f.function_id, f.digest): f for f in self._functions.values()
        }

    def __repr__(self) -> str:
        broken = [fid for fid, f in self._functions.items() if f.error]
        return f"TaskCodeView({sorted(self._functions)}, broken={broken})"

    def __contains__(self, function_id: object) -> bool:
        return function_id in self._functions

    def __iter__(self) -> Iterator[FunctionCode]:
        return iter(self._functions.values())

    def __len__(self) -> int:
        return len(self._functions)

    def get(self, function_id: str) -> FunctionCode:
        """The function, or a stand-in whose error says the task does not define it."""
        found = self._functions.get(function_id)
        if found is None:
            return _missing_function(function_id, sorted(self._functions))
        return found

    def digests(self) -> dict[str, str]:
        """``{function_id: digest}`` for the core's ``prepare_*_with_digests``."""
        return {fid: f.digest for fid, f in self._functions.items()}

    def resolve_for_dispatch(self, function_id: str, digest: str) -> FunctionCode:
        """The function a ``DispatchCallCmd`` names (the seed's ``ResolveForDispatch``).

        A digest that is not the task's pinned one (impossible unless the task
        was mixed up) resolves to the missing-function stand-in.
        """
        found = self._by_digest.get((function_id, digest))
        if found is None:
            return _missing_function(function_id, sorted(self._functions))
        return found

    def errors(self) -> dict[str, CodeError]:
        """The functions that cannot run, by id."""
        return {fid: f.error for fid, f in self._functions.items() if f.error is not None}


def build_task_code_view(functions: Mapping[str, str]) -> TaskCodeView:
    """Check and pin a task's sources. Pure (the compile cache aside); any thread.

    Raises :class:`ValueError` / :class:`TypeError` for ids or sources of the
    wrong type. Syntax errors are not raised: they are the functions' errors.
    """
    view = TaskCodeView({fid: function_code(fid, src) for fid, src in functions.items()})
    for fid, error in view.errors().items():
        _log.warning("function %s cannot run: %s", fid, error.message)
    return view


class FunctionCodeView:
    """The worker's pinned views, by task id; the executor adapter's code resolver."""

    __slots__ = ("_pins", "_sources", "_views", "resolved", "unresolved")

    def __init__(self) -> None:
        self._views: dict[str, TaskCodeView] = {}
        # Interned sources by (function id, digest), and how many views pin each.
        self._sources: dict[tuple[str, str], str] = {}
        self._pins: dict[tuple[str, str], int] = {}
        self.resolved = 0
        self.unresolved = 0

    def __repr__(self) -> str:
        return f"FunctionCodeView(tasks={len(self._views)}, sources={len(self._sources)})"

    def pin(self, task_id: str, view: TaskCodeView) -> None:
        """Make ``view`` the code of ``task_id`` until :meth:`release`."""
        if task_id in self._views:
            raise ValueError(f"task {task_id!r} already has a pinned code view")
        self._views[task_id] = view
        for code in view:
            key = (code.function_id, code.digest)
            self._sources.setdefault(key, code.source)
            self._pins[key] = self._pins.get(key, 0) + 1

    def release(self, task_id: str) -> None:
        """Forget ``task_id``'s view (its calls have all ended). Idempotent."""
        view = self._views.pop(task_id, None)
        if view is None:
            return
        for code in view:
            key = (code.function_id, code.digest)
            pins = self._pins.get(key, 0) - 1
            if pins <= 0:
                self._pins.pop(key, None)
                self._sources.pop(key, None)
            else:
                self._pins[key] = pins

    def view(self, task_id: str) -> TaskCodeView | None:
        return self._views.get(task_id)

    def resolve(self, task_id: str, function_id: str, digest: str) -> str | RemoteError:
        """The executor adapter's resolver: the source of (function id, digest).

        Answers from the task's pinned view, or from another task's copy of the
        same (function id, digest) — a late fetch of a task that just ended.
        """
        view = self._views.get(task_id)
        if view is not None:
            code = view.resolve_for_dispatch(function_id, digest)
            if code.digest != MISSING_FUNCTION_DIGEST:
                self.resolved += 1
                return code.source
        source = self._sources.get((function_id, digest))
        if source is not None and digest != MISSING_FUNCTION_DIGEST:
            self.resolved += 1
            return source
        self.unresolved += 1
        return RemoteError(
            kind=keys.ERR_FUNCTION_CODE_FETCH_FAILED,
            message=f"no source for {function_id!r} at {digest} in task {task_id!r}",
            retryable=False,
        )

"""Function Code View: digests, entry selection, compile errors, pinning and resolving."""

from __future__ import annotations

import hashlib

import pytest

from blockx.wire import RemoteError
from blockx.worker.code import (
    MISSING_FUNCTION_DIGEST,
    FunctionCodeView,
    build_task_code_view,
    function_code,
    source_digest,
)


def test_the_digest_is_sha256_of_the_utf8_source() -> None:
    source = "def _(p):\n    return 'é'\n"
    assert source_digest(source) == "sha256:" + hashlib.sha256(source.encode()).hexdigest()
    assert function_code("f", source).digest == source_digest(source)


@pytest.mark.parametrize(
    ("function_id", "source", "entry"),
    [
        ("f", "def other(p):\n    pass\n\ndef _(p):\n    pass\n", "_"),
        ("f", "def impl(p):\n    pass\n\n_ = impl\n", "_"),
        ("pkg/adder", "def helper():\n    pass\n\ndef adder(p):\n    pass\n", "adder"),
        ("pkg.mod.adder", "def adder(p):\n    pass\n", "adder"),
        (
            "f",
            "def _hidden():\n    pass\n\ndef first(p):\n    pass\n\ndef second(p):\n    pass\n",
            "first",
        ),
    ],
)
def test_entry_selection(function_id: str, source: str, entry: str) -> None:
    code = function_code(function_id, source)
    assert code.error is None and code.entry_selector == entry


def test_a_syntax_error_is_the_functions_error_with_its_line() -> None:
    code = function_code("bad", "x = 1\n\ndef _(p):\n    return (1 +\n")
    assert code.error is not None and code.entry_selector == ""
    assert code.error.message.startswith("SyntaxError:")
    assert "<blockx:bad>" in code.error.message and code.error.lineno is not None
    assert code.error.stack is not None and 'File "<blockx:bad>"' in code.error.stack


def test_compile_errors_that_parse_are_caught_too() -> None:
    code = function_code("bad", "return 5\n")
    assert code.error is not None and "outside function" in code.error.message


def test_a_module_without_an_entry_function_cannot_run() -> None:
    code = function_code("f", "def _private():\n    pass\n\nX = 1\n")
    assert code.error is not None and "no entry function" in code.error.message


def test_a_task_view_pins_digests_and_names_unknown_functions() -> None:
    view = build_task_code_view({"a": "def _(p):\n    pass\n", "b": "def _(p):\n    return (\n"})
    assert set(view.digests()) == {"a", "b"}
    assert list(view.errors()) == ["b"]
    missing = view.get("c")
    assert missing.digest == MISSING_FUNCTION_DIGEST and missing.error is not None
    assert "not defined in this task" in missing.error.message
    a = view.get("a")
    assert view.resolve_for_dispatch("a", a.digest) is a
    assert view.resolve_for_dispatch("a", "sha256:" + "1" * 64).error is not None


def test_the_resolver_answers_from_pinned_views_and_forgets_released_ones() -> None:
    registry = FunctionCodeView()
    source = "def _(p):\n    return p\n"
    view = build_task_code_view({"f": source})
    digest = view.get("f").digest
    registry.pin("t1", view)
    registry.pin("t2", build_task_code_view({"f": source}))
    assert registry.resolve("t1", "f", digest) == source
    registry.release("t1")
    # A late fetch for t1 is answered from t2's copy of the same (function, digest).
    assert registry.resolve("t1", "f", digest) == source
    registry.release("t2")
    error = registry.resolve("t1", "f", digest)
    assert isinstance(error, RemoteError) and error.kind == "function_code_fetch_failed"
    assert isinstance(registry.resolve("t9", "nope", MISSING_FUNCTION_DIGEST), RemoteError)
    with pytest.raises(ValueError):
        registry.pin("t3", view)
        registry.pin("t3", view)


def test_entry_follows_the_seed_order_segment_before_underscore():
    from blockx.worker.code import function_code

    source = "def _(p):\n    return 1\n\ndef adder(p):\n    return 2\n"
    assert function_code("pkg/adder", source).entry_selector == "adder"
    assert function_code("other", source).entry_selector == "_"

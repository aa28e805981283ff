"""The auditor's rules on code it must accept, entry resolution, verdicts and the cache."""

from __future__ import annotations

import random
import threading
from textwrap import dedent

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.audit import (
    POLICY_VERSION,
    Auditor,
    Verdict,
    Violation,
    audit_source,
    compute_verdict_digest,
    resolve_entry_name,
)
from blockx.audit import tables as audit_tables
from blockx.audit.checker import check_source

ACCEPTED: dict[str, str] = {
    "plain_entry": """
        def _(p):
            return {"sum": p["left"] + p["right"]}
    """,
    "locals_named_like_builtins": """
        def _(row):
            open = row["open"]
            type = row["type"]
            format = row.get("format", "csv")
            input = row.get("input")
            return {"open": open, "type": type, "format": format, "input": input}
    """,
    "underscore_throwaway": """
        def _(p):
            total = 0
            for _ in range(3):
                total += 1
            first, _ = p
            return [x for _, x in enumerate(p)], total, first
    """,
    "underscore_alias": """
        def compute(p):
            return p
        _ = compute
    """,
    "closures_and_helpers": """
        RATE = 3

        def scale(x, factor=RATE):
            def inner(y):
                return y * factor
            return inner(x)

        def _(p):
            return sorted(p, key=lambda r: (r["a"], -r["b"]))[:scale(1)]
    """,
    "imports": """
        from __future__ import annotations
        import json
        import math, re, itertools as it
        import blockx.function
        from blockx import function as fn
        from blockx.function import call
        from decimal import Decimal, ROUND_HALF_UP
        from datetime import datetime as dt, timedelta
        from collections import defaultdict, deque
        from typing import Any, Optional

        def _(p: dict[str, Any]) -> Optional[dict]:
            d = defaultdict(list)
            for a, b in it.product([1, 2], repeat=2):
                d[a].append(b)
            amount = Decimal(p["x"]).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            when = dt(2026, 1, 1) + timedelta(days=1)
            child = blockx.function.call("child", 1) or fn.call("child", 2) or call("c", 3)
            return {"d": json.dumps(d), "sqrt": math.sqrt(2), "m": bool(re.match("a", "a")),
                    "amount": str(amount), "when": when.isoformat(), "child": child}
    """,
    "match_statement": """
        def _(p):
            match p:
                case {"kind": "point", "x": int(x), "y": int(y)}:
                    return x + y
                case [first, *rest]:
                    return first, rest
                case str() | bytes():
                    return "text"
                case Decimal(real=r):
                    return r
                case {"k": v, **others}:
                    return v, others
                case None:
                    return None
                case _:
                    return 0
    """,
    "try_except_finally": """
        def _(p):
            try:
                value = int(p)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"bad input: {exc}") from exc
            else:
                value += 1
            finally:
                for x in range(3):
                    if x:
                        break
                    continue
            return value
    """,
    "formatting": """
        def _(p):
            a = "{} and {name}: {0!r:>{width}}".format(p, name="n", width=5)
            b = "{k}".format_map({"k": 1})
            c = "%(a)s %(b)d" % {"a": "x", "b": 1}
            d = f"{p!r:>10} {p['k'] if isinstance(p, dict) else p}"
            return a, b, c, d
    """,
    "attribute_assignment_on_assigned_local": """
        def _(p):
            box = p.copy()
            box.field = 1
            return box
    """,
    "walrus_and_comprehensions": """
        def _(p):
            if (n := len(p)) > 2:
                return {k: v for k, v in p.items() if v}
            return [y for x in p if (y := x * 2)], {x for x in p}, sum(x for x in p), n
    """,
    "module_level_state": """
        CACHE = {}
        NAMES = ["a", "b"]
        CACHE["k"] = NAMES[0]
        del CACHE["k"]

        def _(p):
            CACHE[p] = CACHE.get(p, 0) + 1
            return CACHE[p]
    """,
    "annotations_and_defaults": """
        from typing import List
        LIMIT: int = 10

        def _(p: List[int], *args: int, scale: float = 1.0, **kw: str) -> list:
            x: int
            return [v * scale for v in p[:LIMIT]] + list(args) + list(kw)
    """,
    "sdk_prelude": """
        def _(p):
            row = Table("prices").get_row(p["token"])
            bal = ChainState("eth", p["block"]).get_address_balance(p["addr"])
            return {"row": row, "bal": bal, "day": date(2026, 1, 2).isoformat(),
                    "now": datetime(2026, 1, 2).isoformat(), "j": json.dumps(1)}
    """,
    "docstrings_and_asserts": '''
        """Module doc."""

        def _(p):
            """Entry doc."""
            assert p is not None, "p is required"
            return not p
    ''',
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_the_auditor_accepts_ordinary_code(name: str) -> None:
    verdict = audit_source(dedent(ACCEPTED[name]), "tenant/fn")
    assert verdict.accepted, verdict.violations
    assert verdict.violations == ()
    assert verdict.error_message() == ""


class TestEntryResolution:
    @pytest.mark.parametrize(
        ("source", "function_id", "expected"),
        [
            ("def helper(p): pass\ndef main(p): pass\n", "x/main", "main"),
            ("def adder(p): pass\ndef _(p): pass\n", "pkg/adder", "adder"),
            ("def adder(p): pass\ndef _(p): pass\n", "pkg.mod.adder", "adder"),
            ("def adder(p): pass\ndef _(p): pass\n", "tasks/a.b/adder", "adder"),
            ("def helper(p): pass\ndef _(p): pass\n", "pkg/other", "_"),
            ("def helper(p): pass\n_ = helper\n", "pkg/other", "_"),
            ("def _private(p): pass\ndef public(p): pass\ndef later(p): pass\n", "x", "public"),
            ("def _private(p): pass\n", "x", None),
            ("x = 1\n", "x", None),
        ],
    )
    def test_the_seed_rules_in_order(
        self, source: str, function_id: str, expected: str | None
    ) -> None:
        assert resolve_entry_name(source, function_id) == expected

    def test_a_parsed_tree_is_accepted_too(self) -> None:
        import ast

        assert resolve_entry_name(ast.parse("def f(p): pass\n"), "y") == "f"

    def test_the_verdict_names_the_entry(self) -> None:
        source = "def adder(p):\n    return 1\ndef _(p):\n    return 2\n"
        assert audit_source(source, "t/adder").entry == "adder"
        assert audit_source(source, "t/other").entry == "_"

    def test_no_entry_is_a_violation(self) -> None:
        verdict = audit_source("X = 1\n", "t/fn")
        assert not verdict.accepted
        assert [v.rule for v in verdict.violations] == ["entry.missing"]


class TestVerdicts:
    def test_a_verdict_has_a_stable_digest_that_covers_the_policy(self) -> None:
        source = "def _(p):\n    return p\n"
        digest = compute_verdict_digest(source)
        assert digest.startswith("sha256:") and len(digest) == 71
        assert audit_source(source, "a").verdict_digest == digest
        assert audit_source(source, "b").verdict_digest == digest
        assert compute_verdict_digest(source + " ") != digest
        assert audit_tables.policy_fingerprint() in POLICY_VERSION

    def test_the_audit_payload_is_the_execute_call_audit_object(self) -> None:
        verdict = audit_source("def _(p):\n    return p\n", "a")
        assert verdict.audit_payload() == {
            "policy": "default",
            "verdictDigest": verdict.verdict_digest,
        }

    def test_wire_round_trip(self) -> None:
        verdict = audit_source("import os\ndef _(p):\n    return p.__class__\n", "t/fn")
        wire = verdict.to_wire(7)
        assert wire["requestId"] == 7
        assert wire["violations"][0] == {
            "rule": "import.module",
            "message": "module 'os' is not in the import whitelist",
            "line": 1,
            "col": 8,
        }
        assert Verdict.from_wire(wire) == verdict

    def test_columns_are_one_based_characters(self) -> None:
        verdict = audit_source("def _(p):\n    s = 'é'; return p.__class__\n", "f")
        (violation,) = verdict.violations
        assert violation == Violation(
            rule="attr.underscore",
            message="attribute '__class__' starts with '_'",
            line=2,
            col=23,
        )

    def test_violations_are_capped(self) -> None:
        body = "".join(f"    x{i} = p.__a{i}\n" for i in range(200))
        verdict = audit_source("def _(p):\n" + body, "f")
        assert len(verdict.violations) == audit_tables.MAX_VIOLATIONS
        assert "(+45 more)" in verdict.error_message()

    def test_every_violation_is_in_source_order(self) -> None:
        verdict = audit_source("import os\ndef _(p):\n    return eval(p.__x)\n", "f")
        positions = [(v.line, v.col) for v in verdict.violations]
        assert positions == sorted(positions)

    def test_too_many_nodes(self) -> None:
        source = "X = [" + "1," * (audit_tables.MAX_AST_NODES + 10) + "]\ndef _(p):\n    return X\n"
        source = source[: audit_tables.MAX_SOURCE_BYTES - 1]
        result = check_source(source)
        assert [v.rule for v in result.violations] in (["limit.nodes"], ["syntax.error"])
        big = "X = [" + "1," * (audit_tables.MAX_AST_NODES + 10) + "]\n"
        assert len(big) < audit_tables.MAX_SOURCE_BYTES
        assert [v.rule for v in check_source(big).violations] == ["limit.nodes"]

    def test_non_str_input_is_a_type_error(self) -> None:
        with pytest.raises(TypeError):
            Auditor().audit(b"def _(p): pass", "f")  # type: ignore[arg-type]


class TestCache:
    def test_results_are_cached_by_digest(self) -> None:
        auditor = Auditor(max_entries=2)
        for name in ("a", "b", "a"):
            auditor.audit("def _(p):\n    return 1\n", name)
        assert auditor.stats() == {"entries": 1, "hits": 2, "misses": 1}
        auditor.audit("def _(p):\n    return 2\n", "a")
        auditor.audit("def _(p):\n    return 3\n", "a")
        assert auditor.stats()["entries"] == 2
        assert not auditor.cached(compute_verdict_digest("def _(p):\n    return 1\n"))
        assert "Auditor(policy='default'" in repr(auditor)

    def test_threads_share_one_auditor(self) -> None:
        auditor = Auditor(max_entries=8)
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(40):
                    verdict = auditor.audit(f"def _(p):\n    return {i % 12}\n", f"f{n}")
                    assert verdict.accepted
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert auditor.stats()["entries"] <= 8


class TestNeverRaises:
    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=400))
    def test_any_text(self, text: str) -> None:
        result = check_source(text)
        assert all(v.rule in audit_tables.RULES for v in result.violations)

    def test_spliced_fragments_of_real_code(self) -> None:
        rnd = random.Random(20260611)
        sources = [dedent(s) for s in ACCEPTED.values()]
        for _ in range(2000):
            a, b = rnd.choice(sources), rnd.choice(sources)
            i, j = sorted(rnd.randrange(len(a) + 1) for _ in range(2))
            k = rnd.randrange(len(b) + 1)
            result = check_source(a[:i] + b[k : k + rnd.randrange(60)] + a[j:])
            assert all(v.rule in audit_tables.RULES for v in result.violations)

    def test_a_checker_bug_fails_closed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from blockx.audit import checker

        def broken(self: object, node: object, scope: object) -> None:
            raise KeyError("bug")

        monkeypatch.setattr(checker._Checker, "visit_Name", broken)
        result = check_source("def _(p):\n    return p\n")
        assert [v.rule for v in result.violations] == ["audit.internal"]

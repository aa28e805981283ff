"""Benign functions: accepted by the auditor and correct in the restricted runtime,
both directly and through the executor (``ExecuteCall.audit`` set)."""

from __future__ import annotations

import hashlib
from textwrap import dedent
from typing import Any

import pytest
from restricted_helpers import provider_installed, run_restricted

from blockx.audit import audit_source
from blockx.executor.module_registry import ModuleRegistry
from blockx.executor.restricted_runtime import restricted_namespace
from blockx.executor.runtime import ExecutorRuntime
from blockx.wire import keys

BENIGN: dict[str, tuple[str, Any, Any]] = {
    "json": (
        """
        def _(p):
            data = json.loads(p)
            data["n"] = len(data["items"])
            return json.dumps(data, sort_keys=True, separators=(",", ":"))
        """,
        '{"items": [1, 2], "b": null}',
        '{"b":null,"items":[1,2],"n":2}',
    ),
    "decimal_math": (
        """
        from decimal import Decimal, ROUND_HALF_UP, InvalidOperation

        def _(p):
            total = sum((Decimal(x) for x in p), Decimal("0"))
            try:
                Decimal("nope")
            except InvalidOperation:
                bad = True
            return [str(total.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)), bad]
        """,
        ["1.005", "2.10", "0.001"],
        ["3.11", True],
    ),
    "datetime": (
        """
        from datetime import timedelta, timezone

        def _(p):
            start = datetime.strptime(p, "%Y-%m-%d").replace(tzinfo=timezone.utc)
            end = start + timedelta(days=30, hours=1)
            return {"end": end.isoformat(), "weekday": end.weekday(),
                    "days": (end.date() - date(2026, 1, 1)).days}
        """,
        "2026-01-01",
        {"end": "2026-01-31T01:00:00+00:00", "weekday": 5, "days": 30},
    ),
    "comprehensions_and_lambdas": (
        """
        def _(rows):
            by_kind = {}
            for row in rows:
                by_kind.setdefault(row["kind"], []).append(row["v"])
            ranked = sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))
            return {
                "ranked": [k for k, _ in ranked],
                "squares": {v * v for vs in by_kind.values() for v in vs if v > 1},
                "total": sum(v for vs in by_kind.values() for v in vs),
                "big": [n for v in [4, 1] if (n := v * 10) > 20],
            }
        """,
        [{"kind": "a", "v": 1}, {"kind": "b", "v": 5}, {"kind": "a", "v": 2}],
        {"ranked": ["b", "a"], "squares": {25, 4}, "total": 8, "big": [40]},
    ),
    "try_except_and_errors": (
        """
        def parse(x):
            try:
                return int(x)
            except (ValueError, TypeError) as exc:
                return f"bad: {type_name(x)} ({exc.args[0][:12]})"
            finally:
                for _ in range(2):
                    break

        def type_name(x):
            match x:
                case str():
                    return "str"
                case None:
                    return "none"
                case _:
                    return "other"

        def _(p):
            out = [parse(x) for x in p]
            try:
                raise KeyError("k")
            except LookupError as exc:
                out.append(repr(exc))
            return out
        """,
        ["1", "x", None],
        [1, "bad: str (invalid lite)", "bad: none (int() argume)", "KeyError('k')"],
    ),
    "fstrings_and_literal_templates": (
        """
        def _(p):
            width = 6
            return [
                f"{p['name']!r:>{width}}|{p['n']:04d}|{p['x']:.2f}",
                "{} has {n} items".format(p["name"], n=p["n"]),
                "%(name)s/%(n)03d" % p,
            ]
        """,
        {"name": "ab", "n": 7, "x": 3.14159},
        ["  'ab'|0007|3.14", "ab has 7 items", "ab/007"],
    ),
    "stdlib_facades": (
        """
        import re, math, itertools, statistics, base64, hashlib
        from collections import Counter if False else defaultdict, deque
        from functools import reduce, partial

        def _(p):
            words = re.findall(r"[a-z]+", p.lower())
            counts = defaultdict(int)
            for w in words:
                counts[w] += 1
            window = deque(maxlen=2)
            for w in words:
                window.append(w)
            pairs = list(itertools.islice(itertools.combinations(sorted(counts), 2), 2))
            return {
                "counts": dict(counts), "window": list(window), "pairs": pairs,
                "mean": statistics.mean(counts.values()), "hyp": math.hypot(3, 4),
                "prod": reduce(lambda a, b: a * b, [1, 2, 3]),
                "hex": partial(int, base=16)("ff"),
                "b64": base64.b64encode(p.encode()).decode(),
                "sha": hashlib.sha256(p.encode()).hexdigest()[:8],
            }
        """,
        "To be or not to be",
        None,  # checked below
    ),
}

# `import a if b else c` is not Python; keep the table honest:
BENIGN["stdlib_facades"] = (
    BENIGN["stdlib_facades"][0].replace(
        "from collections import Counter if False else defaultdict, deque",
        "from collections import defaultdict, deque",
    ),
    *BENIGN["stdlib_facades"][1:],
)


def load_entry(source: str) -> Any:
    namespace = run_restricted(dedent(source))
    return namespace["_"]


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_code_is_accepted_and_runs_restricted(name: str) -> None:
    source, args, expected = BENIGN[name]
    verdict = audit_source(dedent(source), f"t/{name}")
    assert verdict.accepted, verdict.violations
    assert verdict.entry == "_"
    result = load_entry(source)(args)
    if name == "stdlib_facades":
        assert result["counts"] == {"to": 2, "be": 2, "or": 1, "not": 1}
        assert result["window"] == ["to", "be"]
        assert result["pairs"] == [("be", "not"), ("be", "or")]
        assert result["mean"] == 1.5 and result["hyp"] == 5.0 and result["prod"] == 6
        assert result["hex"] == 255
        assert result["b64"] == "VG8gYmUgb3Igbm90IHRvIGJl"
        assert result["sha"] == hashlib.sha256(b"To be or not to be").hexdigest()[:8]
    else:
        assert result == expected


def test_sub_calls_go_to_the_provider() -> None:
    source = dedent(
        """
        import blockx.function
        from blockx.function import call

        def _(p):
            child = function.call("adder", {"left": p["left"], "right": p["right"]})
            many = call("f", 1, 2)
            none = blockx.function.call("g")
            return {"sum": child["sum"], "many": many["args"], "none": none["args"]}
        """
    )
    assert audit_source(source, "t/parent").accepted
    with provider_installed() as provider:
        result = load_entry(source)({"left": 1, "right": 2})
    assert result == {"sum": 3, "many": [1, 2], "none": []}
    assert [r[1] for r in provider.requests] == ["adder", "f", "g"]


def test_function_call_outside_a_call_says_so() -> None:
    entry = load_entry("def _(p):\n    return function.call('x', 1)\n")
    with pytest.raises(RuntimeError, match="only works inside a BlockX call"):
        entry(None)


def test_sdk_object_facades_reach_the_provider() -> None:
    source = dedent(
        """
        def _(p):
            row = Table("prices").get_row(p["token"])
            n = Table("seen").upsert_rows([{"key": p["token"]}])
            wei = ChainState("eth", 19000000).get_address_balance(p["addr"])
            return {"usd": row["usd"], "written": n, "wei": wei}
        """
    )
    assert audit_source(source, "t/sdk").accepted
    with provider_installed() as provider:
        result = load_entry(source)({"token": "eth", "addr": "0x" + "ab" * 20})
    assert result == {"usd": "1.25", "written": 1, "wei": 16}
    assert [r[1] for r in provider.requests] == ["blockdb", "blockdb", "rpc"]


def test_print_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    load_entry("def _(p):\n    print('hello', p, sep='-')\n")("x")
    assert capsys.readouterr().out == "hello-x\n"


def test_modules_of_one_task_do_not_share_state() -> None:
    source = "SEEN = []\ndef _(p):\n    SEEN.append(p)\n    return len(SEEN)\n"
    first, second = load_entry(source), load_entry(source)
    assert [first(1), first(2), second(3)] == [1, 2, 1]


# --- through the executor -------------------------------------------------------------


class Driver:
    """A minimal worker for one ExecutorRuntime without a session."""

    def __init__(self) -> None:
        registry = ModuleRegistry(
            restricted_namespace_factory=restricted_namespace, released_namespace_cache=0
        )
        self.rt = ExecutorRuntime("exec-1", registry=registry)
        self.sources: dict[str, str] = {}
        self.terminals: dict[str, dict[str, Any]] = {}

    def execute(
        self, call_id: str, source: str, args: Any, *, audit: bool, task_id: str = "t1"
    ) -> None:
        """Send an ExecuteCall; ``audit`` marks it audited, as the worker's gate would
        after accepting it (the gate is not asked here, so probes can be sent)."""
        digest = "sha256:" + hashlib.sha256(source.encode()).hexdigest()
        self.sources[digest] = source
        payload: dict[str, Any] = {
            keys.FP_TASK_ID: task_id,
            keys.FP_FUNCTION_ID: "t/fn",
            keys.FP_FUNCTION_CODE_DIGEST: digest,
            keys.FP_ARGS: args,
        }
        if audit:
            payload[keys.FP_AUDIT] = audit_source(source, "t/fn").audit_payload()
        self.rt.handle_inbound_message(
            {
                keys.F_MESSAGE_TYPE: keys.MT_EXECUTE_CALL,
                keys.F_CALL_ID: call_id,
                keys.F_PAYLOAD: payload,
            }
        )

    def run(self) -> None:
        while True:
            self.rt.run_until_idle()
            batch = self.rt.drain_outbox()
            if not batch:
                return
            for envelope, _ in batch:
                payload = envelope[keys.F_PAYLOAD]
                kind = envelope[keys.F_MESSAGE_TYPE]
                if kind != keys.MT_CALL_WAITING:
                    self.terminals[envelope[keys.F_CALL_ID]] = envelope
                    continue
                wait = payload[keys.FP_WAIT_KIND]
                if wait == keys.WAIT_FUNCTION_CODE:
                    digest = payload[keys.FP_FUNCTION_CODE_DIGEST]
                    result: Any = {
                        keys.FP_SOURCE: self.sources[digest],
                        keys.FP_FUNCTION_CODE_DIGEST: digest,
                    }
                else:
                    result = {"sum": 42}
                self.rt.handle_inbound_message(
                    {
                        keys.F_MESSAGE_TYPE: keys.MT_RESUME_CALL,
                        keys.F_CALL_ID: envelope[keys.F_CALL_ID],
                        keys.F_REQUEST_ID: envelope[keys.F_REQUEST_ID],
                        keys.F_PAYLOAD: {
                            keys.FP_RESUME_KIND: wait,
                            keys.FP_RESULT: result,
                            keys.FP_BUDGET_USED_MS: 0,
                        },
                    }
                )

    def close(self) -> None:
        self.rt.shutdown()
        self.rt.drain_outbox()


def test_an_accepted_function_runs_audited_in_the_executor() -> None:
    source = dedent(
        """
        from decimal import Decimal

        def _(p):
            child = function.call("adder", {"left": p["left"], "right": p["right"]})
            total = Decimal(str(child["sum"])) + Decimal("0.50")
            return {"child": child, "encoded": json.dumps({"sum": child["sum"]}),
                    "total": str(total), "day": date(2026, 6, 10).isoformat(),
                    "stamp": datetime(2026, 6, 10, 9, 30).isoformat()}
        """
    )
    assert audit_source(source, "t/fn").accepted
    driver = Driver()
    try:
        driver.execute("c1", source, {"left": 1, "right": 2}, audit=True)
        driver.run()
        done = driver.terminals["c1"]
        assert done[keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED, done
        assert done[keys.F_PAYLOAD][keys.FP_OUTPUT] == {
            "child": {"sum": 42},
            "encoded": '{"sum": 42}',
            "total": "42.50",
            "day": "2026-06-10",
            "stamp": "2026-06-10T09:30:00",
        }
    finally:
        driver.close()


def test_audited_calls_get_the_restricted_namespace_and_others_do_not() -> None:
    probe = dedent(
        """
        def _(p):
            try:
                open
                return "open"
            except NameError:
                return "restricted"
        """
    )
    driver = Driver()
    try:
        driver.execute("audited", probe, None, audit=True)
        driver.execute("plain", probe, None, audit=False)
        driver.run()
        assert driver.terminals["audited"][keys.F_PAYLOAD][keys.FP_OUTPUT] == "restricted"
        assert driver.terminals["plain"][keys.F_PAYLOAD][keys.FP_OUTPUT] == "open"
    finally:
        driver.close()


def test_an_escape_that_got_past_the_auditor_fails_the_call_as_user_error() -> None:
    driver = Driver()
    try:
        source = "import os\ndef _(p):\n    return 1\n"
        driver.execute("plain", source, None, audit=False)
        driver.execute("audited", source, None, audit=True, task_id="t2")  # a buggy gate
        driver.run()
        assert driver.terminals["plain"][keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED
        failed = driver.terminals["audited"][keys.F_PAYLOAD]
        assert failed[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert "import of 'os' is not allowed" in failed[keys.FP_ERROR_MESSAGE]
    finally:
        driver.close()


def test_the_executor_installs_the_restricted_namespace_by_default() -> None:
    runtime = ExecutorRuntime("exec-default")
    try:
        assert runtime.registry.restricted_namespace_factory is restricted_namespace
    finally:
        runtime.shutdown()
        runtime.drain_outbox()

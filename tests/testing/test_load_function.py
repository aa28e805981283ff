"""``blockx.testing.load_function``: a function file run in process, as the engine runs it.

The issue's words: a plain callable running the function with the same prelude
(``Table``, ``ChainState``, ``function``), in-memory tables seeded from dicts and
inspectable after, a fake chain, sub-calls to other loaded functions, a virtual
clock for ``time.sleep``.
"""

from __future__ import annotations

import textwrap

import pytest

import blockx.db
from blockx.executor import module_registry
from blockx.executor.errors import (
    NoEntryFunctionError,
    RemoteIOError,
    SubcallCycleDetectedError,
    SubcallDepthExceededError,
    SubcallFailedError,
    UserCodeSyntaxError,
)
from blockx.testing import (
    FunctionFileError,
    LoadedFunction,
    UnansweredRequestError,
    VirtualClock,
    clock,
    load_function,
)
from blockx.wire import NotSerializableError


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def test_a_function_file_becomes_a_plain_callable(tmp_path):
    path = tmp_path / "adder.py"
    path.write_text("def _(p):\n    return {'y': p['x'] + 1}\n")

    adder = load_function(str(path))

    assert isinstance(adder, LoadedFunction)
    assert adder.function_id == "adder"
    assert adder({"x": 41}) == {"y": 42}
    assert adder.call([{"x": 1}]) == {"y": 2}  # the wire rule: a list is spread


def test_the_prelude_is_the_executors_own(monkeypatch):
    # A name another part of BlockX adds to PRELUDE reaches loaded functions too.
    marker = object()
    monkeypatch.setitem(module_registry.PRELUDE, "Extra", marker)
    f = load_function(
        src("""
        def _():
            return sorted(k for k in ("Table", "ChainState", "function", "json", "Decimal",
                                      "datetime", "date", "Extra") if k in globals())
        def table_class():
            return Table is TABLE
        """)
    )
    assert f() == sorted(
        ["Table", "ChainState", "function", "json", "Decimal", "datetime", "date", "Extra"]
    )
    ns = f.env.entry(f.function_id).__globals__
    assert ns["Table"] is blockx.db.Table
    assert ns["Extra"] is marker


def test_running_the_file_directly_lacks_the_prelude_but_load_function_has_it(tmp_path):
    path = tmp_path / "reader.py"
    path.write_text("def _(k):\n    return Table('prices').get_row(k)\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    with pytest.raises(NameError, match="Table"):
        namespace["_"]("ETH")

    reader = load_function(path, tables={"prices": [{"key": "ETH", "usd": 3000}]})
    assert reader("ETH") == {"key": "ETH", "usd": 3000}


def test_tables_are_seeded_from_dicts_and_inspectable_after():
    f = load_function(
        src("""
        def _(symbol):
            prices = Table("prices")
            row = prices.get_row(symbol)
            Table("seen").upsert_rows([{"key": symbol, "found": row is not None}])
            prices.delete_rows(["OLD"])
            return row
        """),
        tables={"prices": [{"key": "ETH", "usd": 3000}, {"key": "OLD", "usd": 1}]},
    )

    assert f("ETH") == {"key": "ETH", "usd": 3000}
    assert f("BTC") is None
    assert f.tables.rows("prices") == [{"key": "ETH", "usd": 3000}]
    assert f.tables["seen"] == [{"key": "BTC", "found": False}, {"key": "ETH", "found": True}]
    assert f.tables.names() == ["prices", "seen"]


def test_the_fake_chain_answers_chain_state():
    addr = "0x" + "ab" * 20
    f = load_function(
        src("""
        def _(addr):
            state = ChainState("eth", 16)
            return {"wei": state.get_address_balance(addr),
                    "head": ChainState("eth").get_block_number()}
        """),
        chain={("eth_getBalance", (addr, "0x10")): "0x1bc16d674ec80000", "eth_blockNumber": "0x20"},
    )

    assert f(addr) == {"wei": 2 * 10**18, "head": 32}
    assert f.chain.requests == [
        ("eth", "eth_getBalance", [addr, "0x10"]),
        ("eth", "eth_blockNumber", []),
    ]


def test_the_fake_chain_may_be_a_callable_and_raise():
    def node(method, params):
        if method == "eth_call":
            raise RemoteIOError("io_error", "execution reverted: not owner")
        return "0x0"

    f = load_function(
        src("""
        def _(to):
            try:
                return ChainState("eth").call(to, "0x8da5cb5b")
            except Exception as exc:  # RemoteIOError, as from a node
                return f"{type(exc).__name__}: {exc.message}"
        """),
        chain=node,
    )
    assert f("0x" + "11" * 20) == "RemoteIOError: execution reverted: not owner"


def test_a_request_without_an_answer_says_what_to_add():
    f = load_function("def _():\n    return ChainState('eth').get_block_number()\n")
    with pytest.raises(UnansweredRequestError, match=r"add \('eth_blockNumber', \(\)\)"):
        f()


def test_other_backends_answer_through_backends():
    f = load_function(
        "from blockx.sdk import db, rpc\nimport blockx.sdk as sdk\n"
        "def _():\n    return sdk.get_provider().read_req('prices', 'quote', {'s': 'ETH'})\n",
        backends={"prices": lambda operation, params: {"op": operation, **params}},
    )
    assert f() == {"op": "quote", "s": "ETH"}
    g = load_function(
        "import blockx.sdk as sdk\ndef _():\n    return sdk.get_provider().read_req('x', 'y', {})\n"
    )
    with pytest.raises(UnansweredRequestError, match="no 'x' backend"):
        g()


def test_sub_calls_run_other_loaded_functions_in_process(tmp_path):
    (tmp_path / "factor.py").write_text("def _(x):\n    return x * 10\n")
    double = load_function("def _(x):\n    return 2 * x\n", function_id="double")
    f = load_function(
        "def _(x):\n    return function.call('factor', x) + function.call('double', x)\n",
        functions={"factor": "factor.py", "double": double},
        base_dir=tmp_path,
    )

    assert f(3) == 36
    assert f.subcalls == [("factor", 3, False), ("double", 3, False)]
    assert f.function("factor")(5) == 50


def test_equal_sub_calls_are_answered_from_the_call_cache():
    child = "def _(x):\n    Table('runs').upsert_row({'key': x})\n    return x\n"
    parent = "def _():\n    return [function.call('child', 1), function.call('child', 1)]\n"
    f = load_function(parent, functions={"child": child})
    assert f() == [1, 1]
    assert f.subcalls == [("child", 1, False), ("child", 1, True)]

    g = load_function(parent, functions={"child": child}, call_cache=False)
    assert g() == [1, 1]
    assert g.subcalls == [("child", 1, False), ("child", 1, False)]


def test_a_failing_sub_call_raises_subcall_failed_in_the_parent():
    f = load_function(
        "def _():\n    return function.call('child', 0)\n",
        functions={"child": "def _(x):\n    return 1 / x\n"},
    )
    with pytest.raises(SubcallFailedError) as raised:
        f()
    assert raised.value.kind == "user_error"
    assert "ZeroDivisionError" in raised.value.message
    assert "→ child" in raised.value.message
    assert isinstance(raised.value.__cause__, ZeroDivisionError)


def test_an_unknown_sub_call_names_what_to_pass():
    f = load_function("def _():\n    return function.call('nowhere')\n")
    with pytest.raises(SubcallFailedError, match="no function 'nowhere'"):
        f()


def test_sub_call_cycles_and_depth_are_refused_as_by_the_worker():
    loop = load_function("def _(x):\n    return function.call('loop', x)\n", function_id="loop")
    with pytest.raises(SubcallCycleDetectedError):
        loop(1)

    deep = "def _(n):\n    return 0 if n == 0 else 1 + function.call('deep', n - 1)\n"
    f = load_function(deep, function_id="deep", max_subcall_depth=3, call_cache=False)
    assert f(3) == 3
    with pytest.raises(SubcallFailedError) as raised:  # refused in the deepest caller
        f(4)
    assert "subcall_depth_exceeded" in raised.value.message
    assert isinstance(raised.value.__cause__.__cause__.__cause__, SubcallDepthExceededError)
    shallow = load_function(deep, function_id="deep", max_subcall_depth=1)
    assert shallow(1) == 1
    with pytest.raises(SubcallFailedError, match="subcall_depth_exceeded"):
        shallow(2)


def test_time_sleep_advances_a_virtual_clock_without_waiting(monkeypatch):
    real_sleeps: list[float] = []
    monkeypatch.setattr(clock, "_original_sleep", real_sleeps.append)
    f = load_function(
        src("""
        import time
        from time import sleep

        def _():
            time.sleep(3600)
            sleep(0.5)
            return "done"
        """)
    )

    assert f() == "done"
    assert f.clock.sleeps == [3600, 0.5]
    assert f.clock.now == 3600.5
    assert real_sleeps == []

    import time

    time.sleep(0)  # outside a call: the real sleep
    assert real_sleeps == [0]


def test_a_clock_and_tables_may_be_shared_between_loads():
    shared = VirtualClock(start=100.0)
    a = load_function("import time\ndef _():\n    time.sleep(1)\n", clock=shared)
    b = load_function("import time\ndef _():\n    time.sleep(2)\n", clock=shared)
    a()
    b()
    assert shared.now == 103.0

    writer = load_function("def _():\n    Table('t').upsert_row({'key': 1})\n")
    reader = load_function("def _():\n    return Table('t').get_row(1)\n", tables=writer.tables)
    writer()
    assert reader() == {"key": 1}


def test_outputs_and_arguments_cross_the_wire():
    f = load_function("def _(p):\n    return {'got': p, 'pair': (1, 2)}\n")
    assert f({"t": (1, 2)}) == {"got": {"t": [1, 2]}, "pair": [1, 2]}

    g = load_function("def _():\n    return {1, 2}\n")
    with pytest.raises(NotSerializableError):
        g()


def test_the_module_runs_once_per_environment():
    f = load_function("count = []\ndef _():\n    count.append(1)\n    return len(count)\n")
    assert [f(), f(), f()] == [1, 2, 3]
    assert load_function(f.source)() == 1


def test_load_errors_are_the_executors(tmp_path):
    with pytest.raises(FunctionFileError, match="no such function file"):
        load_function(str(tmp_path / "missing.py"))
    with pytest.raises(UserCodeSyntaxError):
        load_function("def _(:\n    pass\n")
    with pytest.raises(NoEntryFunctionError):
        load_function("x = 1\n")
    with pytest.raises(UserCodeSyntaxError):  # a sub-function too, at load
        load_function("def _():\n    return 1\n", functions={"child": "def _(:\n"})
    with pytest.raises(TypeError, match="expected source text"):
        load_function(42)  # type: ignore[arg-type]


def test_an_exception_of_the_function_propagates_unchanged():
    f = load_function("def _():\n    raise LookupError('no such wallet')\n")
    with pytest.raises(LookupError, match="no such wallet"):
        f()


def test_no_provider_is_left_behind_after_a_call():
    from blockx.sdk.runtime import current_provider

    f = load_function("def _():\n    return 1\n")
    f()
    assert current_provider() is None
    assert clock.active_clock() is None

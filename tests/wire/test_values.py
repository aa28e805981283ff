"""dumps_wire / loads_wire: the strict JSON rules for values from user code."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import logging
import uuid

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.wire import NotSerializableError, dumps_wire, loads_wire


def test_plain_json_is_compact_utf8():
    assert (
        dumps_wire({"a": [1, 2.5, None, True], "ü": "€"})
        == '{"a":[1,2.5,null,true],"ü":"€"}'.encode()
    )


@pytest.mark.parametrize("n", [2**64, 2**255 + 12345, -(2**70), 10**40])
def test_integers_beyond_64_bits_are_exact(n):
    encoded = dumps_wire({"balance": n, "nested": [n]})
    assert encoded == f'{{"balance":{n},"nested":[{n}]}}'.encode()
    assert loads_wire(encoded) == {"balance": n, "nested": [n]}


def test_big_int_fallback_keeps_datetime_rules():
    value = {
        "n": 2**80,
        "at": dt.datetime(2026, 6, 10, 9, 30, tzinfo=dt.UTC),
        "d": dt.date(2026, 6, 10),
    }
    assert loads_wire(dumps_wire(value)) == {
        "n": 2**80,
        "at": "2026-06-10T09:30:00+00:00",
        "d": "2026-06-10",
    }


def test_datetimes_are_rfc3339():
    aware = dt.datetime(2026, 6, 10, 9, 30, 5, tzinfo=dt.timezone(dt.timedelta(hours=8)))
    naive = dt.datetime(2026, 6, 10, 9, 30)
    assert dumps_wire([aware, naive, dt.date(2026, 1, 2)]) == (
        b'["2026-06-10T09:30:05+08:00","2026-06-10T09:30:00","2026-01-02"]'
    )


def test_dataclass_goes_through_asdict_with_one_warning(caplog):
    @dataclasses.dataclass
    class Row:
        x: int
        inner: list[int]

    with caplog.at_level(logging.WARNING, logger="blockx.wire"):
        assert dumps_wire(Row(1, [2])) == b'{"x":1,"inner":[2]}'
        assert dumps_wire([Row(3, [])]) == b'[{"x":3,"inner":[]}]'
    warnings = [r for r in caplog.records if "asdict" in r.getMessage()]
    assert len(warnings) == 1


def test_uuid_and_enum_follow_orjson():
    class Color(enum.Enum):
        RED = "red"

    u = uuid.UUID(int=1)
    assert dumps_wire([u, Color.RED, None]) == f'["{u}","red",null]'.encode()


@pytest.mark.parametrize(
    ("value", "path", "fragment"),
    [
        ({"price": decimal.Decimal("1.5")}, "$['price']", "Decimal"),
        ({"rows": [{"v": float("nan")}]}, "$['rows'][0]['v']", "NaN"),
        ([None, float("inf")], "$[1]", "Infinity"),
        ({"s": {1, 2}}, "$['s']", "set"),
        ({"b": b"raw"}, "$['b']", "bytes"),
        ({1: "x"}, "$[1]", "key"),
        ({"n": 2**80, "bad": object()}, "$['bad']", "object"),
        ({"n": 2**80, "nan": float("nan")}, "$['nan']", "NaN"),
    ],
)
def test_unserialisable_values_raise_with_their_path(value, path, fragment):
    with pytest.raises(NotSerializableError) as info:
        dumps_wire(value)
    assert info.value.path == path
    assert fragment in str(info.value)
    assert info.value.error_kind == "output_not_serializable"
    assert isinstance(info.value, TypeError)


def test_too_deep_nesting_is_a_typed_error():
    value: list = []
    for _ in range(300):
        value = [value]
    with pytest.raises(NotSerializableError, match="nested"):
        dumps_wire(value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**300), max_value=2**300)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_round_trip_of_any_json_value(value):
    assert loads_wire(dumps_wire(value)) == value


@settings(max_examples=200, deadline=None)
@given(json_values.filter(lambda v: "64-bit" not in repr(v)))
def test_fast_path_matches_orjson_when_orjson_can(value):
    try:
        expected = orjson.dumps(value)
    except TypeError:
        return
    assert dumps_wire(value) == expected


@settings(max_examples=300, deadline=None)
@given(json_values.map(lambda v: {"big": 2**70, "v": v}))
def test_a_value_with_big_ints_means_what_the_standard_librarys_text_means(value):
    # Plain JSON with a uint256 goes through msgspec (blockx/wire/values.py): the same
    # values as the strict stdlib path's text, read back.
    import json

    stdlib = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert loads_wire(dumps_wire(value)) == json.loads(stdlib) == loads_wire(stdlib)


def test_a_tuple_with_a_big_int_is_a_list_and_the_rest_keeps_the_strict_rules():
    assert (
        dumps_wire((2**80, "é", [1.5, None]))
        == b'[1208925819614629174706176,"\xc3\xa9",[1.5,null]]'
    )
    with pytest.raises(NotSerializableError, match="NaN"):
        dumps_wire([2**80, float("nan")])
    with pytest.raises(NotSerializableError, match=r"\$\[1\].*Decimal"):
        import decimal

        dumps_wire([2**80, decimal.Decimal("1.5")])
    with pytest.raises(NotSerializableError, match="key of type int"):
        dumps_wire({"n": 2**80, "m": {1: 2}})

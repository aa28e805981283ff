"""json_values: canonical arguments, re-encoded outputs, rows."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx.wire import NotSerializableError, loads_wire
from blockx.worker.json_values import encode_args, encode_output, rows_from_outputs

plain_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**200), 2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(plain_json)
def test_an_output_reencodes_to_the_same_value(value: Any) -> None:
    """Outputs are decoded wire values; re-encoding them keeps every value (big ints
    exact), whatever the float spelling."""
    decoded = loads_wire(encode_output(value))
    assert decoded == value


@settings(max_examples=300, deadline=None)
@given(plain_json.filter(lambda v: "64-bit" not in repr(v)))
def test_arguments_are_orjsons_sorted_encoding(value: Any) -> None:
    try:
        expected = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an int beyond 64 bits: the exact slow path
        assert loads_wire(encode_args(value)) == value
        return
    encoded = encode_args(value)
    assert encoded == expected and type(encoded) is bytes


def test_equal_arguments_give_equal_bytes_in_any_key_order() -> None:
    assert encode_args({"b": 1, "a": [2, {"d": 3, "c": 4}]}) == encode_args(
        {"a": [2, {"c": 4, "d": 3}], "b": 1}
    )


def test_non_finite_arguments_are_refused() -> None:
    with pytest.raises(NotSerializableError):
        encode_args({"x": float("nan")})


def test_rows_spread_lists_and_skip_nulls() -> None:
    outputs = [encode_output({"y": 1}), encode_output([{"y": 2}, {"y": 3}]), b"null", b"7"]
    assert rows_from_outputs(outputs) == [{"y": 1}, {"y": 2}, {"y": 3}, 7]

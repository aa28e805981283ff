"""blockx.cluster.node.outputs_per_call: a node answers one entry per call of a batch
(its raw output, None for a failed or cancelled call), and refuses outputs that do not
match the succeeded calls (no guessing which row is whose). No Ray needed."""

from __future__ import annotations

import pytest

from blockx.cluster.node import OutputsMisaligned, outputs_per_call


def test_every_call_succeeded_gives_the_outputs_as_they_are() -> None:
    assert outputs_per_call(10, 3, [b"1", b"2", b"3"], [], 0) == [b"1", b"2", b"3"]


def test_failed_calls_get_none_at_their_offset() -> None:
    assert outputs_per_call(10, 4, [b"a", b"b"], [11, 13], 0) == [b"a", None, b"b", None]


def test_cancelled_calls_are_none_after_the_outputs_in_order() -> None:
    assert outputs_per_call(0, 4, [b"a", b"b"], [0], 1) == [None, b"a", b"b", None]


@pytest.mark.parametrize(
    ("outputs", "failed", "cancelled"),
    [
        ([b"a"], [], 0),  # a succeeded call without an output (outputs dropped)
        ([b"a", b"b", b"c"], [1], 0),  # one output too many
        ([b"a", b"b"], [7], 0),  # a failure outside the batch
    ],
)
def test_misaligned_outputs_fail_loudly(
    outputs: list[bytes], failed: list[int], cancelled: int
) -> None:
    with pytest.raises(OutputsMisaligned):
        outputs_per_call(0, 3, outputs, failed, cancelled)

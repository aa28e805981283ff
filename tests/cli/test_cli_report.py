"""The failure report's traceback: BlockX's own frames are left out, nobody else's."""

from __future__ import annotations

import os

import blockx
from blockx.cli.report import _user_frames

PACKAGE = os.path.dirname(os.path.abspath(blockx.__file__))


def test_only_blockx_frames_are_left_out_of_a_traceback() -> None:
    # A library installed next to blockx (site-packages holds both) keeps its frames.
    neighbour = os.path.join(os.path.dirname(PACKAGE), "somelib", "client.py")
    ours = os.path.join(PACKAGE, "sdk", "db.py")
    stack = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "task.yaml", line 8, in _',
            "    t.get_row(1)",
            f'  File "{ours}", line 32, in get_row',
            "    return self._read(...)",
            f'  File "{neighbour}", line 10, in fetch',
            "    raise ValueError('no')",
            "ValueError: no",
        ]
    )
    shown = _user_frames(stack)
    assert 'File "task.yaml", line 8' in shown and "t.get_row(1)" in shown
    assert neighbour in shown and "raise ValueError('no')" in shown
    assert ours not in shown and "self._read" not in shown
    assert shown.rstrip().endswith("ValueError: no")

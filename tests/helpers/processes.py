"""Process checks shared by the test suites (no BlockX imports)."""

from __future__ import annotations

__all__ = ["process_is_gone"]


def process_is_gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a parent (not ours) to reap it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
    return state in (b"Z", b"X")

"""BlockX: run huge numbers of calls of plain synchronous Python functions, fast and safely."""

__version__ = "0.1.0"

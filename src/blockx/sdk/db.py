"""``blockx.sdk.db``: thin table-store reads and writes through the provider.

Every function is one ``read_req`` / ``write_req`` on the ``blockdb`` backend;
``params`` travel as given. Nothing here holds a connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .runtime import get_provider

__all__ = ["BACKEND", "get", "read", "write"]

#: The IO backend these calls are addressed to.
BACKEND: Final = "blockdb"


def read(operation: str, params: Mapping[str, Any], *, cache_key: str | None = None) -> Any:
    """A read operation (``get_row``, ``get_rows``, ``scan``, ...) of the table store."""
    return get_provider().read_req(BACKEND, operation, params, cache_key=cache_key)


def write(operation: str, params: Mapping[str, Any]) -> Any:
    """A write operation (``upsert_rows``, ``delete_rows``, ...) of the table store."""
    return get_provider().write_req(BACKEND, operation, params)


def get(table: str, key: Any, *, cache_key: str | None = None) -> Any:
    """One row by key: ``read("get_row", {"table": table, "key": key})``."""
    return read("get_row", {"table": table, "key": key}, cache_key=cache_key)

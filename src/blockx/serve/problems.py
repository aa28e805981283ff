"""RFC 9457 problem details: every error ``blockx serve`` answers.

A problem is ``application/problem+json``: ``type`` (a URI naming the kind of
problem, ``https://blockx.dev/problems/<slug>``), ``title`` (the kind, in words),
``status``, ``detail`` (this occurrence, in words) and extensions -- an invalid
task's ``problems``: ``[{"path": "$.policy.max_attempts", "message": ...}]``.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from aiohttp import web

__all__ = ["PROBLEM_TYPE", "problem"]

PROBLEM_TYPE: Final = "application/problem+json"
_BASE: Final = "https://blockx.dev/problems/"


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> web.Response:
    """The problem response (see the module docstring)."""
    body: dict[str, Any] = {
        "type": _BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    body.update(extensions)
    return web.Response(
        status=status,
        body=orjson.dumps(body, default=repr),
        content_type=PROBLEM_TYPE,
        headers=headers,
    )

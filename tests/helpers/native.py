"""Whether the dispatcher core runs compiled (mypyc) in this test process.

``make test`` runs the whole suite on the compiled core, then ``tests/core`` again
with ``BLOCKX_PURE_PYTHON=1``; a test that can only look inside the interpreted
core (``copy.deepcopy`` of it, a stand-in object where the compiled code takes a
real one) branches on :data:`CORE_COMPILED` and still checks its behaviour there.
"""

from __future__ import annotations

import blockx.worker.core.dispatcher as _dispatcher

#: True when the core's modules are mypyc's extension modules, not sources.
CORE_COMPILED: bool = not _dispatcher.__file__.endswith(".py")

"""The worker: dispatcher core, actor, executor pool and IO (docs/architecture.md).

Importing it keeps the dataclass methods of its ~100 classes compiled across processes
(:mod:`blockx.method_cache`): a ``blockx run`` or a Ray node worker starts without
compiling them again.
"""

from blockx import method_cache

method_cache.install()

"""``blockx run --ray``: one BlockX worker per Ray node, calls streamed to them in batches.

:mod:`blockx.cluster.placement` is the pure bookkeeping (windows, rendezvous hashing,
losses, de-duplication); :mod:`blockx.cluster.node` the Ray actor hosting a
:class:`~blockx.worker.app.Worker` on a node; :mod:`blockx.cluster.driver` the loop
that places the actors and streams a task's calls (``docs/cluster.md``). Ray is an
optional dependency (``pip install 'blockx[ray]'``): only ``node`` and ``driver``
import it, and only when they run.
"""

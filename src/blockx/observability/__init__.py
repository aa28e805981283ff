"""Observability of a running worker: metrics, traces, logs and the dashboard's snapshots.

Nothing here is imported by the worker's per-call code. The counters live where
things happen (the dispatcher core's ``DispatcherStats``, the actor's
``OrchestratorStats``, the adapter's executor states and their heartbeats, the pool's
slots, the IO subsystem's ``IOStats``); this package only reads them, when asked:

* :mod:`blockx.observability.snapshot` -- plain-dict views of a worker and of its IO
  (for the dashboard and for the metrics collector);
* :mod:`blockx.observability.metrics` -- the Prometheus collector built from them at
  scrape time, the ``/metrics`` text, and the ``--metrics-port`` server
  (docs/observability.md);
* :mod:`blockx.observability.logs` -- the JSON log formatter (docs/observability.md).

This ``__init__`` imports nothing, so importing a submodule costs only that submodule.
"""

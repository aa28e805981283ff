"""Observability: metrics, traces, logs and the dashboard's snapshots (docs/observability.md)."""

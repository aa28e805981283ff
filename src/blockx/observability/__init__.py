"""Observability of a running worker: traces (tracing.py); imports nothing heavy."""

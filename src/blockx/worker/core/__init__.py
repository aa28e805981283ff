"""The worker's pure dispatcher state machine (seed 000, internal/worker/core)."""

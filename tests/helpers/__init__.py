"""Test-side helpers shared by the executor process tests and benches."""

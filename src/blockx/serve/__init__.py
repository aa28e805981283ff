"""blockx serve: the worker as a long-running service (docs/serve.md)."""

"""``blockx serve``: the worker as a long-running HTTP service (docs/serve.md).

The package's parts: ``store`` (the durable state in SQLite), ``documents`` (a
submitted task body checked into a task), ``openapi`` (the API's description),
``runner`` (tasks run on one worker), ``app`` (the aiohttp application). Importing
the package imports none of them: a caller imports the part it needs.
"""

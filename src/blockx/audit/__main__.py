"""``python -m blockx.audit``: the audit daemon (default), or one-shot helpers.

* no arguments: serve frames on stdin/stdout (:mod:`blockx.audit.daemon`);
* ``--check FILE [--function-id ID]``: print one verdict as JSON (exit 1 if rejected);
* ``--print-tables``: print the policy tables as Markdown (``docs/security.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .auditor import Auditor
from .daemon import serve
from .policy_markdown import render_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blockx.audit", description=__doc__)
    parser.add_argument("--check", metavar="FILE", help="audit one file and print its verdict")
    parser.add_argument("--function-id", default=None, help="function id for --check")
    parser.add_argument("--print-tables", action="store_true", help="print the policy tables")
    args = parser.parse_args(argv)
    if args.print_tables:
        sys.stdout.write(render_markdown())
        return 0
    if args.check:
        path = Path(args.check)
        source = path.read_text(encoding="utf-8")
        verdict = Auditor().audit(source, args.function_id or path.stem)
        json.dump(verdict.to_wire(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if verdict.accepted else 1
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout carries frames only
    try:
        return serve(stdin, stdout)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

#!/bin/sh
# Install the system packages the test suite uses, when we can:
#   postgresql  - initdb/pg_ctl for the blockdb PostgreSQL tests (tests/io start their own server)
#   bubblewrap  - bwrap for the sandbox spawn mode (EXECUTOR_SPAWN_MODE=sandbox)
#   chromium chromium-driver - headless browser + chromedriver for tests/serve/test_dashboard.py
# Runs apt-get only as root on a machine that has it, and only for what is missing;
# anywhere else it does nothing (the tests that need a package skip and say why).
set -eu

have_initdb() {
    command -v initdb >/dev/null 2>&1 && return 0
    for f in /usr/lib/postgresql/*/bin/initdb; do
        [ -x "$f" ] && return 0
    done
    return 1
}

missing=""
have_initdb || missing="$missing postgresql"
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
# (fonts-liberation: chromium only recommends a font; without one, text renders as boxes)
{ command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; } || missing="$missing chromium fonts-liberation"
{ command -v chromedriver >/dev/null 2>&1 || [ -x /usr/bin/chromedriver ]; } || missing="$missing chromium-driver"

if [ -z "$missing" ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: missing:$missing (not root or no apt-get: skipped; the tests that need them will skip)" >&2
    exit 0
fi

echo "install-system-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
# shellcheck disable=SC2086
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "install-system-deps: apt-get failed (see above); the tests that need$missing will skip" >&2
    exit 0
fi
rm -f "$log"

#!/usr/bin/env bash
# Print the directory of PostgreSQL's server binaries (stdout: the path only), installing
# Debian's postgresql-15 package when there is none.
#
# Usage: tests/support/ensure-postgres.sh
#
# The Postgres sink's tests (tests/support/postgres.py) start servers of their own from
# these binaries (initdb, pg_ctl) in temporary directories, as a non-root user. Lookup:
# $LOCKGATE_TEST_PG_BIN, then /usr/lib/postgresql/<newest>/bin, then pg_ctl on PATH. When
# none is found and this runs as root with apt-get, it installs postgresql-15 (apt-get
# update + install: about 30 s on a 2-core machine). Idempotent.
#
# Exit status: 0 found or installed; 1 the install failed; 3 none found and not root (or
# no apt-get): the Postgres tests then skip, saying so.
set -euo pipefail

log() { printf 'ensure-postgres: %s\n' "$*" >&2; }

find_pg() {
    local dir
    if [[ -n "${LOCKGATE_TEST_PG_BIN:-}" && -x "${LOCKGATE_TEST_PG_BIN}/pg_ctl" ]]; then
        printf '%s\n' "${LOCKGATE_TEST_PG_BIN}"
        return 0
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "${dir}/pg_ctl" && -x "${dir}/initdb" ]]; then
            printf '%s\n' "${dir}"
            return 0
        fi
    done
    if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
        dirname "$(command -v pg_ctl)"
        return 0
    fi
    return 1
}

if find_pg; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "no PostgreSQL server binaries found and cannot install them here (not root, or"
    log "no apt-get); install Debian's postgresql-15 or set LOCKGATE_TEST_PG_BIN"
    exit 3
fi
log "installing Debian's postgresql-15 package (about 30 s)"
started=${SECONDS}
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -q >&2 && { apt-get install -y -q postgresql-15 >&2 \
        || apt-get install -y -q postgresql >&2; }; }; then
    log "apt-get install postgresql-15 failed (see above)"
    exit 1
fi
log "installed PostgreSQL in $((SECONDS - started)) s"
find_pg

#!/usr/bin/env bash
# Print the path of a Chromium binary (stdout: the path only), installing Debian's package
# when there is none.
#
# Usage: tests/support/ensure-chromium.sh
#
# Chromium drives the console's real-browser test (tests/integration/test_console.py,
# through Playwright for Python with this binary: Playwright's own browser download is not
# used). Lookup order: $LOCKGATE_TEST_CHROMIUM, then chromium, chromium-browser, google-chrome on
# PATH. When none is found and this runs as root on a machine with apt-get, it installs
# Debian's `chromium` package (apt-get update + install: about 35 s on a 2-core machine;
# a found binary is reported in milliseconds). Idempotent.
#
# Exit status: 0 found or installed; 1 the install failed; 3 none found and not root (or
# no apt-get): the browser test then skips, saying so.
set -euo pipefail

log() { printf 'ensure-chromium: %s\n' "$*" >&2; }

find_chromium() {
    local name
    if [[ -n "${LOCKGATE_TEST_CHROMIUM:-}" && -x "${LOCKGATE_TEST_CHROMIUM}" ]]; then
        printf '%s\n' "${LOCKGATE_TEST_CHROMIUM}"
        return 0
    fi
    for name in chromium chromium-browser google-chrome; do
        if command -v "${name}" >/dev/null 2>&1; then
            command -v "${name}"
            return 0
        fi
    done
    return 1
}

if find_chromium; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "no chromium found and cannot install it here (not root, or no apt-get);"
    log "install Debian's chromium package or set LOCKGATE_TEST_CHROMIUM to a Chromium binary"
    exit 3
fi
log "installing Debian's chromium package (about 35 s)"
started=${SECONDS}
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -q >&2 && apt-get install -y -q chromium >&2; }; then
    log "apt-get install chromium failed (see above)"
    exit 1
fi
log "installed chromium in $((SECONDS - started)) s"
find_chromium

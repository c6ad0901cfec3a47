#!/usr/bin/env bash
# Print the path of a toxiproxy-server binary of the pinned version (stdout: the path only).
#
# Usage: tests/support/ensure-toxiproxy.sh [--no-build]
#
# Toxiproxy is the TCP fault proxy of tests/chaos/test_network_faults.py (latency, connection
# resets, a cut-off instance). Lookup order:
#   1. $LOCKGATE_TOOLS_DIR/bin/toxiproxy-server (default ~/.cache/lockgate/tools/bin) if it
#      reports the pinned version;
#   2. `toxiproxy-server` on PATH if it reports the pinned version;
#   3. otherwise build it from source with the Go toolchain into the cache (first run only):
#        go install github.com/Shopify/toxiproxy/v2/cmd/server@<version>
#      This needs `go` (>= 1.23, toxiproxy's go.mod) and the Go module proxy (GOPROXY),
#      nothing else. About 1 min on a 2-core machine with an empty Go module cache; a cached
#      binary is found in milliseconds.
#      With --no-build, exit with status 3 instead of building.
#
# The cache lives outside the repository so that every checkout on the machine shares it.
# Progress goes to stderr. Concurrent callers wait on a lock instead of building twice.
set -euo pipefail

TOXIPROXY_VERSION="v2.12.0"
MODULE="github.com/Shopify/toxiproxy/v2"
NAME="toxiproxy-server"

log() { printf 'ensure-toxiproxy: %s\n' "$*" >&2; }

# reported_version BIN: the version BIN reports ("2.12.0"), or nothing when it cannot run.
reported_version() {
    local out
    out="$("$1" -version 2>/dev/null)" || true
    printf '%s' "${out##* }"
}

has_pinned_version() {
    [[ -x "$1" ]] && [[ "$(reported_version "$1")" == "${TOXIPROXY_VERSION#v}" ]]
}

# find_toxiproxy CACHED: print the path of a pinned toxiproxy-server (cache, then PATH).
find_toxiproxy() {
    local on_path
    if has_pinned_version "$1"; then
        printf '%s\n' "$1"
        return 0
    fi
    if on_path="$(command -v "${NAME}" 2>/dev/null)" && has_pinned_version "${on_path}"; then
        printf '%s\n' "${on_path}"
        return 0
    fi
    return 1
}

# build_toxiproxy TOOLS_DIR CACHED: go install the pinned toxiproxy-server into CACHED.
build_toxiproxy() {
    local tools_dir="$1" cached="$2" scratch built started
    log "building ${NAME} ${TOXIPROXY_VERSION} (first run only, ~1 min) into ${cached%/*}"
    started=${SECONDS}
    # Build into a scratch GOBIN and move into place, so that a killed build never leaves a
    # broken binary at the cached path.
    scratch="$(mktemp -d "${tools_dir}/.toxiproxy-build.XXXXXX")"
    # shellcheck disable=SC2064  # expand now: the local is gone when the trap runs
    trap "rm -rf '${scratch}'" EXIT
    # CGO off: a static binary. -X sets the version string the way toxiproxy's release build
    # does (a plain `go install` reports "git").
    if ! CGO_ENABLED=0 GOBIN="${scratch}" GOFLAGS="${GOFLAGS:-} -trimpath" \
        go install \
        -ldflags "-s -w -X ${MODULE}.Version=${TOXIPROXY_VERSION#v}" \
        "${MODULE}/cmd/server@${TOXIPROXY_VERSION}" >&2; then
        log "go install ${MODULE}/cmd/server@${TOXIPROXY_VERSION} failed (see above)."
        log "check that the Go module proxy is reachable: GOPROXY=$(go env GOPROXY)"
        return 1
    fi
    built="$(reported_version "${scratch}/server")"
    if [[ "${built}" != "${TOXIPROXY_VERSION#v}" ]]; then
        log "built ${NAME} reports version '${built}', expected ${TOXIPROXY_VERSION#v}"
        return 1
    fi
    mv -f "${scratch}/server" "${cached}"
    log "built ${NAME} ${TOXIPROXY_VERSION} in $((SECONDS - started)) s"
}

main() {
    local no_build=false tools_dir bin_dir cached
    case "${1:-}" in
        "") ;;
        --no-build) no_build=true ;;
        -h | --help)
            sed -n '2,19s/^# \{0,1\}//p' "$0" >&2
            return 0
            ;;
        *)
            log "usage: $0 [--no-build]"
            return 2
            ;;
    esac
    if [[ -z "${LOCKGATE_TOOLS_DIR:-}" && -z "${HOME:-}" ]]; then
        log "set LOCKGATE_TOOLS_DIR (or HOME) to choose where ${NAME} is cached"
        return 1
    fi
    tools_dir="${LOCKGATE_TOOLS_DIR:-${HOME}/.cache/lockgate/tools}"
    bin_dir="${tools_dir}/bin"
    cached="${bin_dir}/${NAME}"

    if find_toxiproxy "${cached}"; then
        return 0
    fi
    if [[ "${no_build}" == true ]]; then
        return 3
    fi
    if ! command -v go >/dev/null 2>&1; then
        log "no ${NAME} ${TOXIPROXY_VERSION} in ${cached} or on PATH, and no 'go' to build it with."
        log "install Go (>= 1.23) or put ${NAME} ${TOXIPROXY_VERSION} at ${cached}."
        return 1
    fi

    mkdir -p "${bin_dir}"
    exec 9>"${tools_dir}/.toxiproxy-build.lock"
    if ! flock -n 9; then
        log "another process is building ${NAME} ${TOXIPROXY_VERSION}; waiting for it"
        flock 9
    fi
    # Another process may have finished the build while this one waited for the lock.
    if has_pinned_version "${cached}"; then
        printf '%s\n' "${cached}"
        return 0
    fi
    build_toxiproxy "${tools_dir}" "${cached}"
    printf '%s\n' "${cached}"
}

# The whole script is parsed before main runs, so editing this file during a build cannot
# derail the running copy.
main "$@"
exit

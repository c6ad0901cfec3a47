#!/usr/bin/env bash
# Print the path of a SeaweedFS `weed` binary of the pinned version (stdout: the path only).
#
# Usage: tests/support/ensure-seaweedfs.sh [--no-build]
#
# SeaweedFS (github.com/seaweedfs/seaweedfs, Apache-2.0) is the S3-compatible object store
# of the tests that write an Iceberg warehouse or state snapshots to S3: a real server (a
# master, a volume server, a filer and the S3 gateway in one `weed server` process) that
# keeps its data in a directory across restarts. Lookup order:
#   1. $LOCKGATE_TOOLS_DIR/bin/weed (default ~/.cache/lockgate/tools/bin) if the stamp beside
#      it names the pinned version;
#   2. otherwise build it from source with the Go toolchain into the cache (first run only).
#      The module's go.mod has a replace directive, so `go install MODULE@VERSION` refuses it:
#      the pinned module is downloaded (`go mod download`) and built in a scratch copy with
#      `go build ./weed`. This needs `go` and the Go module proxy (GOPROXY), nothing else.
#      About 4 min on a 2-core machine with an empty Go module cache; a cached binary is
#      found in milliseconds.
#      With --no-build, exit with status 3 instead of building.
#
# The cache lives outside the repository so that every checkout on the machine shares it.
# Progress goes to stderr. Concurrent callers wait on a lock instead of building twice.
set -euo pipefail

SEAWEEDFS_VERSION="v0.0.0-20261109003541-7506e5f91cd6"
MODULE="github.com/seaweedfs/seaweedfs"
NAME="weed"

log() { printf 'ensure-seaweedfs: %s\n' "$*" >&2; }

# is_pinned BIN: BIN runs and its stamp names the pinned version.
is_pinned() {
    [[ -x "$1" ]] && [[ "$(cat "$1.version" 2>/dev/null)" == "${SEAWEEDFS_VERSION}" ]] \
        && "$1" version >/dev/null 2>&1
}

# build_weed TOOLS_DIR CACHED: build the pinned weed into CACHED (and its stamp).
build_weed() {
    local tools_dir="$1" cached="$2" scratch src started
    log "building ${NAME} ${SEAWEEDFS_VERSION} (first run only, ~4 min) into ${cached%/*}"
    started=${SECONDS}
    # Build in a scratch copy and move into place, so that a killed build never leaves a
    # broken binary at the cached path.
    scratch="$(mktemp -d "${tools_dir}/.seaweedfs-build.XXXXXX")"
    # shellcheck disable=SC2064  # expand now: the local is gone when the trap runs
    trap "chmod -R u+w '${scratch}' 2>/dev/null; rm -rf '${scratch}'" EXIT
    if ! src="$(cd "${scratch}" && GOFLAGS=-mod=mod go mod download -json \
        "${MODULE}@${SEAWEEDFS_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')" \
        || [[ -z "${src}" ]]; then
        log "go mod download ${MODULE}@${SEAWEEDFS_VERSION} failed (see above)."
        log "check that the Go module proxy is reachable: GOPROXY=$(go env GOPROXY)"
        return 1
    fi
    cp -r "${src}" "${scratch}/src"
    chmod -R u+w "${scratch}/src"
    # CGO off: a static binary; -s -w: no symbol tables (about 40 % smaller).
    if ! (cd "${scratch}/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
        -o "${scratch}/${NAME}" ./weed) >&2; then
        log "go build ./weed of ${MODULE}@${SEAWEEDFS_VERSION} failed (see above)."
        return 1
    fi
    "${scratch}/${NAME}" version >/dev/null
    mv -f "${scratch}/${NAME}" "${cached}"
    printf '%s' "${SEAWEEDFS_VERSION}" >"${cached}.version"
    log "built ${NAME} ${SEAWEEDFS_VERSION} in $((SECONDS - started)) s"
}

main() {
    local no_build=false tools_dir bin_dir cached
    case "${1:-}" in
        "") ;;
        --no-build) no_build=true ;;
        -h | --help)
            sed -n '2,21s/^# \{0,1\}//p' "$0" >&2
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

    if is_pinned "${cached}"; then
        printf '%s\n' "${cached}"
        return 0
    fi
    if [[ "${no_build}" == true ]]; then
        return 3
    fi
    if ! command -v go >/dev/null 2>&1; then
        log "no ${NAME} ${SEAWEEDFS_VERSION} in ${cached}, and no 'go' to build it with."
        log "install Go or put ${NAME} (with ${NAME}.version) at ${cached}."
        return 1
    fi

    mkdir -p "${bin_dir}"
    exec 9>"${tools_dir}/.seaweedfs-build.lock"
    if ! flock -n 9; then
        log "another process is building ${NAME} ${SEAWEEDFS_VERSION}; waiting for it"
        flock 9
    fi
    # Another process may have finished the build while this one waited for the lock.
    if is_pinned "${cached}"; then
        printf '%s\n' "${cached}"
        return 0
    fi
    build_weed "${tools_dir}" "${cached}"
    printf '%s\n' "${cached}"
}

# The whole script is parsed before main runs, so editing this file during a build cannot
# derail the running copy.
main "$@"
exit

#!/usr/bin/env bash
# Print the path of a helm binary of the pinned version (stdout: the path, nothing else).
#
# Usage: deploy/helm/ensure-helm.sh [--no-build]
#
# Lookup order:
#   1. $LOCKGATE_TOOLS_DIR/bin/helm (default ~/.cache/lockgate/tools/bin/helm) if it reports
#      the pinned version;
#   2. `helm` on PATH if it reports the pinned version;
#   3. otherwise build it from source with the Go toolchain into the cache (first run only):
#        GOBIN=<cache>/bin go install helm.sh/helm/v3/cmd/helm@<version>
#      This needs `go` (>= 1.26, helm's go.mod) and the Go module proxy (GOPROXY), nothing
#      else. It takes about 3.5 min on an idle 2-core machine with an empty Go module cache,
#      8.5 min on a loaded one, seconds with a warm Go build cache.
#      With --no-build, exit with status 3 instead of building.
#
# The cache lives outside the repository so that every checkout on the machine shares it.
# Progress goes to stderr. Concurrent callers wait on a lock instead of building twice.
set -euo pipefail

HELM_VERSION="v3.22.0"

log() { printf 'ensure-helm: %s\n' "$*" >&2; }

# helm_version BIN: the version BIN reports ("v3.22.0"), or nothing when it cannot run.
helm_version() {
    "$1" version --template '{{.Version}}' 2>/dev/null || true
}

has_pinned_version() {
    [[ -x "$1" ]] && [[ "$(helm_version "$1")" == "${HELM_VERSION}" ]]
}

# find_helm CACHED: print the path of a pinned helm (cache first, then PATH) or fail.
find_helm() {
    local on_path
    if has_pinned_version "$1"; then
        printf '%s\n' "$1"
        return 0
    fi
    if on_path="$(command -v helm 2>/dev/null)" && has_pinned_version "${on_path}"; then
        printf '%s\n' "${on_path}"
        return 0
    fi
    return 1
}

# build_helm TOOLS_DIR CACHED: go install the pinned helm into CACHED.
build_helm() {
    local tools_dir="$1" cached="$2" scratch built started
    log "building helm ${HELM_VERSION} (first run only, ~4-10 min) into ${cached%/*}"
    started=${SECONDS}
    # Build into a scratch GOBIN and move into place, so that a killed build never leaves a
    # broken binary at the cached path.
    scratch="$(mktemp -d "${tools_dir}/.helm-build.XXXXXX")"
    # shellcheck disable=SC2064  # expand now: the local is gone when the trap runs
    trap "rm -rf '${scratch}'" EXIT
    # CGO off: a static binary that survives libc upgrades. The -X flags set the version string
    # the way helm's release build does: a plain `go install` reports "v3.22", not "v3.22.0".
    if ! CGO_ENABLED=0 GOBIN="${scratch}" GOFLAGS="${GOFLAGS:-} -trimpath" \
        go install \
        -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.metadata=" \
        "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2; then
        log "go install helm.sh/helm/v3/cmd/helm@${HELM_VERSION} failed (see above)."
        log "check that the Go module proxy is reachable: GOPROXY=$(go env GOPROXY)"
        return 1
    fi
    built="$(helm_version "${scratch}/helm")"
    if [[ "${built}" != "${HELM_VERSION}" ]]; then
        log "built helm reports version '${built}', expected ${HELM_VERSION}"
        return 1
    fi
    mv -f "${scratch}/helm" "${cached}"
    log "built helm ${HELM_VERSION} in $((SECONDS - started)) s"
}

main() {
    local no_build=false tools_dir bin_dir cached
    case "${1:-}" in
        "") ;;
        --no-build) no_build=true ;;
        *)
            log "usage: $0 [--no-build]"
            return 2
            ;;
    esac
    if [[ -z "${LOCKGATE_TOOLS_DIR:-}" && -z "${HOME:-}" ]]; then
        log "set LOCKGATE_TOOLS_DIR (or HOME) to choose where helm is cached"
        return 1
    fi
    tools_dir="${LOCKGATE_TOOLS_DIR:-${HOME}/.cache/lockgate/tools}"
    bin_dir="${tools_dir}/bin"
    cached="${bin_dir}/helm"

    if find_helm "${cached}"; then
        return 0
    fi
    if [[ "${no_build}" == true ]]; then
        return 3
    fi
    if ! command -v go >/dev/null 2>&1; then
        log "no helm ${HELM_VERSION} in ${cached} or on PATH, and no 'go' to build it with."
        log "install Go (>= 1.26) or put helm ${HELM_VERSION} at ${cached}."
        return 1
    fi

    mkdir -p "${bin_dir}"
    exec 9>"${tools_dir}/.helm-build.lock"
    if ! flock -n 9; then
        log "another process is building helm ${HELM_VERSION}; waiting for it"
        flock 9
    fi
    # Another process may have finished the build while this one waited for the lock.
    if has_pinned_version "${cached}"; then
        printf '%s\n' "${cached}"
        return 0
    fi
    build_helm "${tools_dir}" "${cached}"
    printf '%s\n' "${cached}"
}

# The whole script is parsed before main runs, so editing this file during a (long) build
# cannot derail the running copy.
main "$@"
exit

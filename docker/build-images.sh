#!/usr/bin/env bash
# Build lockgate's container images on a machine without an image registry:
#
#   1. docker/ensure-engine.sh   a Docker engine answers (installs/starts dockerd if needed)
#   2. docker/base-image.sh      lockgate/base:bookworm exists (debootstrap -> docker import)
#   3. lockgate/processor:dev    from docker/Dockerfile
#   4. lockgate/kafka:dev        from docker/kafka/Dockerfile + the jars of `broker.sh fetch`
#
# Each image's build context is staged into a temp dir (only the files it needs, plus the
# host's CA bundle as pip-ca.crt for the processor's pip). The sha256 of the staged context,
# the base image id and the build args is stored as the image label io.lockgate.inputs-hash;
# when the existing image carries the same hash the build is skipped.
#
#   docker/build-images.sh [--force] [processor] [kafka]   (default: both)
#
# stdout: the names of the images asked for, one per line. Progress and timings: stderr.
# Environment: LOCKGATE_PROCESSOR_IMAGE (lockgate/processor:dev), LOCKGATE_KAFKA_IMAGE
# (lockgate/kafka:dev), LOCKGATE_BASE_IMAGE (lockgate/base:bookworm), PIP_INDEX_URL (forwarded;
# default: the host pip's `global.index-url`, else pip's own default in the build),
# LOCKGATE_PIP_CA (CA bundle for pip inside the build; default: pip's `global.cert`, $PIP_CERT,
# then /etc/ssl/certs/ca-certificates.crt), LOCKGATE_EXTRAS (forwarded when set: the optional
# dependency groups installed, e.g. "s3,gcs"; the Dockerfile's default is "s3").
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
BASE_IMAGE="${LOCKGATE_BASE_IMAGE:-lockgate/base:bookworm}"
PROCESSOR_IMAGE="${LOCKGATE_PROCESSOR_IMAGE:-lockgate/processor:dev}"
KAFKA_IMAGE="${LOCKGATE_KAFKA_IMAGE:-lockgate/kafka:dev}"
HASH_LABEL=io.lockgate.inputs-hash
KIND_LABEL=io.lockgate.image

LOG_DIR="$REPO_ROOT/.cache/docker-build"

say() { printf '[build-images] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

force=0
want_processor=0
want_kafka=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        processor) want_processor=1 ;;
        kafka) want_kafka=1 ;;
        -h | --help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$arg' (see --help)" ;;
    esac
done
if ((want_processor == 0 && want_kafka == 0)); then
    want_processor=1
    want_kafka=1
fi

total_start=$SECONDS
step_start=0
step() { step_start=$SECONDS; say "$*"; }
step_done() { say "$1 ($((SECONDS - step_start))s)"; }

stage_root="$(mktemp -d /var/tmp/lockgate-build.XXXXXX)"
trap 'rm -rf -- "$stage_root"' EXIT

# sha256 over every file of a directory (relative path, mode, content), order-independent of
# the file system, plus any extra words (base image id, build args).
tree_hash() {
    local dir="$1"
    shift
    {
        (cd -- "$dir" && find . -type f -print0 | LC_ALL=C sort -z |
            xargs -0 -r stat -c '%n %a' && find . -type f -print0 | LC_ALL=C sort -z |
            xargs -0 -r sha256sum)
        printf '%s\n' "$@"
    } | sha256sum | cut -d' ' -f1
}

current_hash() {
    docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" "$1" 2>/dev/null || true
}

# Which client builds, and with which builder. BuildKit is much faster than the classic
# builder on the vfs storage driver (no container + full-tree commit per instruction).
# A docker CLI >= 23 needs the buildx plugin for BuildKit; Debian's docker.io 20.10 CLI
# (/usr/bin/docker) has it built in. LOCKGATE_DOCKER_BUILDKIT=0 forces the classic builder.
pick_builder() {
    BUILD_CLIENT=docker
    BUILDKIT=0
    [[ ${LOCKGATE_DOCKER_BUILDKIT:-1} == 0 ]] && return 0
    if docker buildx version >/dev/null 2>&1; then
        BUILDKIT=1
        return 0
    fi
    local client major
    for client in docker /usr/bin/docker; do
        command -v "$client" >/dev/null 2>&1 || continue
        major="$("$client" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)"
        if [[ $major =~ ^[0-9]+$ ]] && ((major >= 18 && major < 23)); then
            BUILD_CLIENT="$client"
            BUILDKIT=1
            return 0
        fi
    done
}

# build_image KIND IMAGE CONTEXT [docker build args...]
build_image() {
    local kind="$1" image="$2" ctx="$3"
    shift 3
    local base_id hash have
    base_id="$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE")"
    hash="$(tree_hash "$ctx" "base=$base_id" "$@")"
    have="$(current_hash "$image")"
    if ((force == 0)) && [[ $have == "$hash" ]]; then
        say "$image is up to date (inputs ${hash:0:12}); skipping"
        return 0
    fi
    step "building $image (inputs ${hash:0:12}${have:+, was ${have:0:12}})"
    local log="$LOG_DIR/$kind.log"
    local -a progress=()
    ((BUILDKIT)) && progress=(--progress plain)
    if ! DOCKER_BUILDKIT="$BUILDKIT" "$BUILD_CLIENT" build --network host "${progress[@]}" \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --label "$HASH_LABEL=$hash" \
        --label "$KIND_LABEL=$kind" \
        "$@" -t "$image" "$ctx" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        die "building $image failed (output above; full log: $log)"
    fi
    # Superseded builds of this image are now untagged: drop them (vfs copies every layer).
    docker image prune -f --filter "label=$KIND_LABEL=$kind" >/dev/null 2>&1 || true
    step_done "built $image"
}

# ------------------------------------------------------------------ engine + base image
step "checking the Docker engine"
"$SCRIPT_DIR/ensure-engine.sh"
step_done "engine ready"

pick_builder
mkdir -p "$LOG_DIR"
# One build at a time per checkout (parallel pytest workers, two terminals): the second
# caller waits, then finds the images up to date.
exec 8>"$LOG_DIR/.build.lock"
if ! flock -n 8; then
    say "another build-images.sh is running; waiting for it"
    flock -w 3600 8 || die "timed out waiting for $LOG_DIR/.build.lock"
fi
say "builder: $BUILD_CLIENT build, $( ((BUILDKIT)) && echo BuildKit || echo classic builder); logs in $LOG_DIR"

step "checking the base image $BASE_IMAGE"
LOCKGATE_BASE_IMAGE="$BASE_IMAGE" "$SCRIPT_DIR/base-image.sh"
step_done "base image ready"

# ------------------------------------------------------------------ processor image
if ((want_processor)); then
    ctx="$stage_root/processor"
    mkdir -p "$ctx"
    cp "$SCRIPT_DIR/Dockerfile" "$ctx/Dockerfile"
    cp "$REPO_ROOT/pyproject.toml" "$ctx/"
    [[ -f $REPO_ROOT/README.md ]] && cp "$REPO_ROOT/README.md" "$ctx/"
    for d in processors state examples; do
        mkdir -p "$ctx/$d"
        if [[ -d $REPO_ROOT/$d ]]; then
            tar -C "$REPO_ROOT/$d" --exclude=__pycache__ --exclude='*.py[cod]' \
                --exclude=.pytest_cache --exclude=.mypy_cache -cf - . | tar -C "$ctx/$d" -xf -
        fi
    done
    ca="${LOCKGATE_PIP_CA:-}"
    if [[ -z $ca ]] && command -v pip >/dev/null 2>&1; then
        ca="$(pip config get global.cert 2>/dev/null || true)"
    fi
    [[ -n $ca ]] || ca="${PIP_CERT:-}"
    [[ -n $ca ]] || ca=/etc/ssl/certs/ca-certificates.crt
    if [[ -s $ca ]]; then
        cp "$ca" "$ctx/pip-ca.crt"
    else
        say "no CA bundle at '$ca': pip in the build uses the image's own CAs"
    fi
    # The index: $PIP_INDEX_URL, else the host pip's configured global.index-url, else
    # none (pip's own default inside the build). No index is named here.
    index="${PIP_INDEX_URL:-}"
    if [[ -z $index ]] && command -v pip >/dev/null 2>&1; then
        index="$(pip config get global.index-url 2>/dev/null || true)"
    fi
    args=()
    [[ -n $index ]] && args+=(--build-arg "PIP_INDEX_URL=$index")
    # The optional dependency groups (docker/Dockerfile's LOCKGATE_EXTRAS; default there: s3).
    [[ -n ${LOCKGATE_EXTRAS+set} ]] && args+=(--build-arg "LOCKGATE_EXTRAS=$LOCKGATE_EXTRAS")
    build_image processor "$PROCESSOR_IMAGE" "$ctx" "${args[@]}"
fi

# ------------------------------------------------------------------ kafka image
if ((want_kafka)); then
    step "resolving the Kafka jars (docker/kafka/broker.sh fetch)"
    [[ -x $SCRIPT_DIR/kafka/broker.sh ]] || die "docker/kafka/broker.sh is missing"
    libs="$("$SCRIPT_DIR/kafka/broker.sh" fetch | tail -n 1)"
    [[ -d $libs ]] || die "broker.sh fetch printed '$libs', which is not a directory"
    step_done "jars in $libs"
    ctx="$stage_root/kafka"
    mkdir -p "$ctx/libs"
    cp "$SCRIPT_DIR/kafka/Dockerfile" "$SCRIPT_DIR/kafka/entrypoint.sh" "$SCRIPT_DIR/kafka/server-properties.sh" "$SCRIPT_DIR/kafka/log4j2.xml" "$ctx/"
    # Hard links when possible (same file system): no 40 MB copy.
    cp -l "$libs"/*.jar "$ctx/libs/" 2>/dev/null || cp "$libs"/*.jar "$ctx/libs/"
    build_image kafka "$KAFKA_IMAGE" "$ctx"
fi

# The vfs storage driver stores every layer as a full copy: the images a rebuild replaced
# (now untagged) would fill the disk over many test runs. Remove them (best effort).
docker image prune -f >/dev/null 2>&1 || true

say "done in $((SECONDS - total_start))s"
((want_processor)) && printf '%s\n' "$PROCESSOR_IMAGE"
((want_kafka)) && printf '%s\n' "$KAFKA_IMAGE"
exit 0

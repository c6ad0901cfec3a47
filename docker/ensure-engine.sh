#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine.
#
#   docker/ensure-engine.sh
#
# * `docker info` already works      -> exit 0 at once (the fast path).
# * no `dockerd` binary              -> apt-get install docker.io (non-interactive).
# * start `dockerd` detached (own session, so it outlives the caller) with
#       --storage-driver=vfs --iptables=false --ip-forward=false --bridge=none
#   i.e. no overlay mounts, no firewall or routing changes, no docker0 bridge: containers
#   and `docker build` must use `--network host` (or get no network at all).
# * wait until `docker info` works; on timeout print the tail of the daemon log and exit 1.
#
# Idempotent and safe to run concurrently (flock). Progress goes to stderr; stdout stays empty.
#
# Environment:
#   LOCKGATE_DOCKERD_LOG      daemon log file     (default /var/log/lockgate-dockerd.log)
#   LOCKGATE_DOCKERD_TIMEOUT  seconds to wait     (default 60)
#   LOCKGATE_DOCKERD_ARGS     extra dockerd flags (word-split; default empty)
set -euo pipefail

LOG_FILE="${LOCKGATE_DOCKERD_LOG:-/var/log/lockgate-dockerd.log}"
TIMEOUT="${LOCKGATE_DOCKERD_TIMEOUT:-60}"
LOCK_FILE="/run/lockgate-ensure-engine.lock"
PID_FILE="/var/run/docker.pid"

say() { printf '[ensure-engine] %s\n' "$*" >&2; }

engine_up() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_up; then
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    say "no Docker engine answers and starting one needs root (uid is $(id -u))"
    exit 1
fi

# Serialize concurrent callers (e.g. two pytest sessions); the second one just waits.
exec 9>"$LOCK_FILE"
flock -w "$((TIMEOUT + 300))" 9 || { say "could not take $LOCK_FILE"; exit 1; }
if command -v docker >/dev/null 2>&1 && engine_up; then
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    say "dockerd not found: installing docker.io with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # A fresh machine may have no package lists yet; refresh them once if the install fails.
    if ! apt-get install -y -q --no-install-recommends docker.io >&2; then
        apt-get update -q >&2
        apt-get install -y -q --no-install-recommends docker.io >&2
    fi
fi

dockerd_pid() {
    local pid
    [[ -s $PID_FILE ]] || return 1
    pid="$(cat "$PID_FILE")"
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == dockerd ]] || return 1
    printf '%s\n' "$pid"
}

# dockerd supervises its own containerd and records that child's pid here. After a crash or
# a reboot the file outlives the process, and once the pid is reused by an unrelated process
# dockerd believes "containerd is still running", waits for its socket and gives up with
# "timeout waiting for containerd to start" (seen in CI). Remove the file unless the pid is a
# live containerd.
CONTAINERD_PID_FILE="/var/run/docker/containerd/containerd.pid"
clear_stale_containerd_pid() {
    local pid
    [[ -e $CONTAINERD_PID_FILE ]] || return 0
    pid="$(cat "$CONTAINERD_PID_FILE" 2>/dev/null || true)"
    if [[ $pid =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == containerd ]]; then
        return 0
    fi
    say "removing stale $CONTAINERD_PID_FILE (pid '${pid}' is not a running containerd)"
    rm -f "$CONTAINERD_PID_FILE"
}

if pid="$(dockerd_pid)"; then
    say "dockerd (pid $pid) is running but not answering yet; waiting for it"
else
    clear_stale_containerd_pid
    if [[ -e $PID_FILE ]]; then
        say "removing stale $PID_FILE"
        rm -f "$PID_FILE"
    fi
    mkdir -p "$(dirname "$LOG_FILE")"
    # shellcheck disable=SC2206  # extra args are meant to be word-split
    extra=(${LOCKGATE_DOCKERD_ARGS:-})
    say "starting dockerd (storage vfs, no iptables, no bridge); log: $LOG_FILE"
    {
        printf '\n===== %s ensure-engine starting dockerd =====\n' "$(date -Is)"
    } >>"$LOG_FILE"
    setsid nohup dockerd \
        --storage-driver=vfs \
        --iptables=false \
        --ip-forward=false \
        --bridge=none \
        "${extra[@]}" \
        </dev/null >>"$LOG_FILE" 2>&1 &
    started_pid=$!
    disown "$started_pid" 2>/dev/null || true
fi

deadline=$((SECONDS + TIMEOUT))
until engine_up; do
    if ((SECONDS >= deadline)); then
        say "dockerd did not answer within ${TIMEOUT}s; last lines of $LOG_FILE:"
        tail -n 40 "$LOG_FILE" >&2 || true
        exit 1
    fi
    if [[ -n ${started_pid:-} ]] && ! kill -0 "$started_pid" 2>/dev/null && ! dockerd_pid >/dev/null; then
        say "dockerd exited during start-up; last lines of $LOG_FILE:"
        tail -n 40 "$LOG_FILE" >&2 || true
        exit 1
    fi
    sleep 0.5
done
say "Docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"

#!/usr/bin/env bash
# A single-node Kubernetes v1.34 cluster inside this machine, for lockgate's k8s test tier.
#
# Usage: deploy/k8s/cluster.sh build [--kubectl] | up | down | status | env | --help
#
#   build   fetch/build and cache the parts (idempotent; seconds when cached):
#             - Debian packages (apt-get, only when missing): etcd-server, etcd-client,
#               containernetworking-plugins, containerd, runc, iptables, nftables, iproute2,
#               conntrack, openssl, gcc, libc6-dev
#             - kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy
#               v1.34.4 built from the Go module proxy (the k8s.io/kubernetes module, its
#               staging replaces pointed at the published k8s.io/<x>@v0.34.4 modules), in one
#               `go build -p ${LOCKGATE_TEST_K8S_BUILD_JOBS:-4}`; kubectl too with --kubectl
#               or when there is none on PATH (otherwise the one on PATH is used)
#             - CoreDNS v1.12.4 (go install) and a static pause binary (gcc -static)
#   up      start the cluster (build first if needed): certificates, kubeconfigs, a separate
#           containerd (own root/state/socket), etcd, control plane, kubelet, kube-proxy,
#           network fences; load lockgate/processor:dev and lockgate/kafka:dev (and the
#           pause/CoreDNS images) from dockerd into the cluster's containerd; create the
#           local StorageClass and PVs; wait for the node Ready and CoreDNS.
#   down    tear everything down (idempotent): processes (by recorded PID), containers and
#           their mounts, network namespaces, the bridges, iptables rules, cgroups, and the
#           sysctls the kubelet changes are restored to the values recorded at `up`.
#   status  what is running; exit 0 when the cluster answers.
#   env     print `export KUBECONFIG=...` and `export LGK8S_KUBECTL=...` (the kubectl to use)
#           for a shell: eval "$(deploy/k8s/cluster.sh env)"; "$LGK8S_KUBECTL" get pods -A
#
# Cache (machine level, shared by every checkout, like helm's and the Docker images):
#   ${LOCKGATE_TEST_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lockgate/k8s}
#     bin/      the built binaries (+ .version stamps), src/ the patched kubernetes module
# Runtime state (certificates, kubeconfigs, etcd data, containerd root, logs, volumes):
#   ${LOCKGATE_TEST_K8S_STATE:-/var/tmp/lockgate-k8s}      (removed by `down`)
#
# Network (everything inside this machine; nothing routes to another host):
#   node IP 10.200.0.1/32 on the port-less bridge lgk8s-node; pod CIDR 10.244.0.0/24 on the
#   CNI bridge lgk8s-cni0 (no masquerade; pods' only routes: the pod subnet, the service CIDR
#   and the node IP, no default route); service CIDR 10.96.0.0/16
#   (kube-proxy iptables). iptables: mangle chain LGK8S-FENCE (from PREROUTING, FORWARD,
#   POSTROUTING) drops packets from/to those ranges on the external interface; LGK8S-FENCE-FWD
#   (from FORWARD only) drops forwarding through it; filter INPUT drops ext -> node IP.
#
# Needs root, cgroup v1 or v2, Go >= 1.24 (builds), docker (image loading). stderr: progress
# with timings. The kubeconfig for tests: $STATE/admin.kubeconfig (see `env`).
set -euo pipefail

K8S_VERSION="v1.34.4"
K8S_STAGING_VERSION="v0.34.4"
COREDNS_VERSION="v1.12.4"
PAUSE_IMAGE="docker.io/local/pause:3.10"
COREDNS_IMAGE="docker.io/local/coredns:${COREDNS_VERSION}"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
# (Not Debian's kubernetes-client: it is kubectl 1.20. kubectl: a kubectl >= 1.32 on PATH, else
# `build --kubectl` builds one with the components.)
APT_PACKAGES=(etcd-server etcd-client containernetworking-plugins containerd runc
    iptables nftables iproute2 conntrack openssl gcc libc6-dev)
LOAD_IMAGES=(lockgate/processor:dev lockgate/kafka:dev)

NODE_IP="10.200.0.1"
NODE_BRIDGE="lgk8s-node"
CNI_BRIDGE="lgk8s-cni0"
POD_CIDR="10.244.0.0/24"
SERVICE_CIDR="10.96.0.0/16"
KUBE_SVC_IP="10.96.0.1"
DNS_IP="10.96.0.10"
CLUSTER_DOMAIN="cluster.local"
NODE_NAME="lockgate-node"
FENCE_CHAIN="LGK8S-FENCE"
ETCD_CLIENT_PORT=23790
ETCD_PEER_PORT=23800
APISERVER_PORT=6443
# Recorded at `up`, restored at `down`: what the kubelet (protectKernelDefaults off), kube-proxy
# and the CNI bridge plugin (ip_forward) may change.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
    net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables
    net.bridge.bridge-nf-call-ip6tables net.netfilter.nf_conntrack_max
    net.netfilter.nf_conntrack_tcp_timeout_established
    net.netfilter.nf_conntrack_tcp_timeout_close_wait)
PV_COUNT="${LOCKGATE_TEST_K8S_PVS:-24}"

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
CACHE="${LOCKGATE_TEST_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lockgate/k8s}"
STATE="${LOCKGATE_TEST_K8S_STATE:-/var/tmp/lockgate-k8s}"
BIN="${CACHE}/bin"
CNI_BIN_DIR="/usr/lib/cni"
CTR_SOCK="${STATE}/containerd/containerd.sock"

T0=${SECONDS}
log() { printf '[k8s %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

need_root() { [[ ${EUID} -eq 0 ]] || die "must run as root (it starts a kubelet and containerd)"; }

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------

ensure_apt_packages() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("${p}")
    done
    if ((${#missing[@]} == 0)); then
        return 0
    fi
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get"
    log "apt-get install ${missing[*]}"
    # policy-rc.d: never let a package's postinst start a system etcd/containerd.
    local policy=/usr/sbin/policy-rc.d created=0
    if [[ ! -e ${policy} ]]; then
        printf '#!/bin/sh\nexit 101\n' >"${policy}"
        chmod +x "${policy}"
        created=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
        >&2 || {
        ((created)) && rm -f "${policy}"
        die "apt-get install ${missing[*]} failed"
    }
    ((created)) && rm -f "${policy}"
    return 0
}

# Stamp files record what a cached binary was built from; a mismatch rebuilds it.
stamp_ok() { [[ -x "${BIN}/$1" && "$(cat "${BIN}/.$1.version" 2>/dev/null)" == "$2" ]]; }
stamp() { printf '%s\n' "$2" >"${BIN}/.$1.version"; }

prepare_kubernetes_src() {
    local src="${CACHE}/src/kubernetes-${K8S_VERSION}" dir replaces r t
    if [[ -f ${src}/.prepared ]]; then
        printf '%s\n' "${src}"
        return 0
    fi
    t=${SECONDS}
    log "go mod download k8s.io/kubernetes@${K8S_VERSION}"
    dir="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -n ${dir} && -d ${dir} ]] || die "go mod download k8s.io/kubernetes@${K8S_VERSION} failed"
    rm -rf "${src}" "${src}.tmp"
    mkdir -p "${CACHE}/src"
    cp -r "${dir}" "${src}.tmp"
    chmod -R u+w "${src}.tmp"
    (
        cd "${src}.tmp"
        rm -f go.work go.work.sum
        # The module zip has no staging/ modules: use the published ones of the same release.
        replaces="$(go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])')"
        for r in ${replaces}; do
            go mod edit -replace "${r}=${r}@${K8S_STAGING_VERSION}"
        done
    )
    mv "${src}.tmp" "${src}"
    touch "${src}/.prepared"
    log "kubernetes source ready in ${src} ($((SECONDS - t)) s)"
    printf '%s\n' "${src}"
}

build_kubernetes() {
    local todo=() c src ldflags t want=("${COMPONENTS[@]}")
    if [[ ${WITH_KUBECTL} == 1 ]] || ! command -v kubectl >/dev/null 2>&1; then
        want+=(kubectl)
    fi
    for c in "${want[@]}"; do
        stamp_ok "${c}" "${K8S_VERSION}" || todo+=("${c}")
    done
    ((${#todo[@]} == 0)) && {
        log "kubernetes ${K8S_VERSION} components cached"
        return 0
    }
    src="$(prepare_kubernetes_src)"
    ldflags="-s -w"
    local p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X ${p}.gitVersion=${K8S_VERSION} -X ${p}.gitMajor=1"
        ldflags+=" -X ${p}.gitMinor=34 -X ${p}.gitTreeState=clean"
        ldflags+=" -X ${p}.buildDate=1970-01-01T00:00:00Z"
    done
    # One `go build` for all of them: packages shared by the components compile once, and the
    # build keeps more than one package in flight on a machine shared with other jobs.
    t=${SECONDS}
    log "go build ${todo[*]} ${K8S_VERSION} (cold: 10-60 min on a busy 2-core machine)"
    rm -rf "${BIN}/.build"
    mkdir -p "${BIN}/.build"
    local pkgs=()
    for c in "${todo[@]}"; do pkgs+=("./cmd/${c}"); done
    (cd "${src}" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -p "${LOCKGATE_TEST_K8S_BUILD_JOBS:-4}" \
        -trimpath -ldflags "${ldflags}" -o "${BIN}/.build/" "${pkgs[@]}") >&2 ||
        die "go build ${pkgs[*]} failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
    for c in "${todo[@]}"; do
        mv -f "${BIN}/.build/${c}" "${BIN}/${c}"
        stamp "${c}" "${K8S_VERSION}"
    done
    rmdir "${BIN}/.build"
    log "built ${todo[*]} in $((SECONDS - t)) s"
}

build_coredns() {
    stamp_ok coredns "${COREDNS_VERSION}" && return 0
    local t=${SECONDS} scratch
    log "go install github.com/coredns/coredns@${COREDNS_VERSION}"
    scratch="$(mktemp -d "${BIN}/.coredns.XXXXXX")"
    CGO_ENABLED=0 GOBIN="${scratch}" go install -trimpath -ldflags "-s -w" \
        "github.com/coredns/coredns@${COREDNS_VERSION}" >&2 || {
        rm -rf "${scratch}"
        die "go install coredns failed"
    }
    mv -f "${scratch}/coredns" "${BIN}/coredns"
    rm -rf "${scratch}"
    stamp coredns "${COREDNS_VERSION}"
    log "built coredns in $((SECONDS - t)) s"
}

build_pause() {
    stamp_ok pause 1 && return 0
    log "gcc -static pause"
    cat >"${BIN}/.pause.c" <<'EOF'
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void die(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, die);
    signal(SIGTERM, die);
    signal(SIGCHLD, reap);
    for (;;) pause();
    return 0;
}
EOF
    gcc -static -O2 -o "${BIN}/.pause.tmp" "${BIN}/.pause.c" >&2 || die "gcc -static failed"
    mv -f "${BIN}/.pause.tmp" "${BIN}/pause"
    stamp pause 1
}

cmd_build() {
    need_root
    local t=${SECONDS}
    ensure_apt_packages
    command -v go >/dev/null || die "no 'go' on PATH (needed to build the Kubernetes components)"
    mkdir -p "${BIN}"
    exec 8>"${CACHE}/.build.lock"
    if ! flock -n 8; then
        log "another build is running; waiting for it"
        flock 8
    fi
    build_pause
    build_kubernetes
    build_coredns
    exec 8>&-
    log "build done in $((SECONDS - t)) s (cache ${CACHE})"
}

# ---------------------------------------------------------------------------------------------
# up
# ---------------------------------------------------------------------------------------------
PKI="${STATE}/pki"
LOGS="${STATE}/logs"
PIDS="${STATE}/pids"
# kubectl: the cached one (`build --kubectl`), else one on PATH (>= 1.32; skew warnings only).
find_kubectl() {
    if [[ -x ${BIN}/kubectl ]]; then
        printf '%s\n' "${BIN}/kubectl"
    elif command -v kubectl >/dev/null 2>&1; then
        command -v kubectl
    else
        return 1
    fi
}
KUBECTL="$(find_kubectl || echo kubectl-missing)"

ext_if() { ip -o route show default 2>/dev/null | awk '{for(i=1;i<NF;i++) if($i=="dev"){print $(i+1); exit}}'; }

kc() { "${KUBECTL}" --kubeconfig "${STATE}/admin.kubeconfig" "$@"; }

# wait_for SECONDS WHAT CMD...: poll CMD every second until it succeeds.
wait_for() {
    local limit=$1 what=$2 t=${SECONDS}
    shift 2
    log "waiting for ${what}"
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS - t >= limit)); then
            die "${what}: not within ${limit} s (logs: ${LOGS})"
        fi
        sleep 1
    done
    log "${what} ($((SECONDS - t)) s)"
}

# start NAME CMD...: run CMD in its own session, log to $LOGS/NAME.log, PID in $PIDS/NAME.pid.
start() {
    local name=$1
    shift
    setsid "$@" >"${LOGS}/${name}.log" 2>&1 </dev/null &
    printf '%s\n' "$!" >"${PIDS}/${name}.pid"
    log "started ${name} (pid $!)"
}

record_sysctls() {
    [[ -f ${STATE}/sysctls.orig ]] && return 0
    local s v
    : >"${STATE}/sysctls.orig.tmp"
    for s in "${SYSCTLS[@]}"; do
        v="$(sysctl -n "${s}" 2>/dev/null)" || continue
        printf '%s=%s\n' "${s}" "${v}" >>"${STATE}/sysctls.orig.tmp"
    done
    mv "${STATE}/sysctls.orig.tmp" "${STATE}/sysctls.orig"
}

gen_pki() {
    [[ -f ${PKI}/.done ]] && return 0
    local t=${SECONDS}
    mkdir -p "${PKI}"
    (
        cd "${PKI}"
        # EC P-256 keys: RSA key generation takes seconds per key on a busy 2-core machine.
        local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1)
        openssl req -x509 "${ec[@]}" -nodes -keyout ca.key -out ca.crt -days 30 \
            -subj "/CN=lockgate-k8s-ca" 2>/dev/null
        openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null |
            openssl pkcs8 -topk8 -nocrypt -out sa.key 2>/dev/null
        openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
        # cert NAME CN [O] [SAN]
        cert() {
            local subj="/CN=$2"
            [[ -n ${3:-} ]] && subj="/O=$3${subj}"
            openssl req "${ec[@]}" -nodes -keyout "$1.key" -out "$1.csr" -subj "${subj}" \
                2>/dev/null
            {
                echo "basicConstraints=CA:FALSE"
                echo "keyUsage=critical,digitalSignature,keyEncipherment"
                echo "extendedKeyUsage=serverAuth,clientAuth"
                [[ -n ${4:-} ]] && echo "subjectAltName=$4"
            } >"$1.ext"
            openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
                -out "$1.crt" -days 30 -extfile "$1.ext" 2>/dev/null
            rm -f "$1.csr" "$1.ext"
        }
        cert apiserver kube-apiserver "" "IP:${NODE_IP},IP:${KUBE_SVC_IP},IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.${CLUSTER_DOMAIN},DNS:localhost"
        cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
        cert admin lockgate-admin system:masters
        cert controller-manager system:kube-controller-manager
        cert scheduler system:kube-scheduler
        cert proxy system:kube-proxy
        cert kubelet "system:node:${NODE_NAME}" system:nodes "IP:${NODE_IP},DNS:${NODE_NAME}"
    )
    chmod 0600 "${PKI}"/*.key
    local who
    for who in admin controller-manager scheduler proxy kubelet; do
        cat >"${STATE}/${who}.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lockgate
  cluster:
    certificate-authority: ${PKI}/ca.crt
    server: https://${NODE_IP}:${APISERVER_PORT}
users:
- name: ${who}
  user:
    client-certificate: ${PKI}/${who}.crt
    client-key: ${PKI}/${who}.key
contexts:
- name: lockgate
  context: {cluster: lockgate, user: ${who}}
current-context: lockgate
EOF
    done
    touch "${PKI}/.done"
    log "certificates and kubeconfigs ($((SECONDS - t)) s)"
}

net_up() {
    local ext
    ext="$(ext_if)"
    [[ -n ${ext} ]] || ext=eth0
    printf '%s\n' "${ext}" >"${STATE}/ext_if"
    if ! ip link show "${NODE_BRIDGE}" >/dev/null 2>&1; then
        ip link add "${NODE_BRIDGE}" type bridge
    fi
    ip addr replace "${NODE_IP}/32" dev "${NODE_BRIDGE}"
    ip link set "${NODE_BRIDGE}" up
    # The fences: a packet whose source or destination is a cluster address may only use lo
    # and the cluster's own bridges (lgk8s-*). Anything else is dropped before routing
    # (PREROUTING) and after it (POSTROUTING), forwarded or local.
    iptables -t mangle -N "${FENCE_CHAIN}" 2>/dev/null || iptables -t mangle -F "${FENCE_CHAIN}"
    local range dir
    for range in "${NODE_IP}/32" "${POD_CIDR}" "${SERVICE_CIDR}"; do
        for dir in -s -d; do
            iptables -t mangle -A "${FENCE_CHAIN}" "${dir}" "${range}" -i "${ext}" -j DROP
            iptables -t mangle -A "${FENCE_CHAIN}" "${dir}" "${range}" -o "${ext}" -j DROP
        done
    done
    # Forwarded traffic through the external interface (own chain, jumped to from FORWARD
    # only): none while the cluster runs when the host did not forward before (the CNI bridge
    # plugin turns ip_forward on); otherwise none between it and the cluster's bridges.
    iptables -t mangle -N "${FENCE_CHAIN}-FWD" 2>/dev/null || iptables -t mangle -F "${FENCE_CHAIN}-FWD"
    if grep -qx 'net.ipv4.ip_forward=0' "${STATE}/sysctls.orig"; then
        iptables -t mangle -A "${FENCE_CHAIN}-FWD" -i "${ext}" -j DROP
        iptables -t mangle -A "${FENCE_CHAIN}-FWD" -o "${ext}" -j DROP
    else
        iptables -t mangle -A "${FENCE_CHAIN}-FWD" -i "${ext}" -o lgk8s+ -j DROP
        iptables -t mangle -A "${FENCE_CHAIN}-FWD" -i lgk8s+ -o "${ext}" -j DROP
    fi
    local hook
    for hook in PREROUTING FORWARD POSTROUTING; do
        iptables -t mangle -C "${hook}" -j "${FENCE_CHAIN}" 2>/dev/null ||
            iptables -t mangle -I "${hook}" 1 -j "${FENCE_CHAIN}"
    done
    iptables -t mangle -C FORWARD -j "${FENCE_CHAIN}-FWD" 2>/dev/null ||
        iptables -t mangle -I FORWARD 1 -j "${FENCE_CHAIN}-FWD"
    iptables -t filter -C INPUT -i "${ext}" -d "${NODE_IP}" -j DROP 2>/dev/null ||
        iptables -t filter -I INPUT 1 -i "${ext}" -d "${NODE_IP}" -j DROP
    log "network: ${NODE_IP}/32 on ${NODE_BRIDGE}, fences on ${ext} (mangle ${FENCE_CHAIN})"

    mkdir -p "${STATE}/cni/net.d" "${STATE}/cni/ipam"
    cat >"${STATE}/cni/net.d/10-lgk8s.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "lgk8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${CNI_BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "${STATE}/cni/ipam",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "routes": [{"dst": "${SERVICE_CIDR}"}, {"dst": "${NODE_IP}/32"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
}

containerd_up() {
    mkdir -p "${STATE}/containerd"
    cat >"${STATE}/containerd/config.toml" <<EOF
version = 2
root = "${STATE}/containerd/root"
state = "${STATE}/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.introspection-unused"]
[grpc]
  address = "${CTR_SOCK}"
[ttrpc]
  address = "${CTR_SOCK}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "${STATE}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${CNI_BIN_DIR}"
    conf_dir = "${STATE}/cni/net.d"
    max_conf_num = 1
EOF
    start containerd containerd --config "${STATE}/containerd/config.toml"
    wait_for 60 "containerd" ctr --address "${CTR_SOCK}" version
}

# image_from_binary NAME BINARY ENTRYPOINT: a one-binary image in dockerd (docker import).
image_from_binary() {
    local name=$1 binary=$2 entry=$3 dir
    dir="$(mktemp -d)"
    cp "${binary}" "${dir}/${entry}"
    tar -C "${dir}" -c . | docker import --change "ENTRYPOINT [\"/${entry}\"]" - "${name}" >/dev/null
    rm -rf "${dir}"
}

load_images() {
    local t=${SECONDS} img missing=()
    command -v docker >/dev/null || die "no docker: the images are loaded from dockerd"
    for img in "${LOAD_IMAGES[@]}"; do
        docker image inspect "${img}" >/dev/null 2>&1 || missing+=("${img}")
    done
    ((${#missing[@]} == 0)) || die "not in dockerd: ${missing[*]} (run docker/build-images.sh)"
    image_from_binary "${PAUSE_IMAGE#docker.io/}" "${BIN}/pause" pause
    image_from_binary "${COREDNS_IMAGE#docker.io/}" "${BIN}/coredns" coredns
    docker save "${PAUSE_IMAGE#docker.io/}" "${COREDNS_IMAGE#docker.io/}" "${LOAD_IMAGES[@]}" |
        ctr --address "${CTR_SOCK}" -n k8s.io images import - >/dev/null ||
        die "importing the images into the cluster's containerd failed"
    log "images loaded into the cluster's containerd: ${LOAD_IMAGES[*]} + pause, coredns ($((SECONDS - t)) s)"
}

control_plane_up() {
    mkdir -p "${STATE}/etcd"
    start etcd etcd --name lgk8s --data-dir "${STATE}/etcd" \
        --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
        --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
        --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
        --initial-cluster "lgk8s=http://127.0.0.1:${ETCD_PEER_PORT}" \
        --quota-backend-bytes 1073741824
    wait_for 60 "etcd" curl -fsS "http://127.0.0.1:${ETCD_CLIENT_PORT}/health"
    start kube-apiserver "${BIN}/kube-apiserver" \
        --advertise-address="${NODE_IP}" --bind-address="${NODE_IP}" \
        --secure-port="${APISERVER_PORT}" \
        --etcd-servers="http://127.0.0.1:${ETCD_CLIENT_PORT}" \
        --service-cluster-ip-range="${SERVICE_CIDR}" \
        --client-ca-file="${PKI}/ca.crt" \
        --tls-cert-file="${PKI}/apiserver.crt" --tls-private-key-file="${PKI}/apiserver.key" \
        --kubelet-client-certificate="${PKI}/apiserver-kubelet-client.crt" \
        --kubelet-client-key="${PKI}/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types=InternalIP \
        --service-account-key-file="${PKI}/sa.pub" \
        --service-account-signing-key-file="${PKI}/sa.key" \
        --service-account-issuer="https://kubernetes.default.svc.${CLUSTER_DOMAIN}" \
        --authorization-mode=Node,RBAC --allow-privileged=true \
        --enable-admission-plugins=NodeRestriction --profiling=false \
        --endpoint-reconciler-type=lease
    wait_for 180 "kube-apiserver /readyz" kc get --raw /readyz
    # The controller manager exits when RBAC bootstrap has not finished: give it a moment.
    sleep 3
    start kube-controller-manager "${BIN}/kube-controller-manager" \
        --kubeconfig="${STATE}/controller-manager.kubeconfig" \
        --authentication-kubeconfig="${STATE}/controller-manager.kubeconfig" \
        --authorization-kubeconfig="${STATE}/controller-manager.kubeconfig" \
        --bind-address=127.0.0.1 --leader-elect=false \
        --cluster-signing-cert-file="${PKI}/ca.crt" --cluster-signing-key-file="${PKI}/ca.key" \
        --root-ca-file="${PKI}/ca.crt" --service-account-private-key-file="${PKI}/sa.key" \
        --use-service-account-credentials=true --service-cluster-ip-range="${SERVICE_CIDR}" \
        --profiling=false
    start kube-scheduler "${BIN}/kube-scheduler" \
        --kubeconfig="${STATE}/scheduler.kubeconfig" \
        --authentication-kubeconfig="${STATE}/scheduler.kubeconfig" \
        --authorization-kubeconfig="${STATE}/scheduler.kubeconfig" \
        --bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

node_up() {
    mkdir -p "${STATE}/kubelet" "${STATE}/pod-logs"
    : >"${STATE}/resolv.conf" # pods see only the cluster DNS; nothing resolves upstream
    cat >"${STATE}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${PKI}/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: ${PKI}/kubelet.crt
tlsPrivateKeyFile: ${PKI}/kubelet.key
clusterDomain: ${CLUSTER_DOMAIN}
clusterDNS: [${DNS_IP}]
cgroupDriver: cgroupfs
cgroupRoot: /lgk8s
containerRuntimeEndpoint: unix://${CTR_SOCK}
imageServiceEndpoint: unix://${CTR_SOCK}
failSwapOn: false
failCgroupV1: false
resolvConf: ${STATE}/resolv.conf
podLogsDir: ${STATE}/pod-logs
# The disk is shared and may be fuller than the kubelet's defaults allow: evict only when
# really full, and never garbage-collect images (there is no registry to pull them again).
evictionHard: {memory.available: 200Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 60
rotateCertificates: false
serverTLSBootstrap: false
staticPodPath: ""
EOF
    # cgroupRoot must exist in every v1 hierarchy (or in the v2 tree).
    local d
    for d in /sys/fs/cgroup/*/; do
        [[ -d ${d} && -w ${d} ]] || continue
        mkdir -p "${d}lgk8s"
        # A new v1 cpuset cgroup has no CPUs/memory nodes: give it the parent's.
        if [[ -f ${d}cpuset.cpus && -z "$(tr -d '[:space:]' <"${d}lgk8s/cpuset.cpus")" ]]; then
            cat "${d}cpuset.cpus" >"${d}lgk8s/cpuset.cpus"
            cat "${d}cpuset.mems" >"${d}lgk8s/cpuset.mems"
        fi
    done
    [[ -f /sys/fs/cgroup/cgroup.controllers ]] && mkdir -p /sys/fs/cgroup/lgk8s
    start kubelet "${BIN}/kubelet" --config="${STATE}/kubelet.yaml" \
        --kubeconfig="${STATE}/kubelet.kubeconfig" --root-dir="${STATE}/kubelet" \
        --cert-dir="${STATE}/kubelet/pki" --node-ip="${NODE_IP}" \
        --hostname-override="${NODE_NAME}" --v=1
    cat >"${STATE}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: ${STATE}/proxy.kubeconfig}
mode: iptables
clusterCIDR: ${POD_CIDR}
hostnameOverride: ${NODE_NAME}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["${NODE_IP}/32"]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
    start kube-proxy "${BIN}/kube-proxy" --config="${STATE}/kube-proxy.yaml"
    wait_for 180 "node ${NODE_NAME} Ready" node_ready
}

node_ready() {
    [[ "$(kc get node "${NODE_NAME}" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

addons_up() {
    kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes ${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: ${COREDNS_IMAGE}
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10}
        resources: {requests: {cpu: 50m, memory: 50Mi}, limits: {memory: 170Mi}}
        volumeMounts: [{name: config, mountPath: /etc/coredns}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: ${DNS_IP}
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
    # Storage: pre-created local PVs (directories under the state dir) behind a default
    # StorageClass without a provisioner. Local volumes honour fsGroup, so the chart's non-root
    # pods own their state volume; hostPath volumes would not.
    local i pvs=""
    mkdir -p "${STATE}/volumes"
    for ((i = 0; i < PV_COUNT; i++)); do
        mkdir -p "${STATE}/volumes/pv${i}"
        pvs+="---
apiVersion: v1
kind: PersistentVolume
metadata: {name: lgk8s-pv${i}}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: lockgate-local
  local: {path: ${STATE}/volumes/pv${i}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [${NODE_NAME}]}]
"
    done
    kc apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: lockgate-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
${pvs}
EOF
    wait_for 180 "CoreDNS ready" kc -n kube-system wait --for=condition=Available deployment/coredns --timeout=1s
}

cmd_up() {
    need_root
    local t=${SECONDS} c
    for c in "${COMPONENTS[@]}" coredns pause; do
        [[ -x ${BIN}/${c} ]] || {
            log "${BIN}/${c} missing: building first"
            cmd_build
            break
        }
    done
    ensure_apt_packages
    if cmd_status >/dev/null 2>&1; then
        log "cluster already up (KUBECONFIG=${STATE}/admin.kubeconfig)"
        return 0
    fi
    if [[ -d ${PIDS} ]]; then
        log "a previous cluster left state behind: tearing it down first"
        cmd_down
    fi
    mkdir -p "${STATE}" "${LOGS}" "${PIDS}"
    record_sysctls
    iptables-save >"${STATE}/iptables.before" 2>/dev/null || true
    ip6tables-save >"${STATE}/ip6tables.before" 2>/dev/null || true
    gen_pki
    net_up
    containerd_up
    # The images load (about 17 s: docker save | ctr import) while the control plane and the
    # node start; no pod is created before addons_up, so nothing needs them earlier.
    local loader
    load_images &
    loader=$!
    control_plane_up
    node_up
    wait "${loader}" || die "loading the images into the cluster's containerd failed"
    addons_up
    log "cluster up in $((SECONDS - t)) s: export KUBECONFIG=${STATE}/admin.kubeconfig"
}

# ---------------------------------------------------------------------------------------------
# down
# ---------------------------------------------------------------------------------------------

# stop_pid NAME: stop the process recorded in $PIDS/NAME.pid (TERM, then KILL after 15 s).
stop_pid() {
    local name=$1 pid i
    [[ -f ${PIDS}/${name}.pid ]] || return 0
    pid="$(cat "${PIDS}/${name}.pid")"
    if [[ -n ${pid} ]] && kill -0 "${pid}" 2>/dev/null; then
        kill -TERM "${pid}" 2>/dev/null || true
        for ((i = 0; i < 150; i++)); do
            kill -0 "${pid}" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "${pid}" 2>/dev/null; then
            log "${name} (pid ${pid}) ignored SIGTERM: SIGKILL"
            kill -KILL "${pid}" 2>/dev/null || true
            sleep 0.2
        fi
        log "stopped ${name} (pid ${pid})"
    fi
    rm -f "${PIDS}/${name}.pid"
}

# stop_pids GRACE NAME...: stop the processes recorded in $PIDS/NAME.pid together (TERM to all,
# then KILL to those left after GRACE seconds).
stop_pids() {
    local grace=$1 name pid i alive
    shift
    local -A pids=()
    for name in "$@"; do
        [[ -f ${PIDS}/${name}.pid ]] || continue
        pid="$(cat "${PIDS}/${name}.pid")"
        if [[ -n ${pid} ]] && kill -0 "${pid}" 2>/dev/null; then
            kill -TERM "${pid}" 2>/dev/null || true
            pids[${name}]=${pid}
        fi
    done
    for ((i = 0; i < grace * 10 + 20; i++)); do
        alive=()
        for name in "${!pids[@]}"; do
            kill -0 "${pids[${name}]}" 2>/dev/null && alive+=("${name}")
        done
        ((${#alive[@]} > 0)) || break
        if ((i == grace * 10)); then
            for name in "${alive[@]}"; do
                log "${name} (pid ${pids[${name}]}) ignored SIGTERM: SIGKILL"
                kill -KILL "${pids[${name}]}" 2>/dev/null || true
            done
        fi
        sleep 0.1
    done
    for name in "$@"; do
        [[ -n ${pids[${name}]:-} ]] && log "stopped ${name} (pid ${pids[${name}]})"
        rm -f "${PIDS}/${name}.pid"
    done
    return 0
}

# PIDs of the runc shims of the cluster's containerd (their -address is our socket).
our_shims() {
    local p cmd
    for p in /proc/[0-9]*; do
        cmd="$(tr '\0' ' ' <"${p}/cmdline")" || continue
        [[ ${cmd} == *containerd-shim*"-address ${CTR_SOCK} "* ]] && printf '%s\n' "${p#/proc/}"
    done 2>/dev/null # processes that exit meanwhile
    return 0
}

containers_down() {
    local id pid
    if [[ -S ${CTR_SOCK} ]] && ctr --address "${CTR_SOCK}" version >/dev/null 2>&1; then
        # Kill every task (pods' containers and sandboxes), then delete tasks and containers so
        # containerd unmounts their root filesystems.
        for id in $(ctr --address "${CTR_SOCK}" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "${CTR_SOCK}" -n k8s.io tasks kill -s SIGKILL "${id}" >/dev/null 2>&1 || true
        done
        sleep 1
        for id in $(ctr --address "${CTR_SOCK}" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "${CTR_SOCK}" -n k8s.io tasks delete -f "${id}" >/dev/null 2>&1 || true
        done
        for id in $(ctr --address "${CTR_SOCK}" -n k8s.io containers ls -q 2>/dev/null); do
            ctr --address "${CTR_SOCK}" -n k8s.io containers delete "${id}" >/dev/null 2>&1 || true
        done
    fi
    stop_pid containerd
    for pid in $(our_shims); do
        log "killing leftover shim ${pid}"
        kill -KILL "${pid}" 2>/dev/null || true
    done
    # Containers whose shim is gone keep running: kill whatever is still in the pods' cgroups
    # (every process there belongs to this cluster).
    local procs
    for procs in $(find /sys/fs/cgroup/*/lgk8s /sys/fs/cgroup/lgk8s -name cgroup.procs 2>/dev/null); do
        for pid in $(cat "${procs}" 2>/dev/null); do
            log "killing leftover pod process ${pid}"
            kill -KILL "${pid}" 2>/dev/null || true
        done
    done
    sleep 0.5
}

unmount_state() {
    local m i
    for ((i = 0; i < 3; i++)); do
        mapfile -t mounts < <(findmnt -rn -o TARGET | grep -F "${STATE}/" | sort -r || true)
        ((${#mounts[@]} == 0)) && return 0
        for m in "${mounts[@]}"; do
            umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || true
        done
    done
    mapfile -t mounts < <(findmnt -rn -o TARGET | grep -F "${STATE}/" || true)
    ((${#mounts[@]} == 0)) || log "warning: still mounted: ${mounts[*]}"
}

iptables_down() {
    local ext hook table chain
    ext="$(cat "${STATE}/ext_if" 2>/dev/null || ext_if)"
    [[ -n ${ext} ]] || ext=eth0
    # kube-proxy's own rules (KUBE-SERVICES, ...): its cleanup mode removes them.
    [[ -x ${BIN}/kube-proxy ]] && "${BIN}/kube-proxy" --cleanup >/dev/null 2>&1 || true
    for hook in PREROUTING FORWARD POSTROUTING; do
        while iptables -t mangle -D "${hook}" -j "${FENCE_CHAIN}" 2>/dev/null; do :; done
    done
    while iptables -t mangle -D FORWARD -j "${FENCE_CHAIN}-FWD" 2>/dev/null; do :; done
    for chain in "${FENCE_CHAIN}" "${FENCE_CHAIN}-FWD"; do
        iptables -t mangle -F "${chain}" 2>/dev/null || true
        iptables -t mangle -X "${chain}" 2>/dev/null || true
    done
    while iptables -t filter -D INPUT -i "${ext}" -d "${NODE_IP}" -j DROP 2>/dev/null; do :; done
    # Chains the kubelet and kube-proxy made (KUBE-*, IPv4 and IPv6) that did not exist before
    # `up`, and the tables they created.
    ipt_cleanup iptables "${STATE}/iptables.before" ip
    ipt_cleanup ip6tables "${STATE}/ip6tables.before" ip6
}

# ipt_cleanup IPTABLES BEFORE NFT_FAMILY
ipt_cleanup() {
    local ipt=$1 before=$2 family=$3 table chain line
    command -v "${ipt}-save" >/dev/null || return 0
    for table in filter nat mangle; do
        for chain in $("${ipt}-save" -t "${table}" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\).*/\1/p'); do
            grep -q "^:${chain} " "${before}" 2>/dev/null && continue
            # Remove the rules that jump to it, then the chain.
            "${ipt}-save" -t "${table}" | { grep -E -- "^-A [^ ]+ .*-j ${chain}( |$)" || true; } |
                while read -r line; do
                    # The saved rule quotes its comments: let the shell split it.
                    eval "${ipt} -t ${table} -D ${line#-A }" 2>/dev/null || true
                done
            "${ipt}" -t "${table}" -F "${chain}" 2>/dev/null || true
        done
        for chain in $("${ipt}-save" -t "${table}" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\).*/\1/p'); do
            grep -q "^:${chain} " "${before}" 2>/dev/null && continue
            "${ipt}" -t "${table}" -X "${chain}" 2>/dev/null || true
        done
        # A table that did not exist before `up` and is empty again (no rules, no own chains):
        # delete it (iptables-nft cannot; nft can, when installed).
        if [[ -f ${before} ]] && ! grep -qx "\*${table}" "${before}" && command -v nft >/dev/null &&
            ! "${ipt}-save" -t "${table}" 2>/dev/null | grep -qE '^(-A |:[^ ]+ - )'; then
            nft delete table "${family}" "${table}" 2>/dev/null || true
        fi
    done
}

cgroups_down() {
    local top d
    for top in /sys/fs/cgroup/*/lgk8s /sys/fs/cgroup/lgk8s; do
        [[ -d ${top} ]] || continue
        # Deepest first; a cgroup with processes cannot be removed (reported, not forced).
        while read -r d; do
            rmdir "${d}" 2>/dev/null || true
        done < <(find "${top}" -depth -type d 2>/dev/null)
        [[ -d ${top} ]] && log "warning: could not remove cgroup ${top}"
    done
    return 0
}

restore_sysctls() {
    local line
    [[ -f ${STATE}/sysctls.orig ]] || return 0
    while IFS= read -r line; do
        [[ -n ${line} ]] || continue
        sysctl -q -w "${line}" >/dev/null 2>&1 || log "warning: could not restore ${line}"
    done <"${STATE}/sysctls.orig"
    log "sysctls restored: $(tr '\n' ' ' <"${STATE}/sysctls.orig")"
}

cmd_down() {
    need_root
    local t=${SECONDS} c link
    if [[ ! -d ${STATE} ]]; then
        log "nothing to tear down (${STATE} does not exist)"
        return 0
    fi
    # Together, with a short grace: their state (etcd's data, the kubelet's directory) is deleted
    # below, so no graceful drain is worth waiting for (one by one with 15 s each, the apiserver
    # alone could take its whole 15 s, and the others about 2 s each).
    stop_pids 3 kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver
    containers_down
    stop_pid etcd
    unmount_state
    # veth host ends left behind (their netns normally takes them along), then the bridges.
    for link in $(ip -o link show master "${CNI_BRIDGE}" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
        ip link delete "${link}" 2>/dev/null || true
    done
    for link in "${CNI_BRIDGE}" "${NODE_BRIDGE}"; do
        if ip link show "${link}" >/dev/null 2>&1; then
            ip link delete "${link}"
        fi
    done
    iptables_down
    cgroups_down
    restore_sysctls
    # The two helper images `up` made in dockerd (recreated in seconds by the next `up`).
    if command -v docker >/dev/null 2>&1; then
        docker image rm "${PAUSE_IMAGE#docker.io/}" "${COREDNS_IMAGE#docker.io/}" >/dev/null 2>&1 || true
    fi
    # Keep the logs of the last run for post-mortems, then remove the state (never across a
    # mount: refuse when something is still mounted below it).
    if findmnt -rn -o TARGET | grep -qF "${STATE}/"; then
        die "mounts remain under ${STATE}; not removing it"
    fi
    rm -rf "${STATE}.last-logs"
    [[ -d ${LOGS} ]] && cp -r "${LOGS}" "${STATE}.last-logs"
    rm -rf --one-file-system "${STATE}"
    log "cluster down in $((SECONDS - t)) s (logs of the run: ${STATE}.last-logs)"
}

cmd_status() {
    local name pid rc=0
    for name in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
        pid="$(cat "${PIDS}/${name}.pid" 2>/dev/null || true)"
        if [[ -n ${pid} ]] && kill -0 "${pid}" 2>/dev/null; then
            printf '%-24s running (pid %s)\n' "${name}" "${pid}"
        else
            printf '%-24s not running\n' "${name}"
            rc=1
        fi
    done
    if ((rc == 0)) && kc get --raw /readyz >/dev/null 2>&1; then
        kc get nodes -o wide 2>/dev/null || true
        return 0
    fi
    return 1
}

# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------
WITH_KUBECTL=0
main() {
    [[ ${2:-} == --kubectl ]] && WITH_KUBECTL=1
    case "${1:-}" in
        build) cmd_build ;;
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        env)
            printf 'export KUBECONFIG=%q\n' "${STATE}/admin.kubeconfig"
            printf 'export LGK8S_KUBECTL=%q\n' "${KUBECTL}"
            ;;
        -h | --help | help)
            usage
            ;;
        *)
            usage >&2
            exit 2
            ;;
    esac
}

main "$@"
exit

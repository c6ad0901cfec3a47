#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft) broker for lockgate development and tests.
# Runs the broker with the machine's Java (17+) from jars that Maven resolves.
# See docker/kafka/README.md, or run: docker/kafka/broker.sh --help
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "${SCRIPT_DIR}/../.." && pwd -P)"
POM="${SCRIPT_DIR}/pom.xml"
LOG4J_CONFIG="${SCRIPT_DIR}/log4j2.xml"
PROG="docker/kafka/broker.sh"

KAFKA_VERSION="$(sed -n 's:.*<kafka\.version>\([^<]*\)</kafka\.version>.*:\1:p' "${POM}" | head -n 1)"
CACHE_DIR="${REPO_ROOT}/.cache/kafka"
LIBS_DIR="${CACHE_DIR}/${KAFKA_VERSION}/libs"
LIBS_MARKER_NAME=".lockgate-libs-complete"
DATA_MARKER_NAME=".lockgate-kafka-data"

PORT="${LOCKGATE_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${LOCKGATE_KAFKA_CONTROLLER_PORT:-}"
PROXY_PORT="${LOCKGATE_KAFKA_PROXY_PORT:-}"
PROXIED_PORT="${LOCKGATE_KAFKA_PROXIED_PORT:-}"
DATA_DIR="${LOCKGATE_KAFKA_DATA_DIR:-}"
HEAP="${LOCKGATE_KAFKA_HEAP:--Xms256m -Xmx512m}"
EXTRA_JAVA_OPTS="${LOCKGATE_KAFKA_JAVA_OPTS:-}"
READY_TIMEOUT="${LOCKGATE_KAFKA_READY_TIMEOUT:-90}"
STOP_TIMEOUT="${LOCKGATE_KAFKA_STOP_TIMEOUT:-20}"
FRESH="${LOCKGATE_KAFKA_FRESH:-0}"
MVN="${LOCKGATE_MVN:-mvn}"
SECURITY="${LOCKGATE_KAFKA_SECURITY:-plaintext}"
ADMIN_USER="${LOCKGATE_KAFKA_ADMIN_USER:-admin}"
LOCK_FD=""

usage() {
  cat <<EOF
Usage: ${PROG} <command> [--fresh]

Single-node Apache Kafka ${KAFKA_VERSION} (KRaft, broker+controller in one JVM)
listening on 127.0.0.1 only, for lockgate development and tests.

Commands:
  fetch        Resolve the broker jars with Maven into
               .cache/kafka/${KAFKA_VERSION}/libs (skipped when already complete);
               prints that directory on stdout.
  up [--fresh] Start the broker in the background (no-op if it already runs on
               this port) and return once it is ready for transactions; prints
               the bootstrap address (127.0.0.1:PORT) on stdout.
               --fresh wipes the data directory first (same as LOCKGATE_KAFKA_FRESH=1).
  down         Stop the broker on this port (SIGTERM, SIGKILL after the stop
               timeout). Succeeds if it is not running.
  status       Exit 0 if the broker on this port runs and accepts connections.
  help, --help Show this help.

Environment:
  LOCKGATE_KAFKA_PORT             client port (default 9092)
  LOCKGATE_KAFKA_CONTROLLER_PORT  KRaft controller port (default PORT+1)
  LOCKGATE_KAFKA_PROXY_PORT       off by default. When set, a second listener, PROXIED,
                                  is bound to 127.0.0.1:PROXIED_PORT and advertised as
                                  127.0.0.1:PROXY_PORT, for a TCP (fault) proxy listening
                                  on PROXY_PORT and forwarding to PROXIED_PORT: clients
                                  bootstrapping through the proxy keep all their traffic
                                  on it (tests/chaos/test_network_faults.py)
  LOCKGATE_KAFKA_PROXIED_PORT     broker-side port of that listener (default PORT+2;
                                  only used with LOCKGATE_KAFKA_PROXY_PORT)
  LOCKGATE_KAFKA_SECURITY         plaintext (default) or sasl_ssl: the client listener is
                                  SASL_SSL (SCRAM-SHA-512) with TLS from a CA and broker
                                  certificate made at the first start (openssl + keytool,
                                  in DATA_DIR/security), the controller listener needs the
                                  broker's certificate, and the StandardAuthorizer denies
                                  what no ACL allows (allow.everyone.if.no.acl.found=false).
                                  Super users: the admin and the broker. DATA_DIR/security
                                  holds ca.pem and admin.json (librdkafka settings of the
                                  admin). Not combinable with LOCKGATE_KAFKA_PROXY_PORT.
  LOCKGATE_KAFKA_ADMIN_USER       sasl_ssl: the SCRAM super user made at format time
                                  (default admin); its password is random, made at the
                                  first start, in DATA_DIR/security/admin.password
  LOCKGATE_KAFKA_DATA_DIR         data dir (default <repo>/.cache/kafka/data-PORT);
                                  holds server.properties, server.log, broker.pid
  LOCKGATE_KAFKA_HEAP             JVM heap flags (default "-Xms256m -Xmx512m")
  LOCKGATE_KAFKA_JAVA_OPTS        extra JVM flags (default none)
  LOCKGATE_KAFKA_FRESH=1          like 'up --fresh'
  LOCKGATE_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS
                                  group.initial.rebalance.delay.ms (default 0)
  LOCKGATE_KAFKA_READY_TIMEOUT    seconds 'up' waits for readiness (default 90)
  LOCKGATE_KAFKA_STOP_TIMEOUT     seconds 'down' waits before SIGKILL (default 20)
  LOCKGATE_KAFKA_PYTHON           python with confluent_kafka for the readiness
                                  check (default <repo>/.venv/bin/python; "none"
                                  = only wait for the log line + TCP)
  LOCKGATE_MVN                    Maven command (default mvn)
  JAVA_HOME                       if set, \$JAVA_HOME/bin/java is used
EOF
}

log() { printf '%s: %s\n' "${PROG}" "$*" >&2; }
die() {
  printf '%s: error: %s\n' "${PROG}" "$*" >&2
  exit 1
}

is_port_number() { [[ "$1" =~ ^[0-9]+$ ]] && (("$1" >= 1 && "$1" <= 65535)); }

resolve_settings() {
  [[ -n "${KAFKA_VERSION}" ]] || die "cannot read <kafka.version> from ${POM}"
  is_port_number "${PORT}" || die "LOCKGATE_KAFKA_PORT='${PORT}' is not a TCP port number"
  if [[ -z "${CONTROLLER_PORT}" ]]; then
    CONTROLLER_PORT=$((PORT + 1))
  fi
  is_port_number "${CONTROLLER_PORT}" ||
    die "controller port '${CONTROLLER_PORT}' is not a TCP port number (set LOCKGATE_KAFKA_CONTROLLER_PORT)"
  [[ "${CONTROLLER_PORT}" != "${PORT}" ]] || die "controller port must differ from the client port ${PORT}"
  LISTEN_PORTS=("${PORT}" "${CONTROLLER_PORT}")
  case "${SECURITY}" in
    plaintext) ;;
    sasl_ssl)
      [[ -z "${PROXY_PORT}" ]] || die "LOCKGATE_KAFKA_SECURITY=sasl_ssl does not combine with LOCKGATE_KAFKA_PROXY_PORT"
      [[ "${ADMIN_USER}" =~ ^[A-Za-z0-9_.-]+$ ]] ||
        die "LOCKGATE_KAFKA_ADMIN_USER='${ADMIN_USER}' must be letters, digits, '_', '.' or '-'"
      ;;
    *) die "LOCKGATE_KAFKA_SECURITY must be plaintext or sasl_ssl (got '${SECURITY}')" ;;
  esac
  PROXY_ARGS=()
  if [[ -n "${PROXY_PORT}" ]]; then
    is_port_number "${PROXY_PORT}" || die "LOCKGATE_KAFKA_PROXY_PORT='${PROXY_PORT}' is not a TCP port number"
    [[ -n "${PROXIED_PORT}" ]] || PROXIED_PORT=$((PORT + 2))
    is_port_number "${PROXIED_PORT}" ||
      die "proxied listener port '${PROXIED_PORT}' is not a TCP port number (set LOCKGATE_KAFKA_PROXIED_PORT)"
    local p seen=" "
    for p in "${PORT}" "${CONTROLLER_PORT}" "${PROXIED_PORT}" "${PROXY_PORT}"; do
      [[ "${seen}" != *" ${p} "* ]] ||
        die "client, controller, proxied and proxy ports must all differ (got ${PORT}, ${CONTROLLER_PORT}, ${PROXIED_PORT}, ${PROXY_PORT})"
      seen+="${p} "
    done
    LISTEN_PORTS+=("${PROXIED_PORT}")
    PROXY_ARGS=("${PROXIED_PORT}" "${PROXY_PORT}")
  elif [[ -n "${PROXIED_PORT}" ]]; then
    die "LOCKGATE_KAFKA_PROXIED_PORT needs LOCKGATE_KAFKA_PROXY_PORT (the port the proxy listens on)"
  fi
  if [[ -z "${DATA_DIR}" ]]; then
    DATA_DIR="${CACHE_DIR}/data-${PORT}"
  fi
  case "${DATA_DIR}" in
    /*) ;;
    *) DATA_DIR="${PWD}/${DATA_DIR}" ;;
  esac
  DATA_DIR="${DATA_DIR%/}"
  [[ -n "${DATA_DIR}" ]] || die "LOCKGATE_KAFKA_DATA_DIR must not be /"
  PID_FILE="${DATA_DIR}/broker.pid"
  LOG_FILE="${DATA_DIR}/server.log"
  PROPS_FILE="${DATA_DIR}/server.properties"
  LOG_DIRS="${DATA_DIR}/kraft-logs"
  SECURITY_DIR="${DATA_DIR}/security"
  BOOTSTRAP="127.0.0.1:${PORT}"
}

# ---------------------------------------------------------------- prerequisites

find_java() {
  if [[ -n "${JAVA_HOME:-}" && -x "${JAVA_HOME}/bin/java" ]]; then
    JAVA="${JAVA_HOME}/bin/java"
  elif command -v java >/dev/null 2>&1; then
    JAVA="$(command -v java)"
  else
    die "java not found: install a Java 17+ runtime (e.g. openjdk-17-jre-headless) or set JAVA_HOME"
  fi
  local line version major
  line="$("${JAVA}" -version 2>&1 | head -n 1)" || true
  version="$(printf '%s\n' "${line}" | sed -n 's/.*version "\([^"]*\)".*/\1/p')"
  if [[ "${version}" == 1.* ]]; then
    major="$(printf '%s' "${version}" | cut -d. -f2)"
  else
    major="${version%%[.+-]*}"
  fi
  [[ "${major}" =~ ^[0-9]+$ ]] || die "cannot determine the Java version of ${JAVA} (got: ${line:-nothing})"
  ((major >= 17)) || die "Java ${version} at ${JAVA} is too old: Kafka ${KAFKA_VERSION} needs Java 17 or newer"
}

with_lock() {
  # with_lock LOCKFILE CMD...: run CMD holding an exclusive flock (when available).
  local lockfile="$1"
  shift
  if command -v flock >/dev/null 2>&1; then
    exec {LOCK_FD}>"${lockfile}"
    flock "${LOCK_FD}"
    local rc=0
    "$@" || rc=$?
    exec {LOCK_FD}>&-
    LOCK_FD=""
    return "${rc}"
  fi
  "$@"
}

libs_complete() {
  local want
  want="$(pom_checksum)"
  [[ -f "${LIBS_DIR}/${LIBS_MARKER_NAME}" ]] &&
    [[ "$(cat "${LIBS_DIR}/${LIBS_MARKER_NAME}")" == "${want}" ]]
}

pom_checksum() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "${POM}" | cut -d' ' -f1
  else
    shasum -a 256 "${POM}" | cut -d' ' -f1
  fi
}

resolve_libs_locked() {
  libs_complete && return 0
  command -v "${MVN}" >/dev/null 2>&1 ||
    die "Maven ('${MVN}') not found: install Maven 3.6+ (e.g. apt-get install maven) or set LOCKGATE_MVN"
  local version_dir tmp mvn_log
  version_dir="$(dirname -- "${LIBS_DIR}")"
  tmp="${version_dir}/libs.tmp.$$"
  mvn_log="${version_dir}/mvn.log"
  rm -rf -- "${tmp}"
  log "resolving Kafka ${KAFKA_VERSION} jars with Maven (first run downloads ~40 MB)..."
  if ! "${MVN}" -q -B -f "${POM}" \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DincludeScope=runtime -DexcludeTypes=pom -DoutputDirectory="${tmp}" >"${mvn_log}" 2>&1; then
    rm -rf -- "${tmp}"
    tail -n 40 "${mvn_log}" >&2 || true
    die "Maven could not resolve the Kafka ${KAFKA_VERSION} jars (full output: ${mvn_log})"
  fi
  compgen -G "${tmp}/kafka_2.13-${KAFKA_VERSION}.jar" >/dev/null ||
    die "Maven finished but ${tmp} has no kafka_2.13-${KAFKA_VERSION}.jar (see ${mvn_log})"
  pom_checksum >"${tmp}/${LIBS_MARKER_NAME}"
  rm -rf -- "${LIBS_DIR}"
  mv -- "${tmp}" "${LIBS_DIR}"
  log "jars ready in ${LIBS_DIR} ($(find "${LIBS_DIR}" -name '*.jar' | wc -l | tr -d ' ') jars)"
}

ensure_libs() {
  libs_complete && return 0
  mkdir -p -- "$(dirname -- "${LIBS_DIR}")"
  with_lock "$(dirname -- "${LIBS_DIR}")/.fetch.lock" resolve_libs_locked
}

# ---------------------------------------------------------------- process helpers

# pid_alive PID: the process exists and is not a zombie (a broker that died
# while this script, its parent, still runs stays a zombie until we exit).
pid_alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local state=""
  if [[ -r "/proc/$1/stat" ]]; then
    state="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" || true
  else
    state="$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" || true
  fi
  [[ "${state}" != Z ]]
}

pid_cmdline() {
  local pid="$1"
  if [[ -r "/proc/${pid}/cmdline" ]]; then
    tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null || true
  else
    ps -o args= -p "${pid}" 2>/dev/null || true
  fi
}

# Prints the pid of the broker we started for this data dir, if it is alive.
broker_pid() {
  [[ -f "${PID_FILE}" ]] || return 1
  local pid
  pid="$(tr -dc '0-9' <"${PID_FILE}")"
  [[ -n "${pid}" ]] || return 1
  pid_alive "${pid}" || return 1
  # Guard against pid reuse: it must be our kafka.Kafka with our properties file.
  local cmd
  cmd="$(pid_cmdline "${pid}")"
  [[ "${cmd}" == *kafka.Kafka* && "${cmd}" == *"${PROPS_FILE}"* ]] || return 1
  printf '%s\n' "${pid}"
}

tcp_open() {
  # tcp_open HOST PORT: true if something accepts TCP connections there.
  # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

port_in_use() {
  local port="$1"
  if command -v ss >/dev/null 2>&1; then
    [[ -n "$(ss -Hltn "sport = :${port}" 2>/dev/null)" ]] && return 0
  fi
  tcp_open 127.0.0.1 "${port}"
}

port_owner() {
  local port="$1" out=""
  if command -v ss >/dev/null 2>&1; then
    out="$(ss -Hltnp "sport = :${port}" 2>/dev/null | head -n 1 | sed -n 's/.*users:(\(.*\))$/\1/p')"
  fi
  printf '%s' "${out:-unknown process}"
}

print_log_tail() {
  if [[ -f "${LOG_FILE}" ]]; then
    printf -- '----- last 40 lines of %s -----\n' "${LOG_FILE}" >&2
    tail -n 40 "${LOG_FILE}" >&2 || true
    printf -- '----- end of %s -----\n' "${LOG_FILE}" >&2
  fi
}

# ---------------------------------------------------------------- broker config

new_cluster_id() {
  # Kafka's Uuid: 16 random bytes, URL-safe base64 without padding, not starting with '-'.
  local id=""
  while [[ ${#id} -ne 22 || "${id}" == -* ]]; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
  done
  printf '%s\n' "${id}"
}

write_properties() {
  local -a security_env=(KAFKA_SECURITY="${SECURITY}")
  if [[ "${SECURITY}" == sasl_ssl ]]; then
    security_env+=(KAFKA_SECURITY_DIR="${SECURITY_DIR}"
      KAFKA_STORE_PASSWORD="$(cat "${SECURITY_DIR}/store.password")"
      KAFKA_ADMIN_USER="${ADMIN_USER}" KAFKA_ADMIN_PASSWORD="$(cat "${SECURITY_DIR}/admin.password")")
  fi
  (
    umask 077 # sasl_ssl: the file holds the admin's and the key stores' passwords
    {
      printf '# Generated by %s on each %s; edit docker/kafka/server-properties.sh, not this file.\n' "${PROG}" "'up'"
      env "${security_env[@]}" "${SCRIPT_DIR}/server-properties.sh" "${PORT}" "${CONTROLLER_PORT}" \
        "${LOG_DIRS}" "${PROXY_ARGS[@]}"
    } >"${PROPS_FILE}"
  )
}

random_secret() { head -c 18 /dev/urandom | base64 | tr '+/' 'Ab' | tr -d '=\n'; }

# make_security: sasl_ssl only. Once per data dir (kept across restarts, --fresh makes new
# ones): a CA, the broker's key and certificate signed by it (SAN IP:127.0.0.1 and
# localhost, CN=lockgate-broker: its principal on the controller listener), the key store
# and trust store (PKCS12, keytool), the admin's password, and admin.json: the librdkafka
# settings of the admin (tests and tools read it; the readiness check uses it).
make_security() {
  [[ "${SECURITY}" == sasl_ssl ]] || return 0
  if [[ -f "${SECURITY_DIR}/admin.json" ]]; then
    return 0
  fi
  command -v openssl >/dev/null 2>&1 || die "openssl not found (needed by LOCKGATE_KAFKA_SECURITY=sasl_ssl)"
  local keytool="keytool"
  if [[ -x "$(dirname -- "${JAVA}")/keytool" ]]; then
    keytool="$(dirname -- "${JAVA}")/keytool"
  fi
  command -v "${keytool}" >/dev/null 2>&1 || die "keytool not found next to ${JAVA} (needed by LOCKGATE_KAFKA_SECURITY=sasl_ssl)"
  local dir="${SECURITY_DIR}" tmp="${SECURITY_DIR}.tmp.$$" out
  rm -rf -- "${tmp}"
  mkdir -m 700 -p -- "${tmp}"
  log "making a CA, the broker certificate and the admin credentials in ${dir}"
  random_secret >"${tmp}/store.password"
  if [[ -n "${LOCKGATE_KAFKA_ADMIN_PASSWORD:-}" ]]; then
    printf '%s' "${LOCKGATE_KAFKA_ADMIN_PASSWORD}" >"${tmp}/admin.password"
  else
    random_secret >"${tmp}/admin.password"
  fi
  local store_pw
  store_pw="$(cat "${tmp}/store.password")"
  if ! out="$(
    set -e
    cd -- "${tmp}"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 30 -subj "/CN=lockgate-test-ca" \
      -keyout ca.key -out ca.pem 2>&1
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=lockgate-broker" \
      -keyout broker.key -out broker.csr 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >broker.ext
    openssl x509 -req -sha256 -days 30 -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
      -extfile broker.ext -out broker.pem 2>&1
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker \
      -passout "pass:${store_pw}" -out broker.p12 2>&1
    "${keytool}" -importcert -noprompt -alias ca -file ca.pem -storetype PKCS12 \
      -keystore truststore.p12 -storepass "${store_pw}" 2>&1
    rm -f broker.csr broker.ext ca.srl
  )"; then
    printf '%s\n' "${out}" >&2
    rm -rf -- "${tmp}"
    die "making the TLS material in ${tmp} failed"
  fi
  printf '{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "%s", "sasl.password": "%s", "ssl.ca.location": "%s"}\n' \
    "${ADMIN_USER}" "$(cat "${tmp}/admin.password")" "${dir}/ca.pem" >"${tmp}/admin.json"
  chmod 600 -- "${tmp}"/*
  chmod 644 -- "${tmp}/ca.pem"
  rm -rf -- "${dir}"
  mv -- "${tmp}" "${dir}"
}

format_storage() {
  if [[ -f "${LOG_DIRS}/meta.properties" ]]; then
    return 0
  fi
  local cluster_id out
  local -a scram_args=()
  if [[ "${SECURITY}" == sasl_ssl ]]; then
    # SCRAM credentials in the first metadata records: the admin can authenticate as soon
    # as the broker listens (and the broker itself, which uses it between its listeners).
    scram_args=(--add-scram "SCRAM-SHA-512=[name=${ADMIN_USER},password=$(cat "${SECURITY_DIR}/admin.password")]")
  fi
  cluster_id="$(new_cluster_id)"
  log "formatting ${LOG_DIRS} (cluster id ${cluster_id})"
  if ! out="$("${JAVA}" -Xmx256m -Dlog4j2.configurationFile="${LOG4J_CONFIG}" -cp "${LIBS_DIR}/*" \
    kafka.tools.StorageTool format --config "${PROPS_FILE}" --cluster-id "${cluster_id}" \
    --ignore-formatted "${scram_args[@]}" 2>&1)"; then
    printf '%s\n' "${out}" >&2
    die "formatting the Kafka storage in ${LOG_DIRS} failed"
  fi
}

# ---------------------------------------------------------------- readiness

find_python() {
  local candidate
  [[ "${LOCKGATE_KAFKA_PYTHON:-}" != none ]] || return 1
  for candidate in "${LOCKGATE_KAFKA_PYTHON:-}" "${REPO_ROOT}/.venv/bin/python"; do
    [[ -n "${candidate}" && -x "${candidate}" ]] || continue
    if "${candidate}" -c 'import confluent_kafka' >/dev/null 2>&1; then
      printf '%s\n' "${candidate}"
      return 0
    fi
  done
  return 1
}

# Proves the broker serves metadata, the group coordinator (OffsetFetch; creates
# __consumer_offsets) and the transaction coordinator (init_transactions on a
# throwaway transactional producer; creates __transaction_state).
# The group step uses Consumer.committed(), not AdminClient
# list_consumer_group_offsets(): with confluent-kafka/librdkafka 2.16 the latter
# intermittently segfaults against a broker whose __consumer_offsets does not
# exist yet.
READINESS_PY='
import sys, time
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

bootstrap, budget = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + budget
base = {"bootstrap.servers": bootstrap, "log_level": 0}
if len(sys.argv) > 3:  # sasl_ssl: the admin client settings (a JSON file)
    import json
    with open(sys.argv[3]) as f:
        base.update(json.load(f))

def left():
    return max(1.0, deadline - time.monotonic())

def retry(what, fn):
    last = None
    while time.monotonic() < deadline:
        try:
            return fn()
        except KafkaException as exc:
            last = exc
            time.sleep(0.25)
    sys.exit("readiness: %s did not succeed within %.0fs: %s" % (what, budget, last))

md = retry("metadata request", lambda: AdminClient(base).list_topics(timeout=left()))
if not md.brokers:
    sys.exit("readiness: metadata response lists no brokers")

consumer = Consumer(dict(base, **{"group.id": "lockgate-broker-readiness",
                                  "enable.auto.commit": False}))
probe = [TopicPartition("lockgate-broker-readiness", 0)]
retry("group coordinator (OffsetFetch)", lambda: consumer.committed(probe, timeout=min(10.0, left())))
consumer.close()

producer = Producer(dict(base, **{"transactional.id": "lockgate-broker-readiness",
                                  "transaction.timeout.ms": 10000}))
retry("init_transactions", lambda: producer.init_transactions(min(30.0, left())))
'

# wait_ready PID: returns 0 once the broker is ready; on failure prints why
# (with the tail of server.log) and returns 1.
wait_ready() {
  local pid="$1" deadline=$((SECONDS + READY_TIMEOUT))
  local started=0
  while :; do
    if ! pid_alive "${pid}"; then
      print_log_tail
      log "error: the Kafka broker (pid ${pid}) exited during startup"
      return 1
    fi
    if ((started == 0)) && grep -q 'Kafka Server started' "${LOG_FILE}" 2>/dev/null; then
      started=1
    fi
    if ((started == 1)) && tcp_open 127.0.0.1 "${PORT}"; then
      break
    fi
    if ((SECONDS >= deadline)); then
      print_log_tail
      log "error: the Kafka broker (pid ${pid}) was not ready within ${READY_TIMEOUT}s (log: ${LOG_FILE})"
      return 1
    fi
    sleep 0.25
  done

  local python
  if python="$(find_python)"; then
    local budget=$((deadline - SECONDS)) out rc=0
    ((budget >= 10)) || budget=10
    local -a client_conf=()
    [[ "${SECURITY}" != sasl_ssl ]] || client_conf=("${SECURITY_DIR}/admin.json")
    out="$(timeout $((budget + 5)) "${python}" -c "${READINESS_PY}" "${BOOTSTRAP}" "${budget}" \
      "${client_conf[@]}" 2>&1)" || rc=$?
    if ((rc != 0)); then
      print_log_tail
      [[ -z "${out}" ]] || printf '%s\n' "${out}" >&2
      log "error: the Kafka broker on ${BOOTSTRAP} accepts connections but is not ready for" \
        "transactions (readiness check with ${python} exited with status ${rc})"
      return 1
    fi
  else
    [[ "${LOCKGATE_KAFKA_PYTHON:-}" == none ]] ||
      log "no python with confluent_kafka found (.venv/bin/python or LOCKGATE_KAFKA_PYTHON);" \
        "readiness checked by log line + TCP only"
  fi
}

# ---------------------------------------------------------------- commands

ensure_data_dir() {
  if [[ -d "${DATA_DIR}" && ! -f "${DATA_DIR}/${DATA_MARKER_NAME}" ]] &&
    [[ -n "$(ls -A -- "${DATA_DIR}")" ]]; then
    die "${DATA_DIR} exists, is not empty and was not created by ${PROG}; choose another LOCKGATE_KAFKA_DATA_DIR"
  fi
  mkdir -p -- "${DATA_DIR}"
  : >"${DATA_DIR}/${DATA_MARKER_NAME}"
}

wipe_data_dir() {
  [[ -d "${DATA_DIR}" ]] || return 0
  if [[ ! -f "${DATA_DIR}/${DATA_MARKER_NAME}" && -n "$(ls -A -- "${DATA_DIR}")" ]]; then
    die "refusing to wipe ${DATA_DIR}: it was not created by ${PROG}"
  fi
  log "wiping ${DATA_DIR}"
  rm -rf -- "${DATA_DIR}"
}

stop_broker() {
  local pid
  pid="$(broker_pid)" || {
    rm -f -- "${PID_FILE}"
    return 0
  }
  log "stopping Kafka broker on ${BOOTSTRAP} (pid ${pid})"
  kill -TERM "${pid}" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while pid_alive "${pid}" && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if pid_alive "${pid}"; then
    log "broker pid ${pid} still running after ${STOP_TIMEOUT}s; sending SIGKILL"
    kill -KILL "${pid}" 2>/dev/null || true
    while pid_alive "${pid}"; do
      sleep 0.1
    done
  fi
  rm -f -- "${PID_FILE}"
}

cmd_up_locked() {
  local pid
  if [[ "${FRESH}" == 1 ]]; then
    stop_broker
    wipe_data_dir
  elif pid="$(broker_pid)"; then
    log "Kafka broker already running on ${BOOTSTRAP} (pid ${pid})"
    wait_ready "${pid}" || die "the running broker on ${BOOTSTRAP} is not ready; try 'down' then 'up'"
    printf '%s\n' "${BOOTSTRAP}"
    return 0
  fi

  local port
  for port in "${LISTEN_PORTS[@]}"; do
    if port_in_use "${port}"; then
      die "port ${port} on this machine is already in use by $(port_owner "${port}"), not by a broker started by ${PROG} for ${DATA_DIR}; pick another LOCKGATE_KAFKA_PORT (controller port = LOCKGATE_KAFKA_CONTROLLER_PORT, default PORT+1)"
    fi
  done

  ensure_data_dir
  rm -f -- "${PID_FILE}"
  make_security
  write_properties
  format_storage
  if [[ -f "${LOG_FILE}" ]]; then
    mv -f -- "${LOG_FILE}" "${LOG_FILE}.1"
  fi

  local -a heap_opts extra_opts=() java_cmd
  read -r -a heap_opts <<<"${HEAP}"
  if [[ -n "${EXTRA_JAVA_OPTS}" ]]; then
    read -r -a extra_opts <<<"${EXTRA_JAVA_OPTS}"
  fi
  java_cmd=("${JAVA}" "${heap_opts[@]}"
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError
    -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=${LOG4J_CONFIG}"
    "-Dkafka.logs.dir=${DATA_DIR}"
    "${extra_opts[@]}"
    -cp "${LIBS_DIR}/*" kafka.Kafka "${PROPS_FILE}")

  local proxied=""
  [[ -z "${PROXY_PORT}" ]] ||
    proxied=", proxied listener 127.0.0.1:${PROXIED_PORT} advertised as 127.0.0.1:${PROXY_PORT}"
  local secured=""
  [[ "${SECURITY}" != sasl_ssl ]] || secured="SASL_SSL with ACLs, admin settings in ${SECURITY_DIR}/admin.json, "
  log "starting Kafka ${KAFKA_VERSION} on ${BOOTSTRAP} (${secured}controller 127.0.0.1:${CONTROLLER_PORT}${proxied}, data ${DATA_DIR})"
  # New session (setsid) so Ctrl-C in the caller's terminal does not reach the
  # broker; the inner shell records its own pid, then execs java with that pid.
  # stdio is detached so callers capturing our output do not wait on the broker,
  # and the lock fd is closed so the broker does not hold our lock.
  # shellcheck disable=SC2016 # expanded by the inner sh
  local -a launcher=(sh -c 'echo "$$" >"$1"; shift; exec "$@"' sh "${PID_FILE}" "${java_cmd[@]}")
  if command -v setsid >/dev/null 2>&1; then
    launcher=(setsid "${launcher[@]}")
  fi
  if [[ -n "${LOCK_FD:-}" ]]; then
    "${launcher[@]}" </dev/null >>"${LOG_FILE}" 2>&1 {LOCK_FD}>&- &
  else
    "${launcher[@]}" </dev/null >>"${LOG_FILE}" 2>&1 &
  fi
  local deadline=$((SECONDS + 10))
  while [[ ! -s "${PID_FILE}" ]] && ((SECONDS < deadline)); do
    sleep 0.05
  done
  [[ -s "${PID_FILE}" ]] || die "the broker process did not start (no ${PID_FILE})"
  pid="$(tr -dc '0-9' <"${PID_FILE}")"
  if ! wait_ready "${pid}"; then
    stop_broker >/dev/null 2>&1 || true
    die "could not start Kafka on ${BOOTSTRAP}; the broker was stopped (log kept in ${LOG_FILE})"
  fi
  log "Kafka broker ready on ${BOOTSTRAP} (pid ${pid}, log ${LOG_FILE})"
  printf '%s\n' "${BOOTSTRAP}"
}

cmd_up() {
  find_java
  ensure_libs
  mkdir -p -- "$(dirname -- "${DATA_DIR}")"
  with_lock "${DATA_DIR}.lock" cmd_up_locked
}

cmd_down() {
  [[ -f "${PID_FILE}" ]] || return 0
  with_lock "${DATA_DIR}.lock" stop_broker
}

cmd_status() {
  local pid
  if ! pid="$(broker_pid)"; then
    echo "not running (no broker started by ${PROG} for ${DATA_DIR})"
    return 1
  fi
  if ! tcp_open 127.0.0.1 "${PORT}"; then
    echo "running (pid ${pid}) but ${BOOTSTRAP} does not accept connections"
    return 1
  fi
  local proxied=""
  [[ -z "${PROXY_PORT}" ]] ||
    proxied=", proxied listener 127.0.0.1:${PROXIED_PORT} advertised as 127.0.0.1:${PROXY_PORT}"
  echo "running: pid ${pid}, bootstrap ${BOOTSTRAP}, controller 127.0.0.1:${CONTROLLER_PORT}${proxied}, data ${DATA_DIR}"
}

cmd_fetch() {
  ensure_libs
  printf '%s\n' "${LIBS_DIR}"
}

main() {
  local cmd="${1:-}"
  [[ $# -gt 0 ]] && shift
  case "${cmd}" in
    -h | --help | help)
      usage
      return 0
      ;;
    "")
      usage >&2
      return 2
      ;;
  esac
  local arg
  for arg in "$@"; do
    case "${arg}" in
      --fresh) FRESH=1 ;;
      -h | --help)
        usage
        return 0
        ;;
      *) die "unknown argument '${arg}' (see --help)" ;;
    esac
  done
  if [[ "${FRESH}" != 0 && "${FRESH}" != 1 ]]; then
    die "LOCKGATE_KAFKA_FRESH must be 0 or 1 (got '${FRESH}')"
  fi
  [[ "${FRESH}" == 0 || "${cmd}" == up ]] || die "--fresh only applies to 'up'"
  resolve_settings
  case "${cmd}" in
    fetch) cmd_fetch ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) die "unknown command '${cmd}' (see --help)" ;;
  esac
}

main "$@"

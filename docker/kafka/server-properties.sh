#!/usr/bin/env bash
# Prints the server.properties of lockgate's single-node KRaft broker.
# One source for the dev/test broker (broker.sh) and the Kafka image (entrypoint.sh).
# Usage: server-properties.sh PORT CONTROLLER_PORT LOG_DIRS [PROXIED_PORT PROXY_PORT]
#
# With PROXIED_PORT and PROXY_PORT the broker gets a second listener, PROXIED, bound to
# 127.0.0.1:PROXIED_PORT but advertised as 127.0.0.1:PROXY_PORT: a TCP proxy listening on
# PROXY_PORT and forwarding to PROXIED_PORT sees all traffic of the clients that bootstrap
# through it, because the metadata they get back names the proxy, not the broker (used by
# tests/chaos/test_network_faults.py). Without them the output is unchanged.
#
# With KAFKA_SECURITY=sasl_ssl in the environment (set by broker.sh for LOCKGATE_KAFKA_SECURITY)
# the client listener is SASL_SSL (SCRAM-SHA-512, also used between the broker and itself
# as the admin user), the controller listener is SSL with client certificates required
# (the broker authenticates with its own certificate, CN=lockgate-broker), and the KRaft
# StandardAuthorizer denies whatever no ACL allows; super users: the admin and the broker.
# It then also needs KAFKA_SECURITY_DIR (broker.p12, truststore.p12), KAFKA_STORE_PASSWORD,
# KAFKA_ADMIN_USER and KAFKA_ADMIN_PASSWORD. Not combinable with the proxied listener.
set -euo pipefail
[[ $# -eq 3 || $# -eq 5 ]] || {
    echo "usage: $0 PORT CONTROLLER_PORT LOG_DIRS [PROXIED_PORT PROXY_PORT]" >&2
    exit 2
}
PORT=$1 CONTROLLER_PORT=$2 LOG_DIRS=$3
LISTENERS="PLAINTEXT://127.0.0.1:${PORT},CONTROLLER://127.0.0.1:${CONTROLLER_PORT}"
ADVERTISED="PLAINTEXT://127.0.0.1:${PORT}"
PROTOCOLS="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
SECURITY="${KAFKA_SECURITY:-plaintext}"
case "${SECURITY}" in
plaintext) INTER_BROKER=PLAINTEXT ;;
sasl_ssl)
    [[ $# -eq 3 ]] || {
        echo "$0: KAFKA_SECURITY=sasl_ssl does not combine with the proxied listener" >&2
        exit 2
    }
    LISTENERS="SASL_SSL://127.0.0.1:${PORT},CONTROLLER://127.0.0.1:${CONTROLLER_PORT}"
    ADVERTISED="SASL_SSL://127.0.0.1:${PORT}"
    PROTOCOLS="SASL_SSL:SASL_SSL,CONTROLLER:SSL"
    INTER_BROKER=SASL_SSL
    ;;
*)
    echo "$0: KAFKA_SECURITY must be plaintext or sasl_ssl (got '${SECURITY}')" >&2
    exit 2
    ;;
esac
if [[ $# -eq 5 ]]; then
    LISTENERS="${LISTENERS},PROXIED://127.0.0.1:$4"
    ADVERTISED="${ADVERTISED},PROXIED://127.0.0.1:$5"
    PROTOCOLS="${PROTOCOLS},PROXIED:PLAINTEXT"
fi
cat <<EOP
# Single-node KRaft: one JVM is both the broker and the only controller voter.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:${CONTROLLER_PORT}
controller.listener.names=CONTROLLER
listeners=${LISTENERS}
advertised.listeners=${ADVERTISED}
inter.broker.listener.name=${INTER_BROKER}
listener.security.protocol.map=${PROTOCOLS}

log.dirs=${LOG_DIRS}

# One broker: every replication factor and min ISR is 1 (else init_transactions hangs).
default.replication.factor=1
min.insync.replicas=1
num.partitions=1
auto.create.topics.enable=false

# Internal topics: RF 1, a single partition each so they are created fast.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1

# broker.session.timeout.ms keeps its default (9 s), though at load average 9 on 2 cores
# the controller once fenced its own broker for a late heartbeat (every partition offline
# for 2 s): a broker restarted after kill -9 can register only once its previous
# incarnation's session expired, and it gives up after 60 s (120 s made that restart fail).

# Transactions past transaction.timeout.ms are aborted within a second (default 10 s), so
# tests of slow user code see the coordinator's abort at a predictable time.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000

# Groups: no join delay (LOCKGATE_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS, e.g. Kafka's own
# 3000 for a benchmark whose instances must join one group before reading), and allow the
# short session timeouts tests use.
group.initial.rebalance.delay.ms=${LOCKGATE_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS:-0}
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=3000
group.consumer.min.heartbeat.interval.ms=1000
group.share.min.session.timeout.ms=3000
group.share.min.heartbeat.interval.ms=1000

# Small machine: small log-cleaner buffer (on heap) and fewer threads.
log.cleaner.dedupe.buffer.size=16777216
num.network.threads=2
num.io.threads=4
EOP
if [[ "${SECURITY}" == sasl_ssl ]]; then
    cat <<EOP

# SASL_SSL clients (SCRAM-SHA-512), mutual TLS on the controller listener, ACLs enforced.
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="${KAFKA_ADMIN_USER}" password="${KAFKA_ADMIN_PASSWORD}";
ssl.keystore.type=PKCS12
ssl.keystore.location=${KAFKA_SECURITY_DIR}/broker.p12
ssl.keystore.password=${KAFKA_STORE_PASSWORD}
ssl.key.password=${KAFKA_STORE_PASSWORD}
ssl.truststore.type=PKCS12
ssl.truststore.location=${KAFKA_SECURITY_DIR}/truststore.p12
ssl.truststore.password=${KAFKA_STORE_PASSWORD}
listener.name.controller.ssl.client.auth=required
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:${KAFKA_ADMIN_USER};User:CN=lockgate-broker
EOP
fi

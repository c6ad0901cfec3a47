{{/*
Chart name, truncated to 63 characters (the DNS label limit).
*/}}
{{- define "lockgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources: "<release>-<chart>", or the release name when it already
contains the chart name. Truncated to 52 characters so that pod names ("<fullname>-<ordinal>"),
the StatefulSet's controller-revision-hash label and "data-<fullname>-<ordinal>" claims stay
within the 63-character label limit.
*/}}
{{- define "lockgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "lockgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "lockgate.labels" -}}
helm.sh/chart: {{ include "lockgate.chart" . }}
{{ include "lockgate.selectorLabels" . }}
app.kubernetes.io/version: {{ include "lockgate.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: processor
app.kubernetes.io/part-of: lockgate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: stable for the life of the release (a StatefulSet selector is immutable).
*/}}
{{- define "lockgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the ServiceAccount the pods use.
*/}}
{{- define "lockgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lockgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image tag: image.tag, else the chart's appVersion.
*/}}
{{- define "lockgate.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
Image reference: repository@digest when image.digest is set, else repository:tag.
*/}}
{{- define "lockgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "lockgate.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
Name of the headless Service that governs the StatefulSet.
*/}}
{{- define "lockgate.headlessServiceName" -}}
{{- printf "%s-headless" (include "lockgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Path of the SASL password file in the container (LOCKGATE_SASL_PASSWORD_FILE): the Secret's
password key, mounted as the file "password" of the kafka-sasl volume at kafka.sasl.mountPath.
*/}}
{{- define "lockgate.saslPasswordFile" -}}
{{- printf "%s/password" (.Values.kafka.sasl.mountPath | trimSuffix "/") }}
{{- end }}

{{/*
URL template of the peers' HTTP port (LOCKGATE_QUERY_PEER_URL): the pod DNS name
<pod>.<headless service>.<namespace>.svc, with the runtime's literal {instance} placeholder for
the pod name (the instance id). Single braces are no template syntax: they render as written.
*/}}
{{- define "lockgate.queryPeerUrl" -}}
{{- printf "http://{instance}.%s.%s.svc:%d" (include "lockgate.headlessServiceName" .) .Release.Namespace (int64 .Values.httpPort) }}
{{- end }}

{{/*
State directory inside the container (LOCKGATE_STATE_DIR).
*/}}
{{- define "lockgate.stateDir" -}}
{{- printf "%s/state" (.Values.persistence.mountPath | trimSuffix "/") }}
{{- end }}

{{/*
Effective librdkafka security.protocol: kafka.config's own value when set, else SASL_SSL with
SASL, SSL with only TLS, and nothing (librdkafka's PLAINTEXT) without either.
*/}}
{{- define "lockgate.securityProtocol" -}}
{{- $config := .Values.kafka.config | default dict }}
{{- if hasKey $config "security.protocol" }}
{{- index $config "security.protocol" | toString | upper }}
{{- else if .Values.kafka.sasl.existingSecret }}
{{- "SASL_SSL" }}
{{- else if .Values.kafka.tls.existingSecret }}
{{- "SSL" }}
{{- end }}
{{- end }}

{{/*
Environment variable name of a librdkafka property: LOCKGATE_KAFKA__ + the key upper-cased with
dots written as underscores (the app maps them back: processors/_config/settings.py).
*/}}
{{- define "lockgate.kafkaEnvName" -}}
{{- printf "LOCKGATE_KAFKA__%s" (. | upper | replace "." "_") }}
{{- end }}

{{/*
A value as an env string. Helm reads numbers from values files as float64, which would print
1000000 as "1e+06": integral numbers are printed as integers.
*/}}
{{- define "lockgate.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}
{{- int64 . | toString }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
The processor container's env list (YAML). Order: values the chart owns, kafka.config,
SASL/TLS, queryable state, then env and extraEnv. The StatefulSet template checks that no name
appears twice.
*/}}
{{- define "lockgate.env" -}}
- name: LOCKGATE_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: LOCKGATE_BOOTSTRAP_SERVERS
  value: {{ required "kafka.bootstrapServers is required (comma separated host:port list)" .Values.kafka.bootstrapServers | quote }}
- name: LOCKGATE_APP_NAME
  value: {{ include "lockgate.appName" . | quote }}
- name: LOCKGATE_STATE_DIR
  value: {{ include "lockgate.stateDir" . | quote }}
- name: LOCKGATE_GUARANTEE
  value: {{ .Values.processing.guarantee | quote }}
- name: LOCKGATE_CHECKPOINT_INTERVAL_MS
  value: {{ int64 .Values.processing.checkpointIntervalMs | toString | quote }}
- name: LOCKGATE_TRANSACTION_TIMEOUT_MS
  value: {{ int64 .Values.processing.transactionTimeoutMs | toString | quote }}
- name: LOCKGATE_ON_ERROR
  value: {{ .Values.processing.onError | quote }}
- name: LOCKGATE_HTTP_PORT
  value: {{ int64 .Values.httpPort | toString | quote }}
- name: LOCKGATE_LIVENESS_TIMEOUT_MS
  value: {{ int64 .Values.probes.liveness.progressTimeoutMs | toString | quote }}
- name: LOCKGATE_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
- name: LOCKGATE_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: LOCKGATE_KAFKA__SESSION_TIMEOUT_MS
  value: {{ int64 .Values.kafka.sessionTimeoutMs | toString | quote }}
{{- if dig "limits" "memory" "" (.Values.resources | default dict) }}
# The memory budget (RocksDB, read cache, consumer prefetch, epoch size) from the limit.
- name: LOCKGATE_MEMORY_LIMIT_BYTES
  valueFrom:
    resourceFieldRef:
      resource: limits.memory
{{- end }}
{{- if .Values.kafka.leaveGroupOnScaleDown }}
- name: LOCKGATE_LEAVE_GROUP_ON_STOP
  value: "scale-down"
- name: LOCKGATE_KUBERNETES_TOKEN_DIR
  value: /var/run/secrets/lockgate/kubernetes
{{- else }}
- name: LOCKGATE_LEAVE_GROUP_ON_STOP
  value: "never"
{{- end }}
{{- $config := .Values.kafka.config | default dict }}
{{- range $key := keys $config | sortAlpha }}
- name: {{ include "lockgate.kafkaEnvName" $key }}
  value: {{ include "lockgate.envValue" (index $config $key) | quote }}
{{- end }}
{{- if not (hasKey $config "security.protocol") }}
{{- with include "lockgate.securityProtocol" . }}
- name: LOCKGATE_KAFKA__SECURITY_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- with .Values.kafka.sasl }}
{{- if .existingSecret }}
- name: LOCKGATE_KAFKA__SASL_MECHANISM
  value: {{ .mechanism | quote }}
{{- if .username }}
- name: LOCKGATE_SASL_USERNAME
  value: {{ .username | quote }}
{{- else }}
- name: LOCKGATE_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ .usernameKey | quote }}
{{- end }}
{{- /* The password is a mounted file (volume kafka-sasl), read at each client creation. */}}
- name: LOCKGATE_SASL_PASSWORD_FILE
  value: {{ include "lockgate.saslPasswordFile" $ | quote }}
{{- end }}
{{- end }}
{{- with .Values.kafka.tls }}
{{- if .existingSecret }}
{{- $dir := .mountPath | trimSuffix "/" }}
- name: LOCKGATE_KAFKA__SSL_CA_LOCATION
  value: {{ printf "%s/ca.crt" $dir | quote }}
{{- if and .certKey .keyKey }}
- name: LOCKGATE_KAFKA__SSL_CERTIFICATE_LOCATION
  value: {{ printf "%s/tls.crt" $dir | quote }}
- name: LOCKGATE_KAFKA__SSL_KEY_LOCATION
  value: {{ printf "%s/tls.key" $dir | quote }}
{{- if .keyPasswordSecret }}
- name: LOCKGATE_KAFKA__SSL_KEY_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .keyPasswordSecret | quote }}
      key: {{ .keyPasswordKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- with include "lockgate.savepointDir" . }}
- name: LOCKGATE_SAVEPOINT_DIR
  value: {{ . | quote }}
{{- end }}
{{- if eq .Values.upgrade.mode "savepoint" }}
# upgrade.mode=savepoint: key groups halted by the pre-upgrade hook's stop-with-savepoint
# are restored from it by the rolled pods (no savepoint id in the release).
- name: LOCKGATE_RESUME_FROM_STOP_SAVEPOINT
  value: "true"
{{- end }}
{{- with .Values.savepoints }}
{{- if .endpointUrl }}
# The endpoint for botocore (AWS_ENDPOINT_URL, botocore >= 1.31) and for fsspec's s3fs
# (FSSPEC_S3_ENDPOINT_URL: its endpoint_url argument, whatever botocore's version).
- name: AWS_ENDPOINT_URL
  value: {{ .endpointUrl | quote }}
- name: FSSPEC_S3_ENDPOINT_URL
  value: {{ .endpointUrl | quote }}
{{- end }}
{{- if .credentials.existingSecret }}
{{- range $name := keys (.credentials.env | default dict) | sortAlpha }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.savepoints.credentials.existingSecret | quote }}
      key: {{ index $.Values.savepoints.credentials.env $name | quote }}
{{- end }}
{{- end }}
{{- end }}
- name: LOCKGATE_QUERY_ENABLED
  value: {{ .Values.query.enabled | toString | quote }}
{{- with .Values.query }}
{{- if .enabled }}
- name: LOCKGATE_QUERY_PEER_URL
  value: {{ include "lockgate.queryPeerUrl" $ | quote }}
- name: LOCKGATE_QUERY_TIMEOUT_MS
  value: {{ int64 .timeoutMs | toString | quote }}
{{- if .tokenSecret }}
- name: LOCKGATE_QUERY_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .tokenSecret | quote }}
      key: {{ .tokenKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name := keys .Values.env | sortAlpha }}
- name: {{ $name }}
  value: {{ include "lockgate.envValue" (index $.Values.env $name) | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Validations that the schema cannot express (relations between values). Renders nothing.
*/}}
{{- define "lockgate.validate" -}}
{{- $_ := required "app is required: the App object to run, as module:attribute (e.g. examples.running_sum:app)" .Values.app }}
{{- $_ := include "lockgate.appName" . }}
{{- $parts := int64 .Values.kafka.inputPartitions }}
{{- if and $parts (not .Values.autoscaling.keda.enabled) (gt (int64 .Values.replicaCount) $parts) }}
{{- fail (printf "replicaCount (%d) exceeds kafka.inputPartitions (%d): an instance beyond the input partition count owns no key group" (int64 .Values.replicaCount) $parts) }}
{{- end }}
{{- with .Values.kafka.config }}
{{- if hasKey . "heartbeat.interval.ms" }}
{{- if ge (int64 (index . "heartbeat.interval.ms")) (int64 $.Values.kafka.sessionTimeoutMs) }}
{{- fail (printf "kafka.config heartbeat.interval.ms (%d) must be lower than kafka.sessionTimeoutMs (%d)" (int64 (index . "heartbeat.interval.ms")) (int64 $.Values.kafka.sessionTimeoutMs)) }}
{{- end }}
{{- end }}
{{- end }}
{{- $p := .Values.processing }}
{{- if and (eq $p.guarantee "exactly_once") (lt (int64 $p.transactionTimeoutMs) (mul 2 (int64 $p.checkpointIntervalMs))) }}
{{- fail (printf "processing.transactionTimeoutMs (%d) must be at least twice processing.checkpointIntervalMs (%d) with exactly_once: an epoch must fit well inside a transaction (the app refuses to start otherwise)" (int64 $p.transactionTimeoutMs) (int64 $p.checkpointIntervalMs)) }}
{{- end }}
{{- $live := .Values.probes.liveness }}
{{- if and $live.enabled (le (int64 $live.progressTimeoutMs) (int64 $p.transactionTimeoutMs)) }}
{{- fail (printf "probes.liveness.progressTimeoutMs (%d) must exceed processing.transactionTimeoutMs (%d): one record may run up to the transaction timeout (then it is dead-lettered), and a liveness restart before that replays it into a crash loop" (int64 $live.progressTimeoutMs) (int64 $p.transactionTimeoutMs)) }}
{{- end }}
{{- $needMs := add (div (mul 3 (int64 $p.transactionTimeoutMs)) 2) (include "lockgate.closeBudgetMs" . | int64) }}
{{- if le (mul (int64 .Values.terminationGracePeriodSeconds) 1000) $needMs }}
{{- fail (printf "terminationGracePeriodSeconds (%d s) must exceed the stop budget, 1.5 x processing.transactionTimeoutMs + %d ms (%d ms): the batch in progress (half the transaction timeout), the final commit or the settling of an unanswered one (the transaction timeout + 10 s), then closing the consumer and flushing the producer (docs/operations.md, Stopping)" (int64 .Values.terminationGracePeriodSeconds) (include "lockgate.closeBudgetMs" . | int64) $needMs) }}
{{- end }}
{{- with .Values.kafka.tls }}
{{- if and .existingSecret (or (and .certKey (not .keyKey)) (and .keyKey (not .certKey))) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey must be set together (mutual TLS) or both be empty" }}
{{- end }}
{{- if and (not .existingSecret) (or .clientSecret .keyPasswordSecret) }}
{{- fail "kafka.tls.clientSecret and kafka.tls.keyPasswordSecret need kafka.tls.existingSecret (the Secret with the CA certificate)" }}
{{- end }}
{{- if and .clientSecret (not (and .certKey .keyKey)) }}
{{- fail "kafka.tls.clientSecret needs kafka.tls.certKey and kafka.tls.keyKey (its key names)" }}
{{- end }}
{{- if and .keyPasswordSecret (not (and .certKey .keyKey)) }}
{{- fail "kafka.tls.keyPasswordSecret needs a client certificate (kafka.tls.certKey and kafka.tls.keyKey)" }}
{{- end }}
{{- end }}
{{- if and .Values.kafka.sasl.username (not .Values.kafka.sasl.existingSecret) }}
{{- fail "kafka.sasl.username needs kafka.sasl.existingSecret (the Secret with the password)" }}
{{- end }}
{{- if and .Values.kafka.sasl.existingSecret .Values.kafka.tls.existingSecret }}
{{- $sasl := .Values.kafka.sasl.mountPath | trimSuffix "/" }}
{{- $tls := .Values.kafka.tls.mountPath | trimSuffix "/" }}
{{- if or (eq $sasl $tls) (hasPrefix (printf "%s/" $tls) $sasl) (hasPrefix (printf "%s/" $sasl) $tls) }}
{{- fail (printf "kafka.sasl.mountPath (%s) and kafka.tls.mountPath (%s) must be separate directories, neither inside the other: each is a Secret volume of its own" $sasl $tls) }}
{{- end }}
{{- end }}
{{- with .Values.savepoints }}
{{- if and .persistentVolumeClaim.enabled .location }}
{{- $mount := .persistentVolumeClaim.mountPath | trimSuffix "/" }}
{{- if not (or (eq (.location | trimSuffix "/") $mount) (hasPrefix (printf "%s/" $mount) .location)) }}
{{- fail (printf "savepoints.location (%s) must be savepoints.persistentVolumeClaim.mountPath (%s) or a path under it when the claim is enabled (or leave it empty)" .location $mount) }}
{{- end }}
{{- end }}
{{- if and .credentials.existingSecret (not .credentials.env) }}
{{- fail "savepoints.credentials.existingSecret needs savepoints.credentials.env (variable: key in the Secret)" }}
{{- end }}
{{- end }}
{{- if eq .Values.upgrade.mode "savepoint" }}
{{- $named := keys (.Values.env | default dict) }}
{{- range .Values.extraEnv }}{{ $named = append $named .name }}{{ end }}
{{- if has "LOCKGATE_FROM_SAVEPOINT" $named }}
{{- fail "upgrade.mode=savepoint with LOCKGATE_FROM_SAVEPOINT in env or extraEnv: the pods resume from the savepoint the upgrade's hook halted them at, and a savepoint id left in the release would be restored again over it at a later start. Remove it (restore from an explicit savepoint with upgrade.mode=none, then come back: docs/helm.md, Restore)" }}
{{- end }}
{{- end }}
{{- if and (or (eq .Values.upgrade.mode "savepoint") .Values.savepoints.cronJob.enabled .Values.savepoints.stopJobs.enabled) (not (include "lockgate.savepointDir" .)) }}
{{- fail "upgrade.mode=savepoint, savepoints.cronJob.enabled and savepoints.stopJobs.enabled need a savepoint location: savepoints.location (e.g. s3://bucket/prefix) or savepoints.persistentVolumeClaim.enabled" }}
{{- end }}
{{- with .Values.query }}
{{- if and .tokenSecret (not .enabled) }}
{{- fail "query.tokenSecret needs query.enabled: the token only guards GET /state, which is off" }}
{{- end }}
{{- end }}
{{- with .Values.autoscaling.keda }}
{{- if .enabled }}
{{- if gt (int64 .minReplicaCount) (int64 .maxReplicaCount) }}
{{- fail (printf "autoscaling.keda.minReplicaCount (%d) exceeds maxReplicaCount (%d)" (int64 .minReplicaCount) (int64 .maxReplicaCount)) }}
{{- end }}
{{- if not $parts }}
{{- fail "autoscaling.keda needs kafka.inputPartitions (the input partition count): maxReplicaCount must not exceed it" }}
{{- end }}
{{- if gt (int64 .maxReplicaCount) $parts }}
{{- fail (printf "autoscaling.keda.maxReplicaCount (%d) exceeds kafka.inputPartitions (%d): pods beyond the input partition count own no key group, and their restores and rebalances are for nothing" (int64 .maxReplicaCount) $parts) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The app name (LOCKGATE_APP_NAME, the consumer group id). Required: never derived from the release
name, so that two releases cannot share a group, changelogs and transactional ids by accident.
*/}}
{{- define "lockgate.appName" -}}
{{- required "appName is required: it is the consumer group id and the prefix of the app's internal topics and transactional ids; give each release its own (two releases with the same appName on one Kafka cluster fence each other)" .Values.appName }}
{{- end }}

{{/*
The fixed part of the stop budget (processors/_checkpoint/txn.py: stop_budget_s), in milliseconds: the
watchdog margin of the final transactional work (10 s), the consumer's close (10 s) and the
producer's flush (10 s), plus, with kafka.leaveGroupOnScaleDown, the StatefulSet read and the
leave (13 s).
*/}}
{{- define "lockgate.closeBudgetMs" -}}
{{- if .Values.kafka.leaveGroupOnScaleDown }}43000{{ else }}30000{{ end }}
{{- end }}

{{/*
Most replicas the app can run: maxReplicaCount under KEDA, else replicaCount.
*/}}
{{- define "lockgate.maxReplicas" -}}
{{- if .Values.autoscaling.keda.enabled }}
{{- int64 .Values.autoscaling.keda.maxReplicaCount }}
{{- else }}
{{- int64 .Values.replicaCount }}
{{- end }}
{{- end }}

{{/*
Pod annotations that roll the pods when Kafka credentials change (values-driven revision, and
with credentialRotation.lookupSecrets a checksum of the referenced Secrets' data read through
helm's lookup at install/upgrade time). Renders YAML lines, or nothing.
The SASL Secret counts whole, password included: the mounted password file reaches the clients
an instance creates after the kubelet updated it, but the consumer and producer created at
start keep the password they were given, and reconnect with it (docs/helm.md).
*/}}
{{- define "lockgate.credentialAnnotations" -}}
{{- with .Values.credentialRotation }}
{{- if .revision }}
lockgate.io/credentials-revision: {{ .revision | quote }}
{{- end }}
{{- if .lookupSecrets }}
{{- $names := list $.Values.kafka.sasl.existingSecret $.Values.kafka.tls.existingSecret $.Values.kafka.tls.clientSecret $.Values.kafka.tls.keyPasswordSecret | compact | uniq | sortAlpha }}
{{- $data := dict }}
{{- range $names }}
{{- $secret := lookup "v1" "Secret" $.Release.Namespace . }}
{{- if $secret }}
{{- $_ := set $data . ($secret.data | default dict) }}
{{- end }}
{{- end }}
{{- if $data }}
checksum/kafka-credentials: {{ toJson $data | sha256sum | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Default pod anti-affinity from podAntiAffinityPreset (unless affinity.podAntiAffinity is set).
*/}}
{{- define "lockgate.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- if and (not (hasKey $affinity "podAntiAffinity")) (ne .Values.podAntiAffinityPreset "none") }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "lockgate.selectorLabels" . | fromYaml)) }}
{{- if eq .Values.podAntiAffinityPreset "hard" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) }}
{{- else }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- end }}
{{- if $affinity }}
{{- toYaml $affinity }}
{{- end }}
{{- end }}

{{/*
KafkaTopic / resource name of a Kafka topic: lower case, characters outside [a-z0-9.-] as "-".
*/}}
{{- define "lockgate.topicResourceName" -}}
{{- regexReplaceAll "[^a-z0-9.-]" (lower .) "-" | trunc 253 | trimSuffix "-" | trimSuffix "." }}
{{- end }}

{{/*
LockgateNoCheckpoint's threshold in whole seconds: metrics.prometheusRule.noCheckpointIntervals
checkpoint intervals (processing.checkpointIntervalMs), rounded up.
*/}}
{{- define "lockgate.noCheckpointSeconds" -}}
{{- $ms := mul (int64 .Values.metrics.prometheusRule.noCheckpointIntervals) (int64 .Values.processing.checkpointIntervalMs) -}}
{{- div (add $ms 999) 1000 -}}
{{- end }}

{{/*
Volume mounts of the Kafka credentials (SASL password file, TLS files): the processor's and the
console's containers mount the same.
*/}}
{{- define "lockgate.kafkaVolumeMounts" -}}
{{- if .Values.kafka.sasl.existingSecret }}
# The SASL password as a file (LOCKGATE_SASL_PASSWORD_FILE), no subPath: the kubelet
# updates it in place when the Secret is rotated, and each new client reads it.
- name: kafka-sasl
  mountPath: {{ .Values.kafka.sasl.mountPath | quote }}
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: {{ .Values.kafka.tls.mountPath | quote }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Volumes of the Kafka credentials, for lockgate.kafkaVolumeMounts.
*/}}
{{- define "lockgate.kafkaVolumes" -}}
{{- with .Values.kafka.sasl }}
{{- if .existingSecret }}
# Only the password key, as the file "password", readable by the owner and fsGroup.
- name: kafka-sasl
  secret:
    secretName: {{ .existingSecret | quote }}
    defaultMode: 0440
    items:
      - key: {{ .passwordKey | quote }}
        path: password
{{- end }}
{{- end }}
{{- with .Values.kafka.tls }}
{{- if .existingSecret }}
{{- if .clientSecret }}
# The CA and the client certificate come from two Secrets (e.g. Strimzi's cluster CA and
# KafkaUser Secrets), projected into one read-only directory.
- name: kafka-tls
  projected:
    defaultMode: 0440
    sources:
      - secret:
          name: {{ .existingSecret | quote }}
          items:
            - key: {{ .caKey | quote }}
              path: ca.crt
      - secret:
          name: {{ .clientSecret | quote }}
          items:
            - key: {{ .certKey | quote }}
              path: tls.crt
            - key: {{ .keyKey | quote }}
              path: tls.key
{{- else }}
- name: kafka-tls
  secret:
    secretName: {{ .existingSecret | quote }}
    defaultMode: 0440
    items:
      - key: {{ .caKey | quote }}
        path: ca.crt
      {{- if and .certKey .keyKey }}
      - key: {{ .certKey | quote }}
        path: tls.crt
      - key: {{ .keyKey | quote }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Selector labels of the console's pods: a name of their own, so that nothing of the processors
selects them.
*/}}
{{- define "lockgate.consoleSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-console" (include "lockgate.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of the console's resources.
*/}}
{{- define "lockgate.consoleLabels" -}}
helm.sh/chart: {{ include "lockgate.chart" . }}
{{ include "lockgate.consoleSelectorLabels" . }}
app.kubernetes.io/version: {{ include "lockgate.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: console
app.kubernetes.io/part-of: lockgate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
LOCKGATE_SAVEPOINT_DIR: savepoints.location, or the claim's mountPath when only the claim is
set; empty: no savepoint location.
*/}}
{{- define "lockgate.savepointDir" -}}
{{- with .Values.savepoints }}
{{- if .location }}
{{- .location }}
{{- else if .persistentVolumeClaim.enabled }}
{{- .persistentVolumeClaim.mountPath }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of the savepoint claim: existingClaim, else <fullname>-savepoints (rendered by the chart).
*/}}
{{- define "lockgate.savepointClaim" -}}
{{- .Values.savepoints.persistentVolumeClaim.existingClaim | default (printf "%s-savepoints" (include "lockgate.fullname" .)) }}
{{- end }}

{{/*
Whether savepoints.location is an object store URL (scheme://...): the NetworkPolicy then
allows the object store.
*/}}
{{- define "lockgate.savepointsRemote" -}}
{{- if contains "://" .Values.savepoints.location }}true{{ end }}
{{- end }}

{{/*
envFrom of the processor container and the savepoint Jobs (YAML list, or nothing):
savepoints.credentials.envFromSecret first, then envFrom (later sources win on a clash).
*/}}
{{- define "lockgate.envFrom" -}}
{{- $from := list }}
{{- with .Values.savepoints.credentials.envFromSecret }}
{{- $from = append $from (dict "secretRef" (dict "name" .)) }}
{{- end }}
{{- $from = concat $from (.Values.envFrom | default list) }}
{{- if $from }}
{{- toYaml $from }}
{{- end }}
{{- end }}

{{/*
Volume mounts shared by the processor container and the savepoint Jobs: the Kafka credentials
and the savepoint claim (YAML list items, or nothing).
*/}}
{{- define "lockgate.sharedVolumeMounts" -}}
{{- include "lockgate.kafkaVolumeMounts" . }}
{{- if .Values.savepoints.persistentVolumeClaim.enabled }}
- name: savepoints
  mountPath: {{ .Values.savepoints.persistentVolumeClaim.mountPath | quote }}
{{- end }}
{{- end }}

{{/*
Volumes shared by the pods and the savepoint Jobs: the Kafka credentials' and the savepoint
claim (YAML list items, or nothing).
*/}}
{{- define "lockgate.sharedVolumes" -}}
{{- include "lockgate.kafkaVolumes" . }}
{{- if .Values.savepoints.persistentVolumeClaim.enabled }}
# The savepoint location, shared by every pod, the savepoint Jobs and (same claim) the
# other releases of the pipeline.
- name: savepoints
  persistentVolumeClaim:
    claimName: {{ include "lockgate.savepointClaim" . | quote }}
{{- end }}
{{- end }}

{{/*
Labels of the savepoint Jobs' pods: not the release's selector labels (the Service, the PDB,
the ServiceMonitor and the NetworkPolicy of the processors must not select them).
*/}}
{{- define "lockgate.savepointJobLabels" -}}
app.kubernetes.io/name: {{ printf "%s-savepoint" (include "lockgate.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: savepoint
app.kubernetes.io/part-of: lockgate
{{- end }}

{{/*
The container of a savepoint Job (YAML): `lockgate savepoint trigger --pipeline <appName>`
(or, with "cancel", `lockgate savepoint cancel --halted --pipeline <appName>`) with the
processors' environment, Kafka credentials and savepoint location. Argument: a dict with
"root" (the chart context), "stop" (bool) and optionally "cancel" (bool).
*/}}
{{- define "lockgate.savepointContainer" -}}
{{- $ := .root }}
{{- $env := include "lockgate.env" $ | fromYamlArray }}
name: savepoint
image: {{ include "lockgate.image" $ | quote }}
imagePullPolicy: {{ $.Values.image.pullPolicy }}
{{- if .cancel }}
# The image's entrypoint is `lockgate`. Cancels the savepoint(s) the pipeline's key groups
# are halted at (read from their latest committed checkpoint records; each id on stdout):
# they resume where they stopped. Nothing halted: exit 0.
args:
  - savepoint
  - cancel
  - --halted
  - --pipeline
  - {{ include "lockgate.appName" $ | quote }}
{{- else }}
# The image's entrypoint is `lockgate`. The last line of stdout is the descriptor (JSON);
# exit 1 when a key group fails the savepoint or the timeout passes (with --stop the
# savepoint is then cancelled: the halted key groups resume).
args:
  - savepoint
  - trigger
  - --pipeline
  - {{ include "lockgate.appName" $ | quote }}
  {{- if .stop }}
  - --stop
  {{- end }}
  - --json
  - --timeout
  - {{ int64 $.Values.savepoints.triggerTimeoutSeconds | toString | quote }}
{{- end }}
env:
  {{- toYaml $env | nindent 2 }}
{{- with include "lockgate.envFrom" $ | trim }}
envFrom:
  {{- . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $.Values.securityContext | nindent 2 }}
{{- with $.Values.savepoints.jobResources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
  {{- with include "lockgate.sharedVolumeMounts" $ | trim }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end }}

{{/*
The pod spec of a savepoint Job (YAML). Argument as lockgate.savepointContainer, plus
"serviceAccount" (its name). No API token: the Job only talks to Kafka and the savepoint store.
*/}}
{{- define "lockgate.savepointPodSpec" -}}
{{- $ := .root }}
serviceAccountName: {{ .serviceAccount }}
automountServiceAccountToken: false
restartPolicy: Never
{{- with $.Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $.Values.podSecurityContext | nindent 2 }}
containers:
  - {{- include "lockgate.savepointContainer" . | nindent 4 }}
volumes:
  - name: tmp
    emptyDir: {}
  {{- with include "lockgate.sharedVolumes" $ | trim }}
  {{- . | nindent 2 }}
  {{- end }}
{{- with $.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}


{{/*
NetworkPolicy egress rules of the processors and the savepoint Jobs (YAML list items): DNS,
the brokers, the object store (a URL savepoints.location), the schema registry, extraEgress.
*/}}
{{- define "lockgate.egressRules" -}}
{{- with .Values.networkPolicy }}
# DNS (cluster DNS resolves the brokers' names).
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
# The Kafka brokers.
- ports:
    {{- range .kafkaPorts }}
    - port: {{ int64 . }}
      protocol: TCP
    {{- end }}
  {{- with .kafkaTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- if and (include "lockgate.savepointsRemote" $) .objectStorePorts }}
# The savepoint object store (savepoints.location).
- ports:
    {{- range .objectStorePorts }}
    - port: {{ int64 . }}
      protocol: TCP
    {{- end }}
  {{- with .objectStoreTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- if .schemaRegistryPorts }}
# The schema registry.
- ports:
    {{- range .schemaRegistryPorts }}
    - port: {{ int64 . }}
      protocol: TCP
    {{- end }}
  {{- with .schemaRegistryTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- with .extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Labels of the savepoint Jobs, CronJob and their ServiceAccounts: the release's labels with
app.kubernetes.io/component: savepoint.
*/}}
{{- define "lockgate.savepointResourceLabels" -}}
{{- $labels := include "lockgate.labels" . | fromYaml }}
{{- $_ := set $labels "app.kubernetes.io/component" "savepoint" }}
{{- toYaml $labels }}
{{- end }}

{{/*
Name of a savepoint CronJob: <fullname>-<suffix>, the full name shortened so that the whole
stays within a CronJob name's 52 characters (never two CronJobs with one name).
*/}}
{{- define "lockgate.savepointCronJobName" -}}
{{- $keep := sub 51 (len .suffix) | int }}
{{- printf "%s-%s" (include "lockgate.fullname" .root | trunc $keep | trimSuffix "-") .suffix }}
{{- end }}

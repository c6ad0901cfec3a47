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
Name of the headless Service that governs the StatefulSet.
*/}}
{{- define "lockgate.headlessServiceName" -}}
{{- printf "%s-headless" (include "lockgate.fullname" .) | trunc 63 | trimSuffix "-" }}
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
dots written as underscores (the app maps them back: processors/_settings.py).
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
SASL/TLS, then env and extraEnv. The StatefulSet template checks that no name appears twice.
*/}}
{{- define "lockgate.env" -}}
- name: LOCKGATE_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: LOCKGATE_BOOTSTRAP_SERVERS
  value: {{ required "kafka.bootstrapServers is required (comma separated host:port list)" .Values.kafka.bootstrapServers | quote }}
{{- with .Values.appName }}
- name: LOCKGATE_APP_NAME
  value: {{ . | quote }}
{{- end }}
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
- name: LOCKGATE_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ .usernameKey | quote }}
- name: LOCKGATE_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ .passwordKey | quote }}
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
{{- $p := .Values.processing }}
{{- if and (eq $p.guarantee "exactly_once") (lt (int64 $p.transactionTimeoutMs) (mul 2 (int64 $p.checkpointIntervalMs))) }}
{{- fail (printf "processing.transactionTimeoutMs (%d) must be at least twice processing.checkpointIntervalMs (%d) with exactly_once: an epoch must fit well inside a transaction (the app refuses to start otherwise)" (int64 $p.transactionTimeoutMs) (int64 $p.checkpointIntervalMs)) }}
{{- end }}
{{- $needMs := add (int64 $p.checkpointIntervalMs) (int64 $p.transactionTimeoutMs) }}
{{- if le (mul (int64 .Values.terminationGracePeriodSeconds) 1000) $needMs }}
{{- fail (printf "terminationGracePeriodSeconds (%d s) must exceed processing.checkpointIntervalMs + processing.transactionTimeoutMs (%d ms) so that a stopping instance can finish or abort its epoch" (int64 .Values.terminationGracePeriodSeconds) $needMs) }}
{{- end }}
{{- with .Values.kafka.tls }}
{{- if and .existingSecret (or (and .certKey (not .keyKey)) (and .keyKey (not .certKey))) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey must be set together (mutual TLS) or both be empty" }}
{{- end }}
{{- end }}
{{- with .Values.autoscaling.keda }}
{{- if .enabled }}
{{- if gt (int64 .minReplicaCount) (int64 .maxReplicaCount) }}
{{- fail (printf "autoscaling.keda.minReplicaCount (%d) exceeds maxReplicaCount (%d)" (int64 .minReplicaCount) (int64 .maxReplicaCount)) }}
{{- end }}
{{- if not (or .consumerGroup $.Values.appName) }}
{{- fail "autoscaling.keda needs the consumer group: set appName (the group id is the app name) or autoscaling.keda.consumerGroup" }}
{{- end }}
{{- end }}
{{- end }}
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

{{/*
The chart name, or nameOverride.
*/}}
{{- define "tumbler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's resources: fullnameOverride, or the release
name plus the chart name (once), cut to 63 characters (DNS label limit).
*/}}
{{- define "tumbler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "tumbler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "tumbler.labels" -}}
helm.sh/chart: {{ include "tumbler.chart" . }}
{{ include "tumbler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tumbler
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels that select the release's pods. Never change them: a Deployment's
selector is immutable.
*/}}
{{- define "tumbler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tumbler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The ServiceAccount the pods run as.
*/}}
{{- define "tumbler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tumbler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The Secret that holds the Redis URL: the user's existingSecret, or the one
the chart creates.
*/}}
{{- define "tumbler.secretName" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else }}
{{- printf "%s-redis" (include "tumbler.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The key of the Redis URL inside that Secret.
*/}}
{{- define "tumbler.secretKey" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecretKey }}
{{- else -}}
redis-url
{{- end }}
{{- end }}

{{/*
The ConfigMap that holds the settings.
*/}}
{{- define "tumbler.configMapName" -}}
{{- include "tumbler.fullname" . }}
{{- end }}

{{/*
The container image: repository@digest, or repository:tag (tag defaults to
the chart's appVersion).
*/}}
{{- define "tumbler.image" -}}
{{- $repository := required "image.repository is required: no public registry hosts a tumbler image. Build it from the repository's Dockerfile (docker build -t REGISTRY/tumbler:0.1.0 .), push it, and set image.repository=REGISTRY/tumbler" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
An annotations: block for a resource's metadata: commonAnnotations plus the
resource's own (which win), or nothing when both are empty. Call with
(dict "context" $ "annotations" .Values.x.annotations).
*/}}
{{- define "tumbler.annotations" -}}
{{- $all := merge (deepCopy (.annotations | default dict)) (deepCopy (.context.Values.commonAnnotations | default dict)) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The container's Redis settings: TUMBLER_REDIS_URL from a Secret (redis.url
or redis.existingSecret), or, with redis.host, a URL without credentials
built from host, port and db (rediss:// with redis.tls.enabled), the ACL
user in TUMBLER_REDIS_USERNAME and the password, from the key of
redis.existingSecret, in TUMBLER_REDIS_PASSWORD: the password never appears
in the pod spec and may hold any character. With redis.tls.existingSecret,
the CA (and client certificate) files mounted from it.
*/}}
{{- define "tumbler.redisEnv" -}}
{{- if .Values.redis.host }}
{{- $scheme := ternary "rediss" "redis" .Values.redis.tls.enabled }}
- name: TUMBLER_REDIS_URL
  value: {{ printf "%s://%s:%d/%d" $scheme .Values.redis.host (.Values.redis.port | int) (.Values.redis.db | int) | quote }}
{{- with .Values.redis.existingSecret }}
- name: TUMBLER_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.redis.existingSecretPasswordKey }}
{{- end }}
{{- else }}
- name: TUMBLER_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tumbler.secretName" . }}
      key: {{ include "tumbler.secretKey" . }}
{{- end }}
{{- with .Values.redis.username }}
- name: TUMBLER_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if and .Values.redis.tls.enabled .Values.redis.tls.existingSecret }}
- name: TUMBLER_REDIS_TLS_CA_FILE
  value: {{ printf "/etc/tumbler/redis-tls/%s" .Values.redis.tls.caKey | quote }}
{{- if .Values.redis.tls.clientCertificate }}
- name: TUMBLER_REDIS_TLS_CERT_FILE
  value: /etc/tumbler/redis-tls/tls.crt
- name: TUMBLER_REDIS_TLS_KEY_FILE
  value: /etc/tumbler/redis-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/*
Whole seconds the server may need after SIGTERM: the drain plus the grace,
rounded up.
*/}}
{{- define "tumbler.shutdownSeconds" -}}
{{- $ms := add (.Values.config.shutdownDrainMs | int64) (.Values.config.shutdownGraceMs | int64) }}
{{- div (add $ms 999) 1000 }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the user's value, which must be longer than
the drain plus the grace, or that sum plus terminationGraceExtraSeconds.
*/}}
{{- define "tumbler.terminationGracePeriodSeconds" -}}
{{- $needed := include "tumbler.shutdownSeconds" . | int64 }}
{{- $ms := add (.Values.config.shutdownDrainMs | int64) (.Values.config.shutdownGraceMs | int64) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $needed (.Values.terminationGraceExtraSeconds | int64) }}
{{- else }}
{{- $given := .Values.terminationGracePeriodSeconds | int64 }}
{{- if le (mul $given 1000) $ms }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be longer than config.shutdownDrainMs + config.shutdownGraceMs (%d ms), or Kubernetes kills tumbler before it has drained" $given $ms) }}
{{- end }}
{{- $given }}
{{- end }}
{{- end }}

{{/*
Pods that run at the least: replicaCount, or autoscaling.minReplicas.
*/}}
{{- define "tumbler.minPods" -}}
{{- if .Values.autoscaling.enabled }}
{{- .Values.autoscaling.minReplicas | int64 }}
{{- else }}
{{- .Values.replicaCount | int64 }}
{{- end }}
{{- end }}

{{/*
Checks across values that the schema cannot express.
*/}}
{{/*
The Secret with the tokens file, its key, and where the pods read it.
*/}}
{{- define "tumbler.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "tumbler.fullname" . | trunc 58 | trimSuffix "-")) -}}
{{- end -}}

{{- define "tumbler.authSecretKey" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecretKey -}}
{{- else -}}
tokens.toml
{{- end -}}
{{- end -}}

{{- define "tumbler.authTokensFile" -}}
/etc/tumbler/auth/tokens.toml
{{- end -}}

{{/*
"true" when the pods require bearer tokens: auth.enabled, unless insecure.
*/}}
{{- define "tumbler.authEnabled" -}}
{{- if and .Values.auth.enabled (not .Values.insecure) -}}
true
{{- end -}}
{{- end }}

{{/*
"true" when the NetworkPolicy is rendered: networkPolicy.enabled, unless
insecure.
*/}}
{{- define "tumbler.networkPolicyEnabled" -}}
{{- if and .Values.networkPolicy.enabled (not .Values.insecure) -}}
true
{{- end -}}
{{- end }}

{{/*
"true" when the chart generates the admin token: auth on, and neither
tokens nor a tokens-file Secret given.
*/}}
{{- define "tumbler.generatesAdminToken" -}}
{{- if and (include "tumbler.authEnabled" .) (not .Values.auth.existingSecret) (not .Values.auth.tokens) .Values.auth.generateAdminToken -}}
true
{{- end -}}
{{- end }}

{{/*
The Secret that holds the generated admin token (key `token`).
*/}}
{{- define "tumbler.adminTokenSecretName" -}}
{{- printf "%s-admin-token" (include "tumbler.fullname" . | trunc 51 | trimSuffix "-") -}}
{{- end }}

{{- define "tumbler.validate" -}}
{{- if and (include "tumbler.authEnabled" .) (not .Values.auth.existingSecret) (not .Values.auth.tokens) (not .Values.auth.generateAdminToken) }}
{{- fail "auth.enabled needs auth.tokens (name, sha256, role, namespaces; `tumbler token` prints them) or auth.existingSecret with a tokens file, or auth.generateAdminToken=true to generate an admin token; for a trial without authentication set insecure=true" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "tls.enabled needs tls.existingSecret: a kubernetes.io/tls Secret with tls.crt and tls.key" }}
{{- end }}
{{- if and (not .Values.tls.enabled) (or .Values.tls.http .Values.tls.clientCaSecret) }}
{{- fail "tls.http and tls.clientCaSecret need tls.enabled" }}
{{- end }}
{{- if and (not .Values.redis.host) (not .Values.redis.existingSecret) (not .Values.redis.url) }}
{{- fail "set redis.url, or redis.existingSecret (with redis.existingSecretKey) to a Secret that holds the Redis URL, or redis.host (with redis.existingSecret and redis.existingSecretPasswordKey for a password)" }}
{{- end }}
{{- if gt (.Values.config.defaultTtlMs | int64) (.Values.config.maxTtlMs | int64) }}
{{- fail (printf "config.defaultTtlMs (%d) must not exceed config.maxTtlMs (%d)" (.Values.config.defaultTtlMs | int64) (.Values.config.maxTtlMs | int64)) }}
{{- end }}
{{- if and (gt (.Values.config.minReplicasAcked | int64) 0) (ge (.Values.config.minReplicasTimeoutMs | int64) (.Values.config.redisTimeoutMs | int64)) }}
{{- fail (printf "config.minReplicasTimeoutMs (%d) must be below config.redisTimeoutMs (%d) when config.minReplicasAcked is set: the wait for replicas is part of the grant's Redis call" (.Values.config.minReplicasTimeoutMs | int64) (.Values.config.redisTimeoutMs | int64)) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (.Values.autoscaling.minReplicas | int64) (.Values.autoscaling.maxReplicas | int64)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (not .Values.autoscaling.targetCPUUtilizationPercentage) (not .Values.autoscaling.targetMemoryUtilizationPercentage) }}
{{- fail "autoscaling needs targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage" }}
{{- end }}
{{- end }}

{{/*
"true" when the `helm test` Pod can run: tests.enabled, and with auth on a
client token (tests.tokenSecret), and with mutual TLS a client certificate
(tests.clientCertSecret). Otherwise empty, and NOTES says what is missing.
*/}}
{{- define "tumbler.testEnabled" -}}
{{- if and .Values.tests.enabled (or (not (include "tumbler.authEnabled" .)) .Values.tests.tokenSecret (include "tumbler.generatesAdminToken" .)) (or (not (and .Values.tls.enabled .Values.tls.clientCaSecret)) .Values.tests.clientCertSecret) -}}
true
{{- end -}}
{{- end }}

{{/*
Labels of the `helm test` Pod: the release's, but a name of its own, so the
Service, the Deployment and the PodDisruptionBudget never select it.
*/}}
{{- define "tumbler.testLabels" -}}
helm.sh/chart: {{ include "tumbler.chart" . }}
app.kubernetes.io/name: {{ printf "%s-test" (include "tumbler.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tumbler
app.kubernetes.io/component: test
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

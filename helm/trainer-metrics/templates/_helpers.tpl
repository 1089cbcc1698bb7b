{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "trainer-metrics.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>, or <release>-<chart> when the release name does not contain the chart name. */}}
{{- define "trainer-metrics.fullname" -}}
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

{{- define "trainer-metrics.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainer-metrics.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainer-metrics.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trainer-metrics.labels" -}}
helm.sh/chart: {{ include "trainer-metrics.chart" . }}
{{ include "trainer-metrics.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubeflow-trainer
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "trainer-metrics.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainer-metrics.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trainer-metrics.leaseName" -}}
{{- default (include "trainer-metrics.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "trainer-metrics.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "trainer-metrics.scheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* A config value as an env var string: strings as they are, numbers without exponent, booleans true/false. */}}
{{- define "trainer-metrics.envValue" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/*
Checks the relations between values that values.schema.json cannot express, with the service's own rules
(app/config.py), so a bad combination fails at install time rather than in a crash-looping pod.
*/}}
{{- define "trainer-metrics.validate" -}}
{{- $le := .Values.leaderElection }}
{{- if and (gt (int .Values.replicaCount) 1) (not $le.enabled) }}
{{- fail "replicaCount > 1 requires leaderElection.enabled: without a Lease every replica would export the Trainer counters and they would be counted once per replica" }}
{{- end }}
{{- if $le.enabled }}
{{- if not (gt (float64 $le.leaseDurationSeconds) (float64 $le.renewDeadlineSeconds)) }}
{{- fail (printf "leaderElection.leaseDurationSeconds (%v) must be greater than leaderElection.renewDeadlineSeconds (%v)" $le.leaseDurationSeconds $le.renewDeadlineSeconds) }}
{{- end }}
{{- if not (gt (float64 $le.renewDeadlineSeconds) (mulf 1.2 $le.retryPeriodSeconds)) }}
{{- fail (printf "leaderElection.renewDeadlineSeconds (%v) must be greater than 1.2 × leaderElection.retryPeriodSeconds (%v)" $le.renewDeadlineSeconds $le.retryPeriodSeconds) }}
{{- end }}
{{- end }}
{{- $cfg := .Values.config }}
{{- $wmin := dig "watch_timeout_min_seconds" 300 $cfg }}
{{- $wmax := dig "watch_timeout_max_seconds" 600 $cfg }}
{{- if lt (float64 $wmax) (float64 $wmin) }}
{{- fail (printf "config.watch_timeout_max_seconds (%v) must not be below config.watch_timeout_min_seconds (%v)" $wmax $wmin) }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.secretName is required when tls.enabled is true: the name of a kubernetes.io/tls Secret in the release namespace" }}
{{- end }}
{{- end }}

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

{{/*
Namespace of the chart's namespaced objects: namespaceOverride, else the release namespace (as
kube-state-metrics' chart, for a parent chart that installs this one in another namespace).
*/}}
{{- define "trainer-metrics.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "trainer-metrics.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainer-metrics.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainer-metrics.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of every object. No app.kubernetes.io/part-of: this exporter is not part of a Kubeflow Trainer
release; commonLabels can set one (e.g. the platform it belongs to).
*/}}
{{- define "trainer-metrics.labels" -}}
helm.sh/chart: {{ include "trainer-metrics.chart" . }}
{{ include "trainer-metrics.selectorLabels" . }}
app.kubernetes.io/component: metrics
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels of the `helm test` Pod: the release's, without the selector pair, so that the Service, the
PodMonitor, the PodDisruptionBudget and the anti-affinity never take it for a replica.
*/}}
{{- define "trainer-metrics.testLabels" -}}
helm.sh/chart: {{ include "trainer-metrics.chart" . }}
app.kubernetes.io/name: {{ include "trainer-metrics.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
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

{{/*
The image: [registry/]repository, then @digest or :tag (default the appVersion). The registry is
global.imageRegistry, else image.registry (kube-state-metrics' order: a parent chart's mirror wins).
*/}}
{{- define "trainer-metrics.image" -}}
{{- $registry := default .Values.image.registry (dig "imageRegistry" "" (default dict .Values.global)) }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
imagePullSecrets of a pod: global.imagePullSecrets (names or {name: ...}) then imagePullSecrets, each once.
Empty when there are none.
*/}}
{{- define "trainer-metrics.imagePullSecrets" -}}
{{- $names := list }}
{{- range (concat (dig "imagePullSecrets" list (default dict .Values.global)) .Values.imagePullSecrets) }}
{{- $name := . }}
{{- if kindIs "map" . }}{{ $name = get . "name" }}{{ end }}
{{- if and $name (not (has $name $names)) }}
{{- $names = append $names $name }}
{{- end }}
{{- end }}
{{- range $names }}
- name: {{ . }}
{{- end }}
{{- end }}

{{/*
Port of the service's probe-only listener (plain HTTP, its own connection cap): config.probe_port, else the
service's default 8081. Empty when it is 0 (a random port the kubelet cannot know): probes then use the
main port.
*/}}
{{- define "trainer-metrics.probePort" -}}
{{- $p := dig "probe_port" nil .Values.config }}
{{- if kindIs "invalid" $p }}8081{{ else if gt (int $p) 0 }}{{ int $p }}{{ end }}
{{- end }}

{{- define "trainer-metrics.scheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* Name of the container and Service port: what meshes and people read the protocol from. */}}
{{- define "trainer-metrics.portName" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* The kubernetes.io/tls Secret: tls.secretName, else the one the cert-manager Certificate writes. */}}
{{- define "trainer-metrics.tlsSecretName" -}}
{{- if .Values.tls.secretName }}
{{- .Values.tls.secretName }}
{{- else if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "trainer-metrics.fullname" .) }}
{{- end }}
{{- end }}

{{/*
/debug/* lists the TrainJob names of every watched namespace: served only behind auth unless the user says
otherwise (config.debug_endpoints true or false).
*/}}
{{- define "trainer-metrics.debugEndpoints" -}}
{{- $v := dig "debug_endpoints" nil .Values.config }}
{{- if kindIs "invalid" $v }}{{ .Values.auth.enabled }}{{ else }}{{ $v }}{{ end }}
{{- end }}

{{/* Namespace of the ServiceMonitor or PodMonitor (and of the scrape token it reads). */}}
{{- define "trainer-metrics.monitorNamespace" -}}
{{- default (include "trainer-metrics.namespace" .) .Values.serviceMonitor.namespace }}
{{- end }}

{{/*
The `job` label the ServiceMonitor/PodMonitor gives the series: the value of the Service's (pod's)
serviceMonitor.jobLabel label, or the Service's name when it is empty. Empty when that label is not one the
chart sets (then prometheusRule.selector must be given).
*/}}
{{- define "trainer-metrics.jobName" -}}
{{- $label := .Values.serviceMonitor.jobLabel }}
{{- $own := fromYaml (include "trainer-metrics.labels" .) }}
{{- if not $label }}
{{- include "trainer-metrics.fullname" . }}
{{- else if hasKey $own $label }}
{{- get $own $label }}
{{- end }}
{{- end }}

{{/* PromQL matchers every alert selects by (prometheusRule.selector, else the monitor's job). */}}
{{- define "trainer-metrics.ruleSelector" -}}
{{- if .Values.prometheusRule.selector }}
{{- .Values.prometheusRule.selector }}
{{- else }}
{{- $job := include "trainer-metrics.jobName" . }}
{{- if not $job }}
{{- fail (printf "prometheusRule.selector is required: serviceMonitor.jobLabel %q is not a label the chart sets, so the job label of the series is unknown" .Values.serviceMonitor.jobLabel) }}
{{- end }}
{{- printf "job=%q" $job }}
{{- end }}
{{- end }}

{{/* "true" when the chart makes the token Prometheus scrapes with (serviceMonitor.scrapeToken.create). */}}
{{- define "trainer-metrics.scrapeTokenCreated" -}}
{{- $sm := .Values.serviceMonitor }}
{{- if and .Values.auth.enabled (or $sm.enabled .Values.podMonitor.enabled) (not $sm.authorization) (not $sm.bearerTokenSecret) (not $sm.bearerTokenFile) $sm.scrapeToken.create }}true{{ end }}
{{- end }}

{{- define "trainer-metrics.scrapeTokenName" -}}
{{- printf "%s-scraper" (include "trainer-metrics.fullname" .) }}
{{- end }}

{{/*
One scrape endpoint of the ServiceMonitor (endpoints[]) or PodMonitor (podMetricsEndpoints[]): the same
port, path, scheme, TLS check, token and relabelling for both.
*/}}
{{- define "trainer-metrics.scrapeEndpoint" -}}
{{- $sm := .Values.serviceMonitor }}
{{- $fullname := include "trainer-metrics.fullname" . }}
port: {{ include "trainer-metrics.portName" . }}
path: /metrics
interval: {{ $sm.interval }}
scrapeTimeout: {{ $sm.scrapeTimeout }}
# Keep the TrainJob `namespace` label of the Trainer metrics as it is.
honorLabels: {{ $sm.honorLabels }}
{{- if .Values.tls.enabled }}
scheme: https
tlsConfig:
  {{- if $sm.tlsConfig }}
  {{- toYaml $sm.tlsConfig | nindent 2 }}
  {{- else }}
  serverName: {{ printf "%s.%s.svc" $fullname (include "trainer-metrics.namespace" .) }}
  ca:
    secret:
      name: {{ include "trainer-metrics.tlsSecretName" . }}
      key: ca.crt
  {{- end }}
{{- else }}
scheme: http
{{- end }}
{{- if .Values.auth.enabled }}
# The token's subject must be bound to ClusterRole {{ $fullname }}-metrics-reader.
{{- if $sm.authorization }}
authorization:
  {{- toYaml $sm.authorization | nindent 2 }}
{{- else if $sm.bearerTokenSecret }}
bearerTokenSecret:
  {{- toYaml $sm.bearerTokenSecret | nindent 2 }}
{{- else if $sm.bearerTokenFile }}
bearerTokenFile: {{ $sm.bearerTokenFile }}
{{- else if include "trainer-metrics.scrapeTokenCreated" . }}
authorization:
  type: Bearer
  credentials:
    name: {{ include "trainer-metrics.scrapeTokenName" . }}-token
    key: token
{{- end }}
{{- end }}
{{- with $sm.relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $sm.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Scrape limits of a ServiceMonitor/PodMonitor spec; 0 leaves a limit out (no limit). */}}
{{- define "trainer-metrics.scrapeLimits" -}}
{{- range $key := list "sampleLimit" "labelLimit" "labelNameLengthLimit" "labelValueLengthLimit" }}
{{- $v := int (get $.Values.serviceMonitor $key) }}
{{- if gt $v 0 }}
{{ $key }}: {{ $v }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Scrape protocols (spec.scrapeProtocols: protobuf first for native histograms) and whether the classic buckets
of a native histogram are kept (spec.scrapeClassicHistograms), of the ServiceMonitor and the PodMonitor.
*/}}
{{- define "trainer-metrics.scrapeProtocols" -}}
{{- with .Values.serviceMonitor.scrapeProtocols }}
scrapeProtocols:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if not (kindIs "invalid" .Values.serviceMonitor.scrapeClassicHistograms) }}
scrapeClassicHistograms: {{ .Values.serviceMonitor.scrapeClassicHistograms }}
{{- end }}
{{- end }}

{{/* A Prometheus duration ("30s", "1m", "1m30s", "500ms") in seconds; 0 when it is not one. */}}
{{- define "trainer-metrics.durationSeconds" -}}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 "y" 31536000.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" (toString .) -1 }}
{{- $n := regexFind "^[0-9]+" . }}
{{- $total = addf $total (mulf (float64 $n) (get $units (trimPrefix $n .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
The zero hold (TRAINER_METRICS_ZERO_HOLD_SECONDS; docs/metrics.md, "How counting works"):
config.zero_hold_seconds when set, else twice the ServiceMonitor/PodMonitor scrape interval, so that every
Prometheus scraping at that interval stores each new series' 0 first, with one failed scrape tolerated (at
most 600, the service's maximum). Empty when neither says anything (the service's default then).
*/}}
{{- define "trainer-metrics.zeroHoldSeconds" -}}
{{- $set := dig "zero_hold_seconds" nil .Values.config }}
{{- if not (kindIs "invalid" $set) }}
{{- $set }}
{{- else }}
{{- $hold := mulf 2.0 (float64 (include "trainer-metrics.durationSeconds" .Values.serviceMonitor.interval)) }}
{{- if gt $hold 600.0 }}{{ $hold = 600.0 }}{{ end }}
{{- if gt $hold 0.0 }}{{ $hold }}{{ end }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the value when set, else what a leader's graceful stop may take: its wait for
the scrapes to show its last counts (config.handover_wait_seconds, default 3 × zero hold + 5), its Lease
release (within the renew deadline), and 10 s for uvicorn and the informers to close.
*/}}
{{- define "trainer-metrics.terminationGracePeriodSeconds" -}}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- $hold := include "trainer-metrics.zeroHoldSeconds" . }}
{{- $holdSeconds := 60.0 }}
{{- if $hold }}{{ $holdSeconds = float64 $hold }}{{ end }}
{{- $wait := dig "handover_wait_seconds" nil .Values.config }}
{{- if kindIs "invalid" $wait }}{{ $wait = addf (mulf 3.0 $holdSeconds) 5.0 }}{{ end }}
{{- ceil (addf (float64 $wait) (float64 .Values.leaderElection.renewDeadlineSeconds) 10.0) | int }}
{{- end }}
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
{{- if and .Values.tls.enabled (not (include "trainer-metrics.tlsSecretName" .)) }}
{{- fail "tls.secretName is required when tls.enabled is true: the name of a kubernetes.io/tls Secret in the release namespace (or turn on tls.certManager.enabled)" }}
{{- end }}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) }}
{{- fail "tls.certManager.enabled needs tls.enabled: the Certificate's Secret is only used to serve HTTPS" }}
{{- end }}
{{- $sm := .Values.serviceMonitor }}
{{- if and $sm.enabled .Values.podMonitor.enabled }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: Prometheus would scrape every pod twice; keep one (the PodMonitor takes its settings from serviceMonitor.*)" }}
{{- end }}
{{- if and .Values.podMonitor.enabled .Values.auth.enabled $sm.bearerTokenFile (not $sm.authorization) (not $sm.bearerTokenSecret) }}
{{- fail "serviceMonitor.bearerTokenFile does not exist in a PodMonitor: use serviceMonitor.authorization, bearerTokenSecret or scrapeToken.create" }}
{{- end }}
{{- if and .Values.podMonitor.enabled $sm.targetLabels }}
{{- fail "serviceMonitor.targetLabels does not exist in a PodMonitor (it copies Service labels): use serviceMonitor.podTargetLabels" }}
{{- end }}
{{- if not .Values.rbac.useClusterRole }}
{{- if not .Values.watchNamespaces }}
{{- fail "rbac.useClusterRole false needs watchNamespaces: watching every namespace takes a ClusterRole" }}
{{- end }}
{{- if .Values.watchClusterRuntimes }}
{{- fail "rbac.useClusterRole false needs watchClusterRuntimes: false: ClusterTrainingRuntimes are cluster-scoped, reading them takes a ClusterRole" }}
{{- end }}
{{- if .Values.auth.enabled }}
{{- fail "rbac.useClusterRole false cannot go with auth.enabled: TokenReviews, SubjectAccessReviews and the /metrics reader role are cluster-scoped (ClusterRoles)" }}
{{- end }}
{{- end }}
{{- if and .Values.auth.enabled (or $sm.enabled .Values.podMonitor.enabled) (not $sm.authorization) (not $sm.bearerTokenSecret) (not $sm.bearerTokenFile) (not $sm.scrapeToken.create) }}
{{- fail "auth.enabled with a ServiceMonitor/PodMonitor: Prometheus needs a token bound to the metrics-reader ClusterRole; set serviceMonitor.authorization, serviceMonitor.bearerTokenSecret or serviceMonitor.bearerTokenFile, or serviceMonitor.scrapeToken.create: true" }}
{{- end }}
{{- end }}

{{/*
Where the `helm test` Pod runs: beside the ServiceMonitor/PodMonitor when there is one (the Secrets of its
token and TLS check are read from there, as the Prometheus Operator reads them), else in the chart's namespace.
*/}}
{{- define "trainer-metrics.testNamespace" -}}
{{- if or .Values.serviceMonitor.enabled .Values.podMonitor.enabled }}
{{- include "trainer-metrics.monitorNamespace" . }}
{{- else }}
{{- include "trainer-metrics.namespace" . }}
{{- end }}
{{- end }}

{{/*
The Secret {name, key} of the token the ServiceMonitor/PodMonitor presents (the order of scrapeEndpoint), as
JSON; "{}" when auth is off, there is no monitor, or the token is a file in the Prometheus pod.
*/}}
{{- define "trainer-metrics.testToken" -}}
{{- $sm := .Values.serviceMonitor }}
{{- $out := dict }}
{{- if and .Values.auth.enabled (or $sm.enabled .Values.podMonitor.enabled) }}
{{- if $sm.authorization }}
{{- with $sm.authorization.credentials }}{{ $out = dict "name" .name "key" .key }}{{ end }}
{{- else if $sm.bearerTokenSecret }}
{{- $out = dict "name" $sm.bearerTokenSecret.name "key" $sm.bearerTokenSecret.key }}
{{- else if $sm.bearerTokenFile }}
{{- else if include "trainer-metrics.scrapeTokenCreated" . }}
{{- $out = dict "name" (printf "%s-token" (include "trainer-metrics.scrapeTokenName" .)) "key" "token" }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The TLS check of the `helm test` Pod, as JSON: the ServiceMonitor's (serviceMonitor.tlsConfig when set and a
monitor is on, else the chart's default: ca.crt of the TLS Secret, server name <fullname>.<namespace>.svc).
Keys: serverName, insecure, and secret or configMap {name, key} of the CA.
*/}}
{{- define "trainer-metrics.testTls" -}}
{{- $sm := .Values.serviceMonitor }}
{{- $default := printf "%s.%s.svc" (include "trainer-metrics.fullname" .) (include "trainer-metrics.namespace" .) }}
{{- $out := dict "serverName" $default "insecure" false }}
{{- if and $sm.tlsConfig (or $sm.enabled .Values.podMonitor.enabled) }}
{{- $c := $sm.tlsConfig }}
{{- $_ := set $out "serverName" (default $default $c.serverName) }}
{{- $_ := set $out "insecure" (default false $c.insecureSkipVerify) }}
{{- with (dig "ca" "secret" nil $c) }}{{ $_ := set $out "secret" (dict "name" .name "key" .key) }}{{ end }}
{{- with (dig "ca" "configMap" nil $c) }}{{ $_ := set $out "configMap" (dict "name" .name "key" .key) }}{{ end }}
{{- else }}
{{- $_ := set $out "secret" (dict "name" (include "trainer-metrics.tlsSecretName" .) "key" "ca.crt") }}
{{- end }}
{{- toJson $out }}
{{- end }}

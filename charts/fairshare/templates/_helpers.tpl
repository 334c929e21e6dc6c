{{/* fairshare.suffixed is fairshare.fullname followed by "-" and .suffix, the fullname shortened
first so that the whole stays within 63 characters (a Service name must) and keeps its suffix.
Called with (dict "root" $ "suffix" "metrics"). */}}
{{- define "fairshare.suffixed" -}}
{{- printf "%s-%s" (include "fairshare.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-") .suffix -}}
{{- end -}}

{{/* fairshare.fullname is the release-scoped name of the operator's objects. */}}
{{- define "fairshare.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* fairshare.labels are the common labels. */}}
{{- define "fairshare.labels" -}}
app.kubernetes.io/name: fairshare
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* fairshare.selectorLabels select the operator pods. */}}
{{- define "fairshare.selectorLabels" -}}
app.kubernetes.io/name: fairshare
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* fairshare.serviceAccountName of the operator: serviceAccount.name, else the release's full
name, whether the chart creates it or not. Never the namespace's "default" ServiceAccount, which
every other pod of the namespace runs as and which would get the operator's ClusterRole. */}}
{{- define "fairshare.serviceAccountName" -}}
{{- default (include "fairshare.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* fairshare.image is the operator (and default scheduler) image: repository@digest when
image.digest is set, else repository:tag with the tag defaulting to the chart's appVersion. */}}
{{- define "fairshare.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* fairshare.metricsService is "true" when the operator metrics Service is rendered:
metrics.port > 0 and metrics.service.enabled or monitoring.serviceMonitor.enabled. */}}
{{- define "fairshare.metricsService" -}}
{{- if and (ne (int .Values.metrics.port) 0) (or .Values.metrics.service.enabled .Values.monitoring.serviceMonitor.enabled) -}}
true
{{- end -}}
{{- end -}}

{{/* fairshare.durationMillis is a Prometheus duration (values.schema.json checks its form, for
example 1m30s) in milliseconds; a year is 365 days, as in Prometheus. */}}
{{- define "fairshare.durationMillis" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 -}}
{{- $ms := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" . -1 -}}
{{- $ms = add $ms (mul (regexFind "^[0-9]+" . | atoi) (get $units (regexReplaceAll "^[0-9]+" . ""))) -}}
{{- end -}}
{{- $ms -}}
{{- end -}}

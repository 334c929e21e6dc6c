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

{{/* fairshare.serviceAccountName of the operator. */}}
{{- define "fairshare.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fairshare.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* fairshare.image is the operator (and default scheduler) image. */}}
{{- define "fairshare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* fairshare.metricsService is "true" when the operator metrics Service is rendered:
metrics.port > 0 and metrics.service.enabled or monitoring.serviceMonitor.enabled. */}}
{{- define "fairshare.metricsService" -}}
{{- if and (ne (int .Values.metrics.port) 0) (or .Values.metrics.service.enabled .Values.monitoring.serviceMonitor.enabled) -}}
true
{{- end -}}
{{- end -}}

{{/* The chart's name, cut to what label values allow. */}}
{{- define "ferrox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every object the chart makes. */}}
{{- define "ferrox.fullname" -}}
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

{{- define "ferrox.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ferrox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferrox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ferrox.labels" -}}
helm.sh/chart: {{ include "ferrox.chart" . }}
{{ include "ferrox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: model-server
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ferrox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ferrox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the API key, and its key. */}}
{{- define "ferrox.apiKeySecret" -}}
{{- default (printf "%s-api-key" (include "ferrox.fullname" .)) .Values.apiKey.existingSecret }}
{{- end }}

{{- define "ferrox.apiKeySecretKey" -}}
{{- if .Values.apiKey.existingSecret }}
{{- .Values.apiKey.existingSecretKey }}
{{- else -}}
api-key
{{- end }}
{{- end }}

{{- define "ferrox.modelClaim" -}}
{{- default (printf "%s-models" (include "ferrox.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{- define "ferrox.poolName" -}}
{{- default (include "ferrox.fullname" .) .Values.inferencePool.name }}
{{- end }}

{{/*
Memory for one pod, in MiB: the model file, the KV pool and the headroom
(values.yaml, `resources`).
*/}}
{{- define "ferrox.memoryMiB" -}}
{{- $model := divf .Values.model.sizeBytes 1048576 | ceil | int64 }}
{{- add $model (int64 .Values.server.kvMemoryMiB) (int64 .Values.resources.memoryHeadroomMiB) }}
{{- end }}

{{/* The release's full name: the release name, with the chart's name unless it already contains it. */}}
{{- define "trace-repro.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "trace-repro.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "trace-repro.labels" -}}
{{ include "trace-repro.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "trace-repro.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "trace-repro.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "trace-repro.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The stages to deploy, by mode: split = ingest and entities, combined = all. */}}
{{- define "trace-repro.stages" -}}
{{- if eq .Values.mode "split" -}}
ingest,entities
{{- else if eq .Values.mode "combined" -}}
all
{{- else -}}
{{- fail (printf "mode: %q is neither split nor combined" .Values.mode) -}}
{{- end -}}
{{- end -}}

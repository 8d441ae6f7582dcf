{{/*
Labels of every object. app.kubernetes.io/name matches the kustomize base;
the rest are the standard Helm labels (tests/chart.rs ignores them).
*/}}
{{- define "bucketmap.labels" -}}
app.kubernetes.io/name: bucketmap
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
An image reference: repository:tag (tag defaults to the chart's appVersion),
then @digest when one is given (the digest decides what runs).
*/}}
{{- define "bucketmap.image" -}}
{{- $tag := .image.tag | default .chart.AppVersion -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- with .image.digest }}{{ printf "@%s" . }}{{ end -}}
{{- end -}}

{{/* Selector of the operator pods (fixed: names and selectors match the kustomize base). */}}
{{- define "bucketmap.selectorLabels" -}}
app.kubernetes.io/name: bucketmap
app.kubernetes.io/component: operator
{{- end -}}

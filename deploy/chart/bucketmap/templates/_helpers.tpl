{{/*
Labels of every object. app.kubernetes.io/name matches the kustomize base;
the rest are the standard Helm labels (tests/integration/chart/ ignores them).
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
{{- $tag := include "bucketmap.integer" (.image.tag | default .chart.AppVersion) -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- with .image.digest }}{{ printf "@%s" . }}{{ end -}}
{{- end -}}

{{/*
A value the schema allows as an integer (or a string), printed as the user
wrote it. A values file and --set-json hand the templates every number as a
float64, which Go prints in exponent form once it is large (a project
number would reach the operator as 1.23456789012e+11); --set hands an int64,
--set-string a string. The schema refuses numbers with a fraction here, so
printing a float64 without one loses nothing.
*/}}
{{- define "bucketmap.integer" -}}
{{- if kindIs "float64" . }}{{ printf "%.0f" . }}{{ else }}{{ toString . }}{{ end -}}
{{- end -}}

{{/*
A resource quantity (resources.requests and .limits), always as a string,
the form the API server returns it in: a suffixed quantity stays as it is,
and a whole number from a values file prints as its digits, not in
exponent form, so that every way of giving it renders the same.
*/}}
{{- define "bucketmap.quantity" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}{{ printf "%.0f" . }}{{ else }}{{ toString . }}{{ end -}}
{{- end -}}

{{/* Selector of the operator pods (fixed: names and selectors match the kustomize base). */}}
{{- define "bucketmap.selectorLabels" -}}
app.kubernetes.io/name: bucketmap
app.kubernetes.io/component: operator
{{- end -}}

{{/*
The operator pods' default affinity: replicas prefer different nodes, then
different zones, so that one node or zone going away leaves a replica to
serve the webhook. Preferred, not required: a single-node (or single-zone)
cluster still runs every replica. deploy/operator.yaml has the same.
*/}}
{{- define "bucketmap.defaultAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "bucketmap.selectorLabels" . | nindent 12 }}
    - weight: 50
      podAffinityTerm:
        topologyKey: topology.kubernetes.io/zone
        labelSelector:
          matchLabels:
            {{- include "bucketmap.selectorLabels" . | nindent 12 }}
{{- end -}}

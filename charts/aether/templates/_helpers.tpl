{{/*
Labels of every object. Names are fixed (aether-operator, aether-proxy, ...) rather than
derived from the release name: the operator and the proxies find each other by them, and a
cluster runs one mesh.
*/}}
{{- define "aether.commonLabels" -}}
app.kubernetes.io/part-of: aether
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "aether.labels" -}}
{{ include "aether.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of a component: pass (dict "root" $ "component" "operator"). */}}
{{- define "aether.selectorLabels" -}}
app.kubernetes.io/name: aether-{{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* All labels of a component's objects and pods; same argument as aether.selectorLabels. */}}
{{- define "aether.componentLabels" -}}
{{ include "aether.commonLabels" .root }}
{{ include "aether.selectorLabels" . }}
{{- end }}

{{/* The reference of one of aether's images: pass (dict "root" $ "name" "proxy"). */}}
{{- define "aether.image" -}}
{{ .root.Values.image.registry }}/{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* Helpers are namespaced "flotilla.*" so they never clash with a parent chart's. */}}

{{- define "flotilla.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* fullname: "<release>-<chart>", or the release name alone when it already contains the chart name. */}}
{{- define "flotilla.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flotilla.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flotilla.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* labels: the recommended app.kubernetes.io set plus helm.sh/chart; callers add component. */}}
{{- define "flotilla.labels" -}}
helm.sh/chart: {{ include "flotilla.chart" . }}
{{ include "flotilla.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flotilla
{{- end -}}

{{- define "flotilla.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "flotilla.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name an existing ServiceAccount" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* monitoredNamespaces: where model pods live, for the PodMonitor's namespaceSelector. */}}
{{- define "flotilla.monitoredNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- toYaml .Values.operator.watchNamespaces -}}
{{- else -}}
{{- toYaml (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* gatewayName: the gateway's Deployment, Service, ServiceAccount and ClusterRole. */}}
{{- define "flotilla.gatewayName" -}}
{{- printf "%s-gateway" (include "flotilla.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* gatewayImage: gateway.image when set, else the operator image (which ships flotilla-gateway). */}}
{{- define "flotilla.gatewayImage" -}}
{{- if .Values.gateway.image.repository -}}
{{- printf "%s:%s" .Values.gateway.image.repository (default .Chart.AppVersion (default .Values.image.tag .Values.gateway.image.tag)) -}}
{{- else -}}
{{- include "flotilla.image" . -}}
{{- end -}}
{{- end -}}

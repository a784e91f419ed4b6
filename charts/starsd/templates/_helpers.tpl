{{/*
starsd.name: the chart name, or nameOverride; cut to 63 characters (the DNS label limit).
*/}}
{{- define "starsd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
starsd.fullname: the prefix of every resource name, "<release>-<chart>" (or just the release name when it
already holds the chart name), or fullnameOverride; cut to 63 characters.
*/}}
{{- define "starsd.fullname" -}}
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
starsd.chart: "<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "starsd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
starsd.selectorLabels: the labels a selector matches; they never change across upgrades.
*/}}
{{- define "starsd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "starsd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
starsd.labels: the recommended app.kubernetes.io/* labels, on every resource.
*/}}
{{- define "starsd.labels" -}}
helm.sh/chart: {{ include "starsd.chart" . }}
{{ include "starsd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: starsd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
starsd.serviceAccountName: the operator's ServiceAccount.
*/}}
{{- define "starsd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "starsd.operatorName" .) .Values.serviceAccount.name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
starsd.registry: image.registry, which the chart cannot do without: no image is published, so a default would
name images no registry holds and every pod would wait in ImagePullBackOff.
*/}}
{{- define "starsd.registry" -}}
{{- required "image.registry is required: no StarSD image is published. Build and push the images with `make images REGISTRY=registry.example.com/team PUSH=1` (from the repository), then set the same registry: --set image.registry=registry.example.com/team" .Values.image.registry }}
{{- end }}

{{/*
starsd.image: "<image.registry>/<repository>:<tag>" of an image block; called with (dict "root" $ "image" BLOCK).
*/}}
{{- define "starsd.image" -}}
{{- printf "%s/%s:%s" (include "starsd.registry" .root) .image.repository .image.tag }}
{{- end }}

{{/*
starsd.operatorName: the name of the operator's Deployment, ClusterRole and binding; cut to 63 characters.
*/}}
{{- define "starsd.operatorName" -}}
{{- printf "%s-operator" (include "starsd.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

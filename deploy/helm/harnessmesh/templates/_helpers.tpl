{{/* Names: "<release>-harnessmesh" (the release name alone when it already contains "harnessmesh"). */}}
{{- define "harnessmesh.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains "harnessmesh" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-harnessmesh" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* One component's name: harnessmesh.component (dict "ctx" $ "component" "router") */}}
{{- define "harnessmesh.component" -}}
{{- printf "%s-%s" (include "harnessmesh.fullname" .ctx) .component -}}
{{- end -}}

{{- define "harnessmesh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "harnessmesh.selectorLabels" . }}
{{- end -}}

{{- define "harnessmesh.selectorLabels" -}}
app.kubernetes.io/name: harnessmesh
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The Secret holding nats-token, thinking-signature-key and (optional) api-keys. */}}
{{- define "harnessmesh.secretName" -}}
{{- .Values.global.harnessmesh.existingSecret | default (printf "%s-harnessmesh-secrets" .Release.Name | trunc 63) -}}
{{- end -}}

{{- define "harnessmesh.clusterDomain" -}}
{{- .Values.clusterDomain | default "cluster.local" -}}
{{- end -}}

{{/* The NATS the services connect to: the subchart's client Service (named as nats.fullname names it). */}}
{{- define "harnessmesh.natsUrl" -}}
{{- if .Values.nats.enabled -}}
{{- $name := "" -}}
{{- if .Values.nats.fullnameOverride -}}
{{- $name = .Values.nats.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "nats" .Release.Name -}}
{{- $name = .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name = printf "%s-nats" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- printf "nats://%s.%s.svc.%s:%v" $name .Release.Namespace (include "harnessmesh.clusterDomain" .) .Values.nats.config.nats.port -}}
{{- else -}}
{{- required "nats.enabled is false: set externalNats.url" .Values.externalNats.url -}}
{{- end -}}
{{- end -}}

{{/* Copies of each state bucket in JetStream: state.bucketReplicas, else the chart's NATS cluster size (at most
     5, JetStream's limit), else 1 (one NATS node, or externalNats). */}}
{{- define "harnessmesh.bucketReplicas" -}}
{{- if gt (int .Values.state.bucketReplicas) 0 -}}
{{- .Values.state.bucketReplicas -}}
{{- else if and .Values.nats.enabled .Values.nats.config.cluster.enabled -}}
{{- min (int .Values.nats.config.cluster.replicas) 5 -}}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{/* Whether the state stores live in JetStream (state.store: jetstream | memory; anything else fails the render). */}}
{{- define "harnessmesh.sharedState" -}}
{{- if not (has .Values.state.store (list "jetstream" "memory")) -}}
{{- fail (printf "state.store must be jetstream or memory, not %q" .Values.state.store) -}}
{{- end -}}
{{- if eq .Values.state.store "jetstream" -}}true{{- end -}}
{{- end -}}

{{/* host:port of every router replica (StatefulSet pods behind the headless Service), comma-separated:
     parse prefers the first and takes the next while it is unavailable (--router-address a,b). */}}
{{- define "harnessmesh.routerAddresses" -}}
{{- $name := include "harnessmesh.component" (dict "ctx" . "component" "router") -}}
{{- $out := list -}}
{{- range $i := until (int .Values.router.replicas) -}}
{{- $out = append $out (printf "%s-%d.%s.%s.svc.%s:%v" $name $i $name $.Release.Namespace (include "harnessmesh.clusterDomain" $) $.Values.router.port) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{- define "harnessmesh.otlpEndpoint" -}}
{{- if .Values.tracing.otlpEndpoint -}}
{{- .Values.tracing.otlpEndpoint -}}
{{- else -}}
{{- printf "http://%s:4317" (include "harnessmesh.component" (dict "ctx" . "component" "jaeger")) -}}
{{- end -}}
{{- end -}}

{{- define "harnessmesh.image" -}}
{{- printf "%s:%s" .repository (.tag | toString) -}}
{{- end -}}

{{/* Env every harnessmesh container gets: shared options and OpenTelemetry's standard variables.
     harnessmesh.commonEnv (dict "ctx" $ "service" "router") */}}
{{- define "harnessmesh.commonEnv" -}}
{{- $v := .ctx.Values -}}
- name: HARNESSMESH_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
- name: HARNESSMESH_LOG_FORMAT
  value: {{ $v.logFormat | quote }}
- name: HARNESSMESH_NAMESPACE
  value: {{ $v.meshNamespace | quote }}
{{- if $v.tracing.enabled }}
- name: OTEL_SERVICE_NAME
  value: {{ printf "harnessmesh-%s" .service | quote }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ include "harnessmesh.otlpEndpoint" .ctx | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $v.tracing.protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $v.tracing.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $v.tracing.samplerArg | quote }}
{{- end }}
{{- if $v.tls.enabled }}
- name: HARNESSMESH_TLS_CERT
  value: {{ printf "%s/%s" $v.tls.mountPath $v.tls.certKey | quote }}
- name: HARNESSMESH_TLS_KEY
  value: {{ printf "%s/%s" $v.tls.mountPath $v.tls.keyKey | quote }}
- name: HARNESSMESH_TLS_CA
  value: {{ printf "%s/%s" $v.tls.mountPath $v.tls.caKey | quote }}
{{- end }}
{{- end -}}

{{- define "harnessmesh.natsEnv" -}}
- name: HARNESSMESH_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "harnessmesh.secretName" . }}
      key: nats-token
{{- end -}}

{{- define "harnessmesh.volumeMounts" -}}
{{- if .ctx.Values.tls.enabled }}
- name: tls
  mountPath: {{ .ctx.Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- if and .model .ctx.Values.model.volume }}
- name: model
  mountPath: {{ .ctx.Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "harnessmesh.volumes" -}}
{{- if .ctx.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.enabled: set tls.secretName" .ctx.Values.tls.secretName }}
    defaultMode: 0400
{{- end }}
{{- if and .model .ctx.Values.model.volume }}
- name: model
  {{- toYaml .ctx.Values.model.volume | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A probe that runs `harnessmesh health` in the container (the same check compose runs). */}}
{{- define "harnessmesh.execProbe" -}}
exec:
  command:
    {{- toYaml .command | nindent 4 }}
{{- toYaml .timing | nindent 0 }}
{{- end -}}

{{/* Pod-level settings shared by every component: harnessmesh.podSpec (dict "ctx" $ "values" .Values.router) */}}
{{- define "harnessmesh.podCommon" -}}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .ctx.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "harnessmesh.pdb" -}}
{{- if and .values.pdb.enabled (gt (int .values.replicas) 0) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "harnessmesh.component" . }}
  labels:
    {{- include "harnessmesh.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .values.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "harnessmesh.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

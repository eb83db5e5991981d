{{/* Names and labels shared by the chart's templates. */}}

{{/* Every object's name: <release>-injector, or fullnameOverride. */}}
{{- define "consistd.fullname" -}}
{{- default (printf "%s-injector" .Release.Name) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret holding the injector's CA and serving certificate. */}}
{{- define "consistd.secretName" -}}
{{- default (printf "%s-tls" (include "consistd.fullname" .)) .Values.webhook.secretName -}}
{{- end -}}

{{/* The MutatingWebhookConfiguration whose caBundle the injector keeps current. */}}
{{- define "consistd.webhookConfigurationName" -}}
{{- default (include "consistd.fullname" .) .Values.webhook.configurationName -}}
{{- end -}}

{{- define "consistd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Deployment's selector, as in manifests/injector. */}}
{{- define "consistd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "consistd.fullname" . }}
{{- end -}}

{{- define "consistd.labels" -}}
{{ include "consistd.selectorLabels" . }}
app.kubernetes.io/part-of: consistd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

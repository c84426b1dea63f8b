{{- define "dlock.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "dlock.headless" -}}{{ include "dlock.fullname" . }}-peers{{- end -}}

{{- define "dlock.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dlock.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The members' Raft addresses by stable DNS name: n=pod-N.headless:raft. */}}
{{- define "dlock.initialCluster" -}}
{{- $full := include "dlock.fullname" . -}}
{{- $svc := include "dlock.headless" . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $members = append $members (printf "%s-%d=%s-%d.%s.%s.svc:%d" $full $i $full $i $svc $.Release.Namespace (int $.Values.ports.raft)) -}}
{{- end -}}
{{- join "," $members -}}
{{- end -}}

{{/* GOMEMLIMIT from resources.limits.memory (Ki, Mi, Gi or bytes). */}}
{{- define "dlock.goMemLimit" -}}
{{- $m := toString .Values.resources.limits.memory -}}
{{- $bytes := 0 -}}
{{- if hasSuffix "Gi" $m -}}{{- $bytes = mul (trimSuffix "Gi" $m | int64) 1073741824 -}}
{{- else if hasSuffix "Mi" $m -}}{{- $bytes = mul (trimSuffix "Mi" $m | int64) 1048576 -}}
{{- else if hasSuffix "Ki" $m -}}{{- $bytes = mul (trimSuffix "Ki" $m | int64) 1024 -}}
{{- else -}}{{- $bytes = $m | int64 -}}
{{- end -}}
{{- div (mul $bytes (int .Values.goMemLimitPercent)) 100 -}}
{{- end -}}

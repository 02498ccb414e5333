{{/* Names and labels. */}}
{{- define "ssegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ssegate.fullname" -}}
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

{{- define "ssegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ssegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ssegate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ssegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ssegate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ssegate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the deployment secret, and its key. */}}
{{- define "ssegate.secretName" -}}
{{- default (printf "%s-secret" (include "ssegate.fullname" .)) .Values.secret.existingSecret -}}
{{- end -}}

{{- define "ssegate.secretKey" -}}
{{- if .Values.secret.existingSecret -}}{{ .Values.secret.existingSecretKey }}{{- else -}}secret{{- end -}}
{{- end -}}

{{/*
ssegate.redisMode: none, url, urlSecret, sentinel or cluster; fails when
more than one is given.
*/}}
{{- define "ssegate.redisMode" -}}
{{- $r := .Values.redis -}}
{{- $modes := list -}}
{{- if $r.url -}}{{- $modes = append $modes "url" -}}{{- end -}}
{{- if $r.urlSecret.name -}}{{- $modes = append $modes "urlSecret" -}}{{- end -}}
{{- if or $r.sentinel.masterSet $r.sentinel.addresses -}}{{- $modes = append $modes "sentinel" -}}{{- end -}}
{{- if $r.cluster.addresses -}}{{- $modes = append $modes "cluster" -}}{{- end -}}
{{- if gt (len $modes) 1 -}}
{{- fail (printf "redis: give one of url, urlSecret, sentinel and cluster, not %s" (join " and " $modes)) -}}
{{- end -}}
{{- if $modes -}}{{ first $modes }}{{- else -}}none{{- end -}}
{{- end -}}

{{/*
ssegate.redisURL: the -redis URL for the url, sentinel and cluster modes,
the password as $(REDIS_PASSWORD), which Kubernetes expands from the
variable of that name defined before it.
*/}}
{{- define "ssegate.redisURL" -}}
{{- $r := .Values.redis -}}
{{- $mode := include "ssegate.redisMode" . -}}
{{- $auth := "" -}}
{{- if $r.password.existingSecret -}}
{{- $auth = printf "%s:$(REDIS_PASSWORD)@" $r.username -}}
{{- else if $r.username -}}
{{- $auth = printf "%s@" $r.username -}}
{{- end -}}
{{- $scheme := "redis" -}}
{{- if $r.tls -}}{{- $scheme = "rediss" -}}{{- end -}}
{{- if eq $mode "url" -}}
{{- if not (regexMatch "^rediss?://" $r.url) -}}
{{- fail (printf "redis.url: %q is not a redis:// or rediss:// URL" $r.url) -}}
{{- end -}}
{{- if and $auth (contains "@" $r.url) -}}
{{- fail "redis.url: has a user or password of its own; give them in redis.username and redis.password, or the whole URL in redis.urlSecret" -}}
{{- end -}}
{{- $prefix := regexFind "^rediss?://" $r.url -}}
{{- printf "%s%s%s" $prefix $auth (trimPrefix $prefix $r.url) -}}
{{- else if eq $mode "sentinel" -}}
{{- if not (and $r.sentinel.masterSet $r.sentinel.addresses) -}}
{{- fail "redis.sentinel: give both masterSet and addresses" -}}
{{- end -}}
{{- $first := first $r.sentinel.addresses -}}
{{- $q := list -}}
{{- range rest $r.sentinel.addresses -}}{{- $q = append $q (printf "addr=%s" .) -}}{{- end -}}
{{- $q = append $q (printf "master_set=%s" $r.sentinel.masterSet) -}}
{{- printf "%s://%s%s/%d?%s" $scheme $auth $first (int $r.sentinel.db) (join "&" $q) -}}
{{- else if eq $mode "cluster" -}}
{{- $first := first $r.cluster.addresses -}}
{{- $q := list -}}
{{- range rest $r.cluster.addresses -}}{{- $q = append $q (printf "addr=%s" .) -}}{{- end -}}
{{- printf "%s://%s%s" $scheme $auth $first -}}{{- if $q -}}?{{ join "&" $q }}{{- end -}}
{{- end -}}
{{- end -}}

{{/*
ssegate.bytes: a Kubernetes memory quantity (512Mi, 1Gi, 1.5G, 1073741824)
in bytes, as a float.
*/}}
{{- define "ssegate.bytes" -}}
{{- $q := toString . -}}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 -}}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $unit := trimPrefix $n $q -}}
{{- if or (not $n) (not (hasKey $units $unit)) -}}
{{- fail (printf "resources.limits.memory: %q is not a quantity the chart reads (a number with k, M, G, T, Ki, Mi, Gi or Ti)" $q) -}}
{{- end -}}
{{- mulf (float64 $n) (get $units $unit) -}}
{{- end -}}

{{/* ssegate.envValue: a config value as the flag reads it (a float that
holds an integer, as YAML numbers come, without an exponent). */}}
{{- define "ssegate.envValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* ssegate.check: what the chart refuses to render. */}}
{{- define "ssegate.check" -}}
{{- $mode := include "ssegate.redisMode" . -}}
{{- if and (eq $mode "none") (gt (int .Values.replicaCount) 1) -}}
{{- fail (printf "replicaCount %d without redis: replicas that share no store each run their own generation of a duplicate; set redis (docs/deploy.md)" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and (eq $mode "none") .Values.autoscaling.enabled -}}
{{- fail "autoscaling without redis: replicas that share no store each run their own generation of a duplicate; set redis (docs/deploy.md)" -}}
{{- end -}}
{{- if not .Values.upstreams -}}
{{- fail "upstreams: at least one (a base URL, or mock)" -}}
{{- end -}}
{{- if and .Values.secret.value (lt (len .Values.secret.value) 16) -}}
{{- fail "secret.value: at least 16 bytes" -}}
{{- end -}}
{{- range $k, $v := .Values.config -}}
{{- if has $k (list "listen" "admin-listen" "upstream" "secret" "redis" "shutdown-timeout") -}}
{{- fail (printf "config.%s: set by the chart; use its own value (ports, upstreams, secret, redis, drain)" $k) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z][a-z0-9-]*$" $k) -}}
{{- fail (printf "config.%s: not a flag name (lowercase, with dashes, no leading dash)" $k) -}}
{{- end -}}
{{- end -}}
{{- if lt (int .Values.drain.shutdownTimeoutSeconds) 1 -}}
{{- fail "drain.shutdownTimeoutSeconds: at least 1" -}}
{{- end -}}
{{- $p := int .Values.memory.goMemLimitPercent -}}
{{- if or (lt $p 1) (gt $p 99) -}}
{{- fail "memory.goMemLimitPercent: from 1 to 99" -}}
{{- end -}}
{{- end -}}

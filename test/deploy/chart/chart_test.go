package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The chart, the files it copies, and the flags' reference, from this
// module's directory.
const (
	chartDir  = "../../../deploy/helm/ssegate"
	rulesFile = "../../../deploy/prometheus/ssegate.rules.yml"
	dashFile  = "../../../deploy/grafana/ssegate.json"
	flagsDoc  = "../../../docs/flags.md"
)

var (
	helmOnce sync.Once
	helmPath string
)

// helm returns the helm binary: the one .ci/run builds into the user
// cache directory (ssegate-test/helm), else one on PATH. Without either
// the test skips, unless CI is set: then it fails, since CI must run it.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if dir, err := os.UserCacheDir(); err == nil {
			p := filepath.Join(dir, "ssegate-test", "helm")
			if _, err := os.Stat(p); err == nil {
				helmPath = p
				return
			}
		}
		if p, err := exec.LookPath("helm"); err == nil {
			helmPath = p
		}
	})
	if helmPath == "" {
		msg := "helm is not installed: .ci/run builds it (go install helm.sh/helm/v4/cmd/helm@v4.3.2, into the user cache directory's ssegate-test/helm)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return helmPath
}

// runHelm runs helm with args and returns its standard output, or its
// error with standard error.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	// No repositories, registries or kubeconfig of the machine's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "kubeconfig"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// valuesFiles are the chart's CI values files (ci/*-values.yaml), and ""
// for its defaults.
func valuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("ci values files: %v %v; want at least 4", files, err)
	}
	return append([]string{""}, files...)
}

func label(file string) string {
	if file == "" {
		return "defaults"
	}
	return strings.TrimSuffix(filepath.Base(file), "-values.yaml")
}

// TestLint: helm lint --strict passes with the defaults and with every CI
// values file.
func TestLint(t *testing.T) {
	for _, f := range valuesFiles(t) {
		t.Run(label(f), func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			if f != "" {
				args = append(args, "-f", f)
			}
			if out, err := runHelm(t, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// rendered is the chart's output, each object decoded strictly into its
// Kubernetes type.
type rendered struct {
	values      map[string]any
	deployment  *appsv1.Deployment
	service     *corev1.Service
	account     *corev1.ServiceAccount
	secrets     []*corev1.Secret
	configMaps  []*corev1.ConfigMap
	pdb         *policyv1.PodDisruptionBudget
	hpa         *autoscalingv2.HorizontalPodAutoscaler
	monitor     *monitoringv1.ServiceMonitor
	rule        *monitoringv1.PrometheusRule
	kindsByName []string
}

// template renders the chart with the values file (none: the defaults)
// and the --set arguments.
func template(t *testing.T, file string, set ...string) (string, error) {
	t.Helper()
	args := []string{"template", "ssegate", chartDir, "--namespace", "llm"}
	if file != "" {
		args = append(args, "-f", file)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return runHelm(t, args...)
}

// decode splits the output into documents and decodes each strictly into
// the type of its apiVersion and kind: a field the type does not have, a
// value of the wrong type or a duplicate field fails, as does a kind the
// chart is not expected to make.
func decode(t *testing.T, out string) *rendered {
	t.Helper()
	r := &rendered{}
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(out, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		var into any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			if r.deployment != nil {
				t.Fatal("two Deployments")
			}
			r.deployment = &appsv1.Deployment{}
			into = r.deployment
		case "v1 Service":
			r.service = &corev1.Service{}
			into = r.service
		case "v1 ServiceAccount":
			r.account = &corev1.ServiceAccount{}
			into = r.account
		case "v1 Secret":
			s := &corev1.Secret{}
			r.secrets = append(r.secrets, s)
			into = s
		case "v1 ConfigMap":
			c := &corev1.ConfigMap{}
			r.configMaps = append(r.configMaps, c)
			into = c
		case "policy/v1 PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			into = r.pdb
		case "autoscaling/v2 HorizontalPodAutoscaler":
			r.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
			into = r.hpa
		case "monitoring.coreos.com/v1 ServiceMonitor":
			r.monitor = &monitoringv1.ServiceMonitor{}
			into = r.monitor
		case "monitoring.coreos.com/v1 PrometheusRule":
			r.rule = &monitoringv1.PrometheusRule{}
			into = r.rule
		default:
			t.Fatalf("document %d: unexpected %s %s %q\n%s", i, meta.APIVersion, meta.Kind, meta.Metadata.Name, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s %q does not decode strictly: %v\n%s", meta.Kind, meta.Metadata.Name, err, doc)
		}
		r.kindsByName = append(r.kindsByName, meta.Kind+"/"+meta.Metadata.Name)
	}
	if r.deployment == nil || r.service == nil {
		t.Fatalf("no Deployment or Service among %v", r.kindsByName)
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// values returns the chart's defaults with the file's values over them,
// merged map by map as helm merges them.
func values(t *testing.T, file string) map[string]any {
	t.Helper()
	load := func(p string) map[string]any {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return m
	}
	v := load(filepath.Join(chartDir, "values.yaml"))
	if file != "" {
		merge(v, load(file))
	}
	return v
}

func merge(dst, src map[string]any) {
	for k, sv := range src {
		if sm, ok := sv.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = sv
	}
}

// get walks the values by a dotted path.
func get(v map[string]any, path string) any {
	var cur any = v
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

// TestTemplate renders the chart with the defaults and every CI values
// file, decodes every object strictly against the Kubernetes (and
// Prometheus Operator) API types, and checks what the deployment must
// hold: the probes on the admin port, a grace period that outlasts the
// preStop sleep and the drain, GOMEMLIMIT under the memory limit, the
// deployment secret from a Secret, every SSEGATE_ variable a flag of
// ssegate's, the Redis URL of the chosen mode, selectors that select the
// pods, and the image's security context.
func TestTemplate(t *testing.T) {
	flags := documentedFlags(t)
	for _, f := range valuesFiles(t) {
		t.Run(label(f), func(t *testing.T) {
			out, err := template(t, f)
			if err != nil {
				t.Fatal(err)
			}
			r := decode(t, out)
			r.values = values(t, f)
			checkDeployment(t, r, flags)
			checkSecret(t, r)
			checkRedis(t, r)
			checkSelectors(t, r)
			checkOptional(t, r)
		})
	}
}

// env returns the container's variables by name, failing on a name
// given twice.
func env(t *testing.T, c corev1.Container) map[string]corev1.EnvVar {
	t.Helper()
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := m[e.Name]; dup {
			t.Errorf("env %s given twice", e.Name)
		}
		m[e.Name] = e
	}
	return m
}

// containerPort resolves a probe's or Service's port (a name or a number)
// to the container's port number.
func containerPort(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("port %q is not a port of container %s", p.StrVal, c.Name)
	return 0
}

// listenPort is the port of an SSEGATE_*LISTEN address.
func listenPort(t *testing.T, e map[string]corev1.EnvVar, name string) int32 {
	t.Helper()
	v, ok := e[name]
	if !ok {
		t.Fatalf("no %s", name)
	}
	i := strings.LastIndex(v.Value, ":")
	n, err := strconv.Atoi(v.Value[i+1:])
	if err != nil || i < 0 {
		t.Fatalf("%s=%q: not host:port", name, v.Value)
	}
	return int32(n)
}

func checkDeployment(t *testing.T, r *rendered, flags map[string]bool) {
	spec := r.deployment.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers; want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	e := env(t, c)

	// Probes: /healthz for liveness, /readyz for readiness, on the port
	// ssegate serves them on (-admin-listen).
	admin := listenPort(t, e, "SSEGATE_ADMIN_LISTEN")
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe: none, or not an HTTP GET", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s probe path: got %q; want %q", p.name, p.probe.HTTPGet.Path, p.path)
		}
		if got := containerPort(t, c, p.probe.HTTPGet.Port); got != admin {
			t.Errorf("%s probe port: got %d; want %d (SSEGATE_ADMIN_LISTEN)", p.name, got, admin)
		}
	}
	if !strings.HasPrefix(e["SSEGATE_LISTEN"].Value, "0.0.0.0:") || !strings.HasPrefix(e["SSEGATE_ADMIN_LISTEN"].Value, "0.0.0.0:") {
		t.Errorf("listen %q, admin %q: want every interface of the pod", e["SSEGATE_LISTEN"].Value, e["SSEGATE_ADMIN_LISTEN"].Value)
	}

	// The drain: preStop sleeps (no shell in the image), then SIGTERM
	// gives streams -shutdown-timeout, then traces get up to 5 s: the
	// grace period must cover all of it.
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("no preStop sleep: %+v", c.Lifecycle)
	}
	if c.Lifecycle.PreStop.Exec != nil {
		t.Error("preStop runs a command: the image has no shell")
	}
	sleep := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	if sleep < time.Second {
		t.Errorf("preStop sleep %v; want at least 1s for the endpoints to go", sleep)
	}
	drain, err := time.ParseDuration(e["SSEGATE_SHUTDOWN_TIMEOUT"].Value)
	if err != nil {
		t.Fatalf("SSEGATE_SHUTDOWN_TIMEOUT: %v", err)
	}
	if spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	if want := sleep + drain + 5*time.Second; grace < want {
		t.Errorf("terminationGracePeriodSeconds %v; want at least %v (preStop %v + drain %v + 5s for the traces' flush)", grace, want, sleep, drain)
	}
	if s := r.deployment.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update %+v: want maxUnavailable 0 (a new pod ready before an old one drains)", s)
	}

	// Memory: GOMEMLIMIT below the container's limit.
	if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		gml, err := strconv.ParseInt(e["GOMEMLIMIT"].Value, 10, 64)
		if err != nil {
			t.Fatalf("GOMEMLIMIT %q: %v", e["GOMEMLIMIT"].Value, err)
		}
		pct, _ := get(r.values, "memory.goMemLimitPercent").(float64)
		want := lim.Value() * int64(pct) / 100
		if gml >= lim.Value() || gml != want {
			t.Errorf("GOMEMLIMIT %d with a memory limit of %s (%d): want %d (%v%%), below the limit", gml, lim.String(), lim.Value(), want, pct)
		}
		var bounds int64
		for _, n := range []string{"SSEGATE_MAX_STORE_BYTES", "SSEGATE_MAX_LIVE_BYTES"} {
			v, err := strconv.ParseInt(e[n].Value, 10, 64)
			if err != nil {
				t.Fatalf("%s %q: want the bytes, as the chart sets them: %v", n, e[n].Value, err)
			}
			bounds += v
		}
		if bounds >= gml {
			t.Errorf("-max-store-bytes plus -max-live-bytes: %d; want less than GOMEMLIMIT %d", bounds, gml)
		}
	} else if _, ok := e["GOMEMLIMIT"]; ok {
		t.Error("GOMEMLIMIT without a memory limit")
	}

	// Every SSEGATE_ variable is a flag of ssegate's; a value is what
	// the flag parses (no YAML float exponent for a big integer).
	for name, v := range e {
		if !strings.HasPrefix(name, "SSEGATE_") {
			continue
		}
		flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, "SSEGATE_"), "_", "-"))
		if !flags[flag] {
			t.Errorf("%s: -%s is not a flag in docs/flags.md", name, flag)
		}
		if strings.Contains(v.Value, "e+") {
			t.Errorf("%s=%q: a number in exponent form, which the flag refuses", name, v.Value)
		}
	}
	if cfg, ok := r.values["config"].(map[string]any); ok {
		for k, v := range cfg {
			name := "SSEGATE_" + strings.ToUpper(strings.ReplaceAll(k, "-", "_"))
			want := fmt.Sprint(v)
			if f, ok := v.(float64); ok {
				want = strconv.FormatFloat(f, 'f', -1, 64)
			}
			if got := e[name].Value; got != want {
				t.Errorf("config.%s: %s=%q; want %q", k, name, got, want)
			}
		}
	}
	if ups, _ := get(r.values, "upstreams").([]any); e["SSEGATE_UPSTREAM"].Value != joinAny(ups) {
		t.Errorf("SSEGATE_UPSTREAM %q; want %q", e["SSEGATE_UPSTREAM"].Value, joinAny(ups))
	}

	// As in the image: non-root uid 65532, read-only root, no
	// capabilities, no privilege escalation, the runtime's seccomp.
	sc, psc := c.SecurityContext, spec.SecurityContext
	switch {
	case sc == nil || psc == nil:
		t.Fatal("no security context")
	case psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532:
		t.Errorf("pod security context %+v: want runAsNonRoot, uid 65532", psc)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("root filesystem not read-only")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation allowed")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v: want drop ALL, none added", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("seccomp %+v: want RuntimeDefault", sc.SeccompProfile)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the service account token is mounted: ssegate does not talk to the API server")
	}
	if r.account != nil && spec.ServiceAccountName != r.account.Name {
		t.Errorf("serviceAccountName %q; want the chart's %q", spec.ServiceAccountName, r.account.Name)
	}

	// Replicas: more than one (or an autoscaler) only with Redis, which
	// the chart refuses otherwise (TestRefused); with an autoscaler the
	// Deployment leaves replicas to it.
	_, redis := e["SSEGATE_REDIS"]
	replicas := int32(1)
	if p := r.deployment.Spec.Replicas; p != nil {
		replicas = *p
	}
	if r.hpa != nil {
		if r.deployment.Spec.Replicas != nil {
			t.Error("replicas set beside a HorizontalPodAutoscaler: every upgrade would reset the scale")
		}
		replicas = r.hpa.Spec.MaxReplicas
	}
	if replicas > 1 && !redis {
		t.Errorf("%d replicas without SSEGATE_REDIS", replicas)
	}
}

func joinAny(v []any) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// checkSecret: SSEGATE_SECRET comes from a Secret: one the chart made,
// holding at least 16 bytes under the key named, or the one the values
// name.
func checkSecret(t *testing.T, r *rendered) {
	e := env(t, r.deployment.Spec.Template.Spec.Containers[0])
	v, ok := e["SSEGATE_SECRET"]
	if !ok || v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil || v.Value != "" {
		t.Fatalf("SSEGATE_SECRET %+v: want it from a Secret", v)
	}
	ref := v.ValueFrom.SecretKeyRef
	if ref.Optional != nil && *ref.Optional {
		t.Error("SSEGATE_SECRET is optional: a replica without it would draw its own")
	}
	if existing, _ := get(r.values, "secret.existingSecret").(string); existing != "" {
		key, _ := get(r.values, "secret.existingSecretKey").(string)
		if ref.Name != existing || ref.Key != key {
			t.Errorf("SSEGATE_SECRET from %s/%s; want %s/%s", ref.Name, ref.Key, existing, key)
		}
		for _, s := range r.secrets {
			if s.Name == existing {
				t.Errorf("the chart made the existing Secret %s", existing)
			}
		}
		return
	}
	for _, s := range r.secrets {
		if s.Name != ref.Name {
			continue
		}
		if got := len(s.Data[ref.Key]); got < 16 {
			t.Errorf("Secret %s key %s: %d bytes; want at least 16", s.Name, ref.Key, got)
		}
		if want, _ := get(r.values, "secret.value").(string); want != "" && string(s.Data[ref.Key]) != want {
			t.Errorf("Secret %s holds %q; want secret.value %q", s.Name, s.Data[ref.Key], want)
		}
		if s.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("Secret %s is deleted on uninstall: a reinstall would draw a new secret", s.Name)
		}
		return
	}
	t.Errorf("SSEGATE_SECRET names the Secret %s, which the chart did not make (made: %v)", ref.Name, r.kindsByName)
}

// checkRedis: SSEGATE_REDIS is the URL of the mode the values chose, its
// password from a Secret, defined before the variable that names it.
func checkRedis(t *testing.T, r *rendered) {
	c := r.deployment.Spec.Template.Spec.Containers[0]
	e := env(t, c)
	v, on := e["SSEGATE_REDIS"]
	cluster, _ := get(r.values, "redis.cluster.addresses").([]any)
	sentinel, _ := get(r.values, "redis.sentinel.addresses").([]any)
	plain, _ := get(r.values, "redis.url").(string)
	fromSecret, _ := get(r.values, "redis.urlSecret.name").(string)
	if want := len(cluster) > 0 || len(sentinel) > 0 || plain != "" || fromSecret != ""; on != want {
		t.Fatalf("SSEGATE_REDIS set: %v; want %v", on, want)
	}
	if !on {
		return
	}
	if fromSecret != "" {
		if v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil || v.ValueFrom.SecretKeyRef.Name != fromSecret {
			t.Errorf("SSEGATE_REDIS %+v: want it from the Secret %s", v, fromSecret)
		}
		return
	}
	raw := v.Value
	if pw, _ := get(r.values, "redis.password.existingSecret").(string); pw != "" {
		if !strings.Contains(raw, ":$(REDIS_PASSWORD)@") {
			t.Errorf("SSEGATE_REDIS %q: want the password as $(REDIS_PASSWORD)", raw)
		}
		i := slices.IndexFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == "REDIS_PASSWORD" })
		j := slices.IndexFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == "SSEGATE_REDIS" })
		if i < 0 || i > j {
			t.Errorf("REDIS_PASSWORD at %d, SSEGATE_REDIS at %d: Kubernetes expands $(REDIS_PASSWORD) only from a variable defined before", i, j)
		} else if ref := c.Env[i].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != pw {
			t.Errorf("REDIS_PASSWORD %+v: want it from the Secret %s", c.Env[i], pw)
		}
		raw = strings.ReplaceAll(raw, "$(REDIS_PASSWORD)", "pw")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("SSEGATE_REDIS %q: %v", v.Value, err)
	}
	scheme := "redis"
	if tls, _ := get(r.values, "redis.tls").(bool); tls {
		scheme = "rediss"
	}
	q := u.Query()
	switch {
	case len(cluster) > 0:
		if u.Scheme != scheme || u.Host != fmt.Sprint(cluster[0]) || len(q["addr"]) != len(cluster)-1 || (u.Path != "" && u.Path != "/") {
			t.Errorf("SSEGATE_REDIS %q: want %s://%v with the other %d seeds as ?addr= and no database (a Cluster has db 0 only)", v.Value, scheme, cluster[0], len(cluster)-1)
		}
	case len(sentinel) > 0:
		if u.Scheme != scheme || u.Host != fmt.Sprint(sentinel[0]) || len(q["addr"]) != len(sentinel)-1 || q.Get("master_set") != get(r.values, "redis.sentinel.masterSet") {
			t.Errorf("SSEGATE_REDIS %q: want the Sentinels as host and ?addr=, and master_set", v.Value)
		}
	default:
		p, _ := url.Parse(plain)
		if u.Host != p.Host || u.Path != p.Path || u.Scheme != p.Scheme {
			t.Errorf("SSEGATE_REDIS %q; want redis.url %q", v.Value, plain)
		}
	}
	if user, _ := get(r.values, "redis.username").(string); user != "" && u.User.Username() != user {
		t.Errorf("SSEGATE_REDIS %q: user %q; want %q", v.Value, u.User.Username(), user)
	}
}

// checkSelectors: the Service, PodDisruptionBudget and ServiceMonitor
// select the Deployment's pods, and the Service's ports lead to the
// container's: http to -listen, metrics to -admin-listen.
func checkSelectors(t *testing.T, r *rendered) {
	pod := r.deployment.Spec.Template.Labels
	selects := func(what string, sel map[string]string) {
		if len(sel) == 0 {
			t.Errorf("%s selects everything", what)
		}
		for k, v := range sel {
			if pod[k] != v {
				t.Errorf("%s selects %s=%s; the pods have %q", what, k, v, pod[k])
			}
		}
	}
	for k, v := range r.deployment.Spec.Selector.MatchLabels {
		if pod[k] != v {
			t.Errorf("the Deployment's selector %s=%s does not select its own pods", k, v)
		}
	}
	selects("Service", r.service.Spec.Selector)
	c := r.deployment.Spec.Template.Spec.Containers[0]
	e := env(t, c)
	ports := map[string]int32{}
	for _, p := range r.service.Spec.Ports {
		ports[p.Name] = containerPort(t, c, p.TargetPort)
	}
	if ports["http"] != listenPort(t, e, "SSEGATE_LISTEN") || ports["metrics"] != listenPort(t, e, "SSEGATE_ADMIN_LISTEN") {
		t.Errorf("Service ports lead to %v; want http to SSEGATE_LISTEN, metrics to SSEGATE_ADMIN_LISTEN", ports)
	}
	if r.pdb != nil {
		selects("PodDisruptionBudget", r.pdb.Spec.Selector.MatchLabels)
		if r.pdb.Spec.MinAvailable != nil {
			t.Error("PodDisruptionBudget minAvailable: with one replica it blocks every drain of a node")
		}
	}
	if r.hpa != nil {
		if ref := r.hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != r.deployment.Name {
			t.Errorf("HorizontalPodAutoscaler scales %s/%s; want Deployment/%s", ref.Kind, ref.Name, r.deployment.Name)
		}
		if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
			t.Error("HorizontalPodAutoscaler on CPU without a CPU request")
		}
	}
	if r.monitor != nil {
		for k, v := range r.monitor.Spec.Selector.MatchLabels {
			if r.service.Labels[k] != v {
				t.Errorf("ServiceMonitor selects %s=%s; the Service has %q", k, v, r.service.Labels[k])
			}
		}
		if len(r.monitor.Spec.Endpoints) != 1 || r.monitor.Spec.Endpoints[0].Port != "metrics" || r.monitor.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor endpoints %+v: want the Service's metrics port, /metrics", r.monitor.Spec.Endpoints)
		}
	}
}

// checkOptional: the objects the values turn on are there, with the
// project's rules and dashboard as they are in deploy/.
func checkOptional(t *testing.T, r *rendered) {
	want := func(what string, on bool, got bool) {
		if on != got {
			t.Errorf("%s rendered: %v; want %v", what, got, on)
		}
	}
	on := func(path string) bool { b, _ := get(r.values, path).(bool); return b }
	want("HorizontalPodAutoscaler", on("autoscaling.enabled"), r.hpa != nil)
	want("PodDisruptionBudget", on("podDisruptionBudget.enabled"), r.pdb != nil)
	want("ServiceMonitor", on("metrics.serviceMonitor.enabled"), r.monitor != nil)
	want("PrometheusRule", on("metrics.prometheusRule.enabled"), r.rule != nil)
	want("ServiceAccount", on("serviceAccount.create"), r.account != nil)
	var dash *corev1.ConfigMap
	for _, c := range r.configMaps {
		if strings.HasSuffix(c.Name, "-dashboard") {
			dash = c
		}
	}
	want("dashboard ConfigMap", on("metrics.dashboard.enabled"), dash != nil)
	if r.rule != nil {
		var file monitoringv1.PrometheusRuleSpec
		b, err := os.ReadFile(rulesFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, &file); err != nil {
			t.Fatalf("%s as a PrometheusRule spec: %v", rulesFile, err)
		}
		got, _ := json.Marshal(r.rule.Spec)
		exp, _ := json.Marshal(file)
		if !bytes.Equal(got, exp) || len(file.Groups) == 0 {
			t.Errorf("PrometheusRule spec differs from %s", rulesFile)
		}
	}
	if dash != nil {
		b, err := os.ReadFile(dashFile)
		if err != nil {
			t.Fatal(err)
		}
		if dash.Data["ssegate.json"] != string(b) {
			t.Errorf("dashboard ConfigMap's ssegate.json differs from %s", dashFile)
		}
		if !json.Valid([]byte(dash.Data["ssegate.json"])) {
			t.Error("dashboard ConfigMap's ssegate.json is not JSON")
		}
		if dash.Labels["grafana_dashboard"] != "1" {
			t.Errorf("dashboard ConfigMap labels %v: want grafana_dashboard: \"1\" for Grafana's sidecar", dash.Labels)
		}
	}
}

// documentedFlags returns the flag names of docs/flags.md's tables.
func documentedFlags(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(flagsDoc)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `-([a-z0-9-]+)`").FindAllSubmatch(b, -1) {
		flags[string(m[1])] = true
	}
	if len(flags) < 40 || !flags["shutdown-timeout"] || !flags["redis"] {
		t.Fatalf("docs/flags.md: %d flags read; want the whole table", len(flags))
	}
	return flags
}

// TestCopies: the chart's copies of the rules and the dashboard (a chart
// cannot read files outside its directory) are the files in deploy/.
func TestCopies(t *testing.T) {
	for _, c := range []struct{ copy, orig string }{
		{filepath.Join(chartDir, "files", "ssegate.rules.yml"), rulesFile},
		{filepath.Join(chartDir, "files", "ssegate.json"), dashFile},
	} {
		a, err := os.ReadFile(c.copy)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(c.orig)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: copy it again (cp %s %s)", c.copy, c.orig, c.orig, c.copy)
		}
	}
}

// TestRefused: what the chart must not render. Replicas (or an
// autoscaler) without a shared store would each run their own
// generation of a duplicate; the rest are values that would start a
// broken or different deployment than asked. want matches the template's
// fail message, or for what values.schema.json refuses first, the path of
// the value in helm's schema error.
func TestRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		set  []string
		want string
	}{
		{"replicas without redis", []string{"replicaCount=3"}, "replicaCount 3 without redis"},
		{"autoscaling without redis", []string{"autoscaling.enabled=true"}, "autoscaling without redis"},
		{"two redis modes", []string{"redis.url=redis://a:6379", "redis.cluster.addresses={b:6379}"}, "give one of url, urlSecret, sentinel and cluster, not url and cluster"},
		{"sentinel without master", []string{"redis.sentinel.addresses={s:26379}"}, "give both masterSet and addresses"},
		{"url not redis", []string{"redis.url=http://a:6379"}, "is not a redis:// or rediss:// URL|/redis/url"},
		{"url with password and secret", []string{"redis.url=redis://:pw@a:6379", "redis.password.existingSecret=r"}, "redis.url: has a user or password of its own"},
		{"flag the chart sets", []string{"config.shutdown-timeout=5s"}, "config.shutdown-timeout: set by the chart"},
		{"not a flag name", []string{"config.MAX_BODY=1"}, "not a flag name|.MAX_BODY. does not match pattern"},
		{"short secret", []string{"secret.value=short"}, "secret.value: at least 16 bytes|/secret/value"},
		{"no upstream", []string{"upstreams=null"}, "upstreams: at least one"},
		{"unreadable memory limit", []string{"resources.limits.memory=lots"}, `resources.limits.memory: "lots" is not a quantity`},
		{"misspelled value", []string{"replicaCont=3"}, "replicaCont"},
		{"GOMEMLIMIT at the limit", []string{"memory.goMemLimitPercent=100"}, "goMemLimitPercent: from 1 to 99|/memory/goMemLimitPercent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := template(t, "", c.set...)
			if err == nil {
				t.Fatalf("rendered; want it refused with %q\n%s", c.want, out)
			}
			if !regexp.MustCompile(c.want).MatchString(err.Error()) {
				t.Fatalf("got %v; want it to match %q", err, c.want)
			}
		})
	}
}

// TestSecretKept: on an upgrade the chart reads the deployment secret
// back rather than draw a new one; helm template cannot (no cluster), so
// this checks the template reads it: two renders draw two secrets, and
// the lookup is what the Secret's template asks first.
func TestSecretKept(t *testing.T) {
	secretOf := func() string {
		out, err := template(t, "", "upstreams={mock}")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range decode(t, out).secrets {
			return string(s.Data["secret"])
		}
		t.Fatal("no Secret rendered")
		return ""
	}
	if a, b := secretOf(), secretOf(); a == b || len(a) < 32 {
		t.Errorf("two renders drew %q and %q; want two random secrets of at least 32 bytes", a, b)
	}
	tpl, err := os.ReadFile(filepath.Join(chartDir, "templates", "secret.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`lookup "v1" "Secret" \.Release\.Namespace \$name`).Match(tpl) {
		t.Error("templates/secret.yaml does not look up the Secret it made before: an upgrade would draw a new secret")
	}
}

// TestPackage: the chart packages (offline), without its CI values.
func TestPackage(t *testing.T) {
	dir := t.TempDir()
	if out, err := runHelm(t, "package", chartDir, "--destination", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "ssegate-*.tgz"))
	if len(files) != 1 {
		t.Fatalf("packaged %v; want one ssegate-*.tgz", files)
	}
	out, err := exec.Command("tar", "-tzf", files[0]).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ssegate/values.yaml", "ssegate/files/ssegate.rules.yml", "ssegate/files/ssegate.json", "ssegate/templates/deployment.yaml"} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("package lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "ssegate/ci/") {
		t.Errorf("package holds the CI values files:\n%s", out)
	}
}

// Package charttest renders deploy/helm/dlock with the real helm and decodes
// every object strictly into the Kubernetes API types, then checks what a
// dlock cluster needs of them. It is its own module so that the dlock module
// does not depend on the Kubernetes API; .ci/run runs it.
package charttest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// helm finds the helm binary: $HELM, PATH, or Go's bin dir (go install
// helm.sh/helm/v3/cmd/helm@v3.22.0 puts it there).
func helm(t *testing.T) string {
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	out, _ := exec.Command("go", "env", "GOPATH").Output()
	p := filepath.Join(strings.TrimSpace(string(out)), "bin", "helm")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if os.Getenv("DLOCK_DEPLOY_TESTS") == "require" {
		t.Fatal("helm not found: go install helm.sh/helm/v3/cmd/helm@v3.22.0")
	}
	t.Skip("helm not found: go install helm.sh/helm/v3/cmd/helm@v3.22.0 to run this check")
	return ""
}

type rendered struct {
	sts      *appsv1.StatefulSet
	services map[string]*corev1.Service
	pdb      *policyv1.PodDisruptionBudget
}

// render runs helm template with the given --set values and decodes every
// object strictly: an unknown or misplaced field is an error, as the API
// server's strict field validation would make it.
func render(t *testing.T, set ...string) rendered {
	t.Helper()
	args := []string{"template", "locks", filepath.Join("..", "dlock"), "--namespace", "infra"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	r := rendered{services: map[string]*corev1.Service{}}
	for _, doc := range strings.Split(string(out), "\n---") {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		switch meta.Kind {
		case "":
			continue
		case "StatefulSet":
			r.sts = &appsv1.StatefulSet{}
			strict(t, doc, r.sts)
		case "Service":
			s := &corev1.Service{}
			strict(t, doc, s)
			r.services[s.Name] = s
		case "PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			strict(t, doc, r.pdb)
		default:
			t.Fatalf("unexpected kind %s", meta.Kind)
		}
	}
	if r.sts == nil || r.pdb == nil || len(r.services) != 2 {
		t.Fatalf("rendered %d services, statefulset %v, pdb %v", len(r.services), r.sts != nil, r.pdb != nil)
	}
	return r
}

func strict(t *testing.T, doc string, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
		t.Fatalf("strict decode: %v\n%s", err, doc)
	}
}

func env(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func TestChartDefaults(t *testing.T) {
	r := render(t)
	sts := r.sts
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: ordered start deadlocks (no member is ready before a quorum is up)", sts.Spec.PodManagementPolicy)
	}
	if *sts.Spec.Replicas != 3 || sts.Spec.ServiceName != "locks-dlock-peers" {
		t.Errorf("replicas %d, serviceName %q", *sts.Spec.Replicas, sts.Spec.ServiceName)
	}
	headless := r.services["locks-dlock-peers"]
	if headless == nil || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("headless service: %+v", headless)
	}
	if r.pdb.Spec.MaxUnavailable == nil || r.pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("pdb maxUnavailable %v", r.pdb.Spec.MaxUnavailable)
	}
	pod := sts.Spec.Template.Spec
	aa := pod.Affinity.PodAntiAffinity
	if aa == nil || len(aa.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		aa.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("anti-affinity: %+v", aa)
	}
	c := pod.Containers[0]
	if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes: liveness %s readiness %s", c.LivenessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Path)
	}
	e := env(c)
	want := "locks-dlock-0=locks-dlock-0.locks-dlock-peers.infra.svc:7071,locks-dlock-1=locks-dlock-1.locks-dlock-peers.infra.svc:7071,locks-dlock-2=locks-dlock-2.locks-dlock-peers.infra.svc:7071"
	if e["DLOCK_INITIAL_CLUSTER"] != want {
		t.Errorf("initial cluster %q, want %q", e["DLOCK_INITIAL_CLUSTER"], want)
	}
	if e["DLOCK_RAFT_ADVERTISE"] != "$(POD_NAME).locks-dlock-peers.infra.svc:7071" || e["DLOCK_ID"] != "$(POD_NAME)" {
		t.Errorf("advertise %q id %q", e["DLOCK_RAFT_ADVERTISE"], e["DLOCK_ID"])
	}
	// 90 % of the 1Gi limit.
	if e["GOMEMLIMIT"] != "966367641" {
		t.Errorf("GOMEMLIMIT %q", e["GOMEMLIMIT"])
	}
	if c.Resources.Limits.Memory().String() != "1Gi" || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Errorf("resources %v, security %+v", c.Resources, pod.SecurityContext)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || c.VolumeMounts[0].MountPath != "/data" || e["DLOCK_DATA_DIR"] != "/data" {
		t.Errorf("data volume: %+v %+v", sts.Spec.VolumeClaimTemplates, c.VolumeMounts)
	}
	if _, tls := e["DLOCK_TLS_CERT"]; tls || len(pod.Volumes) != 0 {
		t.Errorf("TLS without tls.enabled")
	}
}

func TestChartFiveMembersTLSAndMemory(t *testing.T) {
	r := render(t, "replicas=5", "tls.enabled=true", "tls.apiSecret=api-tls", "tls.peerSecret=peer-tls",
		"resources.limits.memory=2048Mi", "antiAffinity=soft", "env.DLOCK_ACL=true")
	c := r.sts.Spec.Template.Spec.Containers[0]
	e := env(c)
	if n := strings.Count(e["DLOCK_INITIAL_CLUSTER"], "="); n != 5 || *r.sts.Spec.Replicas != 5 {
		t.Errorf("5 replicas, initial cluster %q", e["DLOCK_INITIAL_CLUSTER"])
	}
	if e["GOMEMLIMIT"] != "1932735283" || e["DLOCK_ACL"] != "true" {
		t.Errorf("GOMEMLIMIT %q, DLOCK_ACL %q", e["GOMEMLIMIT"], e["DLOCK_ACL"])
	}
	if e["DLOCK_TLS_CERT"] != "/tls/api/tls.crt" || e["DLOCK_PEER_CA"] != "/tls/peer/ca.crt" || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("TLS env %v, probe scheme %s", e, c.ReadinessProbe.HTTPGet.Scheme)
	}
	vols := r.sts.Spec.Template.Spec.Volumes
	if len(vols) != 2 || vols[0].Secret.SecretName != "api-tls" || vols[1].Secret.SecretName != "peer-tls" {
		t.Errorf("TLS volumes %+v", vols)
	}
	if r.sts.Spec.Template.Spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution == nil {
		t.Errorf("antiAffinity=soft should prefer spreading")
	}
}

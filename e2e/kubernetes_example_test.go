//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// kubeCollections is where each kind of the example's manifests is
// created, as kubectl apply -n NS would.
var kubeCollections = map[string]string{
	"v1/ServiceAccount":                        "/api/v1/namespaces/%s/serviceaccounts",
	"rbac.authorization.k8s.io/v1/Role":        "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles",
	"rbac.authorization.k8s.io/v1/RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings",
	"apps/v1/Deployment":                       "/apis/apps/v1/namespaces/%s/deployments",
}

// applyManifests creates the objects of the YAML files in ns as the
// admin, skipping the kinds in skip, and returns the kinds it created.
func applyManifests(t *testing.T, k *testenv.Kube, ns string, files []string, skip ...string) []string {
	t.Helper()
	var kinds []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var obj map[string]any
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if obj == nil {
				continue
			}
			kind := fmt.Sprint(obj["kind"])
			if slices.Contains(skip, kind) {
				continue
			}
			path, ok := kubeCollections[fmt.Sprint(obj["apiVersion"])+"/"+kind]
			if !ok {
				t.Fatalf("%s: no collection known for %v %v", f, obj["apiVersion"], kind)
			}
			k.Admin(t, http.MethodPost, fmt.Sprintf(path, ns), obj)
			kinds = append(kinds, kind)
		}
	}
	return kinds
}

// podSpec is what the test takes of the Deployment the apiserver stored.
type podSpec struct {
	replicas       int
	serviceAccount string
	command, args  []string
	env            []struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `json:"fieldPath"`
			} `json:"fieldRef"`
		} `json:"valueFrom"`
	}
}

func storedDeployment(t *testing.T, k *testenv.Kube, ns, name string) podSpec {
	t.Helper()
	var d struct {
		Spec struct {
			Replicas int `json:"replicas"`
			Template struct {
				Spec struct {
					ServiceAccountName string `json:"serviceAccountName"`
					Containers         []struct {
						Command []string `json:"command"`
						Args    []string `json:"args"`
						Env     json.RawMessage
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(k.Admin(t, http.MethodGet, "/apis/apps/v1/namespaces/"+ns+"/deployments/"+name, nil), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("deployment %s has %d containers, want 1", name, len(d.Spec.Template.Spec.Containers))
	}
	c := d.Spec.Template.Spec.Containers[0]
	spec := podSpec{replicas: d.Spec.Replicas, serviceAccount: d.Spec.Template.Spec.ServiceAccountName, command: c.Command, args: c.Args}
	if err := json.Unmarshal(c.Env, &spec.env); err != nil {
		t.Fatal(err)
	}
	return spec
}

// podProcess is the container's command line and environment as the
// kubelet would make them for the pod podName in ns: the Downward API's
// fields filled in, $(VAR) in the arguments expanded, and the command
// after "--" replaced by child (the image's /app/worker is not here).
func (s podSpec) podProcess(t *testing.T, ns, podName string, child []string) (argv, env []string) {
	t.Helper()
	vars := map[string]string{}
	for _, e := range s.env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = podName
			case "metadata.namespace":
				v = ns
			default:
				t.Fatalf("env %s: field %s is not filled in by this test", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
		vars[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, a := range append(slices.Clone(s.command), s.args...) {
		argv = append(argv, ref.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := vars[m[2:len(m)-1]]; ok {
				return v
			}
			return m
		}))
	}
	i := slices.Index(argv, "--")
	if i < 0 {
		t.Fatalf("the container's arguments %q have no -- before the command", argv)
	}
	return append(argv[:i+1], child...), env
}

// inPod starts argv (leaderrun first) as a process of a pod whose service
// account has token, the way the kubelet sets one up: the token, the
// cluster's CA and the namespace in /var/run/secrets/kubernetes.io/
// serviceaccount (bind-mounted for this process alone, in a mount
// namespace of its own), KUBERNETES_SERVICE_HOST and _PORT pointing at the
// apiserver, no kubeconfig.
func inPod(t *testing.T, k *testenv.Kube, ns, token string, argv, env []string, extra ...string) *proc {
	t.Helper()
	p, _ := inPodDir(t, k, ns, token, argv, env, extra...)
	return p
}

// inPodDir is inPod, and returns the directory that the pod sees as
// /var/run/secrets/kubernetes.io/serviceaccount, where a test rotates the
// token as the kubelet does.
func inPodDir(t *testing.T, k *testenv.Kube, ns, token string, argv, env []string, extra ...string) (*proc, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "a pod's service account mount needs root (a mount namespace)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testenv.Missing(t, "unshare(1) from util-linux is not installed")
	}
	run := t.TempDir()
	sa := filepath.Join(run, "secrets", "kubernetes.io", "serviceaccount")
	if err := os.MkdirAll(sa, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(k.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"token": []byte(token), "ca.crt": ca, "namespace": []byte(ns)} {
		if err := os.WriteFile(filepath.Join(sa, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if argv[0] != "leaderrun" {
		t.Fatalf("the container runs %q, want leaderrun", argv[0])
	}
	host, port, _ := strings.Cut(k.Addr(), ":")
	env = append(env, "KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port, "HOME="+t.TempDir(), "KUBECONFIG=")
	env = append(env, extra...)
	// /var/run is /run; the mount is private to the new namespace.
	script := `mount --bind "$1" /run && shift && exec "$@"`
	args := append([]string{"--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", run, testenv.Leaderrun(t)}, argv[1:]...)
	return startProgram(t, env, unshare, args...), sa
}

// TestKubernetesExample applies examples/kubernetes/ to the real
// apiserver (no kubelet runs there, so no pod starts: the test plays the
// three pods itself, with the Deployment's own command line, environment
// and service account, in-cluster as a kubelet would set them up). The
// Role suffices: one pod leads, the others wait, and a rolling update's
// SIGTERM hands the lead over at once. The same service account without
// the RoleBinding is refused: exit 69, naming the verb and the account.
// Not in parallel: it counts the shared apiserver's open watches of
// leases, to which any other test on it would add.
func TestKubernetesExample(t *testing.T) {
	k := testenv.SharedKube(t)
	dir := filepath.Join("..", "examples", "kubernetes")
	files := []string{filepath.Join(dir, "rbac.yaml"), filepath.Join(dir, "deployment.yaml")}

	t.Run("bound", func(t *testing.T) {
		ns := k.Namespace(t)
		kinds := applyManifests(t, k, ns, files)
		t.Logf("applied %v in %s", kinds, ns)
		spec := storedDeployment(t, k, ns, "report-worker")
		if spec.replicas != 3 || spec.serviceAccount != "report-worker" {
			t.Fatalf("deployment: %d replicas of service account %q, want 3 of report-worker", spec.replicas, spec.serviceAccount)
		}
		token := k.ServiceAccountToken(t, ns, spec.serviceAccount)
		events := etcdEvents(t)
		var pods []*proc
		watches := k.LeaseWatches(t)
		for i := range spec.replicas {
			argv, env := spec.podProcess(t, ns, fmt.Sprintf("report-worker-7c9d8-%c", 'a'+i), childArgv(t))
			pods = append(pods, inPod(t, k, ns, token, argv, append(env, childEnv(events, "forever")...)))
			if i == 0 {
				waitEvents(t, events, 10*time.Second, "the first pod's worker", etcdHas("start", "report-worker-7c9d8-a"))
			}
		}
		// The holder's name is the pod's, in the Lease's spec as kubectl
		// shows it.
		var lease struct {
			Spec struct {
				HolderIdentity string `json:"holderIdentity"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(k.Admin(t, http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases/report-worker", nil), &lease); err != nil {
			t.Fatal(err)
		}
		if lease.Spec.HolderIdentity != "report-worker-7c9d8-a" {
			t.Errorf("the Lease's holder is %q, want the first pod's name", lease.Spec.HolderIdentity)
		}
		// The leader and both standbys follow the Lease.
		waitFor(t, 10*time.Second, "three watches of the Lease", every(50*time.Millisecond, func() bool { return k.LeaseWatches(t) >= watches+3 }))
		// A rolling update deletes the leading pod: SIGTERM.
		pods[0].signal(syscall.SIGTERM)
		evs := waitEvents(t, events, 10*time.Second, "a standby's worker", func(evs []event) bool { return count(evs, "start") == 2 })
		ivs := checkExclusive(t, evs)
		t.Logf("standby %s took over %v after the leader's worker exited", ivs[1].ID, ivs[1].Start.Sub(ivs[0].End).Round(time.Millisecond))
		if code := pods[0].wait(10 * time.Second); code != 0 {
			t.Errorf("the deleted pod's leaderrun exited %d, want 0 (its worker's status)", code)
		}
		for _, p := range pods[1:] {
			p.signal(syscall.SIGTERM)
			p.wait(10 * time.Second)
		}
		if evs := readEvents(t, events); count(evs, "start") != 2 {
			t.Errorf("workers started:\n%s\nwant two", formatEvents(evs))
		}
	})

	t.Run("without the RoleBinding", func(t *testing.T) {
		ns := k.Namespace(t)
		kinds := applyManifests(t, k, ns, files, "RoleBinding")
		t.Logf("applied %v in %s", kinds, ns)
		spec := storedDeployment(t, k, ns, "report-worker")
		token := k.ServiceAccountToken(t, ns, spec.serviceAccount)
		events := etcdEvents(t)
		argv, env := spec.podProcess(t, ns, "report-worker-7c9d8-a", childArgv(t))
		began := time.Now()
		p := inPod(t, k, ns, token, argv, append(env, childEnv(events, "forever")...))
		code := p.wait(10 * time.Second)
		out := p.stderr.String()
		t.Logf("exit %d after %v: %s", code, time.Since(began).Round(time.Millisecond), lastLine(out))
		user := "system:serviceaccount:" + ns + ":report-worker"
		if code != 69 || !strings.Contains(out, `cannot get resource \"leases\"`) || !strings.Contains(out, user) {
			t.Errorf("exit %d; want 69 saying that %s cannot get leases", code, user)
		}
		if evs := readEvents(t, events); len(evs) != 0 {
			t.Errorf("the worker ran:\n%s", formatEvents(evs))
		}
	})
}

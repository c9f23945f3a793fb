package cmd

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kubeconfigFor writes a kubeconfig whose current context reaches server
// with a token, in namespace (empty: none), and returns its path.
func kubeconfigFor(t *testing.T, dir, name, server, namespace string) string {
	t.Helper()
	ns := ""
	if namespace != "" {
		ns = "\n    namespace: " + namespace
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: %s
users:
- name: u
  user:
    token: secret-token-value
contexts:
- name: ctx
  context:
    cluster: c
    user: u%s
current-context: ctx
`, server, ns)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// refusedServer is an https URL on a loopback port where nothing listens:
// a request there fails at once, and the message names the server.
func refusedServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "https://" + addr
}

// TestKubernetesFlags: how the Kubernetes backend is selected and
// configured, with exit codes and messages, against a server that refuses
// connections (69 shows that the configuration was accepted, and which
// namespace and server it chose). KUBECONFIG never selects the store; in
// a pod, --backend kubernetes does; bad input is 64 naming the flag, the
// rule or the file; a token never shows.
func TestKubernetesFlags(t *testing.T) {
	dir := t.TempDir()
	server := refusedServer(t)
	host := strings.TrimPrefix(server, "https://")
	withNS := kubeconfigFor(t, dir, "with-ns", server, "team-a")
	noNS := kubeconfigFor(t, dir, "no-ns", server, "")
	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte("clusters: [unclosed"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	saDir := "/var/run/secrets/kubernetes.io/serviceaccount"
	_, err := os.Stat(saDir)
	inPod := err == nil
	runArgs := []string{"--lock", "job", "--", "/bin/true"}
	status := func(extra ...string) []string { return append([]string{"status", "--lock", "job"}, extra...) }
	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
		want []string // in the output
	}{
		{name: "kubeconfig selects", args: status("--kubeconfig", withNS), code: 69,
			want: []string{host, "team-a/leases/job"}},
		{name: "KUBECONFIG alone selects nothing", env: map[string]string{"KUBECONFIG": withNS}, args: status(), code: 64,
			want: []string{"no store configured", "--kubeconfig"}},
		{name: "KUBECONFIG with --backend", env: map[string]string{"KUBECONFIG": withNS}, args: status("--backend", "kubernetes"), code: 69,
			want: []string{host, "team-a/leases/job"}},
		{name: "KUBECONFIG list, first missing", env: map[string]string{"KUBECONFIG": missing + string(filepath.ListSeparator) + noNS},
			args: status("--backend", "kubernetes"), code: 69, want: []string{host, "default/leases/job"}},
		{name: "namespace flag wins", args: status("--kubeconfig", withNS, "--namespace", "team-b"), code: 69,
			want: []string{"team-b/leases/job"}},
		{name: "LEADERRUN_NAMESPACE", env: map[string]string{"LEADERRUN_NAMESPACE": "team-c"}, args: status("--kubeconfig", withNS), code: 69,
			want: []string{"team-c/leases/job"}},
		{name: "no namespace anywhere", args: status("--kubeconfig", noNS), code: 69, want: []string{"default/leases/job"}},
		// run logs to the process's stderr: its exit code tells.
		{name: "run reaches the server", args: append([]string{"--kubeconfig", withNS, "--try"}, runArgs...), code: 69},
		{name: "lock not a Lease name", args: []string{"status", "--lock", "Job_1", "--kubeconfig", withNS}, code: 64,
			want: []string{"--lock", "RFC 1123 subdomain"}},
		{name: "bad namespace", args: status("--kubeconfig", withNS, "--namespace", "Team_A"), code: 64,
			want: []string{"--namespace", "RFC 1123 label"}},
		{name: "kubeconfig missing", args: status("--kubeconfig", missing), code: 64, want: []string{missing}},
		{name: "kubeconfig unparsable", args: status("--kubeconfig", broken), code: 64, want: []string{broken}},
		{name: "no configuration", args: status("--backend", "kubernetes"), code: 64,
			want: []string{"--kubeconfig", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"}},
		{name: "in a pod without --backend", env: map[string]string{"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"},
			args: status(), code: 64, want: []string{"no store configured"}},
		{name: "in a pod", env: map[string]string{"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"},
			args: status("--backend", "kubernetes"), code: 64, want: []string{saDir + "/token"}},
		// The store's CheckTimings, which runner.New asks before
		// anything is sent: exit 64, though the server is unreachable.
		{name: "fast renewals leave too little lease",
			args: append([]string{"--kubeconfig", withNS, "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "600ms"}, runArgs...),
			code: 64, want: []string{"--lease-duration", "--retry-period", "--renew-deadline", "--kill-grace", "client-go"}},
		{name: "fast renewals with lease to spare",
			args: append([]string{"--kubeconfig", withNS, "--try", "--lease-duration", "4s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "600ms"}, runArgs...),
			code: 69},
		{name: "one-second renewals, the same lease",
			args: append([]string{"--kubeconfig", withNS, "--try", "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "1s", "--kill-grace", "600ms"}, runArgs...),
			code: 69},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if inPod && tt.name == "in a pod" {
				t.Skipf("%s exists: this host is a pod, whose service account this case would use", saDir)
			}
			// Nothing from the host: no kubeconfig, no pod.
			t.Setenv("HOME", t.TempDir())
			for _, v := range []string{"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "LEADERRUN_NAMESPACE",
				"LEADERRUN_BACKEND", "LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR", "POD_NAMESPACE"} {
				t.Setenv(v, "")
				os.Unsetenv(v)
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"leaderrun"}, tt.args...), &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != tt.code {
				t.Errorf("exit %d, want %d; output:\n%s", code, tt.code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not name %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "secret-token-value") {
				t.Errorf("output shows the token:\n%s", out)
			}
		})
	}
}

package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// Exec credential versions.
const (
	execV1      = "client.authentication.k8s.io/v1"
	execV1beta1 = "client.authentication.k8s.io/v1beta1"
)

// whoami asks the apiserver who c authenticates as (a SelfSubjectReview,
// which every authenticated user may create).
func whoami(t *testing.T, c *Store) (string, error) {
	t.Helper()
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	data, err := c.rest.Post().AbsPath("/apis/authentication.k8s.io/v1/selfsubjectreviews").
		SetHeader("Content-Type", "application/json").Body(body).DoRaw(context.Background())
	if err != nil {
		return "", err
	}
	var r struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	return r.Status.UserInfo.Username, nil
}

// clientFor is the store for api.
func clientFor(t *testing.T, api *APIConfig) *Store {
	t.Helper()
	s, err := Open(api, "")
	if err != nil {
		t.Fatalf("client for %s: %v", api.Source, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func write(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func b64File(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(data)
}

// setEnv leaves the test nothing of the host's configuration (a HOME
// without a kubeconfig, no KUBECONFIG, not in a pod), then sets vars.
func setEnv(t *testing.T, vars map[string]string) {
	t.Setenv("HOME", t.TempDir())
	for _, v := range []string{"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAMESPACE"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
}

// execPlugin writes a credential plugin: a shell script that checks its
// arguments, its environment and KUBERNETES_EXEC_INFO, counts its runs in
// dir/runs, and prints dir/outN.json on its N-th run if there is one, else
// dir/out.json.
func writeExecPlugin(t *testing.T, dir string) string {
	t.Helper()
	script := `#!/bin/sh
echo run >>"$PLUGIN_DIR/runs"
[ "$1" = "get-token" ] && [ "$2" = "--cluster=test" ] || { echo "unexpected arguments: $*" >&2; exit 2; }
[ "$PLUGIN_ENV" = "from-kubeconfig" ] || { echo "PLUGIN_ENV not set" >&2; exit 2; }
case $KUBERNETES_EXEC_INFO in *'"interactive":false'*) ;; *) echo "no KUBERNETES_EXEC_INFO" >&2; exit 2;; esac
n=$(wc -l <"$PLUGIN_DIR/runs" | tr -d ' ')
if [ -f "$PLUGIN_DIR/out$n.json" ]; then cat "$PLUGIN_DIR/out$n.json"; else cat "$PLUGIN_DIR/out.json"; fi
`
	p := filepath.Join(dir, "plugin.sh")
	testenv.WriteExecutable(t, p, []byte(script), 0o700)
	return p
}

func execCredentialJSON(t *testing.T, version string, status map[string]any) string {
	t.Helper()
	data, err := json.Marshal(map[string]any{"apiVersion": version, "kind": "ExecCredential", "status": status})
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func runs(t *testing.T, dir string) int {
	data, _ := os.ReadFile(filepath.Join(dir, "runs"))
	return strings.Count(string(data), "run")
}

// TestKubeconfig: the kubeconfig forms kubectl reads (through client-go's
// clientcmd) reach the real apiserver as the user they name, with the
// extras of impersonation. An exec plugin runs once while its credential
// is valid, and for every use once it has expired (the TLS handshake
// asks for a client certificate, each request for a token); a refused
// token is replaced for the next request, as client-go does.
func TestKubeconfig(t *testing.T) {
	k := testenv.SharedKube(t)
	tokenLimited, tokenAdmin := k.Token(testenv.KubeLimited), k.Token(testenv.KubeAdmin)
	certA, keyA := k.ClientCert(t, "cert-user", "cert-group")
	certB, keyB := k.ClientCert(t, "cert-data-user")
	execCert, execKey := k.ClientCert(t, "exec-cert-user")
	readFile := func(p string) string {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	cluster := func(extra string) string {
		return fmt.Sprintf("clusters:\n- name: test\n  cluster:\n    server: %s\n%s", k.URL, extra)
	}
	withCA := cluster("    certificate-authority: " + k.CAFile + "\n")
	oneUser := func(user string) string {
		return fmt.Sprintf("users:\n- name: u\n  user:\n%s\ncontexts:\n- name: c\n  context: {cluster: test, user: u, namespace: ns-c}\ncurrent-context: c\n", user)
	}
	tests := []struct {
		name    string
		files   map[string]string // relative name -> content; "kubeconfig" is the one used
		list    []string          // KUBECONFIG, relative names; nil: LoadOptions.Kubeconfig
		context string
		want    string
		wantNS  string
		runs    int // exec plugin runs after two requests
		// failFirst: the first request is refused (401), the second
		// authenticated.
		failFirst bool
		extra     map[string][]string // the user's extras, as the apiserver sees them
	}{
		{name: "token, current context", files: map[string]string{"kubeconfig": withCA + fmt.Sprintf(`users:
- name: admin
  user: {token: %s}
- name: limited
  user: {token: %s}
contexts:
- name: a
  context: {cluster: test, user: admin, namespace: ns-a}
- name: b
  context: {cluster: test, user: limited, namespace: ns-b}
current-context: b
`, tokenAdmin, tokenLimited)}, want: testenv.KubeLimited, wantNS: "ns-b"},
		{name: "chosen context", context: "a", files: map[string]string{"kubeconfig": withCA + fmt.Sprintf(`users:
- name: admin
  user: {token: %s}
- name: limited
  user: {token: %s}
contexts:
- name: a
  context: {cluster: test, user: admin, namespace: ns-a}
- name: b
  context: {cluster: test, user: limited}
current-context: b
`, tokenAdmin, tokenLimited)}, want: testenv.KubeAdmin, wantNS: "ns-a"},
		{name: "token file relative to the kubeconfig", files: map[string]string{
			"kubeconfig":    withCA + oneUser("    tokenFile: secrets/token"),
			"secrets/token": tokenLimited + "\n",
		}, want: testenv.KubeLimited, wantNS: "ns-c"},
		{name: "client certificate files relative to the kubeconfig", files: map[string]string{
			"kubeconfig": cluster("    certificate-authority: ca.pem\n") + oneUser("    client-certificate: tls/cert.pem\n    client-key: tls/key.pem"),
			"ca.pem":     readFile(k.CAFile), "tls/cert.pem": readFile(certA), "tls/key.pem": readFile(keyA),
		}, want: "cert-user", wantNS: "ns-c"},
		{name: "client certificate and CA as data", files: map[string]string{
			"kubeconfig": cluster("    certificate-authority-data: "+b64File(t, k.CAFile)+"\n") +
				oneUser("    client-certificate-data: "+b64File(t, certB)+"\n    client-key-data: "+b64File(t, keyB)),
		}, want: "cert-data-user", wantNS: "ns-c"},
		{name: "insecure-skip-tls-verify", files: map[string]string{
			"kubeconfig": cluster("    insecure-skip-tls-verify: true\n") + oneUser("    token: "+tokenLimited),
		}, want: testenv.KubeLimited, wantNS: "ns-c"},
		{name: "impersonation", files: map[string]string{
			"kubeconfig": withCA + oneUser("    token: "+tokenAdmin+"\n    as: "+testenv.KubeOther),
		}, want: testenv.KubeOther, wantNS: "ns-c"},
		{name: "impersonation with extras", files: map[string]string{
			"kubeconfig": withCA + oneUser("    token: "+tokenAdmin+"\n    as: "+testenv.KubeOther+
				"\n    as-user-extra: {reason: [nightly-report], scopes: [a, b]}"),
		}, want: testenv.KubeOther, wantNS: "ns-c", extra: map[string][]string{"reason": {"nightly-report"}, "scopes": {"a", "b"}}},
		{name: "exec plugin v1 token", files: map[string]string{
			"kubeconfig": withCA + oneUser(`    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./plugin.sh
      args: [get-token, --cluster=test]
      env: [{name: PLUGIN_ENV, value: from-kubeconfig}, {name: PLUGIN_DIR, value: DIR}]
      interactiveMode: Never
      provideClusterInfo: true`),
			"out.json": execCredentialJSON(t, execV1, map[string]any{"token": tokenLimited, "expirationTimestamp": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}),
		}, want: testenv.KubeLimited, wantNS: "ns-c", runs: 1},
		{name: "exec plugin v1beta1 client certificate", files: map[string]string{
			"kubeconfig": withCA + oneUser(`    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: ./plugin.sh
      args: [get-token, --cluster=test]
      env: [{name: PLUGIN_ENV, value: from-kubeconfig}, {name: PLUGIN_DIR, value: DIR}]`),
			"out.json": execCredentialJSON(t, execV1beta1, map[string]any{"clientCertificateData": readFile(execCert), "clientKeyData": readFile(execKey)}),
		}, want: "exec-cert-user", wantNS: "ns-c", runs: 1},
		{name: "exec plugin credential expired: run again", files: map[string]string{
			"kubeconfig": withCA + oneUser(`    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./plugin.sh
      args: [get-token, --cluster=test]
      env: [{name: PLUGIN_ENV, value: from-kubeconfig}, {name: PLUGIN_DIR, value: DIR}]
      interactiveMode: IfAvailable`),
			"out.json": execCredentialJSON(t, execV1, map[string]any{"token": tokenLimited, "expirationTimestamp": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)}),
		}, want: testenv.KubeLimited, wantNS: "ns-c", runs: 3},
		{name: "exec plugin token refused: run again and retry", files: map[string]string{
			"kubeconfig": withCA + oneUser(`    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./plugin.sh
      args: [get-token, --cluster=test]
      env: [{name: PLUGIN_ENV, value: from-kubeconfig}, {name: PLUGIN_DIR, value: DIR}]
      interactiveMode: Never`),
			"out1.json": execCredentialJSON(t, execV1, map[string]any{"token": "revoked-token"}),
			"out.json":  execCredentialJSON(t, execV1, map[string]any{"token": tokenLimited}),
		}, want: testenv.KubeLimited, wantNS: "ns-c", runs: 2, failFirst: true},
		{name: "KUBECONFIG list: first file wins, missing files skipped", list: []string{"missing", "first", "second"}, files: map[string]string{
			"first": withCA + fmt.Sprintf("users:\n- name: u\n  user: {token: %s}\n", tokenLimited),
			"second": withCA + fmt.Sprintf(`users:
- name: u
  user: {token: %s}
contexts:
- name: c
  context: {cluster: test, user: u, namespace: ns-second}
current-context: c
`, tokenAdmin),
		}, want: testenv.KubeLimited, wantNS: "ns-second"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				write(t, p, strings.ReplaceAll(content, "value: DIR", "value: "+dir))
			}
			if strings.Contains(tt.files["kubeconfig"], "plugin.sh") {
				writeExecPlugin(t, dir)
			}
			opts := LoadOptions{Context: tt.context}
			setEnv(t, nil)
			if tt.list == nil {
				opts.Kubeconfig = filepath.Join(dir, "kubeconfig")
			} else {
				var paths []string
				for _, f := range tt.list {
					paths = append(paths, filepath.Join(dir, f))
				}
				t.Setenv("KUBECONFIG", strings.Join(paths, string(filepath.ListSeparator)))
			}
			cfg, err := LoadAPIConfig(opts)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if cfg.Namespace != tt.wantNS {
				t.Errorf("namespace %q, want %q", cfg.Namespace, tt.wantNS)
			}
			c := clientFor(t, cfg)
			for i := range 2 {
				got, err := whoami(t, c)
				if i == 0 && tt.failFirst {
					if !apierrors.IsUnauthorized(err) {
						t.Fatalf("request 1 with a revoked token: %q, %v; want 401", got, err)
					}
					continue
				}
				if err != nil || got != tt.want {
					t.Fatalf("request %d authenticated as %q (%v), want %q", i+1, got, err, tt.want)
				}
			}
			if n := runs(t, dir); n != tt.runs {
				t.Errorf("exec plugin ran %d times for two requests, want %d", n, tt.runs)
			}
			if tt.extra != nil {
				if got := extraOf(t, c); !reflect.DeepEqual(got, tt.extra) {
					t.Errorf("extras %v, want %v", got, tt.extra)
				}
			}
		})
	}
}

// extraOf is the user's extras as the apiserver sees them.
func extraOf(t *testing.T, c *Store) map[string][]string {
	t.Helper()
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	data, err := c.rest.Post().AbsPath("/apis/authentication.k8s.io/v1/selfsubjectreviews").
		SetHeader("Content-Type", "application/json").Body(body).DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Status struct {
			UserInfo struct {
				Extra map[string][]string `json:"extra"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	return r.Status.UserInfo.Extra
}

// TestExecPluginCampaign: a store whose credentials come from an exec
// plugin campaigns and holds the Lease; a failing plugin is an error that
// shows its message and never a token.
func TestExecPluginCampaign(t *testing.T) {
	k := testenv.SharedKube(t)
	ns := k.Namespace(t)
	k.Grant(t, ns, testenv.KubeLimited, "get", "create", "update", "watch")
	dir := t.TempDir()
	writeExecPlugin(t, dir)
	write(t, filepath.Join(dir, "out.json"), execCredentialJSON(t, execV1, map[string]any{"token": k.Token(testenv.KubeLimited)}))
	kubeconfig := write(t, filepath.Join(dir, "kubeconfig"), fmt.Sprintf(`clusters:
- name: test
  cluster: {server: %s, certificate-authority: %s}
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: %s
      args: [get-token, --cluster=test]
      env: [{name: PLUGIN_ENV, value: from-kubeconfig}, {name: PLUGIN_DIR, value: %s}]
      interactiveMode: Never
contexts:
- name: c
  context: {cluster: test, user: u, namespace: %s}
current-context: c
`, k.URL, k.CAFile, filepath.Join(dir, "plugin.sh"), dir, ns))
	setEnv(t, nil)
	cfg, err := LoadAPIConfig(LoadOptions{Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cand := backends.Candidate{Identity: "exec", Timings: backends.DefaultTimings, Try: true}
	l, err := backends.Campaign(ctx, s, "exec", cand)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Errorf("renew: %v", err)
	}
	if err := l.Release(ctx, nil); err != nil {
		t.Errorf("release: %v", err)
	}

	// The plugin now fails: its stderr is in the message.
	cfg.REST.ExecProvider.Args = []string{"wrong"}
	s2, err := Open(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	_, err = backends.Campaign(ctx, s2, "exec", cand)
	if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "exit code 2") {
		t.Errorf("campaign with a failing plugin: %v, want ErrUnavailable with the plugin's exit code", err)
	}
	if err != nil && strings.Contains(err.Error(), k.Token(testenv.KubeLimited)) {
		t.Errorf("error shows the token: %v", err)
	}
}

// TestNamespaceDefault: an explicit namespace, else the configuration's,
// else "default".
func TestNamespaceDefault(t *testing.T) {
	tests := []struct {
		name, explicit, implied, want string
	}{
		{"explicit wins", "mine", "context-ns", "mine"},
		{"context or service account", "", "context-ns", "context-ns"},
		{"default", "", "", "default"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(&APIConfig{REST: &rest.Config{Host: "https://127.0.0.1:1"}, Namespace: tt.implied}, tt.explicit)
			if err != nil {
				t.Fatal(err)
			}
			if s.namespace != tt.want {
				t.Errorf("namespace %q, want %q", s.namespace, tt.want)
			}
		})
	}
	if _, err := Open(&APIConfig{REST: &rest.Config{Host: "https://127.0.0.1:1"}}, "Not_Valid"); err == nil {
		t.Error("an invalid namespace was accepted")
	}
}

// TestConfigErrors: configurations that cannot work say what is wrong
// (in client-go's words, after the file and context), before anything is
// sent, and never show a secret.
func TestConfigErrors(t *testing.T) {
	cluster := "clusters:\n- name: test\n  cluster: {server: https://127.0.0.1:1}\n"
	ctx := "contexts:\n- name: c\n  context: {cluster: test, user: u}\ncurrent-context: c\n"
	user := func(fields string) string { return cluster + "users:\n- name: u\n  user: {" + fields + "}\n" + ctx }
	exec := func(fields string) string {
		return user("exec: {command: x, " + fields + "}")
	}
	tests := []struct {
		name       string
		kubeconfig string // "" for none at all
		explicit   bool
		context    string
		want       string
	}{
		{name: "nothing configured", want: "no configuration"},
		{name: "explicit file missing", explicit: true, want: "no such file"},
		{name: "no current context", kubeconfig: cluster, want: "no current-context"},
		{name: "unknown context", kubeconfig: user("token: s3cret"), context: "nope", want: `no context "nope"`},
		{name: "unknown cluster", kubeconfig: "users:\n- name: u\n  user: {token: s3cret}\n" + ctx, want: `names cluster "test"`},
		{name: "unknown user", kubeconfig: cluster + ctx, want: `names user "u"`},
		{name: "cluster without server", kubeconfig: strings.Replace(user("token: s3cret"), "server: https://127.0.0.1:1", "insecure-skip-tls-verify: true", 1), want: "no server"},
		{name: "gcp auth provider", kubeconfig: user("auth-provider: {name: gcp}"), want: "gke-gcloud-auth-plugin"},
		{name: "unknown auth provider", kubeconfig: user("auth-provider: {name: nope}"), want: `no Auth Provider found for name "nope"`},
		{name: "bad base64", kubeconfig: user("client-certificate-data: '%%%'"), want: "illegal base64"},
		{name: "not yaml", kubeconfig: "clusters: [", want: "kubeconfig"},
		{name: "token and password", kubeconfig: user("token: s3cret, username: u, password: p"), want: "more than one authentication method"},
		{name: "certificate without key", kubeconfig: user("client-certificate-data: eA=="), want: "client-key-data or client-key must be specified"},
		{name: "exec old version", kubeconfig: exec("apiVersion: client.authentication.k8s.io/v1alpha1"), want: "v1alpha1"},
		{name: "not a URL", kubeconfig: strings.Replace(user("token: s3cret"), "https://127.0.0.1:1", "'ftp://h:1:2'", 1), want: "ftp://h:1:2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			setEnv(t, nil)
			opts := LoadOptions{Context: tt.context}
			switch {
			case tt.explicit:
				opts.Kubeconfig = filepath.Join(dir, "missing")
			case tt.kubeconfig != "":
				opts.Kubeconfig = write(t, filepath.Join(dir, "kubeconfig"), tt.kubeconfig)
			}
			api, err := LoadAPIConfig(opts)
			if err == nil {
				var s *Store
				if s, err = Open(api, ""); err == nil {
					_, err = backends.ReadStatus(context.Background(), s, "x")
					s.Close()
				}
			}
			t.Logf("%v", err)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("load: %v, want an error saying %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

// TestBasicAuth: a kubeconfig's username and password go out as HTTP
// basic authentication. kube-apiserver no longer accepts it (since 1.19),
// but authenticating proxies in front of one may: a TLS server of the test
// stands in for such a proxy.
func TestBasicAuth(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, _ := r.BasicAuth()
		select {
		case got <- u + ":" + p:
		default:
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	dir := t.TempDir()
	kubeconfig := write(t, filepath.Join(dir, "kubeconfig"), fmt.Sprintf(`clusters:
- name: test
  cluster: {server: %s, insecure-skip-tls-verify: true}
users:
- name: u
  user: {username: alice, password: wonder}
contexts:
- name: c
  context: {cluster: test, user: u}
current-context: c
`, srv.URL))
	setEnv(t, nil)
	cfg, err := LoadAPIConfig(LoadOptions{Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := backends.ReadStatus(context.Background(), s, "basic"); err != nil {
		t.Fatalf("status: %v", err)
	}
	if creds := <-got; creds != "alice:wonder" {
		t.Errorf("basic auth sent %q, want alice:wonder", creds)
	}
}

package kubernetes

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// APIConfig says how to reach one apiserver and who to be there: what
// kubectl makes of a kubeconfig context, or of a pod's service account.
// LoadAPIConfig fills it; every file it names is read again when needed, so
// that rotated credentials are picked up.
type APIConfig struct {
	// Server is the apiserver's URL, https://host:port, maybe with a path
	// (a proxy in front of it).
	Server string
	// CAFile and CAData are the PEM certificates of the CAs that the
	// server's certificate must chain to; both empty: the system's roots.
	CAFile string
	CAData []byte
	// Insecure skips the verification of the server's certificate
	// (insecure-skip-tls-verify). Dangerous: anyone on the path can play
	// the apiserver.
	Insecure bool
	// TLSServerName is the name to verify the server's certificate against
	// instead of the host in Server.
	TLSServerName string
	// ProxyURL is the proxy to reach the server through; empty: the
	// HTTPS_PROXY, HTTP_PROXY and NO_PROXY variables, as kubectl.
	ProxyURL string

	// Token is a bearer token; TokenFile a file holding one, read again
	// whenever it changes (a projected service-account token rotates), and
	// used instead of Token when both are set, as client-go does.
	Token     string
	TokenFile string
	// Username and Password are sent with HTTP basic authentication.
	Username, Password string
	// CertFile and KeyFile, or CertData and KeyData, are a PEM client
	// certificate and its key. Files are read again when they change.
	CertFile, KeyFile string
	CertData, KeyData []byte
	// Exec runs a credential plugin for a token or a client certificate.
	Exec *ExecConfig
	// Impersonate, ImpersonateUID and ImpersonateGroups act as another user
	// (the kubeconfig's as, as-uid and as-groups).
	Impersonate, ImpersonateUID string
	ImpersonateGroups           []string

	// Namespace is the namespace the configuration implies: the service
	// account's in a pod, the context's in a kubeconfig; "" if none.
	Namespace string
	// Source says where the configuration came from, for messages: a
	// context of a kubeconfig, or the pod's service account.
	Source string
}

// ExecConfig is a kubeconfig's exec credential plugin: a command that
// prints a client.authentication.k8s.io ExecCredential with a token or a
// client certificate, and when it expires.
type ExecConfig struct {
	// Command is the program to run: a path, or a name looked up in PATH.
	// LoadAPIConfig resolves a relative path that contains a slash against
	// the kubeconfig's directory, as kubectl does.
	Command string
	Args    []string
	// Env is added to leaderrun's own environment for the command.
	Env []ExecEnvVar
	// APIVersion is the ExecCredential version the plugin speaks:
	// client.authentication.k8s.io/v1 or v1beta1.
	APIVersion string
	// InteractiveMode is Never, IfAvailable or Always. leaderrun never
	// gives the plugin a terminal, so Always cannot be satisfied.
	InteractiveMode string
	// ProvideClusterInfo passes the cluster's server and CA to the plugin
	// in KUBERNETES_EXEC_INFO.
	ProvideClusterInfo bool
	// InstallHint is shown when the command cannot be found.
	InstallHint string
}

// ExecEnvVar is one variable of ExecConfig.Env.
type ExecEnvVar struct {
	Name  string `yaml:"name"`
	Value string `yaml:"value"`
}

// LoadOptions say where LoadAPIConfig looks.
type LoadOptions struct {
	// Kubeconfig is the kubeconfig file to use (--kubeconfig). Empty: the
	// files listed in KUBECONFIG, else ~/.kube/config, else, in a pod, its
	// service account.
	Kubeconfig string
	// Context is the kubeconfig context to use. Empty: current-context.
	Context string
	// Getenv reads the environment. Nil: os.Getenv.
	Getenv func(string) string
	// ServiceAccountDir is where a pod's service account is mounted. Empty:
	// DefaultServiceAccountDir.
	ServiceAccountDir string
}

// DefaultServiceAccountDir is where Kubernetes mounts a pod's service
// account token, its cluster's CA and its namespace.
const DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// ErrNoConfig means that nothing tells how to reach a cluster: no
// kubeconfig file, and not in a pod.
var ErrNoConfig = errors.New("kubernetes: no configuration: set --kubeconfig or KUBECONFIG, or run in a pod (KUBERNETES_SERVICE_HOST)")

// LoadAPIConfig finds the apiserver and credentials as kubectl does. With
// opts.Kubeconfig it reads that one file. Otherwise it merges the files
// listed in KUBECONFIG (skipping those that do not exist; for each cluster,
// user and context name, and for current-context, the first file that sets
// it wins), or reads ~/.kube/config; and if that yields nothing and
// KUBERNETES_SERVICE_HOST is set, it uses the pod's service account, as
// client-go does.
func LoadAPIConfig(opts LoadOptions) (*APIConfig, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var files []string
	explicit := opts.Kubeconfig != ""
	switch {
	case explicit:
		files = []string{opts.Kubeconfig}
	case getenv("KUBECONFIG") != "":
		for _, f := range filepath.SplitList(getenv("KUBECONFIG")) {
			if f != "" {
				files = append(files, f)
			}
		}
	default:
		if home := getenv("HOME"); home != "" {
			files = []string{filepath.Join(home, ".kube", "config")}
		}
	}
	merged, err := loadKubeconfigs(files, explicit)
	if err != nil {
		return nil, err
	}
	if merged.empty() && !explicit && getenv("KUBERNETES_SERVICE_HOST") != "" {
		return inCluster(getenv, opts.ServiceAccountDir)
	}
	if merged.empty() {
		return nil, ErrNoConfig
	}
	return merged.resolve(opts.Context)
}

// kubeconfig is the part of a kubeconfig file that says how to reach a
// cluster. The names are kubectl's.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string    `yaml:"name"`
		Cluster kcCluster `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User kcUser `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string    `yaml:"name"`
		Context kcContext `yaml:"context"`
	} `yaml:"contexts"`
}

type kcCluster struct {
	Server                   string `yaml:"server"`
	TLSServerName            string `yaml:"tls-server-name"`
	InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
	CertificateAuthority     string `yaml:"certificate-authority"`
	CertificateAuthorityData string `yaml:"certificate-authority-data"`
	ProxyURL                 string `yaml:"proxy-url"`

	dir string // of the file that defined it, for relative paths
}

type kcUser struct {
	ClientCertificate     string   `yaml:"client-certificate"`
	ClientCertificateData string   `yaml:"client-certificate-data"`
	ClientKey             string   `yaml:"client-key"`
	ClientKeyData         string   `yaml:"client-key-data"`
	Token                 string   `yaml:"token"`
	TokenFile             string   `yaml:"tokenFile"`
	Username              string   `yaml:"username"`
	Password              string   `yaml:"password"`
	Impersonate           string   `yaml:"as"`
	ImpersonateUID        string   `yaml:"as-uid"`
	ImpersonateGroups     []string `yaml:"as-groups"`
	Exec                  *kcExec  `yaml:"exec"`
	AuthProvider          *struct {
		Name string `yaml:"name"`
	} `yaml:"auth-provider"`

	dir string
}

type kcExec struct {
	Command            string       `yaml:"command"`
	Args               []string     `yaml:"args"`
	Env                []ExecEnvVar `yaml:"env"`
	APIVersion         string       `yaml:"apiVersion"`
	InstallHint        string       `yaml:"installHint"`
	ProvideClusterInfo bool         `yaml:"provideClusterInfo"`
	InteractiveMode    string       `yaml:"interactiveMode"`
}

type kcContext struct {
	Cluster   string `yaml:"cluster"`
	User      string `yaml:"user"`
	Namespace string `yaml:"namespace"`
}

// mergedConfig is what a list of kubeconfig files says, first file first.
type mergedConfig struct {
	files          []string // that were read
	currentContext string
	clusters       map[string]kcCluster
	users          map[string]kcUser
	contexts       map[string]kcContext
}

func (m *mergedConfig) empty() bool {
	return m.currentContext == "" && len(m.contexts) == 0 && len(m.clusters) == 0
}

// loadKubeconfigs reads and merges files. A file that does not exist is
// skipped, unless it was named explicitly; one that cannot be read or
// parsed is an error, as for kubectl.
func loadKubeconfigs(files []string, explicit bool) (*mergedConfig, error) {
	m := &mergedConfig{clusters: map[string]kcCluster{}, users: map[string]kcUser{}, contexts: map[string]kcContext{}}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) && !explicit {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes: read kubeconfig: %w", err)
		}
		var kc kubeconfig
		if err := yaml.Unmarshal(data, &kc); err != nil {
			return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", f, err)
		}
		m.files = append(m.files, f)
		dir := filepath.Dir(f)
		if m.currentContext == "" {
			m.currentContext = kc.CurrentContext
		}
		for _, c := range kc.Clusters {
			if _, ok := m.clusters[c.Name]; !ok {
				c.Cluster.dir = dir
				m.clusters[c.Name] = c.Cluster
			}
		}
		for _, u := range kc.Users {
			if _, ok := m.users[u.Name]; !ok {
				u.User.dir = dir
				m.users[u.Name] = u.User
			}
		}
		for _, c := range kc.Contexts {
			if _, ok := m.contexts[c.Name]; !ok {
				m.contexts[c.Name] = c.Context
			}
		}
	}
	return m, nil
}

// resolve builds the APIConfig of the context named name (empty: the
// current context).
func (m *mergedConfig) resolve(name string) (*APIConfig, error) {
	where := strings.Join(m.files, string(filepath.ListSeparator))
	if name == "" {
		name = m.currentContext
	}
	if name == "" {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s has no current-context; name a context", where)
	}
	kctx, ok := m.contexts[name]
	if !ok {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s has no context %q", where, name)
	}
	cl, ok := m.clusters[kctx.Cluster]
	if !ok {
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s names cluster %q, which it does not define", name, where, kctx.Cluster)
	}
	if cl.Server == "" {
		return nil, fmt.Errorf("kubernetes: cluster %q of kubeconfig %s has no server", kctx.Cluster, where)
	}
	cfg := &APIConfig{
		Server:        cl.Server,
		Insecure:      cl.InsecureSkipTLSVerify,
		TLSServerName: cl.TLSServerName,
		ProxyURL:      cl.ProxyURL,
		CAFile:        resolvePath(cl.dir, cl.CertificateAuthority),
		Namespace:     kctx.Namespace,
		Source:        fmt.Sprintf("context %q of kubeconfig %s", name, where),
	}
	var err error
	if cfg.CAData, err = decodeData(cl.CertificateAuthorityData, "certificate-authority-data of cluster "+kctx.Cluster); err != nil {
		return nil, err
	}
	if kctx.User == "" {
		return cfg, nil // anonymous
	}
	u, ok := m.users[kctx.User]
	if !ok {
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s names user %q, which it does not define", name, where, kctx.User)
	}
	if err := cfg.setUser(kctx.User, u); err != nil {
		return nil, err
	}
	return cfg, nil
}

// setUser takes the credentials of user name.
func (cfg *APIConfig) setUser(name string, u kcUser) error {
	what := func(field string) string { return field + " of user " + name }
	if u.AuthProvider != nil {
		return fmt.Errorf("kubernetes: user %q uses auth-provider %q, which leaderrun does not support: use an exec credential plugin", name, u.AuthProvider.Name)
	}
	cfg.Token = u.Token
	cfg.TokenFile = resolvePath(u.dir, u.TokenFile)
	cfg.Username, cfg.Password = u.Username, u.Password
	cfg.CertFile, cfg.KeyFile = resolvePath(u.dir, u.ClientCertificate), resolvePath(u.dir, u.ClientKey)
	cfg.Impersonate, cfg.ImpersonateUID, cfg.ImpersonateGroups = u.Impersonate, u.ImpersonateUID, u.ImpersonateGroups
	var err error
	if cfg.CertData, err = decodeData(u.ClientCertificateData, what("client-certificate-data")); err != nil {
		return err
	}
	if cfg.KeyData, err = decodeData(u.ClientKeyData, what("client-key-data")); err != nil {
		return err
	}
	if e := u.Exec; e != nil {
		command := e.Command
		// kubectl resolves a relative command with a slash against the
		// kubeconfig's directory; a bare name is looked up in PATH.
		if strings.ContainsRune(command, '/') {
			command = resolvePath(u.dir, command)
		}
		cfg.Exec = &ExecConfig{
			Command: command, Args: e.Args, Env: e.Env, APIVersion: e.APIVersion,
			InteractiveMode: e.InteractiveMode, ProvideClusterInfo: e.ProvideClusterInfo, InstallHint: e.InstallHint,
		}
	}
	return nil
}

func resolvePath(dir, p string) string {
	if p == "" || filepath.IsAbs(p) || dir == "" {
		return p
	}
	return filepath.Join(dir, p)
}

func decodeData(s, what string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	data, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %s: not base64: %w", what, err)
	}
	return data, nil
}

// inCluster is a pod's own service account, as client-go's InClusterConfig
// reads it; the namespace is POD_NAMESPACE if set, else the service
// account's.
func inCluster(getenv func(string) string, dir string) (*APIConfig, error) {
	if dir == "" {
		dir = DefaultServiceAccountDir
	}
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("kubernetes: in a pod, KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set: %w", ErrNoConfig)
	}
	cfg := &APIConfig{
		Server:    "https://" + net.JoinHostPort(host, port),
		TokenFile: filepath.Join(dir, "token"),
		Source:    "the pod's service account (" + dir + ")",
	}
	if _, err := os.Stat(cfg.TokenFile); err != nil {
		return nil, fmt.Errorf("kubernetes: in-cluster service account token: %w", err)
	}
	// Like client-go, do without the CA file if it is missing: the
	// system's roots may do.
	if ca := filepath.Join(dir, "ca.crt"); fileExists(ca) {
		cfg.CAFile = ca
	}
	cfg.Namespace = getenv("POD_NAMESPACE")
	if cfg.Namespace == "" {
		if data, err := os.ReadFile(filepath.Join(dir, "namespace")); err == nil {
			cfg.Namespace = strings.TrimSpace(string(data))
		}
	}
	return cfg, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

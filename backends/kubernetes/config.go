package kubernetes

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/homedir"

	// The auth providers client-go still ships: oidc, and the gcp and
	// azure stubs that say which exec plugin replaced them. Their init
	// costs nothing measurable (docs/backends/kubernetes.md).
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

// APIConfig says how to reach one apiserver and who to be there: what
// kubectl makes of a kubeconfig context, or of a pod's service account.
type APIConfig struct {
	// REST is client-go's configuration: server, TLS, credentials
	// (tokens and token files, client certificates, exec plugins, auth
	// providers), impersonation and proxy. New adds leaderrun's bounds
	// to a copy of it.
	REST *rest.Config
	// Namespace is the namespace the configuration implies: the service
	// account's in a pod (POD_NAMESPACE first), the context's in a
	// kubeconfig; "" if none.
	Namespace string
	// Source says where the configuration came from, for messages: a
	// context of a kubeconfig, or the pod's service account.
	Source string
}

// LoadOptions say where LoadAPIConfig looks.
type LoadOptions struct {
	// Kubeconfig is the kubeconfig file to use (--kubeconfig). Empty: the
	// files listed in KUBECONFIG, else ~/.kube/config, else, in a pod, its
	// service account.
	Kubeconfig string
	// Context is the kubeconfig context to use. Empty: current-context.
	Context string
}

// serviceAccountDir is where Kubernetes mounts a pod's service account
// token, its cluster's CA and its namespace (rest.InClusterConfig reads
// the first two from there).
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// ErrNoConfig means that nothing tells how to reach a cluster: no
// kubeconfig file, and not in a pod.
var ErrNoConfig = errors.New("kubernetes: no configuration: set --kubeconfig or KUBECONFIG, or run in a pod (KUBERNETES_SERVICE_HOST)")

// LoadAPIConfig finds the apiserver and credentials as kubectl does, with
// client-go's clientcmd: with opts.Kubeconfig that one file; otherwise
// the files listed in KUBECONFIG merged (missing ones skipped; for each
// name the first file that sets it wins), or ~/.kube/config. If that
// yields nothing, no file was named and KUBERNETES_SERVICE_HOST is set,
// it is the pod's service account (rest.InClusterConfig, whose token file
// is read again as the kubelet rotates it).
func LoadAPIConfig(opts LoadOptions) (*APIConfig, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = opts.Kubeconfig
	if os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		// clientcmd resolves ~ once, when it is loaded; read HOME now.
		rules.Precedence = []string{filepath.Join(homedir.HomeDir(), clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName)}
	}
	rules.MigrationRules = nil // never write files of the user's
	raw, err := rules.Load()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig: %w", err)
	}
	if clientcmdapi.IsConfigEmpty(raw) {
		if opts.Kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
			return inCluster()
		}
		return nil, ErrNoConfig
	}
	where := strings.Join(rules.GetLoadingPrecedence(), string(filepath.ListSeparator))
	name := opts.Context
	if name == "" {
		name = raw.CurrentContext
	}
	if name == "" {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s has no current-context; name a context", where)
	}
	// clientcmd takes a context that names nothing defined for no
	// configuration at all; say which name is missing.
	kctx, ok := raw.Contexts[name]
	switch {
	case !ok:
		return nil, fmt.Errorf("kubernetes: kubeconfig %s has no context %q", where, name)
	case raw.Clusters[kctx.Cluster] == nil:
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s names cluster %q, which it does not define", name, where, kctx.Cluster)
	case kctx.AuthInfo != "" && raw.AuthInfos[kctx.AuthInfo] == nil:
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s names user %q, which it does not define", name, where, kctx.AuthInfo)
	}
	cc := clientcmd.NewNonInteractiveClientConfig(*raw, name, &clientcmd.ConfigOverrides{}, rules)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s: %w", name, where, err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s: %w", name, where, err)
	}
	return &APIConfig{REST: cfg, Namespace: ns, Source: fmt.Sprintf("context %q of kubeconfig %s", name, where)}, nil
}

// inCluster is a pod's own service account, as client-go reads it; the
// namespace is POD_NAMESPACE if set, else the service account's.
func inCluster() (*APIConfig, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: in-cluster service account (KUBERNETES_SERVICE_HOST is set): %w", err)
	}
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		if data, err := os.ReadFile(filepath.Join(serviceAccountDir, "namespace")); err == nil {
			ns = strings.TrimSpace(string(data))
		}
	}
	return &APIConfig{REST: cfg, Namespace: ns, Source: "the pod's service account (" + serviceAccountDir + ")"}, nil
}

// Connection settings. client-go dials for 30 s; leaderrun's timings are
// seconds, so a dead address is given up sooner.
const (
	dialTimeout  = 5 * time.Second
	tcpKeepAlive = 15 * time.Second
)

// restClient builds client-go's REST client for leases from api: JSON
// only, every answer and watch event bounded (see bounded.go), redirects
// refused, no client-side throttling (leaderrun paces its own requests).
// It also returns the server as messages name it.
func restClient(api *APIConfig) (*rest.RESTClient, string, error) {
	if api.REST == nil {
		return nil, "", fmt.Errorf("kubernetes: %s: no REST configuration", api.Source)
	}
	cfg := rest.CopyConfig(api.REST)
	cfg.GroupVersion = new(coordinationv1.SchemeGroupVersion)
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = leaseSerializer()
	cfg.ContentType = "application/json"
	cfg.AcceptContentTypes = "application/json"
	cfg.UserAgent = "leaderrun"
	cfg.QPS = -1
	cfg.Timeout = 0 // a watch is long; every other request has a deadline of its own
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{Timeout: dialTimeout, KeepAlive: tcpKeepAlive}).DialContext
	}
	if cfg.ExecProvider != nil {
		// leaderrun's standard input is its child's: a plugin never gets it.
		cfg.ExecProvider.StdinUnavailable = true
		cfg.ExecProvider.StdinUnavailableMessage = "leaderrun gives credential plugins no terminal"
	}
	cfg.Wrap(bound)
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes: server of %s: %w", api.Source, err)
	}
	host := base.Scheme + "://" + base.Host + strings.TrimSuffix(base.Path, "/")
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes: %s: %w", api.Source, err)
	}
	client := *hc // never change a shared client
	client.CheckRedirect = refuseRedirect
	rc, err := rest.RESTClientForConfigAndClient(cfg, &client)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes: %s: %w", api.Source, err)
	}
	return rc, host, nil
}

// errRedirect: the apiserver (or something in front of it) answered with
// a redirect. client-go adds the credentials in its transport, so a
// followed redirect would carry the bearer token, the exec plugin's token
// or the client certificate to wherever it points: none is followed.
var errRedirect = fmt.Errorf("%w: a redirect, not followed (credentials are never sent on)", errProtocol)

func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("%w: to %s", errRedirect, redactURL(req.URL))
}

// redactURL is u without user information or query, for messages.
func redactURL(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.Fragment = nil, "", ""
	return c.String()
}

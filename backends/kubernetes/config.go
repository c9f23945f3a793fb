package kubernetes

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/homedir"

	// The auth providers client-go still ships (oidc; gcp and azure say
	// which exec plugin replaced them).
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

// APIConfig says how to reach one apiserver and who to be there: what
// kubectl makes of a kubeconfig context, or of a pod's service account.
type APIConfig struct {
	REST      *rest.Config // client-go's; Open adds leaderrun's bounds to a copy
	Namespace string       // the one the configuration implies; "" if none
	Source    string       // where the configuration came from, for messages
}

// LoadOptions say where LoadAPIConfig looks.
type LoadOptions struct {
	Kubeconfig string // --kubeconfig; empty: see LoadAPIConfig
	Context    string // empty: current-context
}

// serviceAccountDir is where Kubernetes mounts a pod's service account.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// ErrNoConfig: no kubeconfig file, and not in a pod.
var ErrNoConfig = errors.New("kubernetes: no configuration: set --kubeconfig or KUBECONFIG, or run in a pod (KUBERNETES_SERVICE_HOST)")

// LoadAPIConfig finds the apiserver and credentials as kubectl does, with
// client-go's clientcmd: opts.Kubeconfig; else the files listed in
// KUBECONFIG merged (missing ones skipped, the first to set a name wins),
// or ~/.kube/config; else, with KUBERNETES_SERVICE_HOST set, the pod's
// service account (whose token file client-go reads again as it rotates).
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
	// clientcmd takes a context that names nothing defined for no
	// configuration at all: say which name is missing.
	name := cmp.Or(opts.Context, raw.CurrentContext)
	kctx, ok := raw.Contexts[name]
	switch {
	case name == "":
		return nil, fmt.Errorf("kubernetes: kubeconfig %s has no current-context; name a context", where)
	case !ok:
		return nil, fmt.Errorf("kubernetes: kubeconfig %s has no context %q", where, name)
	case raw.Clusters[kctx.Cluster] == nil:
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s names cluster %q, which it does not define", name, where, kctx.Cluster)
	case kctx.AuthInfo != "" && raw.AuthInfos[kctx.AuthInfo] == nil:
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s names user %q, which it does not define", name, where, kctx.AuthInfo)
	}
	cc := clientcmd.NewNonInteractiveClientConfig(*raw, name, &clientcmd.ConfigOverrides{}, rules)
	cfg, err := cc.ClientConfig()
	ns := ""
	if err == nil {
		ns, _, err = cc.Namespace()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: context %q of kubeconfig %s: %w", name, where, err)
	}
	return &APIConfig{REST: cfg, Namespace: ns, Source: fmt.Sprintf("context %q of kubeconfig %s", name, where)}, nil
}

// inCluster is a pod's own service account; the namespace is
// POD_NAMESPACE if set, else the service account's.
func inCluster() (*APIConfig, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: in-cluster service account (KUBERNETES_SERVICE_HOST is set): %w", err)
	}
	data, _ := os.ReadFile(filepath.Join(serviceAccountDir, "namespace"))
	ns := cmp.Or(os.Getenv("POD_NAMESPACE"), strings.TrimSpace(string(data)))
	return &APIConfig{REST: cfg, Namespace: ns, Source: "the pod's service account (" + serviceAccountDir + ")"}, nil
}

// Open opens the Leases of namespace ns (empty: api.Namespace, else
// "default") on the apiserver of api (LoadAPIConfig), with client-go's
// REST client: JSON only, every answer and watch event bounded
// (bounded.go), redirects refused, no client-side throttling (leaderrun
// paces its own requests). It reads the files api names, but sends
// nothing to the apiserver.
func Open(api *APIConfig, ns string) (*Store, error) {
	ns = cmp.Or(ns, api.Namespace, "default")
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	if api.REST == nil {
		return nil, fmt.Errorf("kubernetes: %s: no REST configuration", api.Source)
	}
	cfg := rest.CopyConfig(api.REST)
	cfg.GroupVersion = new(coordinationv1.SchemeGroupVersion)
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = leaseSerializer()
	cfg.ContentType, cfg.AcceptContentTypes, cfg.UserAgent = "application/json", "application/json", "leaderrun"
	cfg.QPS = -1
	cfg.Timeout = 0 // a watch is long; every other request has a deadline of its own
	if cfg.Dial == nil {
		// client-go dials for 30 s; leaderrun's timings are seconds.
		cfg.Dial = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext
	}
	if cfg.ExecProvider != nil {
		// leaderrun's standard input is its child's: a plugin never gets it.
		cfg.ExecProvider.StdinUnavailable = true
		cfg.ExecProvider.StdinUnavailableMessage = "leaderrun gives credential plugins no terminal"
	}
	cfg.Wrap(bound)
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: server of %s: %w", api.Source, err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %s: %w", api.Source, err)
	}
	client := *hc // never change a shared client
	client.CheckRedirect = refuseRedirect
	rc, err := rest.RESTClientForConfigAndClient(cfg, &client)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %s: %w", api.Source, err)
	}
	return &Store{rest: rc, host: base.Scheme + "://" + base.Host + strings.TrimSuffix(base.Path, "/"), namespace: ns}, nil
}

// refuseRedirect refuses every redirect: client-go adds the credentials
// in its transport, so a followed redirect would carry them to wherever it
// points. It names where, without user information or query.
func refuseRedirect(req *http.Request, _ []*http.Request) error {
	u := *req.URL
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return fmt.Errorf("%w: a redirect, not followed (credentials are never sent on): to %s", errProtocol, u.String())
}
